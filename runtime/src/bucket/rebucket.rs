//! `rebucket`: a key's buckets written again under the declaration as it
//! is now, after `size` was lowered (buckets over the new limit, which
//! every read refuses as damaged) or `order` was declared over buckets
//! filled in arrival order (items out of order).
//!
//! A key is one transaction (a [`Move`]): every bucket of the key read,
//! its items taken in stored order (sorted by `order`, stably, when the
//! model has one), the buckets deleted and the new ones inserted, laid
//! out as `push_many` lays them out. A push to the key meanwhile makes
//! the transaction conflict, and it runs again; a call cut short leaves
//! each key either as it was or moved whole, so calling it again
//! finishes. The old buckets' write ids go with the items to the key's
//! last bucket, so that a push whose reply was lost before the move
//! still finds it landed.
//!
//! A key of more than `max_items` is moved bucket by bucket ([`Resize`]):
//! each bucket the declaration refuses split on its own, in a transaction,
//! into buckets of `size` under `seq`s between its own and the next
//! bucket's, so that no other bucket changes; then a `reindex` checks
//! every `start`. Sorting across buckets needs the whole key: a key whose
//! buckets are out of `order` is refused instead.

use std::time::Instant;

use futures::future::BoxFuture;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawBsonRef, RawDocumentBuf};

use super::adopt::report;
use super::moves::{Move, Txn};
use super::shape::{item_len, order_cmp, FLOOR, OPS, OPS_KEPT};
use super::{Bucketed, Buckets};
use crate::action::Call;
use crate::error::{Error, Result};
use crate::progress::OnProgress;
use crate::util::id_of;

/// Keys one read of the keys to move takes: memory holds no more.
const KEYS_A_ROUND: i64 = 1_000;

/// Items one move takes by default (`max_items`): about 10 MB of items of
/// 100 bytes in memory, and a transaction of a few seconds.
pub(super) const MAX_ITEMS: u64 = 100_000;

/// One key's buckets, written again.
pub(super) struct Rebucket {
    pub(super) key: Bson,
    /// The name the items were stored under before `items` was renamed:
    /// read from it too, before the declared one.
    pub(super) from: Option<String>,
    /// A key of more items is refused ([`Error::KeyTooLarge`]).
    pub(super) max_items: u64,
}

/// What one key's move did: the items the key holds, and whether its
/// buckets were written (not when they were already laid out so, as
/// after another service's move of the same key).
#[derive(Debug, Clone, Copy)]
pub(super) struct Moved {
    pub(super) items: u64,
    pub(super) written: bool,
}

impl Move for Rebucket {
    type Out = Moved;
    const OPERATION: &'static str = "rebucket";

    fn run<'a>(&'a self, mut t: Txn<'a>) -> BoxFuture<'a, Result<Moved>> {
        Box::pin(async move {
            let of_key = t.shape.of_key(&self.key);
            let buckets = match t.find_at_most(of_key.clone(), self.max_items).await? {
                Ok(buckets) => buckets,
                Err(items) => {
                    return Err(Error::KeyTooLarge {
                        collection: t.shape.collection().to_owned(),
                        key: Box::new(self.key.clone()),
                        items,
                        limit: self.max_items,
                    })
                }
            };
            let (mut items, mut ops) = (Vec::new(), Vec::new());
            for b in &buckets {
                items.extend(stored_items(&t, b, self.from.as_deref())?);
                ops_of(b, &mut ops);
            }
            if let Some(order) = t.shape.spec.order {
                // Stable: equal values keep their stored order.
                items.sort_by(|a, b| order_cmp(a.0.get(order), b.0.get(order)));
            }
            let op = ObjectId::new();
            let mut laid = t.shape.new_buckets(&self.key, (0, 0), None, &items, op);
            let n = items.len() as u64;
            if laid_out(&buckets, &laid) {
                return Ok(Moved {
                    items: n,
                    written: false,
                });
            }
            t.delete_all(of_key).await?;
            if let Some((last, _)) = laid.last_mut() {
                ops.push(op);
                let from = ops.len().saturating_sub(OPS_KEPT as usize);
                last.insert(OPS, ops[from..].to_vec());
            }
            t.insert_all(laid.into_iter().map(|(b, _)| b).collect())
                .await?;
            Ok(Moved {
                items: n,
                written: true,
            })
        })
    }
}

