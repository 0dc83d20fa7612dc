//! `delete` and `replace`: items changed inside their buckets, with the
//! positions after them moved under the key's lease.

use crate::action::Call;
use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::ReturnDocument;

use super::filter::item_cond;
use super::stored::{item_len, raw_int, with_op, FLOOR, LEN, OPS, TYPE};
use super::{Bucketed, Buckets};
use crate::error::{Error, Result};
use crate::util::id_of;

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::delete`]: as a task of its own, so that a caller that
    /// stops waiting does not cut it between buckets.
    pub(super) async fn remove_spawned(&self, key_b: Bson, matching: Document) -> Result<u64> {
        let cond = item_cond(&matching, (self.spec.key, &key_b))?;
        let this = self.clone();
        match tokio::spawn(tracing::Instrument::in_current_span(async move {
            this.remove_now(&key_b, &cond).await
        }))
        .await
        {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::invalid(
                "runtime",
                "the runtime shut down while `delete` ran; it may have deleted some items",
            )),
        }
    }

    /// Under the key's lease: no other write that moves positions runs
    /// beside it.
    async fn remove_now(&self, key: &Bson, cond: &Document) -> Result<u64> {
        self.leased(key, |taken_over| async move {
            if taken_over {
                self.finish_moves(key).await?;
            }
            self.remove_leased(key, cond).await
        })
        .await
    }

    async fn remove_leased(&self, key: &Bson, cond: &Document) -> Result<u64> {
        let items = &self.paths.items;
        let sound = self.sound();
        let hits = doc! {"$size": {"$filter": {"input": &items, "cond": cond}}};
        let rewrite = vec![
            doc! {"$set": {self.spec.items: {"$filter": {"input": &items, "cond": {"$not": [cond]}}}}},
            // `bytes` is left as it was: a sealed bucket is never appended to.
            doc! {"$set": {"count": {"$size": &items}, "sealed": true}},
        ];
        let mut removed = 0;
        let mut marked = false;
        // Under the lease: retried within a fraction of it (`leased_retry`).
        let mut retry = Self::leased_retry("remove");
        let done = loop {
            let pipeline = vec![
                doc! {"$match": self.of_key(key)},
                doc! {"$project": {
                    "start": 1,
                    "count": 1,
                    LEN: self.len_expr(),
                    TYPE: {"$type": &items},
                    "mp_sound": &sound,
                    "mp_hits": {"$cond": [&sound, &hits, 0]},
                }},
                doc! {"$match": {"$or": [{"mp_sound": false}, {"mp_hits": {"$gt": 0}}]}},
            ];
            let found: Vec<RawDocumentBuf> = self
                .raw
                .aggregate(pipeline)
                .with_type::<RawDocumentBuf>()
                .await?
                .try_collect()
                .await?;
            for b in &found {
                if !matches!(b.get_bool("mp_sound"), Ok(true)) {
                    self.check(b, raw_int(b, LEN).ok())?;
                    return Err(Error::damaged(
                        self.coll.name(),
                        id_of(b),
                        "count",
                        "does not agree with the bucket's items",
                    ));
                }
            }
            if found.is_empty() {
                break Ok(());
            }
            // Positions after the first changed bucket go stale until the
            // recomputation below: mark the key's buckets, so that a read
            // meeting them (after a crash cut this short) recomputes first.
            if !marked {
                self.mark(key, None).await?;
            }
            marked = true;
            let mut all = true;
            for b in &found {
                let count = raw_int(b, "count")
                    .map_err(|found| Error::damaged(self.coll.name(), id_of(b), "count", found))?;
                // By `_id` and the count as read: a bucket that changed since
                // is read again on the next round.
                // Its write id tells a retry by the driver, after a lost
                // reply, from a bucket that changed.
                let op = ObjectId::new();
                let filter = doc! {self.spec.key: key.clone(), "_id": id_of(b), "count": count, OPS: {"$ne": op}, "$expr": &sound};
                let mut write = rewrite.clone();
                write.push(with_op(op));
                let after = self
                    .raw
                    .find_one_and_update(filter, write)
                    .projection(doc! {"count": 1})
                    .return_document(ReturnDocument::After)
                    .await?;
                match after.map(|a| raw_int(&a, "count")) {
                    Some(Ok(left)) => removed += (count - left).max(0) as u64,
                    _ if self.has_op(b, op).await? => {
                        removed += raw_int(b, "mp_hits").unwrap_or(0).max(0) as u64
                    }
                    _ => all = false,
                }
            }
            if all {
                break Ok(());
            }
            // A bucket changed since it was read (a push in order, which
            // takes no lease, won): read again after a pause, or give up,
            // recomputing positions first either way.
            if let Err(e) = retry.pause().await {
                break Err(e);
            }
        };
        if marked {
            self.reindex_now(key, None).await?;
        }
        done.map(|()| removed)
    }

    /// [`Buckets::replace`], in `cx`.
    pub(super) async fn update_in(
        &self,
        key_b: &Bson,
        matching: Document,
        item: &T,
        cx: &mut Call<'_>,
    ) -> Result<bool> {
        let key_b = key_b.clone();
        if self.key_bson(item.bucket_key())? != key_b {
            return Err(Error::invalid("item", "the new item must keep the key"));
        }
        let doc = self.item_doc(item)?;
        let len = item_len(&doc)?;
        let cond = item_cond(&matching, (self.spec.key, &key_b))?;
        let items = &self.paths.items;
        let sound = self.sound();
        let safe = doc! {"$cond": [{"$isArray": [&items]}, &items, []]};
        let hit = doc! {"$in": [true, {"$map": {"input": &safe, "in": &cond}}]};
        let mut filter = self.of_key(&key_b);
        filter.insert("$expr", doc! {"$and": [&sound, hit]});
        let at = doc! {"$indexOfArray": [{"$map": {"input": &items, "in": &cond}}, true]};
        let replaced = doc! {"$map": {
            "input": {"$range": [0, {"$size": &items}]},
            "as": "mp_j",
            "in": {"$cond": [
                {"$eq": ["$$mp_j", "$$mp_at"]},
                {"$literal": doc},
                {"$arrayElemAt": [&items, "$$mp_j"]},
            ]},
        }};
        let mut new_items = doc! {"$let": {"vars": {"mp_at": &at}, "in": replaced}};
        if let Some(order) = self.spec.order {
            new_items = doc! {"$sortArray": {"input": new_items, "sortBy": {order: 1}}};
        }
        // `bytes` follows the item's size, so pushes keep under 16 MiB.
        let old_len = doc! {"$add": [{"$bsonSize": {"$arrayElemAt": [&items, &at]}}, 8]};
        let bytes = doc! {"$add": [{"$ifNull": ["$bytes", 0]}, len, {"$multiply": [-1, old_len]}]};
        let op = ObjectId::new();
        filter.insert(OPS, doc! {"$ne": op});
        let mut set = vec![
            doc! {"$set": {self.spec.items: new_items, "bytes": bytes}},
            with_op(op),
        ];
        if self.spec.order.is_some() {
            // A changed order value may fall below the bucket's floor: its
            // first item bounds it from now on.
            set.push(doc! {"$unset": FLOOR});
        }
        let fam = self
            .raw
            .find_one_and_update(filter, set)
            .with_options(
                cx.opts
                    .driver::<mongodb::options::FindOneAndUpdateOptions>(),
            )
            .sort(doc! {"_id": 1})
            .projection(doc! {"_id": 1});
        let found = crate::action::run!(fam, cx.session.as_deref_mut())?;
        if found.is_some() {
            return Ok(true);
        }
        // Not matched, or applied already and retried by the driver.
        let mut mine = self.of_key(&key_b);
        mine.insert(OPS, op);
        let find = self
            .raw
            .find_one(mine)
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .projection(doc! {"_id": 1});
        if crate::action::run!(find, cx.session.as_deref_mut())?.is_some() {
            return Ok(true);
        }
        let mut filter = self.of_key(&key_b);
        filter.insert("$expr", doc! {"$not": [self.sound()]});
        let find = self
            .raw
            .find_one(filter)
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .sort(doc! {"_id": 1})
            .projection(self.head_projection(None));
        if let Some(d) = crate::action::run!(find, cx.session.as_deref_mut())? {
            self.refuse_found(&d)?;
        }
        Ok(false)
    }

    /// Whether bucket `b` (as read) holds write id `op`.
    async fn has_op(&self, b: &RawDocumentBuf, op: ObjectId) -> Result<bool> {
        let found = self
            .raw
            .find_one(doc! {self.spec.key: Self::key_in(&id_of(b)), "_id": id_of(b), OPS: op})
            .projection(doc! {"_id": 1})
            .await?;
        Ok(found.is_some())
    }
}
