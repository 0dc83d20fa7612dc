//! The checks: a stored document's key against what the model stores, the
//! audit of the whole collection, and the analysis of a candidate key; the
//! actions of the last two, [`AuditKeys`] and [`Analyze`], beside them.

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::FindOptions;

use super::time::{name, other_granularities, stored_time, truncate};
use super::{analyze, key_fields, key_projection, KeyAnalysis, ShardKeyed, ShardSpec, Sharded};
use crate::action::{action, Call};
use crate::error::{Error, Result};

action! {
    /// [`Sharded::audit`]: read options and `session`.
    AuditKeys<'a, T: ShardKeyed> on Sharded, "audit", read;
    { max: usize } -> Audit;
    |this, cx| this.repo.audit_in(this.max, cx).await
}

action! {
    /// [`Sharded::analyze`]: read options and `session`.
    Analyze<'a, T: ShardKeyed> on Sharded, "analyze", read;
    { key: &'a [&'a str], sample: u32 } -> KeyAnalysis;
    |this, cx| this.repo.analyze_in(this.key, this.sample, cx).await
}

impl<T: ShardKeyed> Sharded<T> {
    /// Checks every document's shard key (a scatter-gather over the whole
    /// collection, projected to the key fields): the coarse field present,
    /// and, when derived, a date equal to its timestamp's period. Such a
    /// document is invisible to [`Sharded::find`], and writes to it are
    /// refused. Reports up to `max` of them, as [`Error::Damaged`], in
    /// `_id` order. One `find` and its `getMore`s, in the session when one
    /// is given.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[shard_key(coarse = "month", from = "ts", search = "type")]
    /// # struct Log {
    /// #     #[serde(rename = "_id")] id: ObjectId,
    /// #     #[serde(rename = "type")] kind: String,
    /// #     ts: i64,
    /// #     level: String,
    /// # }
    /// # async fn f(db: Database, log: Log, more: Vec<Log>, at: DateTime) -> mongo_patterns::Result<()> {
    /// let logs = Log::sharded(&db);
    /// let audit = logs.audit(10).await?; // documents whose key is damaged
    /// # Ok(()) }
    /// ```
    pub fn audit(&self, max: usize) -> AuditKeys<'_, T> {
        AuditKeys::new(self, max)
    }

    pub(super) async fn audit_in(&self, max: usize, mut cx: Call<'_>) -> Result<Audit> {
        let o = cx.opts.driver::<FindOptions>();
        let find = self
            .coll
            .find(doc! {})
            .with_options(o)
            .projection(key_projection(&self.spec))
            .sort(doc! {"_id": 1});
        let mut audit = Audit {
            scanned: 0,
            damaged: Vec::new(),
        };
        let mut check = |d: &Document| {
            audit.scanned += 1;
            if audit.damaged.len() < max {
                if let Err(e) = check_stored(&self.spec, self.coll.name(), d, None) {
                    audit.damaged.push(e);
                }
            }
        };
        match cx.session.as_deref_mut() {
            None => {
                let mut cursor = find.await?;
                while let Some(d) = cursor.try_next().await? {
                    check(&d);
                }
            }
            Some(s) => {
                let mut cursor = find.session(&mut *s).await?;
                while let Some(d) = cursor.next(&mut *s).await.transpose()? {
                    check(&d);
                }
            }
        }
        Ok(audit)
    }

    /// Analyses a candidate shard key (BSON field names, in key order) on a
    /// `$sample` of up to `sample` documents: see [`analyze`]. One
    /// `aggregate`, in the session when one is given.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[shard_key(coarse = "month", from = "ts", search = "type")]
    /// # struct Log {
    /// #     #[serde(rename = "_id")] id: ObjectId,
    /// #     #[serde(rename = "type")] kind: String,
    /// #     ts: i64,
    /// #     level: String,
    /// # }
    /// # async fn f(db: Database, log: Log, more: Vec<Log>, at: DateTime) -> mongo_patterns::Result<()> {
    /// let logs = Log::sharded(&db);
    /// let report = logs.analyze(&["month", "type"], 10_000).await?;
    /// let trap = report.low_cardinality() || report.monotonic() == Some(true);
    /// # Ok(()) }
    /// ```
    pub fn analyze<'a>(&'a self, key: &'a [&'a str], sample: u32) -> Analyze<'a, T> {
        Analyze::new(self, key, sample)
    }

    pub(super) async fn analyze_in(
        &self,
        key: &[&str],
        sample: u32,
        cx: Call<'_>,
    ) -> Result<KeyAnalysis> {
        // A read: a write concern among the repository's defaults does not
        // apply to it.
        let mut o = cx.opts.clone();
        o.write_concern = None;
        analyze::analyze_with(&self.coll, key, sample, &o, cx.session).await
    }
}

