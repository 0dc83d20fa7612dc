//! The filter `remove` and `update` take, as an aggregation expression over
//! one item (`$$this`).
//!
//! Both calls work inside a bucket's array, where the query language cannot
//! reach (a query selects documents, not array elements), so the filter is
//! translated into an expression that the server evaluates for each item.
//! The same expression selects the buckets and the items, so the number
//! removed is exactly what matched. Only operators whose meaning translates
//! faithfully are accepted; any other is refused before anything is sent,
//! rather than compared as a literal document (which would match nothing).

use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::ReturnDocument;

use super::act::Cx;
use super::bookkeeping::raw_int;
use super::write::item_len;
use super::{Bucketed, Buckets, LEN, OPS, OPS_KEPT, OPS_PATH, TYPE};
use crate::error::{Error, Result};
use crate::util::id_of;
use crate::util::id_range;

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::remove`]: as a task of its own, so that a caller that
    /// stops waiting does not cut it between buckets.
    pub(super) async fn remove_spawned(&self, key_b: Bson, matching: Document) -> Result<u64> {
        let cond = item_cond(&matching, (self.spec.key, &key_b))?;
        let this = self.clone();
        match tokio::spawn(async move { this.remove_now(&key_b, &cond).await }).await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::invalid(
                "runtime",
                "the runtime shut down while `remove` ran; it may have removed some items",
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
                doc! {"$match": id_range("k", key)},
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
                let filter =
                    doc! {"_id": id_of(b), "count": count, OPS: {"$ne": op}, "$expr": &sound};
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

    /// [`Buckets::update`], in `cx`.
    pub(super) async fn update_in(
        &self,
        key_b: &Bson,
        matching: Document,
        item: &T,
        cx: &mut Cx<'_>,
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
        let mut filter = id_range("k", &key_b);
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
            set.push(doc! {"$unset": super::order::FLOOR});
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
        let mut mine = id_range("k", &key_b);
        mine.insert(OPS, op);
        let find = self
            .raw
            .find_one(mine)
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .projection(doc! {"_id": 1});
        if crate::action::run!(find, cx.session.as_deref_mut())?.is_some() {
            return Ok(true);
        }
        let mut filter = id_range("k", &key_b);
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
            .find_one(doc! {"_id": id_of(b), OPS: op})
            .projection(doc! {"_id": 1})
            .await?;
        Ok(found.is_some())
    }

    /// An error naming the first damaged bucket of `key`, if it has one.
    pub(super) async fn refuse_damaged(&self, key: &Bson) -> Result<()> {
        let mut filter = id_range("k", key);
        filter.insert("$expr", doc! {"$not": [self.sound()]});
        let found = self
            .raw
            .find_one(filter)
            .sort(doc! {"_id": 1})
            .projection(self.head_projection(None))
            .await?;
        match found {
            Some(b) => self.refuse_found(&b),
            None => Ok(()),
        }
    }

    /// The error naming damaged bucket `b`, as read.
    fn refuse_found(&self, b: &RawDocumentBuf) -> Result<()> {
        self.head_of(b)?;
        Err(Error::damaged(
            self.coll.name(),
            id_of(b),
            "count",
            "does not agree with the bucket's items",
        ))
    }
}

/// A pipeline stage that records write `op` among the bucket's last writes.
pub(super) fn with_op(op: ObjectId) -> Document {
    doc! {"$set": {OPS: {"$slice": [
        {"$concatArrays": [{"$cond": [{"$isArray": [OPS_PATH]}, OPS_PATH, []]}, [op]]},
        -OPS_KEPT,
    ]}}}
}

/// Field operators `remove` and `update` accept.
pub const FIELD_OPERATORS: &[&str] = &[
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists",
];
/// Operators that combine filters.
pub const LOGICAL_OPERATORS: &[&str] = &["$and", "$or", "$nor"];

/// Nesting past this is refused: filters come from callers.
const MAX_DEPTH: usize = 32;

/// Translates `filter` into a boolean expression over `$$this`. `key` and
/// its value stand for the key field, which items do not store.
pub(super) fn item_cond(filter: &Document, key: (&str, &Bson)) -> Result<Document> {
    if filter.is_empty() {
        return Err(Error::invalid(
            "matching",
            "name at least one item field (an empty filter would match every item)",
        ));
    }
    filter_expr(filter, key, 0)
}

fn filter_expr(filter: &Document, key: (&str, &Bson), depth: usize) -> Result<Document> {
    if depth > MAX_DEPTH {
        return Err(Error::invalid("matching", "nested too deep"));
    }
    let mut terms = Vec::with_capacity(filter.len());
    for (name, value) in filter {
        if let Some(op) = name.strip_prefix('$') {
            terms.push(Bson::Document(logical(op, value, key, depth)?));
        } else {
            terms.push(Bson::Document(field_expr(name, value, key)?));
        }
    }
    Ok(doc! {"$and": terms})
}

fn logical(op: &str, value: &Bson, key: (&str, &Bson), depth: usize) -> Result<Document> {
    let name = format!("${op}");
    if !LOGICAL_OPERATORS.contains(&name.as_str()) {
        return Err(refused(&name));
    }
    let Bson::Array(parts) = value else {
        return Err(Error::invalid(
            "matching",
            format!("`{name}` takes an array of filters"),
        ));
    };
    if parts.is_empty() {
        return Err(Error::invalid(
            "matching",
            format!("`{name}` needs at least one filter"),
        ));
    }
    let mut terms = Vec::with_capacity(parts.len());
    for p in parts {
        let Bson::Document(d) = p else {
            return Err(Error::invalid(
                "matching",
                format!("`{name}` takes an array of filters"),
            ));
        };
        if d.is_empty() {
            return Err(Error::invalid(
                "matching",
                format!("an empty filter inside `{name}`"),
            ));
        }
        terms.push(Bson::Document(filter_expr(d, key, depth + 1)?));
    }
    Ok(match name.as_str() {
        "$and" => doc! {"$and": terms},
        "$or" => doc! {"$or": terms},
        _ => doc! {"$not": [{"$or": terms}]},
    })
}

/// `{field: value}` or `{field: {$op: value, ...}}`.
fn field_expr(field: &str, value: &Bson, key: (&str, &Bson)) -> Result<Document> {
    if field.is_empty() || field.split('.').any(|p| p.is_empty() || p.starts_with('$')) {
        return Err(Error::invalid(
            "matching",
            format!("`{field}` is not a field path"),
        ));
    }
    // The key is not stored in items: its value is known.
    let path = if field == key.0 {
        Bson::Document(doc! {"$literal": key.1.clone()})
    } else {
        Bson::String(format!("$$this.{field}"))
    };
    let ops = match value {
        Bson::Document(d) if d.keys().any(|k| k.starts_with('$')) => d,
        // A plain value, or a document without operators: equality.
        v => return eq(&path, v),
    };
    if ops.keys().any(|k| !k.starts_with('$')) {
        return Err(Error::invalid(
            "matching",
            format!("`{field}` mixes operators and fields"),
        ));
    }
    let mut terms = Vec::with_capacity(ops.len());
    for (op, v) in ops {
        let term = match op.as_str() {
            "$eq" => eq(&path, v)?,
            "$ne" => doc! {"$not": [eq(&path, v)?]},
            "$gt" | "$gte" | "$lt" | "$lte" => compare(&path, op, v)?,
            "$in" => any_of(&path, op, v)?,
            "$nin" => doc! {"$not": [any_of(&path, op, v)?]},
            "$exists" => {
                let present = if field == key.0 {
                    doc! {"$literal": true}
                } else {
                    present(field)
                };
                match v {
                    Bson::Boolean(true) => present,
                    Bson::Boolean(false) => doc! {"$not": [present]},
                    _ => return Err(Error::invalid("matching", "`$exists` takes true or false")),
                }
            }
            other => return Err(refused(other)),
        };
        terms.push(Bson::Document(term));
    }
    Ok(doc! {"$and": terms})
}

/// Whether the item has `field`: its name among its parent's keys. (Some
/// servers give a missing field's `$type` as "null", not "missing".)
fn present(field: &str) -> Document {
    let (parent, last) = match field.rsplit_once('.') {
        Some((p, l)) => (format!("$$this.{p}"), l),
        None => ("$$this".to_owned(), field),
    };
    let is_object = doc! {"$eq": [{"$type": "$$mp_o"}, "object"]};
    doc! {"$let": {
        "vars": {"mp_o": parent},
        "in": {"$and": [
            &is_object,
            {"$in": [last, {"$map": {
                "input": {"$objectToArray": {"$cond": [&is_object, "$$mp_o", {}]}},
                "as": "mp_kv",
                "in": "$$mp_kv.k",
            }}]},
        ]},
    }}
}

/// Equality as a query means it for a scalar or a whole document: numbers
/// equal across types, and `null` matches a missing field too.
fn eq(path: &Bson, v: &Bson) -> Result<Document> {
    check_value(v)?;
    Ok(match v {
        Bson::Null => doc! {"$in": [{"$type": path}, ["null", "missing", "undefined"]]},
        v => doc! {"$eq": [path, {"$literal": v.clone()}]},
    })
}

/// A range comparison as a query means it: only values of the same type
/// bracket compare (a string is not greater than 2, a missing field is not
/// less than it).
fn compare(path: &Bson, op: &str, v: &Bson) -> Result<Document> {
    check_value(v)?;
    let bracket = match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            doc! {"$isNumber": path}
        }
        Bson::String(_) => doc! {"$in": [{"$type": path}, ["string", "symbol"]]},
        Bson::DateTime(_) => doc! {"$eq": [{"$type": path}, "date"]},
        Bson::ObjectId(_) => doc! {"$eq": [{"$type": path}, "objectId"]},
        Bson::Boolean(_) => doc! {"$eq": [{"$type": path}, "bool"]},
        Bson::Timestamp(_) => doc! {"$eq": [{"$type": path}, "timestamp"]},
        _ => {
            return Err(Error::invalid(
                "matching",
                format!(
                    "`{op}` compares numbers, strings, dates, ObjectIds, booleans or timestamps"
                ),
            ))
        }
    };
    Ok(doc! {"$and": [bracket, {op: [path, {"$literal": v.clone()}]}]})
}

fn any_of(path: &Bson, op: &str, v: &Bson) -> Result<Document> {
    let Bson::Array(vs) = v else {
        return Err(Error::invalid("matching", format!("`{op}` takes an array")));
    };
    let terms = vs
        .iter()
        .map(|v| eq(path, v).map(Bson::Document))
        .collect::<Result<Vec<_>>>()?;
    Ok(doc! {"$or": terms})
}

/// Values whose query meaning is not equality: refused, not guessed.
fn check_value(v: &Bson) -> Result<()> {
    match v {
        Bson::RegularExpression(_) => Err(Error::invalid(
            "matching",
            "a regular expression matches by pattern, which `remove` and `update` do not support",
        )),
        Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => Err(Error::invalid(
            "matching",
            "JavaScript is not a value to compare",
        )),
        Bson::Array(_) => Err(Error::invalid(
            "matching",
            "an array value (a query would match it element by element); name a scalar",
        )),
        Bson::Document(d) => d.values().try_for_each(check_nested),
        _ => Ok(()),
    }
}

/// Inside a document compared whole, arrays compare whole too.
fn check_nested(v: &Bson) -> Result<()> {
    match v {
        Bson::Array(a) => a.iter().try_for_each(check_nested),
        Bson::Document(d) => d.values().try_for_each(check_nested),
        v => check_value(v),
    }
}

fn refused(op: &str) -> Error {
    Error::invalid(
        "matching",
        format!(
            "`{op}` is not supported here; use {} on item fields, combined with {}",
            FIELD_OPERATORS.join(" "),
            LOGICAL_OPERATORS.join(" ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: (&str, &Bson) = ("k", &Bson::Null);

    fn refusal(f: Document) -> String {
        match item_cond(&f, KEY) {
            Err(Error::InvalidArgument { reason, .. }) => reason,
            other => panic!("{f} gave {other:?}"),
        }
    }

    #[test]
    fn bucket_filters_outside_the_subset_are_refused() {
        for f in [
            doc! {},
            doc! {"n": {"$regex": "a"}},
            doc! {"n": {"$elemMatch": {"a": 1}}},
            doc! {"$where": "true"},
            doc! {"$expr": {"$eq": [1, 1]}},
            doc! {"n": {"$not": {"$gt": 1}}},
            doc! {"n": {"$size": 1}},
            doc! {"n": {"$type": "int"}},
            doc! {"n": {"$gt": 1, "a": 1}},
            doc! {"n": {"$in": 1}},
            doc! {"n": {"$gt": Bson::Null}},
            doc! {"n": [1, 2]},
            doc! {"$or": []},
            doc! {"$or": [{}]},
            doc! {"a..b": 1},
            doc! {"a.$b": 1},
            doc! {"n": {"$exists": 1}},
        ] {
            refusal(f);
        }
        assert!(refusal(doc! {"n": {"$foo": 1}}).contains("$foo"));
    }

    #[test]
    fn bucket_filters_translate_to_expressions() {
        let e = item_cond(&doc! {"n": {"$gt": 2}}, KEY).unwrap();
        assert_eq!(
            e,
            doc! {"$and": [{"$and": [{"$and": [{"$isNumber": "$$this.n"}, {"$gt": ["$$this.n", {"$literal": 2}]}]}]}]}
        );
        // The key field is not stored in items: its value stands in.
        let e = item_cond(&doc! {"k": 5}, ("k", &Bson::Int32(5))).unwrap();
        assert_eq!(
            e,
            doc! {"$and": [{"$eq": [{"$literal": 5}, {"$literal": 5}]}]}
        );
        // Deep nesting is refused, not recursed into without bound.
        let mut f = doc! {"n": 1};
        for _ in 0..40 {
            f = doc! {"$and": [f]};
        }
        refusal(f);
    }
}
