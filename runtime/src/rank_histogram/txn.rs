//! The transaction runner: a player's write and the histogram's follow
//! it in one transaction (the caller's, or one of the call's own run
//! through the driver's `and_run`), or, where the caller allows it,
//! one after the other without one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::{ClientSession, Collection};

use super::group::{conflict, only_id, Grouped};
use super::pending::Op;
use super::queue::Turn;
use super::score::AnyScore;
use super::write::{Delta, Txn};
use super::{RankHistogram, Ranks};
use crate::action::{Call, Options};
use crate::error::{Error, Result};
use crate::retry::Retry;
use crate::transaction::{options, to_driver, Stashed};

/// How long a non-atomic write waits for a concurrent writer's `+1` to
/// land.
const NON_ATOMIC_WAIT: Duration = Duration::from_secs(30);

/// A write to the players' collection that the histogram follows.
pub(super) enum SourceOp<'a, T> {
    Insert(&'a T),
    Update(Document, Box<dyn AnyScore>),
    Delete(Document),
}

impl<T> SourceOp<'_, T> {
    fn name(&self) -> &'static str {
        match self {
            SourceOp::Insert(_) => "insert",
            SourceOp::Update(..) => "update_score",
            SourceOp::Delete(_) => "delete",
        }
    }
}

/// What the histogram must do after a player's write.
struct Move {
    board: Bson,
    dec: Option<Bson>,
    inc: Option<Bson>,
}

impl Move {
    fn delta(&self) -> Delta<'_> {
        Delta {
            dec: self.dec.as_ref(),
            inc: self.inc.as_ref(),
        }
    }
}

impl<T: RankHistogram> Ranks<T> {
    /// `op` in a transaction: the caller's, when `session` has one open;
    /// otherwise one of its own (in `session`, or in a session of its own),
    /// through the driver's convenient API: a transient failure (a write
    /// conflict with another writer of the same board, a lost upsert race,
    /// a dropped connection) reruns it after a jittered backoff, and an
    /// unknown commit result retries the commit, for up to 120 s in all. A
    /// call dropped while its own transaction is open has the server abort
    /// it at once (`killSessions`), so the players and board it touched are
    /// free for the next writer.
    pub(super) async fn run_atomically(&self, op: SourceOp<'_, T>, cx: Call<'_>) -> Result<bool> {
        let no_txn = !self.transactions || self.no_transactions.load(Ordering::Relaxed);
        let (o, session, joined) = (cx.opts, cx.session, cx.txn);
        // The paths other than a transaction of its own are boxed, each
        // when taken: inline, they would make every call's future too
        // large for a small allocation.
        let mut txn = match session {
            Some(s) if joined => {
                // A call cut before its last reply has the session killed
                // on the server (see `crate::cut`).
                let write = |s| self.source_op(&op, &o, s);
                return Box::pin(crate::cut::guarded(s, write)).await;
            }
            Some(s) if no_txn => return Box::pin(self.non_atomic(&op, &o, Some(s))).await,
            None if no_txn => return Box::pin(self.non_atomic(&op, &o, None)).await,
            Some(s) => OpenTransaction::new(Held::Borrowed(s), &self.hist),
            // Not causally consistent: a rerun's first command then
            // carries no `readConcern`, so `insert` can stay one
            // `bulkWrite` (a fresh session has nothing to be consistent
            // with).
            None => OpenTransaction::new(
                Held::Owned(Some(Box::new(
                    self.db
                        .client()
                        .start_session()
                        .causal_consistency(false)
                        .await?,
                ))),
                &self.hist,
            ),
        };
        // Only in a session of the call's own, whose first command carries
        // no `readConcern` (a caller's may have read before).
        let combine = matches!(op, SourceOp::Insert(_))
            && (matches!(txn.session, Held::Owned(_)) || self.bulk_with_read_concern)
            && self.combines(&o);
        match self.own_transaction(&op, &o, &mut txn, combine).await {
            // A standalone refuses on the first write, before writing.
            Err(Error::NoTransactions { .. }) => {
                crate::action::learnt(
                    &self.no_transactions,
                    "no_transactions",
                    self.hist.name(),
                    "the deployment refused a transaction (a standalone): insert, update_score and delete write without one where allow_non_atomic permits, and fail with NoTransactions otherwise",
                );
                Box::pin(self.non_atomic(&op, &o, txn.session())).await
            }
            other => other,
        }
    }

