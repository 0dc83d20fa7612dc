//! Reads: a key's newest bucket, pages cut by `start`, totals, streams,
//! and the recomputation of `start` that a read runs first when a removal
//! left positions stale.

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mongodb::bson;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawArray, RawBsonRef, RawDocument, RawDocumentBuf};
use serde::Serialize;

mod keyed;
mod newest;

pub(crate) use keyed::with_key;
pub use keyed::{key_of, KeyInItem};

use newest::{PAGE, P_END, P_FROM};

use super::act::Cx;
use super::bookkeeping::{is_stale, raw_int};
use super::{
    BucketPage, Bucketed, Buckets, Head, PageRequest, HI, LEN, LO, MINE, NEXT, OPS_PATH, STALE,
    TYPE,
};
use crate::action::Options;
use crate::error::{Error, Result};
use crate::util::id_of;
use crate::util::id_range;

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::page`], in `cx`.
    pub(super) async fn page_in(
        &self,
        key_b: &Bson,
        req: PageRequest,
        cx: &mut Cx<'_>,
    ) -> Result<BucketPage<T>> {
        req.check()?;
        // A read that meets a removal's mark recomputes `start` and reads
        // again, once: a page is never cut by stale positions.
        let mut page = self.page_once(key_b, req, cx).await?;
        if page.is_none() {
            // Boxed, as every repair below: inline, it would make every
            // read's future too large for a small allocation.
            page = Box::pin(self.page_repaired(key_b, req, cx)).await?;
        }
        // Marked again at once: a removal is running on this key.
        page.ok_or(Error::Contended {
            operation: "page",
            attempts: 2,
        })
    }

    /// The page, read again after `start` is recomputed: `None` if the
    /// key was marked again meanwhile.
    async fn page_repaired(
        &self,
        key_b: &Bson,
        req: PageRequest,
        cx: &mut Cx<'_>,
    ) -> Result<Option<BucketPage<T>>> {
        cx.outside_transaction("repairing positions a removal left")?;
        // Under the lease, no write can mark the key again before the
        // page is read.
        let scoped = self.scoped(&cx.opts);
        let (scoped, cx) = (&scoped, &mut *cx);
        scoped
            .leased(key_b, |_| async move {
                scoped.finish_moves(key_b).await?;
                scoped.reindex_now(key_b, None).await?;
                self.page_once(key_b, req, cx).await
            })
            .await
    }

    /// The page, or `None` if a bucket it read was marked stale.
    async fn page_once(
        &self,
        key: &Bson,
        req: PageRequest,
        cx: &mut Cx<'_>,
    ) -> Result<Option<BucketPage<T>>> {
        let per = i64::from(req.per_page);
        let skip = (i64::from(req.page) - 1) * per;
        if !req.newest_first {
            // One more than the page, to know whether another follows.
            let Some(mut items) = self.range(key, skip, per + 1, cx).await? else {
                return Ok(None);
            };
            let has_more = items.len() as i64 > per;
            items.truncate(per as usize);
            return Ok(Some(BucketPage { items, has_more }));
        }
        // One aggregation: the newest bucket, for the total, and the page's
        // buckets, looked up from positions computed from it on the server.
        let docs = self
            .aggregate(self.newest_pipeline(key, skip, per), cx)
            .await?;
        // No document: the key has no bucket. Only its total is kept:
        // nothing else of it may stay in the read's future.
        let total = {
            let head = match docs.first() {
                Some(d) => self.head_of(d)?,
                None => Head::default(),
            };
            if head.stale {
                return Ok(None);
            }
            head.total()
        };
        let end = total - skip;
        if end <= 0 {
            return Ok(Some(BucketPage {
                items: Vec::new(),
                has_more: false,
            }));
        }
        let from = (end - per).max(0);
        let first = &docs[0];
        let agreed = raw_int(first, P_FROM) == Ok(from) && raw_int(first, P_END) == Ok(end);
        let buckets: Vec<&RawDocument> = docs
            .iter()
            .filter_map(|d| match d.get(PAGE) {
                Ok(Some(RawBsonRef::Document(b))) if b.get("_id").ok().flatten().is_some() => {
                    Some(b)
                }
                _ => None,
            })
            .collect();
        let items = if agreed && self.covers(&buckets, from, end)? {
            self.slices(buckets.into_iter(), key, end - from)?
        } else {
            // A shorter bucket lies between the page and the newest (a
            // removal, a close by bytes, a late item): read by position
            // (boxed: the second aggregation is the rarer path).
            Box::pin(self.range(key, from, end - from, cx)).await?
        };
        let Some(mut items) = items else {
            return Ok(None);
        };
        items.reverse();
        Ok(Some(BucketPage {
            items,
            has_more: from > 0,
        }))
    }

    /// [`Buckets::total`], in `cx`.
    pub(super) async fn total_in(&self, key_b: &Bson, cx: &mut Cx<'_>) -> Result<u64> {
        Ok(self.fresh_head(key_b, cx).await?.total() as u64)
    }

    /// The newest bucket, with `start` recomputed first if a removal left
    /// it stale.
    pub(super) async fn fresh_head(&self, key: &Bson, cx: &mut Cx<'_>) -> Result<Head> {
        let head = self.head(key, None, cx).await?;
        if !head.stale {
            return Ok(head);
        }
        // Boxed: inline, the repair would make every read's future too
        // large for a small allocation.
        Box::pin(self.head_repaired(key, cx)).await
    }

    /// The newest bucket, after `start` is recomputed under the key's
    /// lease.
    async fn head_repaired(&self, key: &Bson, cx: &mut Cx<'_>) -> Result<Head> {
        cx.outside_transaction("repairing positions a removal left")?;
        let scoped = self.scoped(&cx.opts);
        let scoped = &scoped;
        scoped
            .leased(key, |_| async move {
                scoped.finish_moves(key).await?;
                scoped.reindex_now(key, None).await?;
                self.head(key, None, cx).await
            })
            .await
    }

    /// [`Buckets::stream`] with options `opts`.
    pub(super) fn stream_in(
        &self,
        key_b: Result<Bson>,
        opts: Options,
    ) -> BoxStream<'static, Result<T>> {
        let this = self.scoped(&opts);
        futures::stream::once(async move {
            let key_b = key_b?;
            let cursor = this
                .reads
                .find(id_range("k", &key_b))
                .with_options(opts.driver::<mongodb::options::FindOptions>())
                .sort(doc! {"_id": 1})
                .await?;
            let items = cursor.map_err(Error::from).map(move |bucket| {
                let bucket = bucket?;
                let len = match bucket.get(this.spec.items) {
                    Ok(Some(RawBsonRef::Array(a))) => Some(a.into_iter().count() as i64),
                    _ => None,
                };
                this.check(&bucket, len)?;
                let items = this.items_of(&bucket, &key_b, i64::MAX)?;
                Ok::<_, Error>(futures::stream::iter(items.into_iter().map(Ok)))
            });
            Ok::<_, Error>(items.try_flatten())
        })
        .try_flatten()
        .boxed()
    }

    /// The aggregation a page sends: its only command, unless it meets
    /// positions a removal left stale. Newest first, it also reads the
    /// newest bucket, whose total places the page.
    pub fn page_pipeline<Q>(&self, key: &Q, req: PageRequest) -> Result<Vec<Document>>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        req.check()?;
        let key_b = self.key_bson(key)?;
        let per = i64::from(req.per_page);
        let skip = (i64::from(req.page) - 1) * per;
        Ok(if req.newest_first {
            self.newest_pipeline(&key_b, skip, per)
        } else {
            self.range_pipeline(&key_b, skip, per + 1)
        })
    }

    /// The key's newest bucket, not counting an empty one opened ahead: an
    /// indexed read of the `_id` range.
    /// `mine` says whether write `op` is among its last writes.
    pub(super) async fn head(
        &self,
        key: &Bson,
        op: Option<ObjectId>,
        cx: &mut Cx<'_>,
    ) -> Result<Head> {
        let mut newest = id_range("k", key);
        newest.insert(NEXT, doc! {"$ne": true});
        let find = self
            .reader(cx)
            .find_one(newest)
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .sort(doc! {"_id": -1})
            .projection(self.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        match found {
            Some(d) => self.head_of(&d),
            None => Ok(Head::default()),
        }
    }

    /// Bucket `seq` of `key`, by `_id`; `mine` says whether write `op` is
    /// among the bucket's last writes.
    pub(super) async fn bucket(
        &self,
        key: &Bson,
        seq: i64,
        op: Option<ObjectId>,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Head>> {
        let find = self
            .reader(cx)
            .find_one(doc! {"_id": {"k": key.clone(), "s": seq}})
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .projection(self.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        found.map(|d| self.head_of(&d)).transpose()
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

    /// Items `[from, from + n)` of `key`, oldest first, in one aggregation;
    /// `None` if a bucket it read was marked stale.
    pub(super) async fn range(
        &self,
        key: &Bson,
        from: i64,
        n: i64,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Vec<T>>> {
        // The page's one or two buckets, sliced.
        let buckets = self
            .aggregate(self.range_pipeline(key, from, n), cx)
            .await?;
        self.slices(buckets.iter().map(|b| &**b), key, n)
    }

    /// The first `n` items of buckets sliced by the server, in order; `None`
    /// if one of them was marked stale.
    fn slices<'a>(
        &self,
        buckets: impl Iterator<Item = &'a RawDocument>,
        key: &Bson,
        n: i64,
    ) -> Result<Option<Vec<T>>> {
        let mut out = Vec::with_capacity(n.min(4096) as usize);
        // The server sliced each bucket to the range already. Every bucket
        // it sends is checked, even past the page's end: a damaged one in
        // the range makes the page an error, never a page with a hole.
        let mut stale = false;
        for bucket in buckets {
            let len = raw_int(bucket, LEN).ok();
            self.check(bucket, len)?;
            stale |= is_stale(bucket);
            let want = n - out.len() as i64;
            if want > 0 && !stale {
                out.extend(self.items_of(bucket, key, want)?);
            }
        }
        Ok((!stale).then_some(out))
    }

    /// The handle `cx`'s reads go through: the caller's read preference
    /// for a read of the caller's, the primary's for everything else.
    fn reader(&self, cx: &Cx<'_>) -> &mongodb::Collection<RawDocumentBuf> {
        if cx.for_caller {
            &self.reads
        } else {
            &self.raw
        }
    }

    /// The documents `pipeline` returns, read in `cx`'s session if it has
    /// one.
    async fn aggregate(
        &self,
        pipeline: Vec<Document>,
        cx: &mut Cx<'_>,
    ) -> Result<Vec<RawDocumentBuf>> {
        let opts = cx.opts.driver::<mongodb::options::AggregateOptions>();
        // The cursor is boxed, and so is the read in a session: held
        // across an `.await`, either would make every read's future too
        // large for a small allocation.
        Ok(match cx.session.as_deref_mut() {
            Some(s) => Box::pin(self.aggregate_in(pipeline, opts, cx.for_caller, s)).await?,
            None => {
                let cursor = self.aggregate_cursor(pipeline, opts, cx.for_caller).await?;
                Box::new(cursor).try_collect().await?
            }
        })
    }

    /// The cursor of `pipeline`: the action is built and consumed here, in
    /// a function that is not `async`, so that the read's future holds
    /// only the driver's boxed future, not the action and its options.
    fn aggregate_cursor(
        &self,
        pipeline: Vec<Document>,
        opts: Option<mongodb::options::AggregateOptions>,
        for_caller: bool,
    ) -> impl std::future::Future<Output = mongodb::error::Result<mongodb::Cursor<RawDocumentBuf>>> + '_
    {
        use std::future::IntoFuture;
        let coll = if for_caller { &self.reads } else { &self.raw };
        coll.aggregate(pipeline)
            .with_options(opts)
            .with_type::<RawDocumentBuf>()
            .into_future()
    }

    async fn aggregate_in(
        &self,
        pipeline: Vec<Document>,
        opts: Option<mongodb::options::AggregateOptions>,
        for_caller: bool,
        s: &mut mongodb::ClientSession,
    ) -> Result<Vec<RawDocumentBuf>> {
        let coll = if for_caller { &self.reads } else { &self.raw };
        let agg = coll.aggregate(pipeline).with_options(opts);
        let mut cursor = agg.with_type::<RawDocumentBuf>().session(&mut *s).await?;
        let mut out = Vec::new();
        while let Some(b) = cursor.next(&mut *s).await {
            out.push(b?);
        }
        Ok(out)
    }

    fn range_pipeline(&self, key: &Bson, from: i64, n: i64) -> Vec<Document> {
        let size = self.cap();
        let items = &self.paths.items;
        vec![
            // A bucket holds at most `cap` items, so only buckets starting
            // in (from - size, from + n) can overlap: an index seek.
            // A bucket whose `start` is not a number is sent too (its index
            // keys sort apart from numbers), to be reported as damaged.
            doc! {"$match": {
                self.spec.key: key.clone(),
                "$or": [
                    {"start": {"$gt": from - size, "$lt": from + n}},
                    {"start": {"$not": {"$type": "number"}}},
                ],
            }},
            doc! {"$sort": {"start": 1, "_id": 1}},
            doc! {"$project": {
                "start": 1,
                "count": 1,
                STALE: 1,
                LEN: self.len_expr(),
                TYPE: {"$type": &items},
                // From the page's first item in this bucket, no further
                // than the page's end: two buckets return one page of items.
                self.spec.items: {"$cond": [
                    {"$and": [{"$isArray": [&items]}, {"$isNumber": "$start"}]},
                    {"$slice": [
                        &items,
                        {"$max": [0, {"$subtract": [from, "$start"]}]},
                        {"$subtract": [from + n, {"$max": [from, "$start"]}]},
                    ]},
                    Bson::Null,
                ]},
            }},
        ]
    }

    /// Up to `take` items of a bucket, typed, with the key put back.
    /// Errors name the bucket by its `_id`, and the item by its index in
    /// the array as sent (the page's slice for a page).
    fn items_of(&self, bucket: &RawDocument, key: &Bson, take: i64) -> Result<Vec<T>> {
        let take = take.max(0) as usize;
        // One pass over the bucket's bytes; on any error, again item by
        // item, to name the item and the problem.
        if let Ok(items) =
            keyed::items(bucket.as_bytes(), self.spec.items, self.spec.key, key, take)
        {
            return Ok(items);
        }
        let damaged = |field: String, problem: String| {
            Error::damaged(self.coll.name(), id_of(bucket), field, problem)
        };
        let arr: &RawArray = match bucket.get(self.spec.items) {
            Ok(Some(RawBsonRef::Array(a))) => a,
            _ => {
                return Err(damaged(
                    self.spec.items.to_owned(),
                    "is not an array".into(),
                ))
            }
        };
        let key_raw = bson::RawBson::try_from(key.clone())
            .map_err(|e| Error::invalid("key", e.to_string()))?;
        let mut out = Vec::new();
        for (i, el) in arr.into_iter().take(take).enumerate() {
            let field = || format!("{}.{i}", self.spec.items);
            let el = el.map_err(|e| damaged(field(), e.to_string()))?;
            let RawBsonRef::Document(d) = el else {
                return Err(damaged(
                    field(),
                    format!("is {:?}, not a document", el.element_type()),
                ));
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())
                .map_err(|e| damaged(field(), e.to_string()))?;
            crate::compat::append(&mut item, self.spec.key, key_raw.clone());
            out.push(
                crate::compat::from_slice(item.as_bytes()).map_err(|source| {
                    Error::UnexpectedDocument {
                        collection: self.coll.name().to_owned(),
                        id: Box::new(id_of(bucket)),
                        source,
                    }
                })?,
            );
        }
        Ok(out)
    }

    /// Recomputes `start` of the key's buckets from the counts before them,
    /// and clears a removal's mark. Refuses a key with a damaged bucket
    /// first: positions summed from a damaged count would be wrong for every
    /// later bucket. With `from`, writes only the buckets from that `_id` on
    /// (the others' positions did not change).
    pub(super) async fn reindex_now(&self, key: &Bson, from: Option<&Bson>) -> Result<()> {
        self.refuse_damaged(key).await?;
        // A bucket opened ahead assumes the one before fills to `size`,
        // which the sum below does not: it goes, and a push opens it again.
        let mut ahead = id_range("k", key);
        ahead.extend(doc! {NEXT: true, "count": 0});
        self.coll.delete_many(ahead).await?;
        let mut pipeline = vec![
            doc! {"$match": id_range("k", key)},
            doc! {"$setWindowFields": {
                "sortBy": {"_id": 1},
                "output": {"start": {"$sum": "$count", "window": {"documents": ["unbounded", -1]}}},
            }},
        ];
        if let Some(from) = from {
            pipeline.push(doc! {"$match": {"_id": {"$gte": from.clone()}}});
        }
        pipeline.extend([
            // Clears a removal's mark: positions are right again.
            doc! {"$project": {"start": 1, STALE: {"$literal": false}}},
            doc! {"$merge": {
                "into": self.coll.name(),
                "on": "_id",
                "whenMatched": "merge",
                "whenNotMatched": "discard",
            }},
        ]);
        // On the primary: `$merge` runs where the read does (a secondary
        // since 5.0), and would write `start` from a lagging copy.
        self.raw
            .aggregate(pipeline)
            .await?
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }
}
