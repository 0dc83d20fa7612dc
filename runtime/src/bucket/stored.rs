//! What a bucket records about itself (`count`, `start`, `bytes`, marks)
//! and about its items (the order values at its ends): as expressions the
//! server evaluates in filters and projections, and as the check a read
//! makes of what it got back.

//!
//! The bottom of the module: the field names, the [`Head`] a read makes
//! of a bucket, and the update documents every write sends are here, and
//! everything else writes and reads buckets through them.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawBsonRef, RawDocument};

use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::util::{id_of, id_range};

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
/// `OPS` as a path in an expression.
pub(super) const OPS_PATH: &str = "$mp_ops";
/// How many write ids a bucket keeps: more than the writes that can land
/// between a write and its retry (one per concurrent writer).
pub(super) const OPS_KEPT: i32 = 64;
/// Set on every bucket of a key while a `delete` changes counts and has not
/// yet recomputed `start`: a read that meets it recomputes them first, so a
/// removal cut short by a crash leaves no page wrong.
pub(super) const STALE: &str = "mp_stale";
/// Set on an empty bucket opened ahead of the pushes that will fill it
/// (see [`ahead`]): reads of the newest bucket pass over it.
pub(super) const NEXT: &str = "mp_next";
/// `NEXT` as a path in an expression.
pub(super) const NEXT_PATH: &str = "$mp_next";
/// Items a split is moving out of a bucket, until they are in their new
/// place: `{to: _id, op, items}`.
pub(super) const MOVING: &str = "mp_moving";
/// A bucket's lower bound for `order`: the highest value of the buckets
/// before it when it was opened (their last bucket was full or closed by
/// then, so none of their items can be above it). An item not below it
/// belongs in this bucket, even below the bucket's first item: a push that
/// races the one that opened the bucket, with a value between the two,
/// lands here in one update instead of taking the late path. An empty
/// bucket's floor also keeps a push in order from landing below the
/// buckets before it. Whatever moves items across buckets (a split) or
/// changes an order value (`update`) takes it away from the buckets whose
/// lowest item it may no longer bound; they fall back to their first
/// item's value.
pub(super) const FLOOR: &str = "mp_floor";
/// `FLOOR` as a path in an expression.
pub(super) const FLOOR_PATH: &str = "$mp_floor";

/// The newest bucket of a key, as a push or a page needs it.
#[derive(Debug, Clone, Default)]
pub(super) struct Head {
    /// The bucket's `_id`, and its `seq` as stored (a double between two
    /// integers after a split); `seq` is its integer part.
    pub(super) id: Bson,
    pub(super) raw_seq: Bson,
    /// The order values of its first and last items (its floor when empty).
    pub(super) lo: Option<Bson>,
    pub(super) hi: Option<Bson>,
    pub(super) seq: i64,
    pub(super) start: i64,
    pub(super) count: i64,
    pub(super) bytes: i64,
    pub(super) sealed: bool,
    pub(super) exists: bool,
    /// The bucket holds the write id the read asked about.
    pub(super) mine: bool,
    /// A removal has not finished recomputing `start` (see [`STALE`]).
    pub(super) stale: bool,
}

impl Head {
    pub(super) fn total(&self) -> i64 {
        if self.exists {
            self.start + self.count
        } else {
            0
        }
    }
}

impl<T: Bucketed> Buckets<T> {
    /// A filter on the key's buckets: its `_id` range, and equality on the
    /// key field, which is what `mongos` routes by (the bucket
    /// collection's shard key, see the module docs): every command on a
    /// key's buckets goes to the one shard that holds them.
    pub(super) fn of_key(&self, key: &Bson) -> Document {
        let mut f = doc! {self.spec.key: key.clone()};
        f.extend(id_range("k", key));
        f
    }

    /// The key field's value for a filter on the bucket with `_id` `id`
    /// (its `k`): with it, `mongos` sends a write by `_id` to the one shard
    /// that holds the bucket.
    pub(super) fn key_in(id: &Bson) -> Bson {
        match id {
            Bson::Document(d) => d.get("k").cloned().unwrap_or(Bson::Null),
            _ => Bson::Null,
        }
    }

    /// True for a bucket whose bookkeeping holds: `items` an array, `count`
    /// its length, within `size`, and `start` a number. Every write's filter
    /// carries it, so a damaged bucket is never written to; the read that
    /// follows a write that matched nothing says what is wrong.
    pub(super) fn sound(&self) -> Document {
        let items = self.paths.items.as_str();
        // Built twice rather than cloned: cheaper for a one-entry document.
        doc! {"$and": [
            {"$isArray": [items]},
            {"$eq": [{"$size": {"$cond": [{"$isArray": [items]}, items, []]}}, "$count"]},
            {"$lte": ["$count", self.cap()]},
            {"$isNumber": "$start"},
        ]}
    }

