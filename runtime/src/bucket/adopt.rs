//! `adopt_from`: a flat collection (one document per item) copied into
//! the bucket layout on the server, a batch of keys at a time.
//!
//! Each batch is one aggregation over the source ending in `$merge`: the
//! batch's items numbered per key in `order` (then `_id`) by
//! `$setWindowFields`, grouped `size` at a time into the buckets a
//! `push_many` of the key would write (same `_id`s, `start`s, `count`,
//! `bytes`, floors, every bucket but the last closed), merged on the
//! document key (`_id`, and the shard key on a sharded collection).
//! The buckets depend only on the source, so a batch run again writes the
//! same documents: a cut call is finished by calling it again. Every
//! bucket it writes carries [`ADOPTED`] alone as its write ids; a key
//! with any bucket not so marked (written by the repository since) is
//! refused before the batch writes, so adopting again never overwrites
//! pushes.

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};

use super::shape::{FLOOR, OPS};
use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::action::Call;
use crate::error::{Error, Result};
use crate::progress::{OnProgress, Progress};
use crate::util::id_of;

/// The write id of every bucket `adopt_from` writes (`mp_ops: [ADOPTED]`):
/// a bucket holding anything else has been written by the repository.
pub(super) const ADOPTED: ObjectId = ObjectId::from_bytes(*b"mp_adopted\0\x01");

/// Keys one read of the source's keys takes: memory holds no more.
const KEYS_A_ROUND: i64 = 1_000;

/// Items one `$merge` takes by default (a key with more goes alone).
pub(super) const ITEMS_A_BATCH: u64 = 50_000;

