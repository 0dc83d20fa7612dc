//! One transaction of a call's own at a time per board, per handle and its
//! clones.
//!
//! Every `insert`, `update_score` and `delete` writes its board's
//! histogram (the one document of the array layout; the board's marker
//! and score documents of the documents layout). Two transactions that
//! write one document conflict on the server: the second gets
//! `WriteConflict` and is rerun after a backoff, having sent its commands
//! for nothing. With dozens of tasks on one board most attempts were
//! wasted that way (19.9 round trips a call at 16 tasks, 73 at 64), and
//! calls per second fell as tasks were added.
//!
//! So the tasks of one handle queue for a board before their transaction
//! starts (a fair, in-process queue: nothing is sent to wait), and the
//! server sees one transaction per board at a time from this process;
//! calls that find the board's turn taken wait in its group, which the
//! next turn runs as one transaction (see below). The queue is entered
//! before the transaction's first
//! command, as the transaction's snapshot is taken there: a transaction
//! that waited after its first command would still conflict with the ones
//! committed meanwhile.
//!
//! `update_score` and `delete` name their player by a filter, so the board
//! is known only from their first write. It is remembered per filter (a
//! hint, 4,096 filters at most): the next call with that filter queues from
//! its first attempt. A call whose board is not known yet reads it first
//! (one round trip, on the primary) when other transactions of the handle
//! are under way, or one conflicted or waited in a queue in the last 2 s;
//! otherwise it runs its first attempt
//! unqueued and, if it conflicts, queues for its reruns. A wrong
//! hint (the player moved, the filter now matches another) costs waiting in
//! the wrong queue once, never correctness: the transaction is what keeps
//! player and histogram consistent.
//!
//! Not queued: a caller's transaction (it started before the call, and
//! commits after it).
//!
//! Processes other than this one share no queue. What coordinates them is
//! the board's histogram document itself, on the server: when a call finds
//! its board's turn taken (or the board conflicted lately), it waits in the
//! board's group instead, and the next turn runs every call waiting there
//! as one transaction whose first command writes the histogram (`group`).
//! Another process's transaction that meets it fails at that first
//! command (`WriteConflict`, nothing written) rather than after it read,
//! and is rerun after a pause that doubles while its groups keep
//! conflicting and halves each time one commits ([`Queues::pause`]); its
//! calls join its group meanwhile, so each commit carries more of them.
//! Nothing is held but a transaction's write: a process that dies holding
//! one loses it with its session, or at the server's transaction lifetime.
//! It costs no command of its own: a call whose board is free and quiet
//! runs alone, 3 round trips as before, and a group costs 3 (`find`,
//! `bulkWrite`, `commitTransaction`) however many calls it holds, plus 2
//! (`bulkWrite`, `abortTransaction`) for each attempt that conflicted.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mongodb::bson::{Bson, Document};
use tokio::sync::OwnedMutexGuard;

use super::pending::{key, Pending};
use crate::util::Bounded;

/// Filters whose board is remembered.
const HINTS: usize = 4_096;
/// How long after a conflict a call whose board is not known reads it
/// first.
const CONTENDED: Duration = Duration::from_secs(2);
/// The least and the most a group's pace grows to (µs). At 1 s, a group
/// that lost a few times in a row paused for seconds in all while other
/// processes' groups kept the board (4 clients × 16 tasks: the slowest
/// calls took 2.4 to 4.3 s).
const MIN_PACE_US: u64 = 1_000;
const MAX_PACE_US: u64 = 250_000;
/// The most a group's pace grows to, in average transaction times.
const PACE_TRANSACTIONS: u64 = 24;

/// The boards' queues, and the boards filters led to.
#[derive(Debug)]
pub(super) struct Queues {
    boards: Mutex<HashMap<Vec<u8>, Arc<Board>>>,
    hints: Bounded<u64, Bson>,
    /// When a transaction of this handle last conflicted (ms after
    /// `epoch`, 0: never).
    conflicted: AtomicU64,
    epoch: Instant,
    /// Transactions of the calls' own under way.
    running: AtomicUsize,
    /// The number of the next call that waits in a group (see `group`).
    next: AtomicU64,
    /// How long a group waits, at most, before its transaction's attempts
    /// (µs): doubled when one conflicts (another process held the board),
    /// halved when one commits. See [`Queues::pause`].
    pace: AtomicU64,
    /// How long a group's transaction takes, on average (µs).
    took: AtomicU64,
}

