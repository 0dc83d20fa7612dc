//! `delete`, `delete_before` and `replace`: items changed inside their
//! buckets. A delete moves the positions after what it removed, so it is
//! a [`Move`], one transaction (see [`moves`](super::moves)); a replace
//! changes one bucket and moves nothing.

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
    /// Whether a bucket it empties is removed (but the key's last, which
    /// the key's pushes go on from), as retention wants; `delete` keeps
    /// it, empty and closed.
    drop_emptied: bool,
}

impl Delete {
    pub(super) fn new(key: Bson, matching: &Document, key_field: &str) -> Result<Delete> {
        let cond = item_cond(matching, (key_field, &key))?;
        Ok(Delete {
            key,
            cond,
            drop_emptied: false,
        })
    }

    /// [`Buckets::delete_before`]: the items whose `order` field is below
    /// `cutoff`, and the buckets they filled.
    pub(super) fn before(key: Bson, order: &str, cutoff: Bson, key_field: &str) -> Result<Delete> {
        let mut d = Delete::new(key, &doc! {order: {"$lt": cutoff}}, key_field)?;
        d.drop_emptied = true;
        Ok(d)
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
        let last = match self.drop_emptied {
            true => t.last_two(&self.key).await?.0.map(|h| h.id),
            false => None,
        };
        let mut removed = 0;
        // The key's last bucket, emptied: kept (closed) through the tail,
        // which gives it a successor, then removed.
        let mut emptied_last = None;
        for b in &found {
            let hit = raw_int(b, "mp_hits").unwrap_or(0);
            let count = raw_int(b, "count").unwrap_or(-1);
            let id = id_of(b);
            let mut filter = t.shape.by_id(&id);
            filter.insert("count", count);
            let emptied = self.drop_emptied && hit == count;
            if emptied && last.as_ref() != Some(&id) {
                t.delete_one(filter).await?;
            } else {
                t.write_one(filter, rewrite.clone()).await?;
                emptied_last = emptied.then(|| id.clone());
            }
            t.shift(&self.key, &id, -hit).await?;
            removed += hit as u64;
        }
        t.read_tail(&self.key).await?;
        if let Some(id) = emptied_last {
            let (now_last, _) = t.last_two(&self.key).await?;
            if now_last.is_some_and(|h| h.id != id) {
                let mut filter = t.shape.by_id(&id);
                filter.insert("count", 0);
                t.delete_one(filter).await?;
            }
        }
        Ok(removed)
    }
}

/// Keys [`Buckets::delete_all_before`] takes from one read: each is then
/// one transaction, and memory holds no more than these.
const KEYS_A_ROUND: i64 = 1_000;

impl<T: Bucketed> Buckets<T> {
    /// The `order` field, which retention needs.
    pub(super) fn order_for(&self, call: &str) -> Result<&'static str> {
        self.shape.spec.order.ok_or_else(|| {
            Error::invalid(
                "order",
                format!("`{call}` removes items by their `order` field, and this model keeps items in arrival order: declare `#[bucket(order = \"...\")]`, or remove items with `delete`"),
            )
        })
    }

    /// [`Buckets::delete_all_before`], in `cx`: rounds of at most
    /// [`KEYS_A_ROUND`] keys that hold an item before `cutoff` (one
    /// aggregation on the primary), each key then cut as
    /// [`Buckets::delete_before`] cuts it, until a round finds none.
    pub(super) async fn delete_all_before_in(
        &self,
        cutoff: Bson,
        cx: &mut Call<'_>,
    ) -> Result<u64> {
        let order = self.order_for("delete_all_before")?;
        let (key, items) = (self.shape.spec.key, self.shape.spec.items);
        let pipeline = vec![
            doc! {"$match": {format!("{items}.{order}"): {"$lt": &cutoff}}},
            doc! {"$group": {"_id": format!("${key}")}},
            doc! {"$limit": KEYS_A_ROUND},
        ];
        let mut removed = 0;
        loop {
            let keys = Box::pin(self.aggregate(pipeline.clone(), cx)).await?;
            if keys.is_empty() {
                return Ok(removed);
            }
            let mut cut = 0;
            for k in keys {
                // The group's `_id` is the key, as stored.
                let k = id_of(&k);
                let removal = Delete::before(k, order, cutoff.clone(), key)?;
                cut += Box::pin(self.moved(removal, cx)).await?;
            }
            removed += cut;
            if cut == 0 {
                // Keys matched, yet nothing was before `cutoff` in their
                // items as the move read them: a value the query and the
                // expression order differently. Stop rather than loop.
                return Ok(removed);
            }
        }
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
