//! Reads: a key's newest bucket, pages cut by `start`, totals, streams,
//! and the recomputation of `start` that a read runs first when a removal
//! left positions stale.

use crate::action::Call;
use futures::TryStreamExt;
use mongodb::bson;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawArray, RawBsonRef, RawDocument, RawDocumentBuf};
use serde::Serialize;

mod keyed;
mod newest;

pub(crate) use keyed::with_key;
pub use keyed::{key_of, KeyInItem};

use newest::{PAGE, P_END, P_FROM};

use super::stored::{is_stale, raw_int, Head, LEN, NEXT, STALE, TYPE};
use super::{BucketPage, Bucketed, Buckets, PageRequest};
use crate::error::{Error, Result};
use crate::util::id_of;

/// Keys whose open bucket a repository remembers; past it, it forgets all.
const MAX_REMEMBERED: usize = 100_000;

impl<T: Bucketed> Buckets<T> {
    /// An error naming the first damaged bucket of `key`, if it has one.
    pub(super) async fn refuse_damaged(&self, key: &Bson) -> Result<()> {
        let mut filter = self.of_key(key);
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
    pub(super) fn refuse_found(&self, b: &RawDocumentBuf) -> Result<()> {
        self.head_of(b)?;
        Err(Error::damaged(
            self.coll.name(),
            id_of(b),
            "count",
            "does not agree with the bucket's items",
        ))
    }

    pub(super) fn remembered(&self, slot: &[u8]) -> Option<i64> {
        self.heads.lock().ok()?.get(slot).copied()
    }

    pub(super) fn remember(&self, slot: &[u8], seq: i64) {
        if let Ok(mut heads) = self.heads.lock() {
            if let Some(known) = heads.get_mut(slot) {
                *known = seq;
                return;
            }
            if heads.len() >= MAX_REMEMBERED {
                heads.clear();
            }
            heads.insert(slot.to_vec(), seq);
        }
    }

    /// The page, or `None` if a bucket it read was marked stale.
    pub(super) async fn page_once(
        &self,
        key: &Bson,
        req: PageRequest,
        cx: &mut Call<'_>,
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
        cx: &mut Call<'_>,
    ) -> Result<Head> {
        let mut newest = self.of_key(key);
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
        cx: &mut Call<'_>,
    ) -> Result<Option<Head>> {
        let find = self
            .reader(cx)
            .find_one(doc! {self.spec.key: key.clone(), "_id": {"k": key.clone(), "s": seq}})
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .projection(self.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        found.map(|d| self.head_of(&d)).transpose()
    }

    /// Items `[from, from + n)` of `key`, oldest first, in one aggregation;
    /// `None` if a bucket it read was marked stale.
    pub(super) async fn range(
        &self,
        key: &Bson,
        from: i64,
        n: i64,
        cx: &mut Call<'_>,
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
    fn reader(&self, cx: &Call<'_>) -> &mongodb::Collection<RawDocumentBuf> {
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
        cx: &mut Call<'_>,
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
    pub(super) fn items_of(&self, bucket: &RawDocument, key: &Bson, take: i64) -> Result<Vec<T>> {
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
}
