//! Buffered mode: the per-key buffer and the flush writes, applied exactly
//! once even when a write's outcome is unknown.
//!
//! A write can be cut (its future dropped by a timeout or `select!`) or
//! lose its reply (a connection reset, the server killed after it applied
//! the write). Its outcome is then unknown: putting the count back and
//! writing it again could count it twice, and forgetting it could lose it.
//! So every flush write of a key carries a flush id (this handle's random
//! 64-bit id and a sequence number). Until the write is known to have
//! landed, the key keeps it *in flight*, and re-sends it, with the same id
//! and the same amount, before anything else for that key. The server
//! refuses a repeat: the document keeps, in [`FLUSHES`], the last flush
//! sequence number applied by each of the last [`HANDLES_KEPT`] handles that
//! wrote it (`{h: handle, s: seq}`), the write's filter asks that this
//! handle's entry be below the write's sequence number, and one pipeline
//! update adds the amount and replaces the entry. A key has at most one
//! write in flight per handle, so the sequence numbers a document sees from
//! one handle only grow.
//!
//! Why this design: the driver's retryable writes already make one retry
//! safe, but not a write re-sent later by the caller (here, after the
//! server came back), and not one whose first copy arrives after the
//! re-send. A marker per handle and document holds across both, with one
//! round trip per flush; a marker per flush (`$push` with `$slice`) would
//! forget a write after a fixed number of other flushes, which a hot key
//! reaches in well under a second. The cost is the field: at most
//! `HANDLES_KEPT` entries of about 31 bytes (504 bytes measured) in each
//! document a buffered counter wrote. The bound: a repeat is refused unless
//! `HANDLES_KEPT` other handles wrote the same document between the lost
//! write and its re-send.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::FindOneOptions;

use super::write::{amount_bson, number};
use super::{lock, shard_of, Inner, FLUSH_CONCURRENCY, SHARDS};
use crate::action::Options;
use crate::error::{Error, Result};
use crate::retry::Retry;

/// The field a buffered counter adds to the documents it writes: the last
/// flush each recent handle applied, `[{h: <handle>, s: <seq>}, ...]`.
pub const FLUSHES: &str = "_mp_flushes";
/// Handles remembered per document in [`FLUSHES`].
pub const HANDLES_KEPT: i64 = 16;
/// Rounds one call writes a key before it leaves the rest to the next.
const ROUNDS: usize = 4;
/// Tries of one flush write against a document that changed under it, a
/// few only by design: the key stays busy meanwhile (another flush waits
/// for it at most [`BUSY_WAIT`]), and a flush that gives up keeps its
/// increments in flight for the next flush to send again. The pauses
/// between them are the one retry policy's ([`crate::retry`]).
const TRIES: usize = 4;
/// The longest a flush waits for a key another call is writing (a future
/// kept but no longer polled would hold it for ever).
const BUSY_WAIT: Duration = Duration::from_secs(30);

/// One key's pending increments.
#[derive(Debug)]
pub(super) struct Slot {
    id: Bson,
    /// Increments no write has taken yet.
    count: u64,
    /// A write taken and sent (or being sent) whose landing is not known.
    flight: Option<Flight>,
    /// A task is writing this key now.
    busy: bool,
    /// The sequence number of the last write of this key known landed.
    landed: Option<u64>,
    /// When the oldest of these increments arrived.
    pub(super) since: Instant,
}

impl Slot {
    /// Increments held: not yet taken, and in flight.
    fn held(&self) -> u64 {
        self.count + self.flight.map_or(0, |f| f.amount)
    }
}

#[derive(Debug, Clone, Copy)]
struct Flight {
    seq: u64,
    amount: u64,
}

/// Where a call's increments stand in its key's writes: the first
/// sequence number a write that takes them can have.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark(u64);

/// What a key's writer wants written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// Only a full key (N pending, or the handle shut down).
    Full,
    /// Everything pending.
    All,
}

enum Pick {
    Nothing,
    Busy,
    Send(Bson, Flight),
}

/// Marks a key idle again when its writer ends, also when the writer's
/// future is dropped mid-write; the flight stays for a re-send.
struct Writing<'a> {
    inner: &'a Inner,
    key: &'a [u8],
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut shard = lock(&self.inner.shards[shard_of(self.key)]);
        if let Some(slot) = shard.get_mut(self.key) {
            slot.busy = false;
            if slot.held() == 0 {
                shard.remove(self.key);
                self.inner.keys.fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(shard);
        self.inner.idle.notify_waiters();
    }
}

