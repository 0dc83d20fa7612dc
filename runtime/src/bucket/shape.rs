//! [`Shape`]: the stored format of one bucket collection, as a value.
//!
//! It knows the declaration, the collection's name and the stored field
//! paths, and builds every filter, update and new document the
//! repository sends, and reads back every bucket it gets: nothing else in
//! the module spells a stored field. It holds no collection and no
//! repository, so it can call nothing above it: the bottom layer of the
//! module is kept at the bottom by the compiler.
//!
//! A bucket is `{_id: {k: key, s: seq}, <key>: key, start, count, bytes,
//! items: [...], mp_ops: [...]}`, and at times `sealed: true` (closed:
//! only the key's last bucket takes pushes in order), `mp_next: true` (an
//! empty bucket opened ahead, see `ahead`) and `mp_floor` (with `order`:
//! the highest value before the bucket when it was opened).

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document};

use super::{BucketSpec, MAX_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::util::id_range;

mod head;

pub(super) use head::{raw_int, seq_of, Head};

/// The field names a bucket keeps for itself, beside the key and the
/// items' array: no model field may be stored under one of them (the
/// derive refuses a `key` or `items` that names one, and asserts its list
/// against this one).
pub const RESERVED: &[&str] = &[
    "_id", "start", "count", "bytes", "sealed", OPS, NEXT, FLOOR, LEN, TYPE, MINE, LO, HI,
];

/// Fields the repository's reads compute beside a bucket's own: the
/// array's length, and its BSON type.
pub(super) const LEN: &str = "mp_len";
pub(super) const TYPE: &str = "mp_type";
/// Whether the bucket holds the write id a read asks about.
pub(super) const MINE: &str = "mp_mine";
/// The order values of a bucket's first and last items, as reads compute
/// them.
pub(super) const LO: &str = "mp_lo";
pub(super) const HI: &str = "mp_hi";
/// Each bucket keeps the ids of the last writes that changed it, so that a
/// write the driver retries after a lost reply (it does so once, for
/// example across a server restart) is recognised and not applied twice.
pub(super) const OPS: &str = "mp_ops";
const OPS_PATH: &str = "$mp_ops";
/// How many write ids a bucket keeps: more than the writes that can land
/// between a write and its retry (one per concurrent writer).
pub(super) const OPS_KEPT: i32 = 64;
/// Set on an empty bucket opened ahead of the pushes that will fill it
/// (see `ahead`): reads of the newest bucket pass over it.
pub(super) const NEXT: &str = "mp_next";
const NEXT_PATH: &str = "$mp_next";
/// A bucket's lower bound for `order`: the highest value of the buckets
/// before it when it was opened (they were closed by then, so none of
/// their items can be above it). An item not below it belongs in this
/// bucket, even below the bucket's first item, so a push that races the
/// one that opened the bucket lands here in one update. Whatever moves
/// items across buckets (a split) or changes an order value (`replace`)
/// takes it away from the buckets whose lowest item it may no longer
/// bound; they fall back to their first item's value.
pub(super) const FLOOR: &str = "mp_floor";
const FLOOR_PATH: &str = "$mp_floor";

/// An item as a push stores it, prepared once for every attempt.
#[derive(Debug)]
pub(super) struct Pushed {
    pub(super) key: Bson,
    /// The item without its key field, which the bucket holds.
    pub(super) doc: Document,
    pub(super) len: i64,
    /// The key's slot in what the repository remembers.
    pub(super) slot: Vec<u8>,
    /// The push's write id: once one attempt is applied, no other can be.
    pub(super) op: ObjectId,
}

/// The stored format of one bucket collection: see the module docs.
#[derive(Debug)]
pub(super) struct Shape {
    pub(super) spec: BucketSpec,
    /// The collection's name, to name a bucket in an error.
    collection: String,
    /// `$<items>`.
    items: String,
    /// `$$this.<order>`: an item's order value inside `$filter`.
    this_order: String,
    /// `$$mp_e.<order>`: an end item's order value.
    end_order: String,
}

impl Shape {
    pub(super) fn new(spec: BucketSpec, collection: &str) -> Shape {
        let order = spec.order.unwrap_or("_");
        Shape {
            spec,
            collection: collection.to_owned(),
            items: format!("${}", spec.items),
            this_order: format!("$$this.{order}"),
            end_order: format!("$$mp_e.{order}"),
        }
    }

    /// `$<items>`, the array as an expression.
    pub(super) fn items_path(&self) -> &str {
        &self.items
    }

    /// The collection's name.
    pub(super) fn collection(&self) -> &str {
        &self.collection
    }

    /// [`Error::Damaged`] for bucket `id` of this collection.
    pub(super) fn damaged(&self, id: Bson, field: &str, problem: impl Into<String>) -> Error {
        Error::damaged(&self.collection, id, field, problem)
    }

    /// An item's `order` value (null when it has none), if the model has
    /// `order`.
    pub(super) fn order_of(&self, item: &Document) -> Option<Bson> {
        self.spec
            .order
            .map(|o| item.get(o).cloned().unwrap_or(Bson::Null))
    }

    /// A bucket's most items: `size` for pushes in order, twice that for
    /// late items, which make room by splitting past it.
    pub(super) fn cap(&self) -> i64 {
        let size = self.size();
        if self.spec.order.is_some() {
            2 * size
        } else {
            size
        }
    }

    /// The `$jsonSchema` of a bucket, for the server to enforce (see
    /// `ensure::Validation`): the `_id` `{k, s}` with an integer `s`, the
    /// key, `start` not below 0, `count` from 0 to [`Shape::cap`], and the
    /// items an array no longer than that.
    pub(super) fn schema(&self) -> Document {
        let int = Bson::Array(vec!["int".into(), "long".into()]);
        doc! {
            "required": ["_id", self.spec.key, "start", "count", self.spec.items],
            "properties": {
                "_id": {
                    "bsonType": "object",
                    "required": ["k", "s"],
                    "properties": {"s": {"bsonType": ["int", "long", "double"]}},
                },
                "start": {"bsonType": int.clone(), "minimum": 0},
                "count": {"bsonType": int, "minimum": 0, "maximum": self.cap()},
                self.spec.items: {"bsonType": "array", "maxItems": self.cap()},
            },
        }
    }

    /// With `order`, buckets whose items are not in it (each not below the
    /// one before, as the server compares values): what `order` added
    /// over buckets filled in arrival order leaves. `None` without
    /// `order`.
    pub(super) fn unordered_filter(&self) -> Option<Document> {
        let order = self.spec.order?;
        let items = format!("${}", self.spec.items);
        // `$map` rather than the `items.<order>` path: the same on every
        // server, and a missing value is null, as `order` reads it.
        let values = doc! {"$map": {
            "input": {"$cond": [{"$isArray": &items}, &items, []]},
            "in": format!("$$this.{order}"),
        }};
        let sorted = doc! {"$reduce": {
            "input": values,
            "initialValue": {"ok": true, "prev": Bson::MinKey},
            "in": {
                "ok": {"$and": ["$$value.ok", {"$lte": ["$$value.prev", "$$this"]}]},
                "prev": "$$this",
            },
        }};
        Some(doc! {"$expr": {"$not": [{"$let": {"vars": {"r": sorted}, "in": "$$r.ok"}}]}})
    }

    /// Buckets that [`Shape::check`] refuses as damaged: `items` not an
    /// array, a `count` over [`Shape::cap`] or unlike the array's length,
    /// a `start` below 0. What `plan` looks for: a `size` lowered or an
    /// `items` renamed over stored buckets leaves such buckets.
    pub(super) fn damaged_filter(&self) -> Document {
        let items = self.spec.items;
        let path = format!("${items}");
        doc! {"$or": [
            {items: {"$not": {"$type": "array"}}},
            {"count": {"$gt": self.cap()}},
            {"start": {"$lt": 0}},
            {"$expr": {"$ne": ["$count", {"$size": {"$cond": [{"$isArray": &path}, &path, []]}}]}},
        ]}
    }

    pub(super) fn size(&self) -> i64 {
        i64::from(self.spec.size)
    }

    /// How many of the items with lengths `lens` fit, in order, in `head`:
    /// what its count leaves of `size`, and its bytes of the limit.
    pub(super) fn fits(&self, head: &Head, lens: impl IntoIterator<Item = i64>) -> usize {
        let room = (self.size() - head.count).max(0) as usize;
        let mut bytes = head.bytes;
        let mut n = 0;
        for len in lens.into_iter().take(room) {
            if bytes + len > MAX_BUCKET_BYTES {
                break;
            }
            bytes += len;
            n += 1;
        }
        n
    }

    // ---- filters ----

    /// A filter on the key's buckets: its `_id` range, and equality on the
    /// key field, which is what `mongos` routes by (the collection's shard
    /// key): every command on a key's buckets goes to the one shard that
    /// holds them.
    pub(super) fn of_key(&self, key: &Bson) -> Document {
        let mut f = doc! {self.spec.key: key.clone()};
        f.extend(id_range("k", key));
        f
    }

    /// A filter on one bucket by `_id`, with its key field for `mongos`.
    pub(super) fn by_id(&self, id: &Bson) -> Document {
        doc! {self.spec.key: key_in(id), "_id": id.clone()}
    }

    /// A filter on the key's buckets after bucket `id`.
    pub(super) fn after(&self, key: &Bson, id: &Bson) -> Document {
        let mut f = self.of_key(key);
        f.insert(
            "$and",
            vec![Bson::Document(doc! {"_id": {"$gt": id.clone()}})],
        );
        f
    }

    /// True for a bucket whose bookkeeping holds: `items` an array, `count`
    /// its length, within the cap, and `start` a number. Every write's
    /// filter carries it, so a damaged bucket is never written to; the read
    /// that follows a write that matched nothing says what is wrong.
    pub(super) fn sound(&self) -> Document {
        let items = self.items.as_str();
        doc! {"$and": [
            {"$isArray": [items]},
            {"$eq": [{"$size": {"$cond": [{"$isArray": [items]}, items, []]}}, "$count"]},
            {"$lte": ["$count", self.cap()]},
            {"$isNumber": "$start"},
        ]}
    }

    /// Bucket `seq` of `key` if it is open (not closed, not opened ahead
    /// and empty), sound, without write `op`, and has room for `n` more
    /// items of `len` bytes in all: with `v`, only if its floor (or first
    /// item) is not above `v`, since a lower value belongs further back.
    pub(super) fn open(
        &self,
        key: &Bson,
        seq: i64,
        n: i64,
        len: i64,
        op: ObjectId,
        v: Option<&Bson>,
    ) -> Document {
        let expr = match v {
            Some(v) => doc! {"$and": [self.sound(), {"$lte": [self.lo_expr(), {"$literal": v}]}]},
            None => self.sound(),
        };
        doc! {
            "_id": {"k": key.clone(), "s": seq},
            OPS: {"$ne": op},
            self.spec.key: key.clone(),
            "sealed": Bson::Null,
            "count": {"$lte": self.size() - n},
            "bytes": {"$lte": MAX_BUCKET_BYTES - len},
            "$expr": expr,
        }
    }

    /// Bucket `seq` of `key` open for one more item (`len` bytes) that
    /// is neither its first nor, in the key's first bucket, the one at
    /// half: the pushes that open the next bucket ahead (see `ahead`),
    /// which need the bucket's count back, are left to the
    /// `findAndModify`.
    pub(super) fn open_past_first(&self, key: &Bson, seq: i64, len: i64, op: ObjectId) -> Document {
        let mut f = self.open(key, seq, 1, len, op, None);
        let mut count = doc! {"$gte": 1, "$lte": self.size() - 1};
        if seq == 0 {
            count.insert("$ne", self.half() - 1);
        }
        f.insert("count", count);
        f
    }

    /// Items in the key's first bucket when it opens the next ahead.
    pub(super) fn half(&self) -> i64 {
        (self.size() + 1) / 2
    }

    /// Bucket `seq` of `key` for a batch of `n` items (`len` bytes) sorted
    /// from `v`, appended at its end: open, not opened ahead (the push
    /// landing first there checks its `start`, so a single push does),
    /// sound, with room, and nothing in it above `v`.
    pub(super) fn open_to_batch(
        &self,
        key: &Bson,
        seq: i64,
        n: i64,
        len: i64,
        op: ObjectId,
        v: Option<&Bson>,
    ) -> Document {
        let mut f = self.open(key, seq, n, len, op, None);
        f.insert(NEXT, doc! {"$ne": true});
        if let Some(v) = v {
            f.insert(
                "$expr",
                doc! {"$and": [self.sound(), {"$lte": [self.hi_expr(), {"$literal": v}]}]},
            );
        }
        f
    }

    /// Bucket `head` (as read) if it has not changed since: the same
    /// `count` and `start`, still open, and sound. Closing a bucket names
    /// them, so that a write that moved them in between is seen.
    pub(super) fn unchanged(&self, head: &Head) -> Document {
        doc! {
            self.spec.key: key_in(&head.id),
            "_id": head.id.clone(),
            "count": head.count,
            "start": head.start,
            "sealed": Bson::Null,
            "$expr": self.sound(),
        }
    }

    /// The key's buckets whose floor (or first item) is not above `v` and
    /// that hold items: the last of them covers `v`.
    pub(super) fn covering(&self, key: &Bson, v: &Bson) -> Document {
        let mut f = self.of_key(key);
        f.insert(
            "$expr",
            doc! {"$and": [
                {"$gt": [{"$size": self.safe_items()}, 0]},
                {"$lte": [self.lo_expr(), {"$literal": v}]},
            ]},
        );
        f
    }

    /// The key's buckets with a damaged bookkeeping.
    pub(super) fn damaged_of(&self, key: &Bson) -> Document {
        let mut f = self.of_key(key);
        f.insert("$expr", doc! {"$not": [self.sound()]});
        f
    }

    /// The key's buckets that hold write `op`.
    pub(super) fn holding(&self, key: &Bson, op: ObjectId) -> Document {
        let mut f = self.of_key(key);
        f.insert(OPS, op);
        f
    }

    // ---- expressions ----

    /// The array's length, or null when `items` is not an array: read
    /// beside `count` so that a bucket's bookkeeping can be checked.
    pub(super) fn len_expr(&self) -> Document {
        let items = self.items.as_str();
        doc! {"$cond": [{"$isArray": [items]}, {"$size": items}, Bson::Null]}
    }

    /// The array, or an empty one when `items` is not an array.
    pub(super) fn safe_items(&self) -> Document {
        let items = self.items.as_str();
        doc! {"$cond": [{"$isArray": [items]}, items, []]}
    }

    /// The lowest order value a bucket takes: its floor when it has one,
    /// else its first item's.
    pub(super) fn lo_expr(&self) -> Document {
        doc! {"$ifNull": [FLOOR_PATH, self.end_expr(0)]}
    }

    /// The order value of a bucket's last item (its highest).
    pub(super) fn hi_expr(&self) -> Document {
        self.end_expr(-1)
    }

    fn end_expr(&self, at: i32) -> Document {
        doc! {"$let": {
            "vars": {"mp_e": {"$arrayElemAt": [self.safe_items(), at]}},
            "in": {"$ifNull": [self.end_order.as_str(), FLOOR_PATH]},
        }}
    }

    /// What a read of a bucket projects for [`Shape::head_of`]; with `op`,
    /// whether the bucket holds that write id.
    pub(super) fn head_projection(&self, op: Option<ObjectId>) -> Document {
        let mut p = doc! {
            "start": 1, "count": 1, "bytes": 1, "sealed": 1, NEXT: 1,
            LEN: self.len_expr(),
            TYPE: {"$type": self.items.as_str()},
        };
        if self.spec.order.is_some() {
            p.insert(LO, self.lo_expr());
            p.insert(HI, self.hi_expr());
        }
        if let Some(op) = op {
            p.insert(
                MINE,
                doc! {"$in": [op, {"$cond": [{"$isArray": [OPS_PATH]}, OPS_PATH, []]}]},
            );
        }
        p
    }

    /// What the one-command push reads back: `start`, `count`, and
    /// whether the bucket holds write `op`.
    pub(super) fn mine_projection(&self, op: ObjectId) -> Document {
        doc! {
            "start": 1, "count": 1,
            MINE: {"$in": [op, {"$cond": [{"$isArray": [OPS_PATH]}, OPS_PATH, []]}]},
        }
    }

    // ---- writes ----

    /// The update appending `items` (`len` bytes in all) to a bucket, with
    /// write id `op`. With `order`, callers append only items not below the
    /// bucket's last (and sorted): the array stays sorted, and equal values
    /// keep their arrival order.
    pub(super) fn append(&self, items: Vec<Document>, len: i64, op: ObjectId) -> Document {
        let n = items.len() as i64;
        doc! {
            "$push": {
                self.spec.items: {"$each": items},
                OPS: {"$each": [op], "$slice": -OPS_KEPT},
            },
            "$inc": {"count": n, "bytes": len},
            "$unset": {NEXT: ""},
        }
    }

    /// The update that inserts `item` (order value `v`, `len` bytes) into a
    /// sorted bucket: after every item not above it (so equal values keep
    /// their arrival order), before the rest.
    pub(super) fn insert_sorted(
        &self,
        item: &Document,
        v: &Bson,
        len: i64,
        op: ObjectId,
    ) -> Vec<Document> {
        let (items, at) = (self.items.as_str(), self.this_order.as_str());
        vec![
            doc! {"$set": {
                self.spec.items: {"$concatArrays": [
                    {"$filter": {"input": items, "cond": {"$lte": [at, {"$literal": v}]}}},
                    [{"$literal": item}],
                    {"$filter": {"input": items, "cond": {"$gt": [at, {"$literal": v}]}}},
                ]},
                "count": {"$add": ["$count", 1]},
                "bytes": {"$add": [{"$ifNull": ["$bytes", 0]}, len]},
            }},
            with_op(op),
        ]
    }

    /// The one-command push's update (see `ahead`): appends `item` only to
    /// a bucket that is sound, open, below `size` and has room for `len`
    /// bytes, and otherwise changes nothing (the caller learns which from
    /// the write ids it gets back).
    pub(super) fn append_if_open(&self, item: &Document, len: i64, op: ObjectId) -> Vec<Document> {
        let items = self.items.as_str();
        let bytes = doc! {"$ifNull": ["$bytes", 0]};
        let fits = doc! {"$cond": [
            {"$isNumber": &bytes},
            {"$lte": [{"$add": [&bytes, len]}, MAX_BUCKET_BYTES]},
            false,
        ]};
        let ok = "$mp_ok";
        vec![
            doc! {"$set": {"mp_ok": {"$and": [
                {"$not": [{"$in": [op, {"$cond": [{"$isArray": [OPS_PATH]}, OPS_PATH, []]}]}]},
                self.sound(),
                {"$eq": [{"$ifNull": ["$sealed", Bson::Null]}, Bson::Null]},
                {"$lt": ["$count", self.size()]},
                fits,
            ]}}},
            doc! {"$set": {
                self.spec.items: {"$cond": [ok, {"$concatArrays": [items, [{"$literal": item}]]}, items]},
                "count": {"$cond": [ok, {"$add": ["$count", 1]}, "$count"]},
                "bytes": {"$cond": [ok, {"$add": [&bytes, len]}, "$bytes"]},
                OPS: {"$cond": [ok, {"$slice": [
                    {"$concatArrays": [{"$cond": [{"$isArray": [OPS_PATH]}, OPS_PATH, []]}, [op]]},
                    -OPS_KEPT,
                ]}, OPS_PATH]},
                NEXT: {"$cond": [ok, "$$REMOVE", NEXT_PATH]},
            }},
            doc! {"$unset": "mp_ok"},
        ]
    }

    /// A new bucket `seq` of `key` at `start` holding `items` (`bytes` in
    /// all), written by `op`; with `floor`, the highest value before it.
    pub(super) fn new_bucket(&self, key: &Bson, seq: Bson, start: i64, fill: Fill) -> Document {
        let mut b = doc! {
            "_id": {"k": key.clone(), "s": seq},
            self.spec.key: key.clone(),
            "start": start,
            "count": fill.items.len() as i64,
            "bytes": fill.bytes,
            self.spec.items: fill.items,
            OPS: fill.op.map(|op| vec![op]).unwrap_or_default(),
        };
        if let (Some(floor), Some(_)) = (fill.floor, self.spec.order) {
            b.insert(FLOOR, floor);
        }
        if fill.sealed {
            b.insert("sealed", true);
        }
        if fill.ahead {
            b.insert(NEXT, true);
        }
        b
    }

    /// New buckets of `key` for `items` (as stored, with their lengths),
    /// written by `op`, the first with `seq` and `start` as `at` gives
    /// them: each filled to `size` (or the byte limit), each but the last
    /// closed (only the last takes pushes in order), each one's floor the
    /// last value before it (`floor` for the first). With how many items
    /// each holds.
    pub(super) fn new_buckets(
        &self,
        key: &Bson,
        (mut seq, mut start): (i64, i64),
        mut floor: Option<Bson>,
        items: &[(Document, i64)],
        op: ObjectId,
    ) -> Vec<(Document, usize)> {
        let mut buckets = Vec::new();
        let mut taken = 0;
        while taken < items.len() {
            // Never 0: `item_len` refused items that fit no bucket.
            let lens = items[taken..].iter().map(|(_, l)| *l);
            let n = self.fits(&Head::default(), lens).max(1);
            let chunk = &items[taken..taken + n];
            taken += n;
            let fill = Fill {
                floor: floor.take(),
                sealed: taken < items.len(),
                ..Fill::of(chunk, op)
            };
            floor = chunk.last().and_then(|(d, _)| self.order_of(d));
            buckets.push((self.new_bucket(key, Bson::Int64(seq), start, fill), n));
            seq += 1;
            start += n as i64;
        }
        buckets
    }

    /// The filter and update that put `items` into bucket `seq` of `key`,
    /// opened ahead and still empty, if its `start` is `start`.
    pub(super) fn adopt(
        &self,
        key: &Bson,
        seq: i64,
        start: i64,
        items: &[(Document, i64)],
        op: ObjectId,
    ) -> (Document, Document) {
        let filter = doc! {
            self.spec.key: key.clone(),
            "_id": {"k": key.clone(), "s": seq},
            NEXT: true,
            "count": 0,
            "start": start,
            "$expr": self.sound(),
        };
        let docs = items.iter().map(|(d, _)| d.clone()).collect();
        let len = items.iter().map(|(_, l)| l).sum();
        (filter, self.append(docs, len, op))
    }

    /// The update closing a bucket: it takes no more pushes.
    pub(super) fn seal() -> Document {
        doc! {"$set": {"sealed": true}}
    }
}

/// What a new bucket holds.
#[derive(Debug, Default)]
pub(super) struct Fill {
    pub(super) items: Vec<Bson>,
    pub(super) bytes: i64,
    pub(super) op: Option<ObjectId>,
    pub(super) floor: Option<Bson>,
    pub(super) sealed: bool,
    /// Opened ahead of the pushes that will fill it (see `ahead`).
    pub(super) ahead: bool,
}

impl Fill {
    /// `items` (as stored, with their lengths) written by `op`.
    pub(super) fn of(items: &[(Document, i64)], op: ObjectId) -> Fill {
        Fill {
            items: items
                .iter()
                .map(|(d, _)| Bson::Document(d.clone()))
                .collect(),
            bytes: items.iter().map(|(_, l)| l).sum(),
            op: Some(op),
            ..Fill::default()
        }
    }
}

/// The key field's value for a filter on the bucket with `_id` `id` (its
/// `k`): with it, `mongos` sends a write by `_id` to the one shard that
/// holds the bucket.
pub(super) fn key_in(id: &Bson) -> Bson {
    match id {
        Bson::Document(d) => d.get("k").cloned().unwrap_or(Bson::Null),
        _ => Bson::Null,
    }
}

/// A pipeline stage that records write `op` among the bucket's last writes.
pub(super) fn with_op(op: ObjectId) -> Document {
    doc! {"$set": {OPS: {"$slice": [
        {"$concatArrays": [{"$cond": [{"$isArray": [OPS_PATH]}, OPS_PATH, []]}, [op]]},
        -OPS_KEPT,
    ]}}}
}

/// An item's size inside the array: its document plus the element header
/// (type byte, index digits, NUL).
pub(super) fn item_len(doc: &Document) -> Result<i64> {
    let mut buf = Vec::new();
    doc.to_writer(&mut buf)?;
    let len = buf.len() as i64 + 8;
    if len > MAX_BUCKET_BYTES {
        return Err(Error::DocumentTooLarge {
            bytes: Some(len as usize),
            source: None,
        });
    }
    Ok(len)
}

/// The `_id` of bucket `s` of `key`.
pub(super) fn seq_id(key: &Bson, s: Bson) -> Bson {
    Bson::Document(doc! {"k": key.clone(), "s": s})
}

/// An `int`, `long` or `double` as a double (a `seq`, an order value).
fn as_f64(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    }
}

