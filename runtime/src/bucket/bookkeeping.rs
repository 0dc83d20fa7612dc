//! What a bucket records about itself (`count`, `start`, `bytes`, marks)
//! and about its items (the order values at its ends): as expressions the
//! server evaluates in filters and projections, and as the check a read
//! makes of what it got back.

use mongodb::bson::{doc, Bson, Document, RawBsonRef, RawDocument};

use super::order::FLOOR_PATH;
use super::{Bucketed, Buckets, STALE, TYPE};
use crate::error::{Error, Result};
use crate::util::id_of;

impl<T: Bucketed> Buckets<T> {
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
    /// [`FLOOR`](super::order::FLOOR)), else its first item's.
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
