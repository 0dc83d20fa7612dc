//! `delete` and `replace`: items changed inside their buckets. A delete
//! moves the positions after what it removed, so it is a [`Move`], one
//! transaction (see [`moves`](super::moves)); a replace changes one bucket
//! and moves nothing.

use futures::future::BoxFuture;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document};

use super::filter::item_cond;
use super::moves::{Move, Txn};
use super::shape::{item_len, raw_int, with_op, FLOOR, LEN, OPS, TYPE};
use super::{Bucketed, Buckets};
use crate::action::Call;
use crate::error::{Error, Result};
use crate::util::id_of;

/// [`Buckets::delete`]: the items of a key that match a filter.
pub(super) struct Delete {
    pub(super) key: Bson,
    /// The filter, as an expression over one item (see [`item_cond`]).
    pub(super) cond: Document,
}

impl Delete {
    pub(super) fn new(key: Bson, matching: &Document, key_field: &str) -> Result<Delete> {
        let cond = item_cond(matching, (key_field, &key))?;
        Ok(Delete { key, cond })
    }
}

impl Move for Delete {
    /// How many items it removed.
    type Out = u64;
    const OPERATION: &'static str = "delete";

    fn run<'a>(&'a self, t: Txn<'a>) -> BoxFuture<'a, Result<u64>> {
        Box::pin(self.remove(t))
    }
}

impl Delete {
    /// One aggregation finds the buckets with matching items (and any
    /// damaged bucket of the key, which makes the call fail before it
    /// writes); each is rewritten by `_id` without them, and closed (so
    /// that no push fills the gap out of order), and the buckets after it
    /// move back by as many; the key's tail is kept as every move keeps it.
    async fn remove(&self, mut t: Txn<'_>) -> Result<u64> {
        let items = t.shape.items_path();
        let sound = t.shape.sound();
        let hits = doc! {"$size": {"$filter": {"input": items, "cond": &self.cond}}};
        let pipeline = vec![
            doc! {"$match": t.shape.of_key(&self.key)},
            doc! {"$project": {
                "start": 1,
                "count": 1,
                LEN: t.shape.len_expr(),
                TYPE: {"$type": items},
                "mp_sound": &sound,
                "mp_hits": {"$cond": [&sound, &hits, 0]},
            }},
            doc! {"$match": {"$or": [{"mp_sound": false}, {"mp_hits": {"$gt": 0}}]}},
            doc! {"$sort": {"_id": 1}},
        ];
        let found = t.aggregate(pipeline).await?;
        for b in &found {
            if !matches!(b.get_bool("mp_sound"), Ok(true)) {
                t.shape.check(b, raw_int(b, LEN).ok())?;
                return Err(t.shape.damaged(
                    id_of(b),
                    "count",
                    "does not agree with the bucket's items",
                ));
            }
        }
        if found.is_empty() {
            return Ok(0);
        }
        let rewrite = vec![
            doc! {"$set": {t.shape.spec.items: {"$filter": {"input": items, "cond": {"$not": [&self.cond]}}}}},
            // `bytes` is left as it was: a closed bucket is never appended
            // to.
            doc! {"$set": {"count": {"$size": items}, "sealed": true}},
            with_op(ObjectId::new()),
        ];
        let mut removed = 0;
        for b in &found {
            let hit = raw_int(b, "mp_hits").unwrap_or(0);
            let mut filter = t.shape.by_id(&id_of(b));
            filter.insert("count", raw_int(b, "count").unwrap_or(-1));
            t.write_one(filter, rewrite.clone()).await?;
            t.shift(&self.key, &id_of(b), -hit).await?;
            removed += hit as u64;
        }
        t.read_tail(&self.key).await?;
        Ok(removed)
    }
}

impl<T: Bucketed> Buckets<T> {
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
        let cond = item_cond(&matching, (self.shape.spec.key, &key_b))?;
        let items = self.shape.items_path();
        let sound = self.shape.sound();
        let safe = doc! {"$cond": [{"$isArray": [&items]}, &items, []]};
        let hit = doc! {"$in": [true, {"$map": {"input": &safe, "in": &cond}}]};
        let mut filter = self.shape.of_key(&key_b);
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
        if let Some(order) = self.shape.spec.order {
            new_items = doc! {"$sortArray": {"input": new_items, "sortBy": {order: 1}}};
        }
        // `bytes` follows the item's size, so pushes keep under 16 MiB.
        let old_len = doc! {"$add": [{"$bsonSize": {"$arrayElemAt": [&items, &at]}}, 8]};
        let bytes = doc! {"$add": [{"$ifNull": ["$bytes", 0]}, len, {"$multiply": [-1, old_len]}]};
        let op = ObjectId::new();
        filter.insert(OPS, doc! {"$ne": op});
        let mut set = vec![
            doc! {"$set": {self.shape.spec.items: new_items, "bytes": bytes}},
            with_op(op),
        ];
        if self.shape.spec.order.is_some() {
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
        let find = self
            .raw
            .find_one(self.shape.holding(&key_b, op))
            .with_options(cx.read_options::<mongodb::options::FindOneOptions>())
            .projection(doc! {"_id": 1});
        if crate::action::run!(find, cx.session.as_deref_mut())?.is_some() {
            return Ok(true);
        }
        self.refuse_damaged(&key_b, cx).await?;
        Ok(false)
    }
}
