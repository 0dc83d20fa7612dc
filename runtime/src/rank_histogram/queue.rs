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
//! server sees one transaction per board at a time from this process: 3
//! round trips a call however many tasks wait, and the board's rate that
//! of one task. The queue is entered before the transaction's first
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
//! commits after it), and processes other than this one, which still
//! conflict with each other, at most one transaction each per board.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mongodb::bson::{Bson, Document};
use tokio::sync::OwnedMutexGuard;

use crate::util::Bounded;

/// Filters whose board is remembered.
const HINTS: usize = 4_096;
/// How long after a conflict a call whose board is not known reads it
/// first.
const CONTENDED: Duration = Duration::from_secs(2);

/// The boards' queues, and the boards filters led to.
#[derive(Debug)]
pub(super) struct Queues {
    boards: Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<()>>>>,
    hints: Bounded<u64, Bson>,
    /// When a transaction of this handle last conflicted (ms after
    /// `epoch`, 0: never).
    conflicted: AtomicU64,
    epoch: Instant,
    /// Transactions of the calls' own under way.
    running: AtomicUsize,
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
        let mut boards = self
            .queues
            .boards
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Nobody else holds or waits for it: forget it.
        if boards
            .get(&self.key)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            boards.remove(&self.key);
        }
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
        }
    }
}

impl Queues {
    /// Waits for `board`'s turn. Dropped while waiting, it leaves the
    /// queue.
    pub(super) async fn enter(self: &Arc<Self>, board: &Bson) -> Turn {
        let key = key(board);
        let queue = self
            .boards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_default()
            .clone();
        let guard = match queue.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                // It would have conflicted: the board is contended.
                self.conflicted();
                queue.lock_owned().await
            }
        };
        Turn {
            key,
            guard: Some(guard),
            queues: self.clone(),
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

    /// The board `filter` led to last time, if remembered.
    pub(super) fn hint(&self, filter: &Document) -> Option<Bson> {
        self.hints.get(&fingerprint(filter))
    }

    /// Remembers that `filter` led to `board`.
    pub(super) fn learn(&self, filter: &Document, board: &Bson) {
        self.hints.insert(&fingerprint(filter), board.clone());
    }
}

/// A board's queue key: its BSON bytes, so that `1` and `1.0` (one value
/// to the server, and one histogram) share a queue only when they are
/// stored alike; two queues for one board cost only conflicts.
fn key(board: &Bson) -> Vec<u8> {
    crate::compat::raw_document(&mongodb::bson::doc! {"b": board})
        .map(|d| d.as_bytes().to_vec())
        .unwrap_or_default()
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