impl Inner {
    /// Adds `n` to `id`'s pending count, refusing a total past `i64::MAX`
    /// before anything is added. Returns whether the key is now due for a
    /// write (it may be under way in another call), whether more than
    /// `max_keys` keys are pending, and the [`Mark`] that says when these
    /// increments are written.
    pub(super) fn buffer(&self, key: &[u8], id: Bson, n: u64) -> Result<(bool, bool, Mark)> {
        let every = u64::from(self.spec.every);
        let mut shard = lock(&self.shards[shard_of(key)]);
        let held = shard.get(key).map_or(0, Slot::held);
        if held.checked_add(n).is_none_or(|t| t > i64::MAX as u64) {
            return Err(Error::invalid(
                "n",
                format!("{n} more than the {held} pending would pass i64::MAX"),
            ));
        }
        let slot = match shard.get_mut(key) {
            Some(slot) => slot,
            None => {
                self.keys.fetch_add(1, Ordering::Relaxed);
                shard.entry(key.to_vec()).or_insert(Slot {
                    id,
                    count: 0,
                    flight: None,
                    busy: false,
                    landed: None,
                    since: Instant::now(),
                })
            }
        };
        if slot.held() == 0 {
            slot.since = Instant::now();
        }
        slot.count += n;
        self.increments.add(n);
        self.pending.fetch_add(n, Ordering::Relaxed);
        let due = slot.held() >= every || self.closed.load(Ordering::Acquire);
        let crowded = self.keys.load(Ordering::Relaxed) > self.spec.max_keys;
        // Under the key's lock: any write of the key picked after this one
        // takes a number from here on, and these increments with it.
        let mark = Mark(self.seq.load(Ordering::Relaxed));
        Ok((due, crowded, mark))
    }

    /// Increments pending for `key`, in flight included.
    pub(super) fn held(&self, key: &[u8]) -> u64 {
        lock(&self.shards[shard_of(key)])
            .get(key)
            .map_or(0, Slot::held)
    }

    /// Writes `key` as `want` says: first a write in flight whose outcome
    /// is unknown (same id, same amount), then what was counted since.
    /// With `wait`, a key another task is writing is waited for (up to
    /// [`BUSY_WAIT`], then `Contended`); without, it is left to that task.
    pub(super) async fn drain(
        &self,
        key: &[u8],
        want: Want,
        wait: bool,
        opts: &Options,
    ) -> Result<()> {
        let mut rounds = 0;
        let mut waits = 0;
        let deadline = tokio::time::Instant::now() + BUSY_WAIT;
        while rounds < ROUNDS {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            let (id, flight) = match self.pick(key, want) {
                Pick::Nothing => return Ok(()),
                Pick::Busy if wait => {
                    waits += 1;
                    if tokio::time::timeout_at(deadline, idle).await.is_err() {
                        return Err(Error::Contended {
                            operation: "flush",
                            attempts: waits,
                        });
                    }
                    continue;
                }
                Pick::Busy => return Ok(()),
                Pick::Send(id, flight) => (id, flight),
            };
            let writing = Writing { inner: self, key };
            match self.send(&id, flight, opts).await {
                Ok(()) => self.landed(key, flight),
                Err(Error::UnsupportedValue {
                    collection,
                    id,
                    field,
                    found,
                    why,
                    ..
                }) => {
                    let dropped = self.give_up(key);
                    return Err(Error::UnsupportedValue {
                        collection,
                        id,
                        field,
                        found,
                        why,
                        dropped: Some(dropped),
                    });
                }
                // Unknown outcome or refused: the flight stays, for a re-send.
                Err(e) => return Err(e),
            }
            drop(writing);
            rounds += 1;
        }
        Ok(())
    }

    /// Writes `key` until it holds fewer than N increments (none after
    /// `shutdown`), waiting for a write of it under way in another call,
    /// or a write of it that landed carried the increments `mark` took.
    pub(super) async fn settle(&self, key: &[u8], mark: Mark, opts: &Options) -> Result<()> {
        let every = u64::from(self.spec.every);
        loop {
            self.drain(key, Want::Full, true, opts).await?;
            let shard = lock(&self.shards[shard_of(key)]);
            let Some(slot) = shard.get(key) else {
                return Ok(());
            };
            let closed = self.closed.load(Ordering::Acquire);
            if slot.held() == 0
                || (slot.held() < every && !closed)
                || slot.landed.is_some_and(|s| s >= mark.0)
            {
                return Ok(());
            }
        }
    }