/// The items of bucket `b` as stored: under `from` (the name before
/// `items` was renamed) first, where it has them, then under the declared
/// name.
fn stored_items(
    t: &Txn<'_>,
    b: &RawDocumentBuf,
    from: Option<&str>,
) -> Result<Vec<(Document, i64)>> {
    let declared = t.shape.spec.items;
    let has = |f: &str| b.get(f).ok().flatten().is_some();
    let Some(old) = from.filter(|old| has(old)) else {
        return items_of(t, b, declared);
    };
    let mut items = items_of(t, b, old)?;
    if has(declared) {
        items.extend(items_of(t, b, declared)?);
    }
    Ok(items)
}

/// Adds the write ids bucket `b` holds to `ops`, each once.
fn ops_of(b: &RawDocumentBuf, ops: &mut Vec<ObjectId>) {
    for op in b.get_array(OPS).into_iter().flatten().flatten() {
        if let Some(op) = op.as_object_id().filter(|op| !ops.contains(op)) {
            ops.push(op);
        }
    }
}

/// One bucket of a key too large for one move ([`Rebucket::max_items`]),
/// written again on its own: its items (sorted by `order`, stably) in
/// buckets of the declared `size`, the first under the bucket's own `seq`
/// and `start`, the others under `seq`s between it and the next bucket's,
/// so that no other bucket's `_id` or `start` changes and memory holds
/// one bucket. Every bucket but the key's last is closed.
pub(super) struct Resize {
    pub(super) key: Bson,
    pub(super) id: Bson,
    pub(super) from: Option<String>,
}

impl Move for Resize {
    /// Whether the bucket was written (not when another service did it
    /// first).
    type Out = bool;
    const OPERATION: &'static str = "rebucket";

    fn run<'a>(&'a self, mut t: Txn<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let found = t.find(t.shape.by_id(&self.id), 1, 1, doc! {}).await?;
            let Some(b) = found.first() else {
                return Ok(false);
            };
            let from = self.from.as_deref();
            let count = super::shape::raw_int(b, "count").unwrap_or(-1);
            let start = super::shape::raw_int(b, "start").unwrap_or(-1);
            let mut items = stored_items(&t, b, from)?;
            let old = from.is_some_and(|f| b.get(f).ok().flatten().is_some());
            let sound = count == items.len() as i64 && start >= 0 && count <= t.shape.cap();
            if sound && !old {
                return Ok(false);
            }
            if let Some(order) = t.shape.spec.order {
                items.sort_by(|a, b| order_cmp(a.0.get(order), b.0.get(order)));
            }
            // The next bucket's `seq` only (it may be over the limit too).
            let after = t.shape.after(&self.key, &self.id);
            let next = t.find(after, 1, 1, doc! {"_id": 1}).await?;
            let next = next.first().map(|d| seq_of(&id_of(d)));
            let floor = b
                .get(FLOOR)
                .ok()
                .flatten()
                .and_then(|v| Bson::try_from(v).ok());
            let op = ObjectId::new();
            // Laid out as a whole move lays them, from this bucket's
            // `start`; then each given its `seq`.
            let mut laid = t
                .shape
                .new_buckets(&self.key, (0, start.max(0)), floor, &items, op);
            let seq = seq_of(&self.id);
            let more = laid.len().saturating_sub(1);
            let seqs = match (&next, &seq) {
                (Some(n), _) => super::shape::spread(&seq, n, more).ok_or_else(|| {
                    Error::invalid(
                        "size",
                        "no room for more buckets between two neighbours: rebucket the key whole \
                         (raise `max_items`), or adopt it into a new collection",
                    )
                })?,
                (None, Bson::Int64(s)) => (1..=more as i64).map(|k| Bson::Int64(s + k)).collect(),
                (None, other) => {
                    return Err(t.shape.damaged(
                        self.id.clone(),
                        "_id",
                        format!("has seq {other:?}"),
                    ))
                }
            };
            for ((bucket, _), seq) in laid.iter_mut().zip(std::iter::once(seq).chain(seqs)) {
                bucket.insert("_id", doc! {"k": self.key.clone(), "s": seq});
            }
            let was_sealed = matches!(b.get("sealed"), Ok(Some(RawBsonRef::Boolean(true))));
            if let Some((last, _)) = laid.last_mut() {
                // Only the key's last bucket takes pushes in order.
                if was_sealed || next.is_some() {
                    last.insert("sealed", true);
                }
                let mut ops = Vec::new();
                ops_of(b, &mut ops);
                ops.push(op);
                let from = ops.len().saturating_sub(OPS_KEPT as usize);
                last.insert(OPS, ops[from..].to_vec());
            }
            let mut filter = t.shape.by_id(&self.id);
            filter.insert("count", count);
            t.delete_one(filter).await?;
            // No `tail` here: the key's `start`s and total are as they
            // were, and the later buckets may be over the limit still (the
            // `reindex` after the last step ends with one).
            t.insert_all(laid.into_iter().map(|(b, _)| b).collect())
                .await?;
            Ok(true)
        })
    }
}