/// A `seq` strictly between `a` and `b`: an integer when one fits, else the
/// midpoint as a double; `None` when doubles have no room left.
pub(super) fn between(a: &Bson, b: &Bson) -> Option<Bson> {
    spread(a, b, 1)?.pop()
}

/// `n` `seq`s strictly between `a` and `b`, increasing and evenly
/// spaced (room left on both sides of each for later splits): integers
/// when they fit, else doubles; `None` when doubles have no room left.
pub(super) fn spread(a: &Bson, b: &Bson, n: usize) -> Option<Vec<Bson>> {
    if let (Bson::Int64(i), Bson::Int64(j)) = (a, b) {
        let parts = n as i64 + 1;
        if j - i >= parts {
            return Some(
                (1..parts)
                    .map(|k| Bson::Int64(i + k * (j - i) / parts))
                    .collect(),
            );
        }
    }
    let (x, y) = (as_f64(a)?, as_f64(b)?);
    let step = (y - x) / (n + 1) as f64;
    let seqs: Vec<f64> = (1..=n).map(|k| x + step * k as f64).collect();
    let mut prev = x;
    for &m in seqs.iter().chain(std::iter::once(&y)) {
        if m <= prev {
            return None;
        }
        prev = m;
    }
    Some(seqs.into_iter().map(Bson::Double).collect())
}

