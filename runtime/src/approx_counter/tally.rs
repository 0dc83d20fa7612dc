//! The count of increments a handle has seen, kept per thread.
//!
//! An increment that does not write costs a few nanoseconds; one locked
//! add on a cache line that every thread shares would be most of that, and
//! more when threads meet on it. Each thread instead owns a lane of every
//! handle (claimed once per thread, given back when it ends): only its
//! owner writes a lane, so a plain load and store count an increment, and
//! `stats` adds the lanes up. Threads past the lanes share one atomic.
//!
//! A lane's count is also where the thread's next draw is in the handle's
//! random stream (see `sampling`), so counting an increment and moving
//! the random state are one store. A lane holds its position as the
//! stream's word for it, `key + (position + 1)·γ` (γ odd, so distinct
//! positions are distinct words): the draw then mixes the lane's value as
//! it is, and `sum` turns words back into counts with γ's inverse.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::util::{GAMMA, GAMMA_INVERSE};

/// Lanes per handle: one cache line each.
const LANES: usize = 32;
/// Not claimed yet.
const UNCLAIMED: usize = usize::MAX;
/// The thread is ending: the shared atomic from now on.
const ENDING: usize = usize::MAX - 1;

#[repr(align(64))]
#[derive(Debug, Default)]
struct Lane(AtomicU64);

#[derive(Debug)]
pub(super) struct Tally {
    /// Lane `i` counts from position `base(i)`, so that its count is also
    /// a position in the handle's random stream that no other lane
    /// reaches; it holds the position's word.
    lanes: [Lane; LANES],
    /// The same, from position 0.
    shared: AtomicU64,
    key: u64,
}

/// Where lane `i` counts from: `(i + 1)·2⁵⁶` (the shared atomic from 0).
const fn base(i: usize) -> u64 {
    (i as u64 + 1) << 56
}

/// The word of `position` in the stream `key`.
#[inline(always)]
pub(super) const fn word(key: u64, position: u64) -> u64 {
    key.wrapping_add(position.wrapping_add(1).wrapping_mul(GAMMA))
}

impl Tally {
    /// A tally whose positions are words of the stream `key`.
    pub(super) fn new(key: u64) -> Self {
        Tally {
            lanes: std::array::from_fn(|i| Lane(AtomicU64::new(word(key, base(i))))),
            shared: AtomicU64::new(word(key, 0)),
            key,
        }
    }

    /// Counts `n` increments; returns the word of the first one's
    /// position in this handle's sequence of increments (the lane's
    /// count before them, in the lane's own range). No two increments of
    /// one handle get the same position while a lane counts fewer than
    /// 2⁵⁶, so the words can seed a random stream.
    #[inline(always)]
    pub(super) fn add(&self, n: u64) -> u64 {
        let i = LANE.try_with(Cell::get).unwrap_or(ENDING);
        if i < LANES {
            // Only this thread writes this lane while it holds it.
            let Lane(lane) = &self.lanes[i];
            let before = lane.load(Ordering::Relaxed);
            lane.store(
                before.wrapping_add(n.wrapping_mul(GAMMA)),
                Ordering::Relaxed,
            );
            return before;
        }
        self.add_unlaned(i, n)
    }

    /// A thread without a lane: it claims one, or counts in the shared
    /// atomic (past the lanes, or while it ends).
    #[cold]
    #[inline(never)]
    fn add_unlaned(&self, i: usize, n: u64) -> u64 {
        if i == UNCLAIMED && claim() < LANES {
            return self.add(n);
        }
        self.shared
            .fetch_add(n.wrapping_mul(GAMMA), Ordering::Relaxed)
    }

    /// Increments counted, over every lane and the shared atomic.
    pub(super) fn sum(&self) -> u64 {
        let count = |now: u64, from: u64| {
            now.wrapping_sub(word(self.key, from))
                .wrapping_mul(GAMMA_INVERSE)
        };
        self.lanes.iter().enumerate().fold(
            count(self.shared.load(Ordering::Relaxed), 0),
            |s, (i, Lane(l))| s.wrapping_add(count(l.load(Ordering::Relaxed), base(i))),
        )
    }
}

thread_local! {
    /// This thread's lane: no destructor, so reading it is one load.
    static LANE: Cell<usize> = const { Cell::new(UNCLAIMED) };
    /// Gives the lane back when the thread ends.
    static CLAIM: Claim = const { Claim(Cell::new(UNCLAIMED)) };
}

/// Lanes given back, smallest first, and the next never claimed.
static FREE: Mutex<(BinaryHeap<Reverse<usize>>, usize)> = Mutex::new((BinaryHeap::new(), 0));

/// Claims a lane for this thread: its index (the shared atomic's when it
/// is `LANES` or past, or `ENDING`).
fn claim() -> usize {
    let i = {
        let mut free = super::lock(&FREE);
        match free.0.pop() {
            Some(Reverse(i)) => i,
            None => {
                free.1 += 1;
                free.1 - 1
            }
        }
    };
    // Registering the claim's destructor can fail only while the thread
    // ends: then the lane is not kept, and the shared atomic counts.
    let kept = CLAIM.try_with(|c| c.0.set(i)).is_ok();
    let i = if kept { i } else { release(i) };
    LANE.with(|l| l.set(i));
    i
}

fn release(i: usize) -> usize {
    super::lock(&FREE).0.push(Reverse(i));
    ENDING
}

struct Claim(Cell<usize>);

impl Drop for Claim {
    fn drop(&mut self) {
        let i = self.0.get();
        if i != UNCLAIMED {
            // Later increments on this thread (other destructors) go to the
            // shared atomic: the lane may already have a new owner.
            let _ = LANE.try_with(|l| l.set(ENDING));
            release(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_count_exactly() {
        let t = std::sync::Arc::new(Tally::new(0x5eed));
        let threads: Vec<_> = (0..LANES + 8)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    (0..1000).for_each(|_| {
                        t.add(3);
                    })
                })
            })
            .collect();
        for h in threads {
            h.join().unwrap();
        }
        t.add(1);
        assert_eq!(t.sum(), 3 * 1000 * (LANES as u64 + 8) + 1);
    }

    #[test]
    fn positions_are_never_given_twice() {
        let t = std::sync::Arc::new(Tally::new(0x5eed));
        let threads: Vec<_> = (0..LANES + 8)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || (0..1000).map(|_| t.add(2)).collect::<Vec<u64>>())
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for h in threads {
            for at in h.join().unwrap() {
                // Each call takes two positions: the words `at` and `at + γ`.
                let next = at.wrapping_add(GAMMA);
                assert!(seen.insert(at) && seen.insert(next), "{at} given twice");
            }
        }
        assert_eq!(t.sum(), 2 * 1000 * (LANES as u64 + 8));
    }
}