/// One board's queue: the turn, and the calls waiting to be run together
/// by whoever takes it next (see `group`).
#[derive(Debug, Default)]
pub(super) struct Board {
    turn: Arc<tokio::sync::Mutex<()>>,
    pending: Mutex<Vec<Pending>>,
}

/// Counts a transaction of a call's own as under way while it lives.
pub(super) struct Running<'a>(&'a Queues);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A call's turn on one board: the others wait until it is dropped.
pub(super) struct Turn {
    key: Vec<u8>,
    guard: Option<OwnedMutexGuard<()>>,
    board: Option<Arc<Board>>,
    queues: Arc<Queues>,
}

impl Turn {
    /// Whether this is the turn of `board`.
    pub(super) fn of(&self, board: &Bson) -> bool {
        self.key == key(board)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        if let Some(b) = self.board.take() {
            self.queues.release(&self.key, b);
        }
    }
}

/// What [`Queues::join`] gave a call.
pub(super) enum Joined {
    Free(Turn),
    Lead(Turn, Waiting),
    Wait(Waiting),
}

/// A call waiting in a board's group (see `group`): its entry leaves the
/// group when it is dropped, unless a turn took it already.
pub(super) struct Waiting {
    key: Vec<u8>,
    board: Option<Arc<Board>>,
    id: u64,
    queues: Arc<Queues>,
}

impl Waiting {
    /// The board it waits on. `board` is `Some` from `Queues::join`, which
    /// makes every `Waiting`, until `Drop` takes it (so that `release`
    /// can count the board's other holders); nothing calls this after
    /// that, so the `expect` cannot fire.
    fn board(&self) -> &Arc<Board> {
        self.board.as_ref().expect("only Drop takes the board")
    }

    /// Waits for the board's turn.
    pub(super) async fn turn(&self) -> Turn {
        let guard = self.board().turn.clone().lock_owned().await;
        Turn {
            key: self.key.clone(),
            guard: Some(guard),
            board: Some(self.board().clone()),
            queues: self.queues.clone(),
        }
    }

    /// Takes out of the group, once this call has the turn, this call and
    /// the others waiting with the same options, each of a player of its
    /// own, at most `most`: `None` when another turn took this call already.
    pub(super) fn take(&self, most: usize) -> Option<Vec<Pending>> {
        let mut pending = self
            .board()
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mine = pending.iter().position(|p| p.id == self.id)?;
        let first = pending.remove(mine);
        let mut players: Vec<Option<Vec<u8>>> = vec![first.player()];
        let mut taken = vec![first];
        let mut i = 0;
        while i < pending.len() && taken.len() < most {
            let p = &pending[i];
            let player = p.player();
            let other = player.is_none() || !players.contains(&player);
            if p.opts == taken[0].opts && other {
                players.push(player);
                taken.push(pending.remove(i));
            } else {
                i += 1;
            }
        }
        Some(taken)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(b) = self.board.take() else { return };
        b.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|p| p.id != self.id);
        self.queues.release(&self.key, b);
    }
}

impl Default for Queues {
    fn default() -> Self {
        Queues {
            boards: Default::default(),
            hints: Bounded::new(HINTS),
            conflicted: AtomicU64::new(0),
            epoch: Instant::now(),
            running: AtomicUsize::new(0),
            next: AtomicU64::new(0),
            pace: AtomicU64::new(0),
            took: AtomicU64::new(0),
        }
    }
}

