//! The per-key lease that serializes every write that moves positions,
//! the marks it sets, the moves it finishes and the recount of `start`.
//!
//! A write that changes the count of a bucket before the key's last (a
//! late item, a split, a removal) shifts the `start` of every later bucket.
//! Such writes take the key's lease (a document in `<collection>.mp_locks`),
//! mark the key's buckets stale, write, recompute `start` and clear the
//! marks, then give the lease back. Reads that meet a mark take the lease
//! too, finish what an interrupted write left (a split's moved items) and
//! recompute `start` first, so no page is cut by stale positions. Pushes in
//! order never take the lease: they change the last bucket only.

use crate::action::Call;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, DateTime, Document, RawBsonRef, RawDocumentBuf};
use mongodb::Collection;

use super::stored::{between, item_len, seq_id, with_op, Head, FLOOR, MOVING, NEXT, OPS, STALE};
use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::retry::Retry;
use crate::util::id_of;

/// How long a lease holds without its holder giving it back (a holder that
/// crashed or lost the server): past it, the next writer or reader takes
/// it over and repairs what was left.
pub(super) const LEASE_MS: i64 = 10_000;
/// How long a writer or a read that needs the lease waits for it before
/// giving up with `Contended`.
const WAIT_MS: u64 = 60_000;
/// How long a write that moves positions retries a race it keeps losing
/// (to pushes in order, which take no lease): a fraction of the lease, so
/// that its holder gives the lease back before the lease can end under it
/// and a second writer take it.
const LEASED_BOUND: Duration = Duration::from_millis(LEASE_MS as u64 / 5);
/// The longest pause in such a retry, as while waiting for the lease: the
/// holder keeps every other such write waiting meanwhile.
const LEASED_CAP: Duration = Duration::from_millis(25);

/// How long after a cut the lease of the cut call ends: time for a
/// command the call had already sent to reach the server and finish
/// before another writer can take the lease over and repair around it.
pub(super) const CUT_GRACE_MS: i64 = 1_000;

/// A lease the running call has not given back yet. Dropped armed (the
/// call's future was dropped between taking the lease and giving it back,
/// or giving it back failed), it ends the lease [`CUT_GRACE_MS`] after the
/// cut, in a task of its own, instead of leaving every other writer and
/// every read that meets a mark on the key waiting out the whole
/// [`LEASE_MS`]. The next holder finds the lease ended and finishes what
/// the cut call left, as it does after a crash. Outside a tokio runtime
/// there is nothing to run that on, and the lease runs out as before.
#[must_use = "a guard disarmed at once guards nothing"]
pub(super) struct Held(Option<(Collection<Document>, Bson, ObjectId)>);

impl Held {
    fn new(locks: &Collection<Document>, key: &Bson, op: ObjectId) -> Held {
        Held(Some((locks.clone(), key.clone(), op)))
    }

    /// The lease is given back: nothing to end.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some((locks, key, op)) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // Only this call's lease (`op`); nothing if it was never taken
            // or was taken over meanwhile. On the server's clock, as every
            // end of a lease is.
            let until = doc! {"$toDate": {"$add": [{"$toLong": "$$NOW"}, CUT_GRACE_MS]}};
            let end = vec![doc! {"$set": {"until": until}}];
            // Ignored on failure: the lease then runs out as it would
            // have.
            let _ = locks.update_one(doc! {"_id": key, "op": op}, end).await;
        });
    }
}