    /// `op` in a transaction of its own in `txn`'s session, through
    /// the driver's `and_run`. `NoTransactions` when the deployment
    /// refused one.
    async fn own_transaction(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        txn: &mut OpenTransaction<'_>,
        combine: bool,
    ) -> Result<bool> {
        let inside = o.clone().in_transaction();
        let (_running, contended) = self.queues.start();
        let mut board = self.known_board(op, o, contended).await?;
        // Boxed: it lives across the awaits below, and every call's future
        // would carry it inline.
        let group = match txn.session {
            Held::Owned(_) => self.group_op(op, o).map(Box::new),
            Held::Borrowed(_) => None,
        };
        // A call that ran alone and conflicted with another process joins
        // its board's group once, instead of rerunning alone.
        let mut may_regroup = group.is_some();
        loop {
            let mut turn = None;
            if let (Some(b), Some(g)) = (&board, &group) {
                // Nothing is open in the session while the call waits in
                // its group: there is nothing to kill if it is dropped.
                txn.armed = false;
                // Boxed: inline, it would make every call's future larger.
                match Box::pin(self.grouped(b, Op::clone(g), o)).await {
                    Grouped::Done(r) => return r,
                    Grouped::Turn(t) => turn = Some(t),
                    Grouped::Alone => may_regroup = false,
                }
                txn.armed = true;
            }
            let Some(session) = txn.session() else {
                // Only `Drop` takes the session out.
                return Err(Error::invalid("session", "no session"));
            };
            // Boxed: inline, it would make every call's future too large
            // for a small allocation.
            let mut attempts = Box::new(Attempts {
                stashed: None,
                count: 0,
                combine,
                board,
                turn,
                may_regroup,
                regroup: false,
            });
            let result = session
                .start_transaction()
                .with_options(options(o))
                // `and_run` rather than `and_run2`: the latter's async closure
                // trips rust-lang/rust#96865 here ("implementation of `Send` is
                // not general enough" for `&Ranks<T>`, `&Options`, … when the
                // action boxes this future as `Send`), even with owned captures.
                // Same retries, backoff and 120 s bound.
                .and_run(
                    (self, op, &inside, &mut *attempts),
                    |s, (this, op, inside, attempts)| {
                        Box::pin(this.attempt(op, inside, s, attempts))
                    },
                )
                .await;
            if matches!(txn.session, Held::Borrowed(_)) {
                // `and_run` has committed or aborted: the caller's session is
                // only killed when this call is dropped mid-transaction.
                txn.armed = false;
            }
            if attempts.regroup && result.is_err() && attempts.board.is_some() {
                // Aborted by `and_run`: nothing of it is stored.
                txn.armed = false;
                may_regroup = false;
                board = attempts.board.take();
                continue;
            }
            return own_outcome(result, txn, *attempts, op.name());
        }
    }

    /// `op` as a group sends it (see `group`), if it can be grouped.
    fn group_op(&self, op: &SourceOp<'_, T>, o: &Options) -> Option<Op> {
        if !self.groups(o) {
            return None;
        }
        Some(match op {
            SourceOp::Insert(doc) => Op::Insert {
                player: crate::compat::to_document(*doc).ok()?,
                score: self.score_bson(doc.score()).ok()?,
            },
            SourceOp::Update(filter, new) => Op::Update {
                id: only_id(filter)?.clone(),
                stored: new.stored().ok()?,
                number: self.number_bson(new.number()).ok()?,
            },
            SourceOp::Delete(filter) => Op::Delete {
                id: only_id(filter)?.clone(),
            },
        })
    }