impl Queues {
    /// Waits for `board`'s turn. Dropped while waiting, it leaves the
    /// queue.
    pub(super) async fn enter(self: &Arc<Self>, board: &Bson) -> Turn {
        let key = key(board);
        let b = self.board(&key);
        let guard = match b.turn.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                // It would have conflicted: the board is contended.
                self.conflicted();
                b.turn.clone().lock_owned().await
            }
        };
        Turn {
            key,
            guard: Some(guard),
            board: Some(b),
            queues: self.clone(),
        }
    }

    /// `board`'s turn at once when nobody holds it and no transaction of
    /// this handle conflicted or waited lately (`Free`: the call runs
    /// alone); otherwise the call `entry` makes (given its number) goes
    /// into the board's group, with the turn when it was free (`Lead`: the
    /// group runs now) or to wait for it (`Wait`): see `group`.
    pub(super) fn join(
        self: &Arc<Self>,
        board: &Bson,
        entry: impl FnOnce(u64) -> Pending,
    ) -> Joined {
        let key = key(board);
        let b = self.board(&key);
        let turn = match b.turn.clone().try_lock_owned() {
            Ok(guard) => Some(Turn {
                key: key.clone(),
                guard: Some(guard),
                board: Some(b.clone()),
                queues: self.clone(),
            }),
            Err(_) => None,
        };
        match turn {
            Some(t) if !self.contended() => return Joined::Free(t),
            Some(_) => {}
            None => self.conflicted(),
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        b.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry(id));
        let waiting = Waiting {
            key,
            board: Some(b),
            id,
            queues: self.clone(),
        };
        match turn {
            Some(t) => Joined::Lead(t, waiting),
            None => Joined::Wait(waiting),
        }
    }

    fn board(&self, key: &[u8]) -> Arc<Board> {
        self.boards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_vec())
            .or_default()
            .clone()
    }

    /// `board` is no longer held by its turn or waiter: forgotten when
    /// nobody else holds or waits for it.
    fn release(&self, key: &[u8], board: Arc<Board>) {
        let mut boards = self.boards.lock().unwrap_or_else(PoisonError::into_inner);
        drop(board);
        if boards.get(key).is_some_and(|q| Arc::strong_count(q) == 1) {
            boards.remove(key);
        }
    }

    /// A transaction of this handle conflicted with another and was rerun,
    /// or waited for another's turn.
    pub(super) fn conflicted(&self) {
        let since = self.epoch.elapsed().as_millis() as u64;
        self.conflicted.store(since.max(1), Ordering::Relaxed);
    }

    /// A transaction of a call's own starts; whether others were under
    /// way or one conflicted recently: a call whose board is not known then
    /// reads it before its transaction (a round trip) rather than risk an
    /// attempt unqueued (two, and the abort).
    pub(super) fn start(&self) -> (Running<'_>, bool) {
        let others = self.running.fetch_add(1, Ordering::Relaxed) > 0;
        (Running(self), others || self.contended())
    }

    fn contended(&self) -> bool {
        let at = self.conflicted.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64;
        at != 0 && now.saturating_sub(at) < CONTENDED.as_millis() as u64
    }

    /// The pause before a group's `attempt` (1 for its first): a random
    /// part of the current pace, none while no attempt conflicted lately.
    /// Processes share no memory: those that meet on a board's histogram
    /// take turns by waiting longer, at random, each time they conflict
    /// (their groups grow meanwhile), and less each time they commit. A
    /// group that lost twice or more waits for a part of that, the smaller
    /// the more it lost: the pace is the process's, so without this a
    /// loser's every rerun waited as long as the next group's first try,
    /// and the processes that had just committed took the board again
    /// first.
    pub(super) fn pause(&self, attempt: usize) -> Option<Duration> {
        let pace = self.pace.load(Ordering::Relaxed);
        let part = crate::retry::unit() / attempt.saturating_sub(1).max(1) as f64;
        (pace > 0).then(|| Duration::from_micros((pace as f64 * part) as u64))
    }

    /// A group's attempt conflicted with another process's transaction.
    pub(super) fn lost(&self) {
        let took = self.took.load(Ordering::Relaxed).max(MIN_PACE_US);
        let pace = self.pace.load(Ordering::Relaxed);
        // At most the time of a few dozen transactions: short ones (the
        // documents layout's) are not paused for as long as long ones.
        let cap = (took * PACE_TRANSACTIONS).min(MAX_PACE_US);
        let next = (pace * 2).max(took).min(cap);
        self.pace.store(next, Ordering::Relaxed);
    }

    /// A group's transaction committed, having taken `took`. The pace
    /// comes down by a quarter, not by half: with 16 processes on one
    /// board, halving it let them meet again at once (4.08 round trips a
    /// call on the array layout, against 3.57 and 3.63 at three quarters;
    /// the same rate).
    pub(super) fn won(&self, took: Duration) {
        let us = took.as_micros().min(u128::from(MAX_PACE_US)) as u64;
        let avg = self.took.load(Ordering::Relaxed);
        let avg = if avg == 0 { us } else { (avg * 7 + us) / 8 };
        self.took.store(avg, Ordering::Relaxed);
        let pace = self.pace.load(Ordering::Relaxed) * 3 / 4;
        let pace = if pace < avg / 4 { 0 } else { pace };
        self.pace.store(pace, Ordering::Relaxed);
    }

    /// The board `filter` led to last time, if remembered.
    pub(super) fn hint(&self, filter: &Document) -> Option<Bson> {
        self.hints.get(&fingerprint(filter))
    }

    /// Remembers that `filter` led to `board`.
    pub(super) fn learn(&self, filter: &Document, board: &Bson) {
        self.hints.insert(&fingerprint(filter), board.clone());
    }
}