impl<T: Bucketed> Buckets<T> {
    /// Takes the key's lease for `op`, waiting (with jittered backoff) while
    /// another writer holds it, at most a lease and a few seconds.
    /// Says whether it took the lease over from a holder that did not
    /// give it back (it crashed, or its write failed): then what it left
    /// needs finishing.
    ///
    /// The lease's end is on the server's clock (`$$NOW`), never the
    /// client's: application hosts whose clocks disagree would otherwise
    /// both hold it (a host running behind writes an end already past for
    /// the others; a host running ahead sees a held lease as ended).
    /// One round trip when the lease is free: an upsert by `{_id: key, op}`,
    /// which fails with a duplicate `_id` while another write holds the
    /// lease. Then a second update takes it over if it has ended; it cannot
    /// be the same command, as an upsert's filter may not use `$expr`.
    pub(super) async fn lock(&self, key: &Bson, op: ObjectId) -> Result<bool> {
        // Pauses of 25 ms at most: the lease is held for the milliseconds
        // of one late write.
        let mut retry = Retry::within("lease", Duration::from_millis(WAIT_MS)).capped(LEASED_CAP);
        // `$toLong`/`$toDate` rather than `$add` on the date itself, which
        // the test server does not evaluate.
        let until = doc! {"$toDate": {"$add": [{"$toLong": "$$NOW"}, LEASE_MS]}};
        let take = doc! {"_id": key.clone(), "op": op};
        let renew = vec![doc! {"$set": {"until": &until}}];
        let ended = doc! {"_id": key.clone(), "$expr": {"$lt": ["$until", "$$NOW"]}};
        let take_over = vec![doc! {"$set": {"op": op, "until": &until}}];
        loop {
            let r = self
                .locks
                .update_one(take.clone(), renew.clone())
                .upsert(true)
                .await
                .map_err(Error::from);
            match r {
                Ok(_) => return Ok(false),
                Err(e) if e.is_duplicate_key() => {}
                Err(e) => return Err(e),
            }
            let r = self
                .locks
                .update_one(ended.clone(), take_over.clone())
                .await?;
            if r.matched_count == 1 {
                tracing::debug!(
                    target: "mongo_patterns::lease",
                    "took over the key's lease from a holder that did not give it back"
                );
                return Ok(true);
            }
            // Held: waited for as every race is (`crate::retry`: random
            // jitter, so waiters do not wake in step), up to `WAIT_MS`;
            // counted in the span's `lease_waits`.
            retry.wait().await?;
        }
    }

    /// Gives the lease back: deleted after a body that succeeded, expired
    /// at once after one that failed (so the next holder finishes its
    /// work first).
    pub(super) async fn unlock(&self, key: &Bson, op: ObjectId, ok: bool) -> Result<()> {
        let mine = doc! {"_id": key.clone(), "op": op};
        if ok {
            self.locks.delete_one(mine).await?;
        } else {
            self.locks
                .update_one(mine, doc! {"$set": {"until": DateTime::from_millis(0)}})
                .await?;
        }
        Ok(())
    }

    /// The retry of a race lost under the key's lease (or by a write that
    /// marks positions): within [`LEASED_BOUND`], pauses up to
    /// [`LEASED_CAP`].
    pub(super) fn leased_retry(operation: &'static str) -> Retry {
        Retry::within(operation, LEASED_BOUND).capped(LEASED_CAP)
    }

    /// Runs `body` under the key's lease (`body` learns whether the lease
    /// was taken over), and gives the lease back whatever it returned.
    /// Cut before it has given the lease back (the caller stopped waiting
    /// inside `body`, or while the lease was being taken), it ends the
    /// lease [`CUT_GRACE_MS`] later instead of leaving it to run out: see
    /// [`Held`].
    pub(super) async fn leased<R, F>(&self, key: &Bson, body: impl FnOnce(bool) -> F) -> Result<R>
    where
        F: std::future::Future<Output = Result<R>>,
    {
        let op = ObjectId::new();
        let mut held = Held::new(&self.locks, key, op);
        let taken_over = self.lock(key, op).await?;
        let r = body(taken_over).await;
        let u = self.unlock(key, op, r.is_ok()).await;
        if u.is_ok() {
            held.disarm();
        }
        let r = r?;
        u?;
        Ok(r)
    }

