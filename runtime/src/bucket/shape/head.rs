//! [`Head`]: a bucket as a write needs it, read back and checked.

use mongodb::bson::{Bson, RawBsonRef, RawDocument};

use super::{Shape, HI, LEN, LO, MINE, NEXT, TYPE};
use crate::error::Result;
use crate::util::id_of;

/// A bucket as a write needs it: where it is, what it holds, whether it
/// takes pushes.
#[derive(Debug, Clone, Default)]
pub(in crate::bucket) struct Head {
    /// The bucket's `_id`, and its `seq` as stored (a double between two
    /// integers after a split); `seq` is its integer part.
    pub(in crate::bucket) id: Bson,
    pub(in crate::bucket) raw_seq: Bson,
    pub(in crate::bucket) seq: i64,
    /// The order values of its first and last items (its floor when
    /// empty; `lo` is the floor whenever it has one).
    pub(in crate::bucket) lo: Option<Bson>,
    pub(in crate::bucket) hi: Option<Bson>,
    pub(in crate::bucket) start: i64,
    pub(in crate::bucket) count: i64,
    pub(in crate::bucket) bytes: i64,
    pub(in crate::bucket) sealed: bool,
    /// Opened ahead and still empty (see `ahead`).
    pub(in crate::bucket) next: bool,
    pub(in crate::bucket) exists: bool,
    /// The bucket holds the write id the read asked about.
    pub(in crate::bucket) mine: bool,
}

impl Head {
    /// Items before the bucket's end: the key's total, for its last one.
    pub(in crate::bucket) fn total(&self) -> i64 {
        if self.exists {
            self.start + self.count
        } else {
            0
        }
    }
}

impl Shape {
    /// Checks a bucket's bookkeeping as read (`len` is the array's length,
    /// `None` when `items` is not an array): the [`Error::Damaged`] that
    /// names it, or its `(start, count)`.
    pub(in crate::bucket) fn check(&self, d: &RawDocument, len: Option<i64>) -> Result<(i64, i64)> {
        let damaged = |field: &str, problem: String| self.damaged(id_of(d), field, problem);
        let Some(len) = len else {
            // The server's name for what it holds, where a read asked for it.
            let found = match (d.get_str(TYPE), d.get(self.spec.items)) {
                (Ok(t), _) => t.to_owned(),
                (_, Ok(Some(v))) => format!("{:?}", v.element_type()),
                _ => "missing".to_owned(),
            };
            return Err(damaged(
                self.spec.items,
                format!("is {found}, not an array (`items` renamed over stored buckets? `Model::plan` counts them)"),
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
                format!(
                    "is {count}, over the bucket's limit {} (`size` lowered over stored buckets? `Model::plan` counts them)",
                    self.cap()
                ),
            ));
        }
        let start = raw_int(d, "start")
            .map_err(|found| damaged("start", format!("is {found}, not an integer")))?;
        if start < 0 {
            return Err(damaged("start", format!("is {start}, below 0")));
        }
        Ok((start, count))
    }

    /// A bucket read with [`Shape::head_projection`], checked.
    pub(in crate::bucket) fn head_of(&self, d: &RawDocument) -> Result<Head> {
        let seq = seq_of(d)
            .ok_or_else(|| self.damaged(id_of(d), "_id", "is not {k: key, s: integer}"))?;
        let (start, count) = self.check(d, raw_int(d, LEN).ok())?;
        let value = |f: &str| {
            d.get(f)
                .ok()
                .flatten()
                .and_then(|v| Bson::try_from(crate::compat::to_raw_bson(v)).ok())
        };
        let flag = |f: &str| matches!(d.get(f), Ok(Some(RawBsonRef::Boolean(true))));
        Ok(Head {
            id: id_of(d),
            raw_seq: seq.1,
            seq: seq.0,
            lo: value(LO),
            hi: value(HI),
            start,
            count,
            bytes: raw_int(d, "bytes").unwrap_or(0),
            sealed: flag("sealed"),
            next: flag(NEXT),
            exists: true,
            mine: flag(MINE),
        })
    }
}

/// The `seq` of a bucket as read (with its `_id`): its integer part, and
/// the value stored (a double between two integers after a split).
pub(in crate::bucket) fn seq_of(d: &RawDocument) -> Option<(i64, Bson)> {
    match d.get("_id") {
        Ok(Some(RawBsonRef::Document(id))) => match id.get("s") {
            Ok(Some(RawBsonRef::Double(v))) if v.is_finite() && v.abs() < 9.0e15 => {
                Some((v.floor() as i64, Bson::Double(v)))
            }
            _ => raw_int(id, "s").ok().map(|s| (s, Bson::Int64(s))),
        },
        _ => None,
    }
}

/// An integer field of a raw document (an integral double counts, as the
/// shell writes numbers so), or what was found instead.
pub(in crate::bucket) fn raw_int(d: &RawDocument, field: &str) -> std::result::Result<i64, String> {
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