    /// The board whose queue (see `queue`) is known before the first
    /// attempt: an insert's, the one remembered for a filter, or, when
    /// writers contend, the one the filter's player is on. Otherwise the
    /// first attempt learns it, if it conflicts.
    async fn known_board(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        contended: bool,
    ) -> Result<Option<Bson>> {
        Ok(match op {
            SourceOp::Insert(doc) => self.board_bson(doc.board()).ok(),
            SourceOp::Update(filter, _) | SourceOp::Delete(filter) => {
                match self.queues.hint(filter) {
                    Some(b) => Some(b),
                    // Boxed: rare, and inline it would make every call's
                    // future too large for a small allocation.
                    None if contended => Box::pin(self.board_of(filter, o)).await?,
                    None => None,
                }
            }
        })
    }

    /// One attempt of `op` in the transaction open in `s`: its turn in the
    /// board's queue taken before the transaction's first command (which
    /// takes its snapshot), then the insert as one combined command, or
    /// the player's write and the histogram's. An error goes back as the
    /// driver's, for `and_run` to read its labels (see [`to_driver`]).
    async fn attempt(
        &self,
        op: &SourceOp<'_, T>,
        inside: &Options,
        s: &mut ClientSession,
        attempts: &mut Attempts,
    ) -> mongodb::error::Result<bool> {
        attempts.count += 1;
        if let Some(b) = attempts.board.as_ref() {
            if !attempts.turn.as_ref().is_some_and(|t| t.of(b)) {
                attempts.turn = None;
                attempts.turn = Some(self.queues.enter(b).await);
            }
        }
        let done = match op {
            SourceOp::Insert(doc) if attempts.combine => {
                match self.insert_combined(doc, inside, s).await {
                    Ok(None) => Ok(true),
                    // Rerun as separate commands.
                    Ok(Some(e)) => {
                        attempts.combine = false;
                        Err(Error::Raced(e))
                    }
                    Err(e) => Err(e),
                }
            }
            _ => self.queued_op(op, inside, s, &mut attempts.board).await,
        };
        done.map_err(|e| {
            let conflicted = conflict(&e);
            let m = to_driver(e, &mut attempts.stashed);
            if conflicted {
                self.queues.conflicted();
                if attempts.may_regroup && attempts.board.is_some() {
                    // Rerun in the board's group (see `own_transaction`).
                    attempts.regroup = true;
                    let e = Error::invalid("group", "rerun in the board's group");
                    return to_driver(e, &mut attempts.stashed);
                }
            }
            m
        })
    }

    /// `op` without a transaction, where the caller allowed it.
    async fn non_atomic(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        mut session: Option<&mut ClientSession>,
    ) -> Result<bool> {
        if !self.allow_non_atomic {
            return Err(Error::NoTransactions {
                operation: op.name(),
            });
        }
        let Some(m) = self.player_write(op, o, session.as_deref_mut()).await? else {
            return Ok(false);
        };
        // `+1` first: it cannot fail for want of a count, so no two writers
        // can each wait for the other's.
        if let Some(i) = &m.inc {
            let inc = Delta {
                dec: None,
                inc: Some(i),
            };
            self.write(&m.board, inc, o, session.as_deref_mut(), Txn::No)
                .await?;
        }
        let Some(d) = &m.dec else { return Ok(true) };
        let dec = Delta {
            dec: Some(d),
            inc: None,
        };
        // A concurrent writer may have moved this player onto the old score
        // with its `+1` still to land: waited for, as any lost race, up to
        // NON_ATOMIC_WAIT, and then the score is not found.
        let mut retry = Retry::within(op.name(), NON_ATOMIC_WAIT);
        loop {
            match self
                .write(&m.board, dec, o, session.as_deref_mut(), Txn::No)
                .await
            {
                Err(e @ Error::ScoreNotFound { .. }) => {
                    if retry.pause().await.is_err() {
                        return Err(e);
                    }
                }
                other => return other.map(|()| true),
            }
        }
    }