fn fingerprint(filter: &Document) -> u64 {
    let mut h = DefaultHasher::new();
    match crate::compat::raw_document(filter) {
        Ok(d) => d.as_bytes().hash(&mut h),
        Err(_) => format!("{filter:?}").hash(&mut h),
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;
    use std::time::Duration;

    #[tokio::test]
    async fn one_turn_per_board_and_forgotten_when_free() {
        let q = Arc::new(Queues::default());
        let a = q.enter(&Bson::from("a")).await;
        let b = q.enter(&Bson::from("b")).await;
        assert!(a.of(&Bson::from("a")) && !a.of(&Bson::from("b")));
        let board = Bson::from("a");
        let waiting = tokio::time::timeout(Duration::from_millis(50), q.enter(&board));
        assert!(waiting.await.is_err(), "a second turn of one board waits");
        drop(a);
        let again = tokio::time::timeout(Duration::from_secs(5), q.enter(&Bson::from("a")))
            .await
            .expect("free once dropped");
        drop((again, b));
        assert!(q.boards.lock().unwrap().is_empty(), "nothing left behind");
    }

    #[test]
    fn a_group_that_lost_often_waits_less_and_no_pause_passes_the_bound() {
        let q = Queues::default();
        // Transactions of 100 ms, which lose again and again.
        q.won(Duration::from_millis(100));
        for _ in 0..20 {
            q.lost();
        }
        let pace = Duration::from_micros(q.pace.load(Ordering::Relaxed));
        assert_eq!(pace, Duration::from_micros(MAX_PACE_US));
        for attempt in 1..=8_usize {
            let most = pace / attempt.saturating_sub(1).max(1) as u32;
            for _ in 0..100 {
                let pause = q.pause(attempt);
                assert!(
                    pause.is_some_and(|p| p <= most),
                    "attempt {attempt}: {pause:?}, not a pause within {most:?}"
                );
            }
        }
        // Commits bring it down to none.
        for _ in 0..40 {
            q.won(Duration::from_millis(100));
        }
        assert_eq!(q.pause(3), None);
    }

    #[test]
    fn hints_are_bounded() {
        let q = Queues::default();
        for i in 0..(HINTS as i64 + 10) {
            q.learn(&doc! {"_id": i}, &Bson::Int64(i % 7));
        }
        assert!(q.hints.len() <= HINTS);
        assert_eq!(
            q.hint(&doc! {"_id": HINTS as i64 + 9}),
            Some(Bson::Int64((HINTS as i64 + 9) % 7))
        );
        assert_eq!(q.hint(&doc! {"_id": -1}), None);
    }
}
