//! Reads: a key's newest bucket, pages cut by `start`, totals and
//! streams. Positions are never stale: whatever moves them does so in one
//! transaction (see [`moves`](super::moves)), so every read sees them
//! before or after, whole.

use crate::action::Call;
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

use super::shape::{raw_int, Head, LEN, NEXT, TYPE};
use super::{BucketPage, Bucketed, Buckets, PageRequest};
use crate::error::{Error, Result};
use crate::util::id_of;

impl<T: Bucketed> Buckets<T> {
    /// An error naming the first damaged bucket of `key`, if it has one.
    pub(super) async fn refuse_damaged(&self, key: &Bson, cx: &mut Call<'_>) -> Result<()> {
        let find = self
            .raw
            .find_one(self.shape.damaged_of(key))
            .with_options(cx.read_options::<mongodb::options::FindOneOptions>())
            .sort(doc! {"_id": 1})
            .projection(self.shape.head_projection(None));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        match found {
            Some(b) => self.refuse_found(&b),
            None => Ok(()),
        }
    }

    /// The error naming damaged bucket `b`, as read.
    pub(super) fn refuse_found(&self, b: &RawDocumentBuf) -> Result<()> {
        self.shape.head_of(b)?;
        Err(self
            .shape
            .damaged(id_of(b), "count", "does not agree with the bucket's items"))
    }

    /// Where the key's open bucket was, as this handle last saw it.
    pub(super) fn remembered(&self, slot: &[u8]) -> Option<i64> {
        self.heads.get(slot).map(|(seq, _)| seq)
    }

    /// [`remembered`](Self::remembered), with how many items the bucket
    /// held at least when last seen (0: not known).
    pub(super) fn remembered_fill(&self, slot: &[u8]) -> Option<(i64, i64)> {
        self.heads.get(slot)
    }

    pub(super) fn remember(&self, slot: &[u8], seq: i64) {
        self.remember_fill(slot, seq, 0);
    }

    /// Bucket `seq` is the key's open one and holds at least `count`
    /// items. Only a hint for which command a push sends: the command's
    /// filter still decides, so a count gone stale (other writers,
    /// a removal) costs a round trip, never an item.
    pub(super) fn remember_fill(&self, slot: &[u8], seq: i64, count: i64) {
        self.heads.update(slot, |known| match known {
            Some(&(s, c)) if s == seq => (seq, c.max(count)),
            _ => (seq, count),
        });
    }

