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
//! The kill is sent once, at the cut, and never again later: a later
//! kill of the same server session could interrupt whatever the next user
//! of that server session runs (the driver pools server sessions, and the
//! caller may end theirs at once; at the cut itself that takes the caller
//! ending its session and another task starting one in the instant the
//! kill is on its way). What it cannot reach: a command of the
//! cut call held in the network until after the kill, which then starts
//! the transaction anew. The caller's next transaction in the same session
//! (or the next user of its pooled server session) fences that one: a
//! higher transaction number makes the server abort the older transaction
//! and refuse its late commands. Until then it holds what it wrote, at
//! most for the server's transaction lifetime (60 s by default).
//!
//! A server that refuses `killSessions` (Atlas shared tiers and Flex
//! clusters do) leaves the cut transaction in the same state: open until
//! the session's next transaction fences it or its lifetime runs out. On
//! such a deployment, after a cut inside a transaction, abort it and run
//! the next one in the same session (`and_run2` does), or give calls
//! inside transactions no deadline shorter than their bound.
//! The refusal is said at DEBUG on `mongo_patterns::cut`.
//!
//! Nothing of this runs outside a transaction: a guard there is one null
//! word.

use mongodb::bson::{doc, Document};
use mongodb::{Client, ClientSession};

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
        runtime.spawn(async move { kill_session(&client, id).await });
    }
}

/// `killSessions` for the session `id`: the server aborts its open
/// transaction and interrupts its running commands. A refusal (a server
/// that does not let the user kill sessions) is said at DEBUG: the
/// session's next transaction, or the server's transaction lifetime,
/// remains the bound.
pub(crate) async fn kill_session(client: &Client, id: Document) {
    let kill = doc! {"killSessions": [id]};
    if let Err(e) = client.database("admin").run_command(kill).await {
        tracing::debug!(
            target: "mongo_patterns::cut",
            error = %e,
            "killSessions was refused: the cut transaction stays open until the session's next transaction or its lifetime ends"
        );
    }
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