    /// One write to the players' collection and the matching histogram
    /// write, in `session`'s transaction; `false` when the filter matched
    /// nothing.
    async fn source_op(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        session: &mut ClientSession,
    ) -> Result<bool> {
        let Some(m) = self.player_write(op, o, Some(&mut *session)).await? else {
            return Ok(false);
        };
        self.write(&m.board, m.delta(), o, Some(session), Txn::AfterPlayer)
            .await?;
        Ok(true)
    }

    /// The board of the player `filter` matches, read on the primary
    /// before a transaction (a hint for its queue: see `queue`).
    async fn board_of(&self, filter: &Document, o: &Options) -> Result<Option<Bson>> {
        let board = self.spec.board;
        let mut find = mongodb::options::FindOneOptions::default();
        find.projection = Some(doc! {board: 1, "_id": 0});
        find.selection_criteria = Some(crate::util::primary());
        find.max_time = o.max_time;
        find.comment = o.comment.clone();
        let found = self
            .source
            .clone_with_type::<Document>()
            .find_one(filter.clone())
            .with_options(find)
            .await?;
        // As the player's write will name it (through `T::Board`), so that
        // the hint and the board found agree; a value that does not
        // convert is no hint.
        Ok(found
            .and_then(|d| d.get(board).cloned())
            .and_then(|b| crate::compat::from_bson::<T::Board>(b).ok())
            .and_then(|b| self.board_bson(&b).ok()))
    }

    /// [`source_op`](Self::source_op) in a transaction of the call's own:
    /// the board the player's write found is remembered, for the next
    /// attempt's queue and the next call with the same filter.
    async fn queued_op(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        session: &mut ClientSession,
        board: &mut Option<Bson>,
    ) -> Result<bool> {
        let Some(m) = self.player_write(op, o, Some(&mut *session)).await? else {
            return Ok(false);
        };
        if let SourceOp::Update(filter, _) | SourceOp::Delete(filter) = op {
            self.queues.learn(filter, &m.board);
        }
        *board = Some(m.board.clone());
        self.write(&m.board, m.delta(), o, Some(session), Txn::AfterPlayer)
            .await?;
        Ok(true)
    }

    /// The player's half of `op`; what the histogram must then do, or
    /// `None` when the filter matched nothing. Scores are checked before
    /// anything is sent.
    async fn player_write(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        session: Option<&mut ClientSession>,
    ) -> Result<Option<Move>> {
        let (old, new) = match op {
            SourceOp::Insert(doc) => {
                let board = self.board_bson(doc.board())?;
                let s = self.score_bson(doc.score())?;
                let insert = self.source.insert_one(*doc).with_options(o.driver());
                crate::action::run!(insert, session)?;
                return Ok(Some(Move {
                    board,
                    dec: None,
                    inc: Some(s),
                }));
            }
            SourceOp::Update(filter, new) => {
                let n = self.number_bson(new.number())?;
                let set = doc! {"$set": {self.spec.score: new.stored()?}};
                let update = self
                    .source
                    .find_one_and_update(filter.clone(), set)
                    .with_options(o.driver());
                (crate::action::run!(update, session)?, Some(n))
            }
            SourceOp::Delete(filter) => {
                let delete = self
                    .source
                    .find_one_and_delete(filter.clone())
                    .with_options(o.driver());
                (crate::action::run!(delete, session)?, None)
            }
        };
        let Some(old) = old else { return Ok(None) };
        Ok(Some(Move {
            board: self.board_bson(old.board())?,
            dec: Some(self.score_bson(old.score())?),
            inc: new,
        }))
    }
}