    /// Marks the key's buckets stale, then makes sure no bucket can be
    /// opened from positions read before the mark: a push that read a full
    /// last bucket before the mark would open the next one with a `start`
    /// that misses this write. If the last bucket is full (or sealed), an
    /// empty marked bucket is opened after it first, so that push's insert
    /// fails as a duplicate and it reads again (and sees the mark, which a
    /// bucket opened from a marked one inherits).
    /// `from` limits the mark to the buckets from that `_id` on, the ones
    /// whose positions the write changes.
    pub(super) async fn mark(&self, key: &Bson, from: Option<&Bson>) -> Result<()> {
        let mut mark = self.of_key(key);
        mark.insert(STALE, doc! {"$ne": true});
        if let Some(from) = from {
            mark.insert(
                "$and",
                vec![Bson::Document(doc! {"_id": {"$gte": from.clone()}})],
            );
        }
        let mut retry = Self::leased_retry("mark");
        loop {
            self.coll
                .update_many(mark.clone(), doc! {"$set": {STALE: true}})
                .await?;
            let head = self.head(key, None, &mut Call::plain()).await?;
            if !head.exists {
                return Ok(());
            }
            if !head.stale {
                // Opened since the mark by a push (a race lost): mark it
                // too, and look again.
                retry.pause().await?;
                continue;
            }
            if !head.sealed && head.count < i64::from(self.spec.size) {
                return Ok(());
            }
            if self.spec.order.is_some() && !head.sealed {
                // Closed before the fence makes it not the last: a late
                // item is placed without the lease only in an open last
                // bucket (see `near`), and one read before the mark would
                // otherwise land behind the fence once the mark is gone.
                let close = doc! {"$set": {"sealed": true}};
                self.coll
                    .update_one(
                        doc! {self.spec.key: key.clone(), "_id": head.id.clone()},
                        close,
                    )
                    .await?;
            }
            let mut fence = self.new_bucket(key, head.seq + 1, head.total());
            fence.insert("count", 0_i64);
            fence.insert("bytes", 0_i64);
            fence.insert(self.spec.items, Vec::<Bson>::new());
            fence.insert(OPS, Vec::<Bson>::new());
            fence.insert(STALE, true);
            // Its floor is the highest value before it: the head's last, or
            // (a head a removal emptied) that of the last bucket with items.
            let floor = match head.hi.clone() {
                Some(hi) => Some(hi),
                None if self.spec.order.is_some() => {
                    let mut any = self.of_key(key);
                    any.insert("count", doc! {"$gt": 0});
                    match self
                        .raw
                        .find_one(any)
                        .sort(doc! {"_id": -1})
                        .projection(self.head_projection(None))
                        .await?
                    {
                        Some(d) => self.head_of(&d)?.hi,
                        None => None,
                    }
                }
                None => None,
            };
            if let Some(floor) = floor {
                fence.insert(FLOOR, floor);
            }
            match self.coll.insert_one(fence).await.map_err(Error::from) {
                Ok(_) => return Ok(()),
                Err(e) if e.is_duplicate_key() => {
                    // An empty bucket opened ahead is there: marked, it is
                    // the fence.
                    let ahead = doc! {self.spec.key: key.clone(), "_id": {"k": key.clone(), "s": head.seq + 1}, NEXT: true};
                    let set = doc! {"$set": {STALE: true}};
                    if self.coll.update_one(ahead, set).await?.matched_count == 1 {
                        return Ok(());
                    }
                    // A push opened it (a race lost): look again.
                    retry.pause().await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// What a read does on meeting a mark: under the lease, finish any
    /// split an interrupted write left, then recompute `start`.
    pub(super) async fn repair(&self, key: &Bson) -> Result<()> {
        self.leased(key, |_| async {
            self.finish_moves(key).await?;
            self.reindex_now(key, None).await
        })
        .await
    }

    /// Splits bucket `c` in two. The first bucket gives its lower half to a
    /// new bucket before it (so items arriving ever earlier, a backfill,
    /// never run out of room); any other bucket gives its upper half to the
    /// next bucket when that has room, else to a new bucket between the two
    /// (a fractional `seq`). The moved items are first set aside in `c`
    /// itself, in the write that takes them out, then delivered: a crash
    /// between the two leaves them in `c`'s [`MOVING`], which the next
    /// repair delivers. Nothing is lost or shown twice.
    /// Returns whether its write matched (not: `c` changed since it was
    /// read, or a retry by the driver found it applied), and the new
    /// bucket's `_id` when it goes before `c` (either way: that bucket's
    /// positions need recomputing if the split was applied).
    pub(super) async fn split(&self, key: &Bson, c: &Head) -> Result<(bool, Option<Bson>)> {
        let half = (c.count / 2).max(1);
        let prev = self.neighbour(key, &c.id, -1).await?;
        let next = self.neighbour(key, &c.id, 1).await?;
        let (lower, to) = if prev.is_none() {
            (true, Some(seq_id(key, Bson::Int64(c.seq - 1))))
        } else {
            let upper = c.count - half;
            match &next {
                Some(n) if n.count + upper <= self.cap() && n.bytes < MAX_BUCKET_BYTES / 2 => {
                    (false, Some(n.id.clone()))
                }
                Some(n) => (
                    false,
                    between(&c.raw_seq, &n.raw_seq).map(|s| seq_id(key, s)),
                ),
                None => (false, Some(seq_id(key, Bson::Int64(c.seq + 1)))),
            }
        };
        let Some(to) = to else {
            return Err(Error::invalid(
                "order",
                "no room for another bucket between two neighbours; run `reindex` after \
                 moving items, or use a larger `size`",
            ));
        };
        let op = ObjectId::new();
        let items = &self.paths.items;
        let (keep, moved) = if lower {
            (
                doc! {"$slice": [&items, half, {"$max": [1, "$count"]}]},
                doc! {"$slice": [&items, half]},
            )
        } else {
            (
                doc! {"$slice": [&items, half]},
                doc! {"$slice": [&items, half, {"$max": [1, "$count"]}]},
            )
        };
        let filter = doc! {
            self.spec.key: key.clone(),
            "_id": c.id.clone(),
            "count": c.count,
            MOVING: {"$exists": false},
            "$expr": self.sound(),
        };
        let update = vec![
            doc! {"$set": {
                MOVING: {"to": &to, "op": op, "lower": lower, "items": moved},
                self.spec.items: keep,
            }},
            doc! {"$set": {
                "count": {"$size": &items},
                "bytes": {"$sum": {"$map": {"input": &items, "in": {"$add": [{"$bsonSize": "$$this"}, 8]}}}},
                // Only the last bucket takes pushes in order.
                "sealed": true,
            }},
            // Given its lower half away, `c`'s floor no longer bounds the
            // buckets before it: its first item does.
            doc! {"$unset": FLOOR},
        ];
        let r = self.coll.update_one(filter, update).await?;
        self.finish_moves(key).await?;
        Ok((r.matched_count == 1, lower.then_some(to)))
    }

    /// Delivers the items that splits set aside and have not delivered yet
    /// (a crash, or a lost reply, between the two writes).
    pub(super) async fn finish_moves(&self, key: &Bson) -> Result<()> {
        let mut f = self.of_key(key);
        f.insert(MOVING, doc! {"$exists": true});
        let found: Vec<RawDocumentBuf> = self
            .raw
            .find(f)
            .projection(doc! {MOVING: 1})
            .await?
            .try_collect()
            .await?;
        for b in &found {
            let damaged = |problem: &str| {
                Error::damaged(self.coll.name(), id_of(b), MOVING, problem.to_owned())
            };
            let Ok(Some(RawBsonRef::Document(m))) = b.get(MOVING) else {
                return Err(damaged("is not a document"));
            };
            let m: Document = m
                .try_into()
                .map_err(|_| damaged("is not a readable document"))?;
            let (Some(to), Ok(op), Ok(items)) = (
                m.get("to").cloned(),
                m.get_object_id("op"),
                m.get_array("items"),
            ) else {
                return Err(damaged("lacks `to`, `op` or `items`"));
            };
            let lower = m.get_bool("lower").unwrap_or(false);
            self.deliver(key, &to, op, items.clone(), lower).await?;
            self.coll
                .update_one(
                    doc! {self.spec.key: key.clone(), "_id": id_of(b), format!("{MOVING}.op"): op},
                    doc! {"$unset": {MOVING: ""}},
                )
                .await?;
        }
        Ok(())
    }

    /// Puts moved `items` into bucket `to`: prepended to it if it exists
    /// (once: its write id is kept), else a new sealed bucket. `lower` says
    /// they came from the next bucket, so go at the end.
    async fn deliver(
        &self,
        key: &Bson,
        to: &Bson,
        op: ObjectId,
        items: Vec<Bson>,
        lower: bool,
    ) -> Result<()> {
        let n = items.len() as i64;
        let arr = &self.paths.items;
        let lit = doc! {"$literal": &items};
        let joined = if lower {
            doc! {"$concatArrays": [&arr, &lit]}
        } else {
            doc! {"$concatArrays": [&lit, &arr]}
        };
        let mut update = vec![
            doc! {"$set": {
                self.spec.items: joined,
                "count": {"$add": ["$count", n]},
                "bytes": {"$sum": {"$map": {"input": &arr, "in": {"$add": [{"$bsonSize": "$$this"}, 8]}}}},
            }},
            with_op(op),
        ];
        if !lower {
            // Items put before a bucket's own may be below its floor: the
            // first of them bounds it now.
            update.push(doc! {"$unset": FLOOR});
        }
        let r = self
            .coll
            .update_one(
                doc! {self.spec.key: key.clone(), "_id": to.clone(), OPS: {"$ne": op}, "$expr": self.sound()},
                update,
            )
            .await?;
        if r.matched_count == 1 {
            return Ok(());
        }
        let mut bucket = doc! {"_id": to.clone(), self.spec.key: key.clone(), "start": 0_i64};
        let bytes: i64 = items
            .iter()
            .map(|i| match i {
                Bson::Document(d) => item_len(d).unwrap_or(0),
                _ => 0,
            })
            .sum();
        bucket.insert("count", n);
        bucket.insert("bytes", bytes);
        bucket.insert(self.spec.items, items);
        bucket.insert(OPS, vec![op]);
        bucket.insert(STALE, true);
        // A bucket between two others takes no pushes in order; a new last
        // bucket does.
        if self.neighbour(key, to, 1).await?.is_some() {
            bucket.insert("sealed", true);
        }
        match self.coll.insert_one(bucket).await.map_err(Error::from) {
            Ok(_) => Ok(()),
            Err(e) if e.is_duplicate_key() => {
                let has = self
                    .raw
                    .find_one(doc! {self.spec.key: key.clone(), "_id": to.clone(), OPS: op})
                    .projection(doc! {"_id": 1})
                    .await?;
                if has.is_some() {
                    Ok(())
                } else {
                    Err(Error::damaged(
                        self.coll.name(),
                        to.clone(),
                        "count",
                        "does not agree with the bucket's items",
                    ))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The bucket just before (`dir` -1) or after (1) `id`.
    async fn neighbour(&self, key: &Bson, id: &Bson, dir: i32) -> Result<Option<Head>> {
        let mut f = self.of_key(key);
        let op = if dir < 0 { "$lt" } else { "$gt" };
        f.insert("$and", vec![Bson::Document(doc! {"_id": {op: id.clone()}})]);
        let found = self
            .raw
            .find_one(f)
            .sort(doc! {"_id": dir})
            .projection(self.head_projection(None))
            .await?;
        found.map(|d| self.head_of(&d)).transpose()
    }

    /// Recomputes `start` of the key's buckets from the counts before them,
    /// and clears a removal's mark. Refuses a key with a damaged bucket
    /// first: positions summed from a damaged count would be wrong for every
    /// later bucket. With `from`, writes only the buckets from that `_id` on
    /// (the others' positions did not change).
    pub(super) async fn reindex_now(&self, key: &Bson, from: Option<&Bson>) -> Result<()> {
        self.refuse_damaged(key).await?;
        // A bucket opened ahead assumes the one before fills to `size`,
        // which the sum below does not: it goes, and a push opens it again.
        let mut ahead = self.of_key(key);
        ahead.extend(doc! {NEXT: true, "count": 0});
        self.coll.delete_many(ahead).await?;
        let mut pipeline = vec![
            doc! {"$match": self.of_key(key)},
            doc! {"$setWindowFields": {
                "sortBy": {"_id": 1},
                "output": {"start": {"$sum": "$count", "window": {"documents": ["unbounded", -1]}}},
            }},
        ];
        if let Some(from) = from {
            pipeline.push(doc! {"$match": {"_id": {"$gte": from.clone()}}});
        }
        pipeline.extend([
            // Clears a removal's mark: positions are right again. The key
            // field stays: `$merge` matches on the document key (`_id`,
            // and on a sharded collection its shard key, the key field),
            // its default `on`; naming it would need a unique index on the
            // fields named.
            doc! {"$project": {"start": 1, self.spec.key: 1, STALE: {"$literal": false}}},
            doc! {"$merge": {
                "into": self.coll.name(),
                "whenMatched": "merge",
                "whenNotMatched": "discard",
            }},
        ]);
        // On the primary: `$merge` runs where the read does (a secondary
        // since 5.0), and would write `start` from a lagging copy.
        self.raw
            .aggregate(pipeline)
            .await?
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }
}