    /// [`Buckets::page`], in `cx`.
    pub(super) async fn page_in(
        &self,
        key: &Bson,
        req: PageRequest,
        cx: &mut Call<'_>,
    ) -> Result<BucketPage<T>> {
        req.check()?;
        let per = i64::from(req.page_size);
        let skip = (i64::from(req.page) - 1) * per;
        if !req.newest_first {
            // One more than the page, to know whether another follows.
            let mut items = self.range(key, skip, per + 1, cx).await?;
            let has_more = items.len() as i64 > per;
            items.truncate(per as usize);
            return Ok(BucketPage { items, has_more });
        }
        // One aggregation: the newest bucket, for the total, and the page's
        // buckets, looked up from positions computed from it on the server.
        let docs = self
            .aggregate(self.newest_pipeline(key, skip, per), cx)
            .await?;
        // No document: the key has no bucket. Only its total is kept:
        // nothing else of it may stay in the read's future.
        let total = match docs.first() {
            Some(d) => self.shape.head_of(d)?.total(),
            None => 0,
        };
        let end = total - skip;
        if end <= 0 {
            return Ok(BucketPage {
                items: Vec::new(),
                has_more: false,
            });
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
        let mut items = if agreed && self.covers(&buckets, from, end)? {
            self.slices(buckets.into_iter(), key, end - from)?
        } else {
            // A shorter bucket lies between the page and the newest (a
            // removal, a close by bytes, a late item): read by position
            // (boxed: the second aggregation is the rarer path).
            Box::pin(self.range(key, from, end - from, cx)).await?
        };
        items.reverse();
        Ok(BucketPage {
            items,
            has_more: from > 0,
        })
    }

    /// [`Buckets::total`], in `cx`.
    pub(super) async fn count_in(&self, key: &Bson, cx: &mut Call<'_>) -> Result<u64> {
        Ok(self.head(key, None, cx).await?.total() as u64)
    }

    /// [`Buckets::stream`], in `cx`: its session, if any, moves into the
    /// stream.
    pub(super) async fn stream_in<'a>(
        &'a self,
        key: Bson,
        cx: &mut Call<'a>,
    ) -> Result<BoxStream<'a, Result<T>>> {
        let find = self
            .reads
            .find(self.shape.of_key(&key))
            .with_options(cx.opts.driver::<mongodb::options::FindOptions>())
            .sort(doc! {"_id": 1});
        let buckets: BoxStream<'a, Result<RawDocumentBuf>> = match cx.session.take() {
            None => find.await?.map_err(Error::from).boxed(),
            // The session moves into the stream, which runs each
            // `getMore` in it.
            Some(s) => {
                let cursor = find.session(&mut *s).await?;
                futures::stream::unfold((cursor, s), |(mut cursor, s)| async move {
                    let next = cursor.next(s).await?;
                    Some((next.map_err(Error::from), (cursor, s)))
                })
                .boxed()
            }
        };
        let items = buckets.map(move |bucket| {
            let bucket = bucket?;
            let len = match bucket.get(self.shape.spec.items) {
                Ok(Some(RawBsonRef::Array(a))) => Some(a.into_iter().count() as i64),
                _ => None,
            };
            self.shape.check(&bucket, len)?;
            let items = self.items_of(&bucket, &key, i64::MAX)?;
            Ok::<_, Error>(futures::stream::iter(items.into_iter().map(Ok)))
        });
        Ok(items.try_flatten().boxed())
    }

    /// The aggregation a page sends: its only command, unless a shorter
    /// bucket lies between the page and the newest. Newest first, it also
    /// reads the newest bucket, whose total places the page.
    pub fn page_pipeline<Q>(&self, key: &Q, req: PageRequest) -> Result<Vec<Document>>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        req.check()?;
        let key_b = self.key_bson(key)?;
        let per = i64::from(req.page_size);
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
        let mut newest = self.shape.of_key(key);
        newest.insert(NEXT, doc! {"$ne": true});
        let find = self
            .reader(cx)
            .find_one(newest)
            .with_options(cx.read_options::<mongodb::options::FindOneOptions>())
            .sort(doc! {"_id": -1})
            .projection(self.shape.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        match found {
            Some(d) => self.shape.head_of(&d),
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
            .find_one(
                self.shape
                    .by_id(&super::shape::seq_id(key, Bson::Int64(seq))),
            )
            .with_options(cx.read_options::<mongodb::options::FindOneOptions>())
            .projection(self.shape.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        found.map(|d| self.shape.head_of(&d)).transpose()
    }

    /// Items `[from, from + n)` of `key`, oldest first, in one aggregation.
    pub(super) async fn range(
        &self,
        key: &Bson,
        from: i64,
        n: i64,
        cx: &mut Call<'_>,
    ) -> Result<Vec<T>> {
        // The page's one or two buckets, sliced.
        let buckets = self
            .aggregate(self.range_pipeline(key, from, n), cx)
            .await?;
        self.slices(buckets.iter().map(|b| &**b), key, n)
    }

    /// The first `n` items of buckets sliced by the server, in order.
    fn slices<'a>(
        &self,
        buckets: impl Iterator<Item = &'a RawDocument>,
        key: &Bson,
        n: i64,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(n.min(4096) as usize);
        // The server sliced each bucket to the range already. Every bucket
        // it sends is checked, even past the page's end: a damaged one in
        // the range makes the page an error, never a page with a hole.
        for bucket in buckets {
            self.shape.check(bucket, raw_int(bucket, LEN).ok())?;
            let want = n - out.len() as i64;
            if want > 0 {
                out.extend(self.items_of(bucket, key, want)?);
            }
        }
        Ok(out)
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
    pub(super) async fn aggregate(
        &self,
        pipeline: Vec<Document>,
        cx: &mut Call<'_>,
    ) -> Result<Vec<RawDocumentBuf>> {
        let opts = cx.read_options::<mongodb::options::AggregateOptions>();
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
        let size = self.shape.cap();
        let items = self.shape.items_path();
        vec![
            // A bucket holds at most `cap` items, so only buckets starting
            // in (from - size, from + n) can overlap: an index seek.
            // A bucket whose `start` is not a number is sent too (its index
            // keys sort apart from numbers), to be reported as damaged.
            doc! {"$match": {
                self.shape.spec.key: key.clone(),
                "$or": [
                    {"start": {"$gt": from - size, "$lt": from + n}},
                    {"start": {"$not": {"$type": "number"}}},
                ],
            }},
            doc! {"$sort": {"start": 1, "_id": 1}},
            doc! {"$project": {
                "start": 1,
                "count": 1,
                LEN: self.shape.len_expr(),
                TYPE: {"$type": items},
                // From the page's first item in this bucket, no further
                // than the page's end: two buckets return one page of items.
                self.shape.spec.items: {"$cond": [
                    {"$and": [{"$isArray": [items]}, {"$isNumber": "$start"}]},
                    {"$slice": [
                        items,
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
        if let Ok(items) = keyed::items(
            bucket.as_bytes(),
            self.shape.spec.items,
            self.shape.spec.key,
            key,
            take,
        ) {
            return Ok(items);
        }
        let damaged =
            |field: String, problem: String| self.shape.damaged(id_of(bucket), &field, problem);
        let arr: &RawArray = match bucket.get(self.shape.spec.items) {
            Ok(Some(RawBsonRef::Array(a))) => a,
            _ => {
                return Err(damaged(
                    self.shape.spec.items.to_owned(),
                    "is not an array".into(),
                ))
            }
        };
        let key_raw = bson::RawBson::try_from(key.clone())
            .map_err(|e| Error::invalid("key", e.to_string()))?;
        let mut out = Vec::new();
        for (i, el) in arr.into_iter().take(take).enumerate() {
            let field = || format!("{}.{i}", self.shape.spec.items);
            let el = el.map_err(|e| damaged(field(), e.to_string()))?;
            let RawBsonRef::Document(d) = el else {
                return Err(damaged(
                    field(),
                    format!("is {:?}, not a document", el.element_type()),
                ));
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())
                .map_err(|e| damaged(field(), e.to_string()))?;
            crate::compat::append(&mut item, self.shape.spec.key, key_raw.clone());
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