    /// The array's length, or null when `items` is not an array: read
    /// beside `count` so that a bucket's bookkeeping can be checked.
    pub(super) fn len_expr(&self) -> Document {
        let items = self.paths.items.as_str();
        doc! {"$cond": [{"$isArray": [items]}, {"$size": items}, Bson::Null]}
    }

    /// Checks a bucket's bookkeeping as read (`len` is the array's length,
    /// `None` when `items` is not an array): the [`Error::Damaged`] that
    /// names it, or its `(start, count)`.
    pub(super) fn check(&self, d: &RawDocument, len: Option<i64>) -> Result<(i64, i64)> {
        let damaged = |field: &str, problem: String| {
            Error::damaged(self.coll.name(), id_of(d), field, problem)
        };
        let Some(len) = len else {
            // The server's name for what it holds, where a read asked for it.
            let found = match (d.get_str(TYPE), d.get(self.spec.items)) {
                (Ok(t), _) => t.to_owned(),
                (_, Ok(Some(v))) => format!("{:?}", v.element_type()),
                _ => "missing".to_owned(),
            };
            return Err(damaged(
                self.spec.items,
                format!("is {found}, not an array"),
            ));
        };
        let count = raw_int(d, "count")
            .map_err(|found| damaged("count", format!("is {found}, not an integer")))?;
        if count != len {
            return Err(damaged(
                "count",
                format!("is {count}, but the array holds {len} items"),
            ));
        }
        if count > self.cap() {
            return Err(damaged(
                "count",
                format!("is {count}, over the bucket's limit {}", self.cap()),
            ));
        }
        let start = raw_int(d, "start")
            .map_err(|found| damaged("start", format!("is {found}, not an integer")))?;
        if start < 0 {
            return Err(damaged("start", format!("is {start}, below 0")));
        }
        Ok((start, count))
    }

    /// A bucket's most items: `size` for pushes in order, twice that for
    /// late items, which make room by splitting past it.
    pub(super) fn cap(&self) -> i64 {
        let size = i64::from(self.spec.size);
        if self.spec.order.is_some() {
            2 * size
        } else {
            size
        }
    }

    /// The array, or an empty one when `items` is not an array.
    pub(super) fn safe_items(&self) -> Document {
        let items = self.paths.items.as_str();
        doc! {"$cond": [{"$isArray": [items]}, items, []]}
    }

