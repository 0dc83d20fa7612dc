//! Late items with `order` (below what the key's last bucket holds) that
//! belong further back than [`near`](super::near) reaches: into the bucket
//! whose range covers the value, under the key's lease (see
//! [`lease`](super::lease)), splitting that bucket when it grows past twice
//! `size`.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document};

use super::stored::{Head, OPS};
use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::error::{Error, Result};

impl<T: Bucketed> Buckets<T> {
    /// A late push (its order value below what the key's last bucket
    /// holds): run as a task of its own, so that a caller that stops
    /// waiting does not cut it between its writes.
    pub(super) async fn push_late(
        &self,
        key: &Bson,
        item: Document,
        len: i64,
        op: ObjectId,
    ) -> Result<()> {
        let this = self.clone();
        let key = key.clone();
        let late = async move {
            let (this, key, item) = (&this, &key, &item);
            this.leased(key, |taken_over| async move {
                if taken_over {
                    this.finish_moves(key).await?;
                    this.reindex_now(key, None).await?;
                }
                match this.insert_late(key, item, len, op).await? {
                    Some(from) => this.reindex_now(key, Some(&from)).await,
                    None => Ok(()),
                }
            })
            .await
        };
        let task = tokio::spawn(tracing::Instrument::in_current_span(late));
        match task.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::invalid(
                "runtime",
                "the runtime shut down while a late push ran; it may have been stored",
            )),
        }
    }

    /// Inserts `item` sorted into the bucket that covers its order value:
    /// the last bucket (by `_id`) whose first item is not above it, or the
    /// first bucket when it is below them all. A bucket may grow to twice
    /// `size`; past that (or past the byte limit) it is split first.
    /// Marks the buckets from the covering one on first; returns the
    /// `_id` from which positions must be recomputed (`None`: nothing was
    /// written).
    async fn insert_late(
        &self,
        key: &Bson,
        item: &Document,
        len: i64,
        op: ObjectId,
    ) -> Result<Option<Bson>> {
        let Some(order) = self.spec.order else {
            return Err(Error::invalid("order", "a late push needs `order`"));
        };
        let v = item.get(order).cloned().unwrap_or(Bson::Null);
        let mut from: Option<Bson> = None;
        let mut retry = Self::leased_retry("push");
        // Whether an insert was sent and matched nothing: only then can a
        // round find this write applied (the driver retried it after a
        // lost reply).
        let mut sent = false;
        loop {
            let c = self.covering(key, &v, sent.then_some(op)).await?;
            let Some(c) = c else {
                return Err(Error::invalid("key", "no bucket to insert into"));
            };
            if c.mine {
                return Ok(from);
            }
            if from.is_none() {
                self.mark(key, Some(&c.id)).await?;
                from = Some(c.id.clone());
            }
            if c.count + 1 > self.cap() || c.bytes + len > MAX_BUCKET_BYTES {
                let (split, lower) = self.split(key, &c).await?;
                if let Some(lower) = lower {
                    // A new first bucket: positions from it on.
                    from = Some(lower);
                }
                if !split {
                    // Changed by a push in order since it was read.
                    retry.pause().await?;
                }
                continue;
            }
            let filter = doc! {
                self.spec.key: key.clone(),
                "_id": c.id.clone(),
                "count": c.count,
                OPS: {"$ne": op},
                "$expr": self.sound(),
            };
            let update = self.insert_sorted(item, &v, len, op);
            let r = self.coll.update_one(filter, update).await?;
            if r.matched_count == 1 {
                return Ok(from);
            }
            // Changed by a push in order (the last bucket: a race lost), or
            // applied already: the next round reads it again.
            sent = true;
            retry.pause().await?;
        }
    }

    /// The bucket an item of order value `v` belongs in; `mine` says
    /// whether write `op` is among its last writes.
    async fn covering(&self, key: &Bson, v: &Bson, op: Option<ObjectId>) -> Result<Option<Head>> {
        if let Some(op) = op {
            let mut mine = self.of_key(key);
            mine.insert(OPS, op);
            if let Some(d) = self
                .raw
                .find_one(mine)
                .projection(self.head_projection(Some(op)))
                .await?
            {
                return Ok(Some(self.head_of(&d)?));
            }
        }
        let lo = self.lo_expr();
        let mut below = self.of_key(key);
        below.insert(
            "$expr",
            doc! {"$and": [
                {"$gt": [{"$size": self.safe_items()}, 0]},
                {"$lte": [&lo, {"$literal": v}]},
            ]},
        );
        let found = self
            .raw
            .find_one(below)
            .sort(doc! {"_id": -1})
            .projection(self.head_projection(None))
            .await?;
        let found = match found {
            Some(d) => Some(d),
            None => {
                // Below every item: the first bucket that holds any, else
                // the last bucket.
                let mut any = self.of_key(key);
                any.insert("count", doc! {"$gt": 0});
                match self
                    .raw
                    .find_one(any)
                    .sort(doc! {"_id": 1})
                    .projection(self.head_projection(None))
                    .await?
                {
                    Some(d) => Some(d),
                    None => {
                        self.raw
                            .find_one(self.of_key(key))
                            .sort(doc! {"_id": -1})
                            .projection(self.head_projection(None))
                            .await?
                    }
                }
            }
        };
        found.map(|d| self.head_of(&d)).transpose()
    }
}
