//! A call cut inside a transaction: the server must not keep the
//! transaction, and its locks, for its whole lifetime.
//!
//! The driver marks a transaction as started on the server only when the
//! reply to its first command arrives. A call dropped while that command is
//! in flight (a request timeout, a `select!`) leaves the session believing
//! nothing was sent: `abort_transaction()` then sends nothing, a dropped
//! session is pooled as it is, and the server, which did receive the
//! command, keeps the transaction open with what it wrote locked until the
//! transaction's lifetime (60 s by default) runs out. Other writers of the
//! same documents meet a write conflict or wait meanwhile.
//!
//! [`CutGuard`] closes that gap for the writes of every pattern in the
//! caller's transaction (the rank histogram's transactions of its own have
//! `OpenTransaction`, which kills with [`kill_session`] and then fences
//! its own session): armed while a call runs inside the caller's
//! transaction, dropped while armed (the call was cut before its last
//! reply), it has the server kill the session's server side
//! (`killSessions`), which aborts whatever transaction it has open and
//! interrupts its command still running. Whether the command in flight
//! was the transaction's first is not something the driver says, so any
//! cut inside a transaction kills: the transaction is lost either way (a
//! call cut half way would otherwise leave half its writes to commit).
//!
//! A command may also reach the server after the kill (held in the
//! network or in the server's queue) and start the transaction anew, so
//! the session is killed once more a second after the cut. That second
//! kill is blind: the driver does not say which transaction number the
//! cut command carried, and its commands cannot be sent with a session id
//! of our choosing. A transaction the caller starts in the same session
//! within that second (an `and_run2` retry) is killed with it, and fails
//! with `NoSuchTransaction` (labelled `TransientTransactionError`, so the
//! retry loop runs it again); so is a command of another session that
//! reuses the same server session from the driver's pool in that second.
//! A new transaction in the session also fences the cut one by itself:
//! it carries a higher number, which aborts an older one the server still
//! has open and makes the server refuse that one's late commands.
//!
//! Nothing of this runs outside a transaction: a guard there is one null
//! word.

use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::{Client, ClientSession};

/// How long after a cut the session is killed again, once, for a command
/// that reached the server after the first kill (held in the network or
/// in the server's queue): it would start the transaction anew.
const LATE: Duration = Duration::from_millis(1000);

/// Kills a session's server side when dropped while armed; see the
/// [module](self). One word: nothing is allocated unless armed, which
/// happens only inside a transaction.
#[must_use = "a guard disarmed at once guards nothing"]
pub(crate) struct CutGuard(Option<Box<Armed>>);

struct Armed {
    client: Client,
    id: Document,
}

impl CutGuard {
    /// Armed for `session` when `txn` (it has a transaction open);
    /// otherwise a guard that does nothing.
    pub(crate) fn new(txn: bool, session: Option<&ClientSession>) -> CutGuard {
        match session {
            Some(s) if txn => CutGuard::arm(s),
            _ => CutGuard(None),
        }
    }

    /// Armed for `session`.
    pub(crate) fn arm(session: &ClientSession) -> CutGuard {
        CutGuard(Some(Box::new(Armed {
            client: session.client(),
            id: session.id().clone(),
        })))
    }

    /// The call has its last reply: nothing to kill.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CutGuard {
    fn drop(&mut self) {
        let Some(armed) = self.0.take() else { return };
        // The driver runs on tokio; outside a runtime there is nothing to
        // spawn on, and the server's transaction lifetime still applies.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Armed { client, id } = *armed;
        runtime.spawn(async move {
            kill_session(&client, id.clone()).await;
            tokio::time::sleep(LATE).await;
            kill_session(&client, id).await;
        });
    }
}

/// `killSessions` for the session `id`: the server aborts its open
/// transaction and interrupts its running commands. Errors are ignored:
/// the server's transaction lifetime remains the bound.
pub(crate) async fn kill_session(client: &Client, id: Document) {
    let kill = doc! {"killSessions": [id]};
    let _ = client.database("admin").run_command(kill).await;
}

/// `f` in `session`, with a [`CutGuard`] armed for it (`session` has a
/// transaction open): boxed by the callers, a path only transactions take.
pub(crate) async fn guarded<'s, R, F>(
    session: &'s mut ClientSession,
    f: impl FnOnce(&'s mut ClientSession) -> F,
) -> R
where
    F: std::future::Future<Output = R>,
{
    let mut cut = CutGuard::arm(session);
    let r = f(session).await;
    cut.disarm();
    r
}
