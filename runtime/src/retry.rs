//! The one retry policy of every internal retry: a lost race (a concurrent
//! upsert, a write conflict, a bucket that filled) is tried
//! again after a jittered exponential backoff, for one time bound, then
//! reported as [`Error::Contended`].
//!
//! The backoff is the driver's convenient transaction API's (5 ms ×
//! 1.5^attempt, at most 500 ms), times a random factor in [0, 1): a real
//! random one, so that writers that lost the same race do not wake in step
//! and lose the next one together. The bound is that API's 120 s, so a
//! call retries its own races no longer than a transaction of its own
//! would.
//!
//! A loop pauses only after a race it lost (a write that matched nothing
//! because another writer changed the document, a duplicate key on an
//! insert another writer won); a round that made progress
//! neither pauses nor counts. Its users:
//!
//! - the rank histogram: `rank_histogram/write.rs` and `documents.rs`,
//!   and `txn.rs`'s wait for a non-atomic write's `+1` (30 s);
//! - the shard key's `upsert` and `replace` (`shard_key/write.rs`);
//! - buckets: `push` and `push_many` (`bucket/push.rs`, `bucket/many.rs`);
//!   their transactions (a late item, `delete`, `reindex`) are rerun by
//!   the driver's convenient API, with the same backoff and bound;
//! - a buffered counter's flush write (`approx_counter/buffer.rs`), which
//!   gives up after a few tries by design ([`Retry::at_most`]).
//!
//! Each pause is recorded in the operation's span (`retries`) and said at
//! DEBUG (see the
//! [guide](crate::guide#tracing)).
//!
//! Inside a caller's transaction nothing waits out the bound: a push or
//! `push_many` there retries a few rounds without pausing (it would read
//! the same snapshot again), then returns a transient error that the
//! caller's `and_run2` reruns.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a call retries lost races before it is `Contended`.
pub(crate) const BOUND: Duration = Duration::from_secs(120);
/// The longest pause.
const CAP: Duration = Duration::from_millis(500);

/// A call's retries of one kind of race.
#[derive(Debug)]
pub(crate) struct Retry {
    operation: &'static str,
    started: Instant,
    bound: Duration,
    attempt: u32,
    /// Attempts after which it gives up whatever the time (none unless set).
    most: Option<usize>,
}

impl Retry {
    /// Retries of `operation`, for at most [`BOUND`].
    pub(crate) fn new(operation: &'static str) -> Self {
        Retry::within(operation, BOUND)
    }

    /// Retries of `operation` for at most `bound`.
    pub(crate) fn within(operation: &'static str, bound: Duration) -> Self {
        Retry {
            operation,
            started: Instant::now(),
            bound,
            attempt: 0,
            most: None,
        }
    }

    /// At most `attempts` attempts too, for a retry that gives up early by
    /// design (a counter flush leaves its increments pending for the next).
    pub(crate) fn at_most(mut self, attempts: usize) -> Self {
        self.most = Some(attempts);
        self
    }

    /// Attempts made so far (the first counts once it failed).
    pub(crate) fn attempts(&self) -> usize {
        self.attempt as usize + 1
    }

    /// After a lost race: sleeps the next backoff, or returns
    /// [`Error::Contended`] once the bound has passed (or the attempts
    /// set with [`Retry::at_most`] are spent). Records the retries so far
    /// in the operation's span (`retries`) and says so at DEBUG (target
    /// `mongo_patterns::retry`).
    pub(crate) async fn pause(&mut self) -> Result<()> {
        if self.started.elapsed() >= self.bound || self.most.is_some_and(|m| self.attempts() >= m) {
            return Err(self.contended());
        }
        let backoff = backoff_within(self.attempt, CAP);
        // The span's field holds this loop's count: a later loop of the
        // same call (rare) records its own over it.
        tracing::Span::current().record("retries", self.attempt + 1);
        tracing::debug!(
            target: "mongo_patterns::retry",
            operation = self.operation,
            attempt = self.attempt + 1,
            backoff_ms = backoff.as_secs_f64() * 1000.0,
            "lost a race: retrying"
        );
        // Boxed: rare, and inline it would grow every caller's future.
        Box::pin(tokio::time::sleep(backoff)).await;
        self.attempt += 1;
        Ok(())
    }

    /// The error a call returns when it stops retrying.
    pub(crate) fn contended(&self) -> Error {
        Error::Contended {
            operation: self.operation,
            attempts: self.attempts(),
        }
    }
}

/// The backoff before retry `attempt` (0 for the first): 5 ms ×
/// 1.5^attempt, at most `cap` (500 ms for every retry), times a random
/// factor in [0, 1), applied below the cap (so waiters with a low cap still
/// do not wake in step).
fn backoff_within(attempt: u32, cap: Duration) -> Duration {
    let ceiling = (5.0 * 1.5_f64.powi(attempt.min(30) as i32)).min(cap.as_secs_f64() * 1000.0);
    Duration::from_micros((ceiling * unit() * 1000.0) as u64)
}

/// A random number in [0, 1): `RandomState` is keyed from the OS's random
/// source once per thread and moves on at each instance, which is random
/// enough to spread writers apart, without a dependency.
pub(crate) fn unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::util::splitmix64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    ));
    (h.finish() >> 11) as f64 / (1_u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_capped() {
        for attempt in [0, 1, 5, 10, 30, 1_000] {
            let d = backoff_within(attempt, CAP);
            let cap = (5.0 * 1.5_f64.powi(attempt.min(30) as i32)).min(500.0);
            assert!(
                d <= Duration::from_secs_f64(cap / 1000.0),
                "{attempt}: {d:?}"
            );
        }
        let spread: std::collections::HashSet<Duration> =
            (0..20).map(|_| backoff_within(10, CAP)).collect();
        assert!(spread.len() > 10, "jittered: {spread:?}");
        let capped: std::collections::HashSet<Duration> = (0..20)
            .map(|_| backoff_within(20, Duration::from_millis(25)))
            .collect();
        assert!(capped.iter().all(|d| *d <= Duration::from_millis(25)));
        assert!(capped.len() > 10, "jittered under a cap too: {capped:?}");
    }

    #[tokio::test]
    async fn contended_after_at_most_attempts() {
        let mut r = Retry::new("op").at_most(4);
        for _ in 0..3 {
            r.pause().await.unwrap();
        }
        let err = r.pause().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Contended {
                    operation: "op",
                    attempts: 4
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn contended_once_the_bound_passed() {
        let mut r = Retry::within("op", Duration::from_millis(30));
        let mut pauses = 0;
        let err = loop {
            match r.pause().await {
                Ok(()) => pauses += 1,
                Err(e) => break e,
            }
        };
        assert!(pauses > 0);
        assert!(
            matches!(err, Error::Contended { operation: "op", attempts } if attempts == pauses + 1),
            "{err:?}"
        );
    }
}