    /// Under the key's lock: the write to send now, marking the key busy.
    fn pick(&self, key: &[u8], want: Want) -> Pick {
        let mut shard = lock(&self.shards[shard_of(key)]);
        let Some(slot) = shard.get_mut(key) else {
            return Pick::Nothing;
        };
        if slot.busy {
            return Pick::Busy;
        }
        let due = match want {
            Want::All => slot.held() > 0,
            Want::Full => {
                slot.held() >= u64::from(self.spec.every)
                    || (slot.held() > 0 && self.closed.load(Ordering::Acquire))
            }
        };
        if !due {
            return Pick::Nothing;
        }
        let flight = match slot.flight {
            Some(f) => f,
            None => {
                let f = Flight {
                    seq: self.seq.fetch_add(1, Ordering::Relaxed),
                    amount: std::mem::take(&mut slot.count),
                };
                slot.flight = Some(f);
                slot.since = Instant::now();
                f
            }
        };
        slot.busy = true;
        Pick::Send(slot.id.clone(), flight)
    }

    /// The flight landed (or was found already applied): it is no longer
    /// pending.
    fn landed(&self, key: &[u8], flight: Flight) {
        let mut shard = lock(&self.shards[shard_of(key)]);
        if let Some(slot) = shard.get_mut(key) {
            slot.flight = None;
            slot.landed = Some(flight.seq);
            self.pending.fetch_sub(flight.amount, Ordering::Relaxed);
        }
    }