/// The `seq` of a bucket's `_id`.
fn seq_of(id: &Bson) -> Bson {
    match id {
        Bson::Document(id) => id.get("s").cloned().unwrap_or(Bson::Null),
        _ => Bson::Null,
    }
}

/// Whether the key's `stored` buckets are already `laid` (write ids
/// aside): moved by another service since its keys were found, so that
/// writing them again would only cost the transaction.
fn laid_out(stored: &[RawDocumentBuf], laid: &[(Document, usize)]) -> bool {
    let without_ops = |mut d: Document| {
        d.remove(OPS);
        d
    };
    stored.len() == laid.len()
        && stored.iter().zip(laid).all(|(s, (l, _))| {
            Document::try_from(s.as_ref()).is_ok_and(|s| without_ops(s) == without_ops(l.clone()))
        })
}

/// The items of bucket `b` under `field`, as stored, with their lengths:
/// a bucket whose items are not an array of documents is damaged
/// (nothing is written).
fn items_of(t: &Txn<'_>, b: &RawDocumentBuf, field: &str) -> Result<Vec<(Document, i64)>> {
    let damaged = |problem: &str| t.shape.damaged(id_of(b), field, problem);
    let Ok(array) = b.get_array(field) else {
        return Err(damaged("is not an array"));
    };
    let mut items = Vec::new();
    for item in array {
        let item = item
            .ok()
            .and_then(|i| i.as_document())
            .and_then(|d| Document::try_from(d).ok())
            .ok_or_else(|| damaged("holds an item that is not a document"))?;
        let len = item_len(&item)?;
        items.push((item, len));
    }
    Ok(items)
}

/// `items_from`'s name: a top-level field other than the declared items
/// and the bucket's own fields, or the move would read the same items
/// twice, or a field that holds none.
pub(super) fn check_from(shape: &super::shape::Shape, from: Option<&str>) -> Result<()> {
    let Some(old) = from else {
        return Ok(());
    };
    let why = if old.is_empty() || old.starts_with('$') || old.contains('.') || old.contains('\0') {
        "must be a top-level field name (not empty, no `$` first, no `.`)"
    } else if old == shape.spec.items {
        "is the declared `items`: name the field the items were stored under before"
    } else if old == shape.spec.key || super::shape::RESERVED.contains(&old) {
        "is one of the bucket's own fields, not an array of items"
    } else {
        return Ok(());
    };
    Err(Error::invalid("items_from", format!("`{old}` {why}")))
}

/// What [`Buckets::rebucket_all`] did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Rebucketed {
    /// Keys written again; not those another service moved since they
    /// were found, which are read and left as they are.
    pub keys: u64,
    /// The items those keys hold.
    pub items: u64,
    /// Keys over the limit of one move whose buckets must be sorted
    /// across (so not moved bucket by bucket), left as they were, each an
    /// [`Error::KeyTooLarge`] naming it and its items.
    pub too_large: Vec<Error>,
}

