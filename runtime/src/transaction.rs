//! Transactions of a call's own, run through the driver's convenient API
//! (`and_run`): a transient failure (a write conflict with another writer,
//! a lost race, a dropped connection) reruns the whole transaction after a
//! jittered backoff, and an unknown commit result retries the commit, for
//! up to 120 s in all. What this adds is the mapping between the
//! library's errors and the driver's: the callback's own errors are kept
//! apart and returned as they were, the 120 s bound is
//! [`Error::Contended`], and a deployment that has no transactions is
//! [`Error::NoTransactions`].

use futures::future::BoxFuture;
use mongodb::ClientSession;

use crate::action::Options;
use crate::error::{server_codes, Error, Result};

/// The options of a transaction of the call's own: its write concern
/// (sent with the commit), read concern and the commit's time bound. It
/// reads the primary whatever the call's or the client's read preference:
/// a transaction reads nothing else, and the driver would refuse its first
/// read under the `secondaryPreferred` a client's URI may carry.
pub(crate) fn options(o: &Options) -> mongodb::options::TransactionOptions {
    let mut t = mongodb::options::TransactionOptions::default();
    t.write_concern = o.write_concern.clone();
    t.read_concern = o.read_concern.clone();
    t.selection_criteria = Some(crate::util::primary());
    t.max_commit_time = o.max_time;
    t
}

/// The marker of an error of ours carried through `and_run`.
pub(crate) struct Stashed;

/// An error of the transaction's callback as `and_run` needs it: the
/// driver's own (with its labels), a lost race labelled transient so that
/// it is rerun, or a marker for an error of ours, kept in `stashed`.
pub(crate) fn to_driver(e: Error, stashed: &mut Option<Error>) -> mongodb::error::Error {
    match e {
        Error::Database(m) | Error::Unavailable(m) => m,
        Error::Raced(m) => crate::error::with_transient_label(m),
        other => {
            *stashed = Some(other);
            mongodb::error::Error::custom(Stashed)
        }
    }
}

/// IllegalOperation: "Transaction numbers are only allowed on a replica set
/// member or mongos", which a standalone answers to the first write; or the
/// driver's own refusal, before anything is sent, of a deployment whose
/// `hello` advertises no sessions or a wire version before transactions.
pub(crate) fn refused(e: &Error) -> bool {
    match e {
        Error::Database(m) => {
            server_codes(m).contains(&crate::error::code::ILLEGAL_OPERATION)
                || matches!(&*m.kind, mongodb::error::ErrorKind::Transaction { message, .. }
                    if message.contains("not supported by this deployment"))
        }
        _ => false,
    }
}

/// `body` in a transaction of `session`, started with the options `o`
/// gives (see [`options`]), through `and_run`; `operation` names the call
/// in the errors.
pub(crate) async fn run<C, R, F>(
    session: &mut ClientSession,
    o: &Options,
    operation: &'static str,
    context: C,
    mut body: F,
) -> Result<R>
where
    C: Send,
    F: for<'b> FnMut(&'b mut ClientSession, &'b mut C) -> BoxFuture<'b, Result<R>> + Send,
{
    let (mut stashed, mut attempts) = (None, 0);
    let result = session
        .start_transaction()
        .with_options(options(o))
        .and_run(
            (context, &mut stashed, &mut attempts, &mut body),
            |s, (context, stashed, attempts, body)| {
                **attempts += 1;
                Box::pin(async move { body(s, context).await.map_err(|e| to_driver(e, stashed)) })
            },
        )
        .await;
    outcome(result, stashed, attempts, operation)
}

/// The call's result from `and_run`'s, after `attempts` runs of its
/// callback: the callback's own error when it `stashed` one, `Contended`
/// when the reruns ran out of time, `NoTransactions` when the deployment
/// refused a transaction, else the driver's error as ours.
pub(crate) fn outcome<R>(
    result: mongodb::error::Result<R>,
    stashed: Option<Error>,
    attempts: usize,
    operation: &'static str,
) -> Result<R> {
    let e = match result {
        Ok(r) => return Ok(r),
        Err(e) => e,
    };
    if e.get_custom::<Stashed>().is_some() {
        // The callback's own error; `and_run` aborted the transaction.
        return Err(stashed.unwrap_or_else(|| Error::Database(e)));
    }
    if matches!(*e.kind, mongodb::error::ErrorKind::Transaction { .. })
        && e.to_string().contains("maximum time")
    {
        return Err(Error::Contended {
            operation,
            attempts,
        });
    }
    let e = Error::from(e);
    if refused(&e) {
        return Err(Error::NoTransactions { operation });
    }
    Err(e)
}