    /// The server refused the key's document: drop what it holds, and say
    /// how much.
    fn give_up(&self, key: &[u8]) -> u64 {
        let mut shard = lock(&self.shards[shard_of(key)]);
        let Some(slot) = shard.get_mut(key) else {
            return 0;
        };
        let dropped = slot.held();
        slot.count = 0;
        slot.flight = None;
        self.pending.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// Writes the oldest eighth of the pending keys (at least one), so that
    /// the scan this takes is paid once per `max_keys / 8` new keys.
    pub(super) async fn evict_oldest(&self, opts: &Options) -> Result<()> {
        let mut ages: Vec<(Instant, Vec<u8>)> = Vec::new();
        for shard in &self.shards {
            let shard = lock(shard);
            ages.extend(
                shard
                    .iter()
                    .filter(|(_, s)| !s.busy)
                    .map(|(k, s)| (s.since, k.clone())),
            );
        }
        let over = ages.len().saturating_sub(self.spec.max_keys);
        let n = over.max(self.spec.max_keys.div_ceil(8)).min(ages.len());
        if n == 0 {
            return Ok(());
        }
        ages.select_nth_unstable_by_key(n - 1, |(since, _)| *since);
        ages.truncate(n);
        self.drain_all(ages.into_iter().map(|(_, k)| k).collect(), false, opts)
            .await
    }

    /// Writes every pending key `which` selects, waiting for keys other
    /// tasks are writing. Every key is tried; the first error is returned.
    pub(super) async fn flush_where(
        &self,
        which: impl Fn(&Slot) -> bool,
        opts: &Options,
    ) -> Result<()> {
        let mut keys = Vec::new();
        for shard in &self.shards {
            let shard = lock(shard);
            keys.extend(
                shard
                    .iter()
                    .filter(|(_, s)| which(s))
                    .map(|(k, _)| k.clone()),
            );
        }
        self.drain_all(keys, true, opts).await
    }

    async fn drain_all(&self, keys: Vec<Vec<u8>>, wait: bool, opts: &Options) -> Result<()> {
        let results: Vec<Result<()>> = futures::stream::iter(keys)
            .map(|key| async move { self.drain(&key, Want::All, wait, opts).await })
            .buffer_unordered(FLUSH_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// One flush write: adds `flight.amount` unless this handle's entry in
    /// [`FLUSHES`] says it landed already. `Ok` when it is applied now or
    /// was before, or the document is missing and `upsert` is off. With
    /// `w: 0` a write sent is taken as landed (nothing comes back to say
    /// otherwise); its flush id still keeps a re-send from counting twice.
    async fn send(&self, id: &Bson, flight: Flight, opts: &Options) -> Result<()> {
        let field = self.spec.field;
        let (hid, seq) = (self.handle as i64, flight.seq as i64);
        let amount = amount_bson(flight.amount)?;
        let counted = format!("${field}");
        let flushes = format!("${FLUSHES}");
        let filter = doc! {
            "_id": id,
            "$and": [
                {"$or": [
                    {field: {"$exists": false}},
                    {field: {"$type": ["int", "long", "double", "null"]}},
                ]},
                {FLUSHES: {"$not": {"$elemMatch": {"h": hid, "s": {"$gte": seq}}}}},
            ],
        };
        let update = vec![doc! {"$set": {
            field: {"$add": [{"$ifNull": [&counted, 0]}, amount]},
            FLUSHES: {"$slice": [{"$concatArrays": [
                {"$filter": {
                    "input": {"$cond": [{"$isArray": &flushes}, &flushes, []]},
                    "cond": {"$ne": ["$$this.h", hid]},
                }},
                [{"h": hid, "s": seq}],
            ]}, -HANDLES_KEPT]},
        }}];
        // The check after a refused write reads the primary: only the
        // comment and time bound apply to it.
        // Whatever the client's read preference: a secondary's lagging copy
        // would call a stored flush missing, or a refused one applied.
        let mut check = FindOneOptions::default();
        check.comment = opts.comment.clone();
        check.max_time = opts.max_time;
        check.projection = Some(doc! {field: 1, FLUSHES: 1});
        check.selection_criteria = Some(crate::util::primary());
        let mut resent = false;
        let mut retry = Retry::new("flush").at_most(TRIES);
        loop {
            let res = self
                .update(filter.clone(), update.clone().into(), opts, false, None)
                .await;
            match res {
                Ok(u) if !u.acknowledged => return Ok(()),
                Ok(u) if u.matched > 0 || u.upserted => {
                    self.writes.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if e.is_duplicate_key() => {}
                // An election refused it, or its reply was lost: the flush
                // id makes sending it again safe, once now, as the driver's
                // retryable writes do (the driver's own retry has happened
                // already where it applies).
                Err(e) if !resent && resendable(&e) => {
                    resent = true;
                    continue;
                }
                Err(e) => return Err(e),
            }
            // The filter refused: find out why.
            let found = self
                .coll
                .find_one(doc! {"_id": id})
                .with_options(check.clone())
                .await?;
            match found {
                // Deleted in between: create it.
                None if self.spec.upsert => {}
                // Missing and not to be created: nothing to count.
                None => return Ok(()),
                Some(d) if applied(&d, hid, seq) => return Ok(()),
                // Changed in between (another client fixed the field).
                Some(d) => {
                    number(&d, field, self.coll.name())?;
                }
            }
            // A race lost (or a concurrent upsert's duplicate key): again,
            // after a pause, while tries are left.
            retry.pause().await?;
        }
    }
}

/// Whether a flush that failed with `e` may be sent again at once: it was
/// not stored, or its outcome is unknown (the flush id refuses a repeat).
fn resendable(e: &Error) -> bool {
    use crate::failover::{outcome, Outcome};
    matches!(e, Error::OutcomeUnknown { .. })
        || e.mongo().is_some_and(|m| outcome(m) != Outcome::Failed)
}

/// Whether `d`'s [`FLUSHES`] says handle `hid` applied flush `seq`.
fn applied(d: &Document, hid: i64, seq: i64) -> bool {
    let Ok(entries) = d.get_array(FLUSHES) else {
        return false;
    };
    entries.iter().any(|e| {
        e.as_document().is_some_and(|e| {
            e.get("h") == Some(&Bson::Int64(hid))
                && e.get("s").and_then(Bson::as_i64).is_some_and(|s| s >= seq)
        })
    })
}

/// A fresh slot map per shard.
pub(super) fn shards() -> Vec<std::sync::Mutex<HashMap<Vec<u8>, Slot>>> {
    (0..SHARDS).map(|_| std::sync::Mutex::default()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_is_applied_when_its_handle_marked_it_or_a_later_one() {
        let d = doc! {FLUSHES: [{"h": 7_i64, "s": 5_i64}, {"h": 8_i64, "s": 2_i64}]};
        assert!(applied(&d, 7, 5));
        assert!(applied(&d, 7, 4));
        assert!(!applied(&d, 7, 6));
        assert!(!applied(&d, 9, 1), "another handle's entry says nothing");
        assert!(!applied(&doc! {}, 7, 1));
        assert!(!applied(&doc! {FLUSHES: "damaged"}, 7, 1));
        assert!(!applied(
            &doc! {FLUSHES: [1, {"h": 7_i32, "s": 9_i64}]},
            7,
            1
        ));
    }
}