/// A transaction a call has open. Dropped while armed (the call's future
/// was dropped: a timeout, a `select!`), it has the server kill the session,
/// which aborts the transaction and frees what it locked, before the
/// session goes back to the pool. The driver alone would not: a session
/// whose first command of the transaction was still in flight is pooled as
/// it is, and its transaction holds its locks until the server's
/// transaction lifetime (60 s by default) runs out.
///
/// A command already sent may reach the server after the kill, and would
/// then start the transaction anew. So a session of the call's own is also
/// fenced: a transaction with the next number is started and aborted in it,
/// which aborts the older one if it is open, and makes the server refuse
/// any of its commands still on the way (`TransactionTooOld`).
///
/// A caller's session is killed on the server, not fenced: the caller
/// still holds it, with the transaction open locally, to abort or drop. Its
/// next transaction fences it.
struct OpenTransaction<'s> {
    session: Held<'s>,
    armed: bool,
    /// Where the fence reads (nothing: it looks up a missing `_id`).
    fence: &'s Collection<Document>,
}

/// The session a call's own transaction runs in.
enum Held<'s> {
    /// A session of the call's own (`None` once `Drop` took it), boxed:
    /// a session is large, a borrowed one a pointer.
    Owned(Option<Box<ClientSession>>),
    /// The caller's.
    Borrowed(&'s mut ClientSession),
}

impl<'s> OpenTransaction<'s> {
    fn new(session: Held<'s>, fence: &'s Collection<Document>) -> Self {
        OpenTransaction {
            session,
            armed: true,
            fence,
        }
    }

    fn session(&mut self) -> Option<&mut ClientSession> {
        match &mut self.session {
            Held::Owned(s) => s.as_deref_mut(),
            Held::Borrowed(s) => Some(&mut **s),
        }
    }
}

impl Drop for OpenTransaction<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The driver runs on tokio; outside a runtime there is nothing to
        // spawn on, and the server's transaction lifetime still applies.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, id, owned) = match &mut self.session {
            Held::Owned(s) => match s.take() {
                Some(s) => (s.client(), s.id().clone(), Some(s)),
                None => return,
            },
            Held::Borrowed(s) => (s.client(), s.id().clone(), None),
        };
        let fence = self.fence.clone();
        runtime.spawn(async move {
            crate::cut::kill_session(&client, id).await;
            if let Some(mut s) = owned {
                // Errors are ignored: the server's transaction lifetime
                // remains the bound.
                let _ = s.abort_transaction().await;
                if s.start_transaction().await.is_ok() {
                    let missing = doc! {"_id": Bson::MinKey};
                    let _ = fence.find_one(missing).session(&mut *s).await;
                    let _ = s.abort_transaction().await;
                }
            }
        });
    }
}

/// What the attempts of one transaction of a call's own share: the error
/// of ours the last one stashed (see [`to_driver`]), how many ran, whether
/// an insert is still sent as one combined command, and the board's queue
/// with the turn held in it.
struct Attempts {
    stashed: Option<Error>,
    count: usize,
    combine: bool,
    board: Option<Bson>,
    turn: Option<Turn>,
    /// Whether a conflict sends the call to its board's group, and
    /// whether one did.
    may_regroup: bool,
    regroup: bool,
}

/// The call's result from `and_run`'s: the callback's own error when it
/// stashed one, `Contended` when the retries ran out of time,
/// `NoTransactions` when the deployment refused a transaction. `txn` is
/// disarmed when the transaction is over.
fn own_outcome(
    result: mongodb::error::Result<bool>,
    txn: &mut OpenTransaction<'_>,
    attempts: Attempts,
    operation: &'static str,
) -> Result<bool> {
    // Committed, or aborted by `and_run` after the callback's own error.
    let over = match &result {
        Ok(_) => true,
        Err(e) => e.get_custom::<Stashed>().is_some(),
    };
    let r = crate::transaction::outcome(result, attempts.stashed, attempts.count, operation);
    if over || matches!(r, Err(Error::NoTransactions { .. })) {
        txn.armed = false;
    }
    r
}