/// What [`Sharded::audit`] found.
#[derive(Debug)]
#[non_exhaustive]
pub struct Audit {
    /// Documents checked: the whole collection.
    pub scanned: u64,
    /// Up to the asked number of documents whose key is missing or wrong,
    /// each an [`Error::Damaged`] naming its `_id` and field.
    pub damaged: Vec<Error>,
}

/// BSON types that compare as one in a filter: numbers, and null with a
/// missing value.
fn same_bracket(a: &Bson, b: &Bson) -> bool {
    let bracket = |v: &Bson| match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 0x01,
        Bson::Null | Bson::Undefined => 0x0a,
        other => other.element_type() as u8,
    };
    bracket(a) == bracket(b)
}

pub(super) fn type_name(v: Option<&Bson>) -> String {
    v.map_or("nothing".to_owned(), |b| format!("{:?}", b.element_type()))
}

/// Checks a stored document's shard key: each key field that `new` (the
/// document about to be written, or, for an audit, the derived coarse
/// field alone) has must be stored, as the same type; a derived coarse
/// field must be its stored timestamp's period.
pub(super) fn check_stored(
    spec: &ShardSpec,
    collection: &str,
    stored: &Document,
    new: Option<&Document>,
) -> Result<()> {
    let id = || stored.get("_id").cloned().unwrap_or(Bson::Null);
    let damaged = |field: &str, problem: String| Error::damaged(collection, id(), field, problem);
    for field in key_fields(spec) {
        let want = match new {
            Some(n) => n.get(field),
            // An audit knows only that the coarse field is always stored.
            None if Some(field) == spec.coarse() => Some(&Bson::Null),
            None => None,
        };
        let Some(want) = want else { continue };
        match stored.get(field) {
            None => {
                return Err(damaged(
                    field,
                    "is missing: it is part of the shard key, and the model always stores it"
                        .to_owned(),
                ))
            }
            Some(got) if new.is_some() && !same_bracket(got, want) => {
                return Err(damaged(
                    field,
                    format!(
                        "holds {}, where the model stores {}",
                        type_name(Some(got)),
                        type_name(Some(want))
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    let (Some(coarse), Some(derived)) = (spec.coarse(), spec.derived()) else {
        return Ok(());
    };
    let Some(Bson::DateTime(month)) = stored.get(coarse) else {
        return Err(damaged(
            coarse,
            format!(
                "holds {}, not the date derived from `{}`",
                type_name(stored.get(coarse)),
                derived.from
            ),
        ));
    };
    let Some(at) = stored_time(stored.get(derived.from), derived.repr) else {
        return Err(damaged(
            derived.from,
            format!(
                "holds {}, not a timestamp the shard key derives from",
                type_name(stored.get(derived.from))
            ),
        ));
    };
    let want = truncate(at, derived.granularity);
    if *month != want {
        let others = other_granularities(at, *month, derived.granularity);
        let why = match others.is_empty() {
            true => String::new(),
            false => format!(
                " (it is its {}: written under another granularity; `fill_coarse` rewrites it)",
                others.into_iter().map(name).collect::<Vec<_>>().join(", ")
            ),
        };
        return Err(damaged(
            coarse,
            format!(
                "is {month}, but `{}` is in the {} of {want}{why}",
                derived.from,
                name(derived.granularity)
            ),
        ));
    }
    Ok(())
}