    /// The lowest order value a bucket takes: its floor when it has one
    /// (the highest value of the buckets before it, set as it opened; see
    /// [`FLOOR`](FLOOR)), else its first item's.
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
            "in": {"$ifNull": [self.paths.end_order.as_str(), FLOOR_PATH]},
        }}
    }

    pub(super) fn head_projection(&self, op: Option<ObjectId>) -> Document {
        let mut p = doc! {
            "start": 1, "count": 1, "bytes": 1, "sealed": 1, STALE: 1,
            LEN: self.len_expr(),
            TYPE: {"$type": self.paths.items.as_str()},
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

    pub(super) fn head_of(&self, d: &RawDocument) -> Result<Head> {
        let seq = match d.get("_id") {
            Ok(Some(RawBsonRef::Document(id))) => match id.get("s") {
                Ok(Some(RawBsonRef::Double(v))) if v.is_finite() && v.abs() < 9.0e15 => {
                    Some((v.floor() as i64, Bson::Double(v)))
                }
                _ => raw_int(id, "s").ok().map(|s| (s, Bson::Int64(s))),
            },
            _ => None,
        }
        .ok_or_else(|| {
            Error::damaged(
                self.coll.name(),
                id_of(d),
                "_id",
                "is not {k: key, s: integer}",
            )
        })?;
        let len = raw_int(d, LEN).ok();
        let (start, count) = self.check(d, len)?;
        let value = |f: &str| {
            d.get(f)
                .ok()
                .flatten()
                .and_then(|v| Bson::try_from(crate::compat::to_raw_bson(v)).ok())
        };
        Ok(Head {
            id: id_of(d),
            raw_seq: seq.1,
            lo: value(LO),
            hi: value(HI),
            seq: seq.0,
            start,
            count,
            bytes: raw_int(d, "bytes").unwrap_or(0),
            sealed: matches!(d.get("sealed"), Ok(Some(RawBsonRef::Boolean(true)))),
            exists: true,
            mine: matches!(d.get(MINE), Ok(Some(RawBsonRef::Boolean(true)))),
            stale: is_stale(d),
        })
    }

    pub(super) fn append(&self, items: Vec<Document>, len: i64, op: ObjectId) -> Document {
        let n = items.len() as i64;
        // With `order`, callers append only items not below the bucket's
        // last (and sorted): the array stays sorted, and equal values keep
        // their arrival order.
        let each = doc! {"$each": items};
        doc! {
            "$push": {
                self.spec.items: each,
                OPS: {"$each": [op], "$slice": -OPS_KEPT},
            },
            "$inc": {"count": n, "bytes": len},
            "$unset": {NEXT: ""},
        }
    }

    pub(super) fn new_bucket(&self, key: &Bson, seq: i64, start: i64) -> Document {
        doc! {
            "_id": {"k": key.clone(), "s": seq},
            self.spec.key: key.clone(),
            "start": start,
        }
    }

    /// How many of `items` fit in `head`.
    pub(super) fn fits(&self, head: &Head, items: &[(Document, i64)]) -> usize {
        let room = (i64::from(self.spec.size) - head.count).max(0) as usize;
        let mut bytes = head.bytes;
        let mut n = 0;
        for (_, len) in items.iter().take(room) {
            if bytes + len > MAX_BUCKET_BYTES {
                break;
            }
            bytes += len;
            n += 1;
        }
        n
    }

    /// The write that inserts `item` (order value `v`) into a sorted
    /// bucket: after every item not above it (so equal values keep their
    /// arrival order), before the rest.
    pub(super) fn insert_sorted(
        &self,
        item: &Document,
        v: &Bson,
        len: i64,
        op: ObjectId,
    ) -> Vec<Document> {
        let (items, at) = (self.paths.items.as_str(), self.paths.this_order.as_str());
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
}

/// An integer field of a raw document (an integral double counts, as the
/// shell writes numbers so), or what was found instead.
pub(super) fn raw_int(d: &RawDocument, field: &str) -> std::result::Result<i64, String> {
    match d.get(field) {
        Ok(Some(RawBsonRef::Int32(v))) => Ok(i64::from(v)),
        Ok(Some(RawBsonRef::Int64(v))) => Ok(v),
        Ok(Some(RawBsonRef::Double(v))) if v.fract() == 0.0 && v.abs() < 9.0e15 => Ok(v as i64),
        Ok(Some(RawBsonRef::Double(v))) => Err(format!("{v}")),
        Ok(Some(v)) => Err(format!("{:?}", v.element_type())),
        Ok(None) => Err("missing".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// An `int`, `long` or `double` as a double (a `seq`, an order value).
pub(super) fn as_f64(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    }
}

pub(super) fn is_stale(d: &RawDocument) -> bool {
    matches!(d.get(STALE), Ok(Some(RawBsonRef::Boolean(true))))
}

/// MongoDB's order for the values an `order` field holds: a missing or
/// null value first, then numbers (NaN below every other number), dates,
/// timestamps.
pub(super) fn order_cmp(a: Option<&Bson>, b: Option<&Bson>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    fn rank(v: Option<&Bson>) -> u8 {
        match v {
            None | Some(Bson::Null) => 0,
            Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)) => 1,
            Some(Bson::DateTime(_)) => 2,
            Some(Bson::Timestamp(_)) => 3,
            Some(_) => 4,
        }
    }
    match (a, b) {
        (Some(Bson::Int32(x)), Some(Bson::Int32(y))) => x.cmp(y),
        (Some(Bson::Int64(x)), Some(Bson::Int64(y))) => x.cmp(y),
        (Some(Bson::DateTime(x)), Some(Bson::DateTime(y))) => x.cmp(y),
        (Some(Bson::Timestamp(x)), Some(Bson::Timestamp(y))) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Some(x), Some(y)) if rank(a) == 1 && rank(b) == 1 => match (as_f64(x), as_f64(y)) {
            (Some(x), Some(y)) if x.is_nan() || y.is_nan() => y.is_nan().cmp(&x.is_nan()),
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        },
        _ => rank(a).cmp(&rank(b)),
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

pub(super) fn seq_id(key: &Bson, s: Bson) -> Bson {
    Bson::Document(doc! {"k": key.clone(), "s": s})
}

/// A `seq` strictly between `a` and `b`: an integer when one fits, else the
/// midpoint as a double; `None` when doubles have no room left.
pub(super) fn between(a: &Bson, b: &Bson) -> Option<Bson> {
    let (x, y) = (as_f64(a)?, as_f64(b)?);
    if let (Bson::Int64(i), Bson::Int64(j)) = (a, b) {
        if j - i >= 2 {
            return Some(Bson::Int64(i + (j - i) / 2));
        }
    }
    let m = x + (y - x) / 2.0;
    (m > x && m < y).then_some(Bson::Double(m))
}
