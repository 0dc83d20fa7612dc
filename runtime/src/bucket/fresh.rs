//! Reads that see no stale positions: a read that meets a mark finishes
//! what the write that set it left, under the key's lease, then reads
//! again.

use super::cx::outside_transaction;
use crate::action::Call;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{doc, Bson, RawBsonRef, RawDocumentBuf};

use super::stored::Head;
use super::{BucketPage, Bucketed, Buckets, PageRequest};
use crate::error::{Error, Result};

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::page`], in `cx`.
    pub(super) async fn page_in(
        &self,
        key_b: &Bson,
        req: PageRequest,
        cx: &mut Call<'_>,
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
        cx: &mut Call<'_>,
    ) -> Result<Option<BucketPage<T>>> {
        outside_transaction(cx, "repairing positions a removal left")?;
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

    /// [`Buckets::total`], in `cx`.
    pub(super) async fn total_in(&self, key_b: &Bson, cx: &mut Call<'_>) -> Result<u64> {
        Ok(self.fresh_head(key_b, cx).await?.total() as u64)
    }

    /// The newest bucket, with `start` recomputed first if a removal left
    /// it stale.
    pub(super) async fn fresh_head(&self, key: &Bson, cx: &mut Call<'_>) -> Result<Head> {
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
    async fn head_repaired(&self, key: &Bson, cx: &mut Call<'_>) -> Result<Head> {
        outside_transaction(cx, "repairing positions a removal left")?;
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

    /// [`Buckets::stream`], in `cx`: its session, if any, moves into the
    /// stream.
    pub(super) async fn stream_in<'a>(
        &'a self,
        key_b: Bson,
        cx: &mut Call<'a>,
    ) -> Result<BoxStream<'a, Result<T>>> {
        let find = self
            .reads
            .find(self.of_key(&key_b))
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
            let len = match bucket.get(self.spec.items) {
                Ok(Some(RawBsonRef::Array(a))) => Some(a.into_iter().count() as i64),
                _ => None,
            };
            self.check(&bucket, len)?;
            let items = self.items_of(&bucket, &key_b, i64::MAX)?;
            Ok::<_, Error>(futures::stream::iter(items.into_iter().map(Ok)))
        });
        Ok(items.try_flatten().boxed())
    }
}
