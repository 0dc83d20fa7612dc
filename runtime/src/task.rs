//! Work a caller cannot cut: a call whose writes must not stop between two
//! of them (a delete over several buckets, a move in a transaction) runs
//! them as a task of its own, which goes on when the caller stops waiting
//! (a timeout, a `select!`, a dropped future).

use std::future::Future;

use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::error::{Error, Result};

/// Runs `fut` as a task of its own, in the current span, and waits for
/// it. Dropping the returned future leaves `fut` running to its end. A
/// panic in `fut` is resumed here; when the runtime shuts down before
/// `fut` ends, the error is [`Error::OutcomeUnknown`] for `operation`
/// (some of its writes may be stored): see [`shut_down`].
pub(crate) async fn uncut<F, R>(fut: F, operation: &'static str) -> Result<R>
where
    F: Future<Output = Result<R>> + Send + 'static,
    R: Send + 'static,
{
    joined(tokio::spawn(fut.in_current_span()), operation).await
}

/// `task`'s result: its own, its panic resumed, or [`shut_down`] when the
/// runtime dropped it.
async fn joined<R>(task: JoinHandle<Result<R>>, operation: &'static str) -> Result<R> {
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: nothing here aborts it, so the runtime shut down.
        Err(_) => Err(shut_down(operation)),
    }
}

/// The error of `operation` when the runtime shut down while a task of its
/// own ran it (or before it told the call how it ended):
/// [`Error::OutcomeUnknown`], its source a driver error saying so.
pub(crate) fn shut_down(operation: &'static str) -> Error {
    Error::OutcomeUnknown {
        operation,
        source: mongodb::error::Error::custom(format!(
            "the runtime shut down while `{operation}` ran"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gives_the_task_result() {
        assert_eq!(uncut(async { Ok(7) }, "push").await.unwrap(), 7);
        let refused = uncut(async { Err::<(), _>(Error::invalid("x", "no")) }, "push").await;
        assert!(matches!(refused, Err(Error::InvalidArgument { .. })));
    }

    /// The task goes on when the call is dropped.
    #[tokio::test]
    async fn dropping_the_call_leaves_the_task_running() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = uncut(
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let _ = tx.send(());
                Ok(())
            },
            "delete",
        );
        let _ = tokio::time::timeout(std::time::Duration::from_millis(1), call).await;
        rx.await.expect("the task ran to its end");
    }

    #[tokio::test]
    #[should_panic(expected = "inside")]
    async fn resumes_a_panic() {
        let _ = uncut::<_, ()>(async { panic!("inside") }, "push").await;
    }

    #[tokio::test]
    async fn a_runtime_shutting_down_leaves_the_outcome_unknown() {
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let task = other.spawn(std::future::pending::<Result<()>>());
        other.shutdown_background();
        let e = joined(task, "delete").await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutcomeUnknown {
                    operation: "delete",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!e.is_retryable());
        let source = std::error::Error::source(&e).unwrap().to_string();
        assert!(
            source.contains("the runtime shut down while `delete` ran"),
            "{source}"
        );
    }
}