impl<T: Bucketed> Buckets<T> {
    /// One key moved: whole ([`Rebucket`]), or, when it holds more than
    /// one move takes, bucket by bucket ([`Buckets::rebucket_in_steps`]);
    /// [`Error::KeyTooLarge`] when it can be neither.
    pub(super) async fn rebucket_key(&self, r: Rebucket, cx: &mut Call<'_>) -> Result<Moved> {
        let (key, from) = (r.key.clone(), r.from.clone());
        match Box::pin(self.moved(r, cx)).await {
            Err(e @ Error::KeyTooLarge { .. }) => {
                match Box::pin(self.rebucket_in_steps(&key, from.as_deref(), cx)).await? {
                    Some(items) => Ok(Moved {
                        items,
                        written: true,
                    }),
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// A key too large for one move ([`Rebucket`]), moved bucket by bucket:
    /// each bucket the declaration refuses (or that holds items under
    /// `from`) written again on its own ([`Resize`], one transaction),
    /// then every `start` checked against the counts (a `reindex`). The
    /// items the key holds; `None`, and nothing written, when a bucket's
    /// items are out of `order`, as when `order` was declared over buckets
    /// filled in arrival order: only a move of the whole key sorts across
    /// buckets.
    pub(super) async fn rebucket_in_steps(
        &self,
        key: &Bson,
        from: Option<&str>,
        cx: &mut Call<'_>,
    ) -> Result<Option<u64>> {
        let of_key = self.shape.of_key(key);
        if let Some(unordered) = self.shape.unordered_filter() {
            let mut f = of_key.clone();
            f.extend(unordered);
            let any = vec![
                doc! {"$match": f},
                doc! {"$limit": 1},
                doc! {"$project": {"_id": 1}},
            ];
            if !Box::pin(self.aggregate(any, cx)).await?.is_empty() {
                return Ok(None);
            }
        }
        let mut bad = vec![Bson::Document(self.shape.damaged_filter())];
        if let Some(old) = from {
            bad.push(Bson::Document(doc! {old: {"$exists": true}}));
        }
        let mut f = of_key.clone();
        f.insert("$or", bad);
        // Their `_id`s only: memory holds no bucket but the one moving.
        let ids = vec![
            doc! {"$match": f},
            doc! {"$sort": {"_id": 1}},
            doc! {"$project": {"_id": 1}},
        ];
        for d in Box::pin(self.aggregate(ids, cx)).await? {
            let resize = Resize {
                key: key.clone(),
                id: id_of(&d),
                from: from.map(str::to_owned),
            };
            Box::pin(self.moved(resize, cx)).await?;
        }
        let recount = super::moves::Reindex { key: key.clone() };
        Ok(Some(Box::pin(self.moved(recount, cx)).await?))
    }

    /// [`Buckets::rebucket_all`], in `cx`: the keys that have a bucket the
    /// declaration refuses or finds out of order, 1,000 at a time in BSON
    /// order, each moved in its own transaction.
    pub(super) async fn rebucket_all_in(
        &self,
        mut progress: Option<OnProgress>,
        from: Option<String>,
        max_items: u64,
        cx: &mut Call<'_>,
    ) -> Result<Rebucketed> {
        check_from(&self.shape, from.as_deref())?;
        let started = Instant::now();
        let key = self.shape.spec.key;
        let mut bad = vec![Bson::Document(self.shape.damaged_filter())];
        if let Some(old) = &from {
            bad.push(Bson::Document(doc! {old: {"$exists": true}}));
        }
        bad.extend(self.shape.unordered_filter().map(Bson::Document));
        let group = vec![
            doc! {"$match": {"$or": bad}},
            doc! {"$group": {"_id": format!("${key}")}},
        ];
        let mut count = group.clone();
        count.push(doc! {"$count": "n"});
        let of = Box::pin(self.aggregate(count, cx))
            .await?
            .first()
            .and_then(|d| super::shape::raw_int(d, "n").ok())
            .unwrap_or(0) as u64;
        let (mut done, mut moved) = (0u64, Rebucketed::default());
        let mut last: Option<Bson> = None;
        loop {
            let mut round = group.clone();
            if let Some(l) = &last {
                round.push(doc! {"$match": {"$expr": {"$gt": ["$_id", {"$literal": l}]}}});
            }
            round.push(doc! {"$sort": {"_id": 1}});
            round.push(doc! {"$limit": KEYS_A_ROUND});
            let keys = Box::pin(self.aggregate(round, cx)).await?;
            let Some(l) = keys.last() else {
                return Ok(moved);
            };
            last = Some(id_of(l));
            for k in &keys {
                let rebucket = Rebucket {
                    key: id_of(k),
                    from: from.clone(),
                    max_items,
                };
                match Box::pin(self.rebucket_key(rebucket, cx)).await {
                    Ok(m) if m.written => {
                        moved.keys += 1;
                        moved.items += m.items;
                    }
                    // Moved by another service since the keys were read.
                    Ok(_) => {}
                    Err(e @ Error::KeyTooLarge { .. }) => moved.too_large.push(e),
                    Err(e) => return Err(e),
                }
                done += 1;
            }
            report(&mut progress, done, of, started);
        }
    }
}