/// Whether order value `v` is below `bound` in MongoDB's order (a missing
/// bound is below everything).
pub(super) fn below(v: &Bson, bound: Option<&Bson>) -> bool {
    order_cmp(Some(v), bound) == std::cmp::Ordering::Less
}

/// MongoDB's order of two `order` values (missing counts as null, as the
/// server sorts it).
pub(super) fn order_cmp(a: Option<&Bson>, b: Option<&Bson>) -> std::cmp::Ordering {
    crate::order::cmp(a.unwrap_or(&Bson::Null), b.unwrap_or(&Bson::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_gives_increasing_seqs_strictly_between() {
        assert_eq!(
            spread(&Bson::Int64(3), &Bson::Int64(11), 3),
            Some(vec![Bson::Int64(5), Bson::Int64(7), Bson::Int64(9)])
        );
        assert_eq!(
            between(&Bson::Int64(3), &Bson::Int64(9)),
            Some(Bson::Int64(6))
        );
        assert_eq!(
            between(&Bson::Int64(3), &Bson::Int64(4)),
            Some(Bson::Double(3.5))
        );
        assert_eq!(
            spread(&Bson::Int64(3), &Bson::Int64(4), 3),
            Some(vec![
                Bson::Double(3.25),
                Bson::Double(3.5),
                Bson::Double(3.75)
            ])
        );
        assert_eq!(spread(&Bson::Int64(3), &Bson::Int64(4), 0), Some(vec![]));
        let tight = (1.0_f64, 1.0_f64 + f64::EPSILON);
        assert_eq!(
            spread(&Bson::Double(tight.0), &Bson::Double(tight.1), 2),
            None
        );
    }
}