/// What the caller set on [`Adopt`](super::Adopt).
pub(super) struct AdoptArgs {
    pub(super) source: String,
    pub(super) only: Option<Document>,
    pub(super) batch: u64,
    pub(super) progress: Option<OnProgress>,
}

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::adopt_from`], in `cx`.
    pub(super) async fn adopt_in(&self, mut a: AdoptArgs, cx: &mut Call<'_>) -> Result<u64> {
        if cx.txn {
            return Err(Error::invalid(
                "session",
                "`adopt_from` writes with `$merge`, which a transaction refuses: call it outside one",
            ));
        }
        let started = Instant::now();
        let key = self.shape.spec.key;
        let source = self.db.collection::<RawDocumentBuf>(&a.source);
        let has_key = doc! {key: {"$ne": Bson::Null}};
        let keep_id = self.keeps_id(&source, &has_key).await?;
        let of = self.adopt_total(&source, &has_key, a.only.as_ref()).await?;
        let mut done = 0u64;
        let mut last: Option<Bson> = None;
        loop {
            let round = self
                .adopt_keys(&source, &has_key, a.only.as_ref(), last.as_ref())
                .await?;
            let Some((k, _)) = round.last() else {
                return Ok(done);
            };
            last = Some(k.clone());
            let mut batch: Vec<(Bson, u64)> = Vec::new();
            let mut items = 0;
            for (k, n) in round {
                if !batch.is_empty() && items + n > a.batch {
                    done += self.adopt_batch(&source, &batch, keep_id, cx).await?;
                    report(&mut a.progress, done, of, started);
                    (batch, items) = (Vec::new(), 0);
                }
                items += n;
                batch.push((k, n));
            }
            done += self.adopt_batch(&source, &batch, keep_id, cx).await?;
            report(&mut a.progress, done, of, started);
        }
    }

    /// Whether items keep their `_id`: whether the model, as it decodes a
    /// source document and serializes it again, has one. The first
    /// document is decoded as the model, which also refuses a source that
    /// does not hold the model's items before anything is written.
    async fn keeps_id(
        &self,
        source: &mongodb::Collection<RawDocumentBuf>,
        has_key: &Document,
    ) -> Result<bool> {
        let Some(first) = source.find_one(has_key.clone()).await? else {
            return Ok(false);
        };
        let item: T =
            crate::compat::from_slice(first.as_bytes()).map_err(|e| Error::UnexpectedDocument {
                collection: source.name().to_owned(),
                id: Box::new(id_of(&first)),
                source: e,
            })?;
        Ok(crate::compat::to_document(&item)?.contains_key("_id"))
    }

    /// Items to adopt: those with a key; with `only`, those of the keys
    /// that have an item matching it.
    async fn adopt_total(
        &self,
        source: &mongodb::Collection<RawDocumentBuf>,
        has_key: &Document,
        only: Option<&Document>,
    ) -> Result<u64> {
        let Some(only) = only else {
            return Ok(source.count_documents(has_key.clone()).await?);
        };
        let key = self.shape.spec.key;
        let pipeline = vec![
            doc! {"$match": {"$and": [has_key, only]}},
            doc! {"$group": {"_id": format!("${key}")}},
            doc! {"$lookup": {
                "from": source.name(), "localField": "_id", "foreignField": key,
                "pipeline": [{"$count": "n"}], "as": "m",
            }},
            doc! {"$group": {"_id": Bson::Null, "n": {"$sum": {"$first": "$m.n"}}}},
        ];
        let got: Vec<RawDocumentBuf> = source
            .aggregate(pipeline)
            .with_type::<RawDocumentBuf>()
            .await?
            .try_collect()
            .await?;
        Ok(got
            .first()
            .and_then(|d| super::shape::raw_int(d, "n").ok())
            .map_or(0, |n| n.max(0) as u64))
    }

    /// The next [`KEYS_A_ROUND`] keys after `last`, in BSON order (compared
    /// by an expression, across types as the sort does), each with its
    /// number of items.
    async fn adopt_keys(
        &self,
        source: &mongodb::Collection<RawDocumentBuf>,
        has_key: &Document,
        only: Option<&Document>,
        last: Option<&Bson>,
    ) -> Result<Vec<(Bson, u64)>> {
        let key = self.shape.spec.key;
        let filter = match only {
            Some(only) => doc! {"$and": [has_key, only]},
            None => has_key.clone(),
        };
        let mut pipeline = vec![
            doc! {"$match": filter},
            doc! {"$group": {"_id": format!("${key}"), "n": {"$sum": 1}}},
        ];
        if let Some(l) = last {
            pipeline.push(doc! {"$match": {"$expr": {"$gt": ["$_id", {"$literal": l}]}}});
        }
        pipeline.push(doc! {"$sort": {"_id": 1}});
        pipeline.push(doc! {"$limit": KEYS_A_ROUND});
        let got: Vec<RawDocumentBuf> = source
            .aggregate(pipeline)
            .with_type::<RawDocumentBuf>()
            .allow_disk_use(true)
            .await?
            .try_collect()
            .await?;
        let mut keys: Vec<(Bson, u64)> = got
            .iter()
            .map(|d| (id_of(d), super::shape::raw_int(d, "n").unwrap_or(0) as u64))
            .collect();
        if only.is_some() && !keys.is_empty() {
            // Counted above are the matching items; the key's buckets hold
            // them all.
            let ks: Vec<Bson> = keys.iter().map(|(k, _)| k.clone()).collect();
            let pipeline = vec![
                doc! {"$match": {key: {"$in": ks}}},
                doc! {"$group": {"_id": format!("${key}"), "n": {"$sum": 1}}},
            ];
            let all: Vec<RawDocumentBuf> = source
                .aggregate(pipeline)
                .with_type::<RawDocumentBuf>()
                .await?
                .try_collect()
                .await?;
            for (k, n) in &mut keys {
                *n = all
                    .iter()
                    .find(|d| id_of(d) == *k)
                    .and_then(|d| super::shape::raw_int(d, "n").ok())
                    .unwrap_or(0) as u64;
            }
        }
        Ok(keys)
    }

    /// One batch: refuses a key the repository has written to, merges the
    /// keys' buckets, removes buckets of an earlier adoption past the
    /// keys' ends (the source lost items since). Returns its items.
    async fn adopt_batch(
        &self,
        source: &mongodb::Collection<RawDocumentBuf>,
        batch: &[(Bson, u64)],
        keep_id: bool,
        cx: &mut Call<'_>,
    ) -> Result<u64> {
        if batch.is_empty() {
            return Ok(0);
        }
        let key = self.shape.spec.key;
        let keys: Vec<Bson> = batch.iter().map(|(k, _)| k.clone()).collect();
        // The keys' buckets by the `{key, start}` index, then the few
        // with another write id, grouped: the lowest such key is named.
        let check = vec![
            doc! {"$match": {key: {"$in": &keys}}},
            doc! {"$match": {"$expr": {"$ne": [format!("${OPS}"), [ADOPTED]]}}},
            doc! {"$group": {"_id": format!("${key}")}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$limit": 1},
        ];
        let written: Vec<RawDocumentBuf> = self
            .raw
            .aggregate(check)
            .with_type::<RawDocumentBuf>()
            .await?
            .try_collect()
            .await?;
        if let Some(b) = written.first() {
            return Err(Error::AlreadyBucketed {
                collection: self.coll.name().to_owned(),
                key: Box::new(id_of(b)),
            });
        }
        let pipeline = self.adopt_pipeline(keys.clone(), keep_id);
        let mut opts = cx
            .opts
            .driver::<mongodb::options::AggregateOptions>()
            .unwrap_or_default();
        opts.allow_disk_use = Some(true);
        let merged = source.aggregate(pipeline).with_options(opts).await;
        merged
            .map_err(|e| self.too_large(e))?
            .try_collect::<Vec<_>>()
            .await?;
        let stale: Vec<Document> = batch
            .iter()
            .map(|(k, n)| doc! {key: k.clone(), "start": {"$gte": *n as i64}})
            .collect();
        self.coll
            .delete_many(doc! {key: {"$in": &keys}, OPS: [ADOPTED], "$or": stale})
            .with_options(cx.opts.driver::<mongodb::options::DeleteOptions>())
            .await?;
        Ok(batch.iter().map(|(_, n)| n).sum())
    }

    /// The aggregation that writes `keys`' buckets: see the module docs.
    fn adopt_pipeline(&self, keys: Vec<Bson>, keep_id: bool) -> Vec<Document> {
        let spec = self.shape.spec;
        let (key, items) = (spec.key, spec.items);
        let size = i64::from(spec.size);
        let mut sort = Document::new();
        if let Some(order) = spec.order {
            sort.insert(order, 1);
        }
        sort.insert("_id", 1);
        let mut unset = vec![format!("mp_i.{key}"), "mp_i.mp_adopt_n".to_owned()];
        if !keep_id {
            unset.push("mp_i._id".to_owned());
        }
        let mut group = doc! {
            "_id": {"k": "$mp_k", "s": "$mp_s"},
            "items": {"$push": "$mp_i"},
            "count": {"$sum": 1},
            "bytes": {"$sum": {"$add": [{"$bsonSize": "$mp_i"}, 8]}},
        };
        let mut windows = doc! {"mp_nb": {"$count": {}}};
        if let Some(order) = spec.order {
            group.insert("hi", doc! {"$last": format!("$mp_i.{order}")});
            windows.insert("mp_floor", doc! {"$shift": {"output": "$hi", "by": -1}});
        }
        // The bucket as `Shape::new_bucket` lays it out, field for field.
        let mut bucket = doc! {
            "_id": {"k": "$_id.k", "s": "$_id.s"},
            key: "$_id.k",
            "start": {"$multiply": ["$_id.s", size]},
            "count": {"$toLong": "$count"},
            "bytes": {"$toLong": "$bytes"},
            items: "$items",
            OPS: {"$literal": [ADOPTED]},
        };
        if spec.order.is_some() {
            bucket.insert(
                FLOOR,
                doc! {"$cond": [{"$gt": ["$_id.s", 0]}, "$mp_floor", "$$REMOVE"]},
            );
        }
        bucket.insert(
            "sealed",
            doc! {"$cond": [{"$lt": ["$_id.s", {"$subtract": ["$mp_nb", 1]}]}, true, "$$REMOVE"]},
        );
        vec![
            doc! {"$match": {key: {"$in": keys}}},
            doc! {"$setWindowFields": {
                "partitionBy": format!("${key}"),
                "sortBy": sort,
                "output": {"mp_adopt_n": {"$documentNumber": {}}},
            }},
            doc! {"$replaceWith": {
                "mp_k": format!("${key}"),
                "mp_s": {"$toLong": {"$floor": {"$divide": [{"$subtract": ["$mp_adopt_n", 1]}, size]}}},
                "mp_n": "$mp_adopt_n",
                "mp_i": "$$ROOT",
            }},
            doc! {"$unset": unset},
            doc! {"$sort": {"mp_k": 1, "mp_n": 1}},
            doc! {"$group": group},
            doc! {"$setWindowFields": {
                "partitionBy": "$_id.k",
                "sortBy": {"_id.s": 1},
                "output": windows,
            }},
            // A bucket over the byte limit fails the batch before it is
            // written: `$toLong` of a string that is no number.
            doc! {"$set": {"bytes": {"$cond": [
                {"$gt": ["$bytes", MAX_BUCKET_BYTES]},
                {"$toLong": "mp_bucket_too_large"},
                "$bytes",
            ]}}},
            doc! {"$replaceWith": bucket},
            // No `on`: on a sharded collection the default is the document
            // key (`_id` and the shard key), which `mongos` needs and which
            // takes no unique index of its own; an explicit `["_id", key]`
            // would (SERVER-114730), and `_id` alone is refused there.
            doc! {"$merge": {
                "into": self.coll.name(),
                "whenMatched": "replace",
                "whenNotMatched": "insert",
            }},
        ]
    }

    /// The server's refusal of a bucket over the byte limit, as
    /// [`Error::DocumentTooLarge`]; any other error as it is.
    fn too_large(&self, e: mongodb::error::Error) -> Error {
        if e.to_string().contains("mp_bucket_too_large") {
            return Error::DocumentTooLarge {
                bytes: None,
                source: Some(Box::new(e)),
            };
        }
        e.into()
    }
}

/// Tells `progress`, if any, that `done` of `of` are done.
pub(super) fn report(progress: &mut Option<OnProgress>, done: u64, of: u64, started: Instant) {
    if let Some(f) = progress.as_mut() {
        f(Progress::new(done, of.max(done), started.elapsed()));
    }
}
