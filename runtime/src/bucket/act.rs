//! The repository's operations as actions: configured by setters, run by
//! `.await`. `page_pipeline` stays a plain method: it sends nothing, so no
//! option could apply; `declared` likewise.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use mongodb::bson::{Bson, Document};
use mongodb::ClientSession;

use super::adopt::{AdoptArgs, ITEMS_A_BATCH};
use super::edit::Delete as Removal;
use super::moves::Reindex as Recount;
use super::rebucket::{check_from, Rebucket as Rewrite, Rebucketed, MAX_ITEMS};
use super::shape::{item_len, Pushed};
use super::{BucketPage, Bucketed, Buckets, PageRequest};
use crate::action::{action, Call, Given};
use crate::error::{Error, Result};
use crate::util::key_bytes;

impl<T> crate::action::Repository for Buckets<T> {
    const PATTERN: &'static str = "bucket";

    fn defaults(&self) -> &crate::action::Options {
        &self.defaults
    }

    fn collection_name(&self) -> &str {
        self.coll.name()
    }
}

action! {
    /// [`Buckets::push`]: one `update` on the hot path.
    Push<'a, T: Bucketed> on Buckets, "push", write, guarded;
    { item: &'a T } -> ();
    |this, cx| this.repo.push_in(this.item, &mut cx).await
}

action! {
    /// [`Buckets::push_many`].
    PushMany<'a, T: Bucketed> on Buckets, "push_many", write, guarded;
    { items: &'a [T] } -> ();
    |this, cx| this.repo.push_groups(this.items, &mut cx).await
}

action! {
    /// [`Buckets::page`].
    FetchPage<'a, T: Bucketed> on Buckets, "page", read;
    { key: Result<Bson>, req: PageRequest } -> BucketPage<T>;
    |this, cx| this.repo.page_in(&this.key?, this.req, &mut cx).await
}

action! {
    /// [`Buckets::count`].
    Count<'a, T: Bucketed> on Buckets, "count", read;
    { key: Result<Bson> } -> u64;
    |this, cx| this.repo.count_in(&this.key?, &mut cx).await
}

action! {
    /// [`Buckets::reindex`].
    Reindex<'a, T: Bucketed> on Buckets, "reindex", both;
    { key: Result<Bson> } -> ();
    |this, cx| this.repo.moved(Recount { key: this.key? }, &mut cx).await.map(drop)
}

action! {
    /// [`Buckets::delete`].
    Delete<'a, T: Bucketed> on Buckets, "delete", both;
    { key: Result<Bson>, matching: Document } -> u64;
    |this, cx| {
        let removal = Removal::new(this.key?, &this.matching, this.repo.shape.spec.key)?;
        this.repo.moved(removal, &mut cx).await
    }
}

action! {
    /// [`Buckets::delete_before`].
    DeleteBefore<'a, T: Bucketed> on Buckets, "delete_before", both;
    { key: Result<Bson>, cutoff: Bson } -> u64;
    |this, cx| {
        let order = this.repo.order_for("delete_before")?;
        let key_field = this.repo.shape.spec.key;
        let removal = Removal::before(this.key?, order, this.cutoff, key_field)?;
        this.repo.moved(removal, &mut cx).await
    }
}

action! {
    /// [`Buckets::delete_all_before`].
    DeleteAllBefore<'a, T: Bucketed> on Buckets, "delete_all_before", both;
    { cutoff: Bson } -> u64;
    |this, cx| this.repo.delete_all_before_in(this.cutoff, &mut cx).await
}

action! {
    /// [`Buckets::replace`].
    Replace<'a, T: Bucketed> on Buckets, "replace", both, guarded;
    { key: Result<Bson>, matching: Document, item: &'a T } -> bool;
    |this, cx| this.repo.update_in(&this.key?, this.matching, this.item, &mut cx).await
}

action! {
    /// [`Buckets::adopt_from`]: a flat collection copied into buckets, a
    /// batch of keys at a time.
    Adopt<'a, T: Bucketed> on Buckets, "adopt_from", write;
    { args: AdoptArgs } -> u64;
    |this, cx| this.repo.adopt_in(this.args, &mut cx).await
}

action! {
    /// [`Buckets::rebucket`]: `items_from`, `max_items`.
    Rebucket<'a, T: Bucketed> on Buckets, "rebucket", both;
    { key: Result<Bson>, from: Option<String>, max_items: u64 } -> u64;
    |this, cx| {
        check_from(&this.repo.shape, this.from.as_deref())?;
        let rewrite = Rewrite { key: this.key?, from: this.from, max_items: this.max_items };
        Ok(this.repo.rebucket_key(rewrite, &mut cx).await?.items)
    }
}

impl<'a, T: Bucketed + Send + Sync + 'a> Rebucket<'a, T> {
    /// The name the items were stored under before `items` was renamed:
    /// each bucket's items are read from it (and from the declared name,
    /// after them, where another writer already wrote there; the
    /// repository's own pushes refuse such a bucket), and the new buckets
    /// hold them under the declared name only.
    pub fn items_from(mut self, old: &str) -> Self {
        self.from = Some(old.to_owned());
        self
    }

    /// The most items one move of the whole key holds in memory and
    /// writes in one transaction (100,000 by default). A key of more is
    /// found out as soon as its buckets' counts pass it, before the rest
    /// is read, and is moved bucket by bucket instead (see
    /// [`Buckets::rebucket`]); one whose buckets must be sorted across is
    /// refused with [`Error::KeyTooLarge`], nothing written.
    pub fn max_items(mut self, n: u64) -> Self {
        self.max_items = n;
        self
    }
}

action! {
    /// [`Buckets::rebucket_all`]: every key the declaration refuses or
    /// finds out of order, one transaction each; `on_progress`,
    /// `items_from`, `max_items`.
    RebucketAll<'a, T: Bucketed> on Buckets, "rebucket_all", both;
    { progress: Option<crate::progress::OnProgress>, from: Option<String>, max_items: u64 } -> Rebucketed;
    |this, cx| this.repo.rebucket_all_in(this.progress, this.from, this.max_items, &mut cx).await
}

impl<'a, T: Bucketed + Send + Sync + 'a> RebucketAll<'a, T> {
    /// Called after each round of up to 1,000 keys with the keys done, of
    /// how many (counted when the call began), and the time so far.
    pub fn on_progress(
        mut self,
        f: impl FnMut(crate::progress::Progress) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The name the items were stored under before `items` was renamed:
    /// every key with a bucket holding it is moved too (see
    /// [`Rebucket::items_from`]).
    pub fn items_from(mut self, old: &str) -> Self {
        self.from = Some(old.to_owned());
        self
    }

    /// The most items one move of a whole key holds (100,000 by
    /// default): a key of more is moved bucket by bucket, or, when its
    /// buckets must be sorted across, left as it is and named in
    /// [`Rebucketed::too_large`] (see [`Rebucket::max_items`]).
    pub fn max_items(mut self, n: u64) -> Self {
        self.max_items = n;
        self
    }
}

impl<'a, T: Bucketed + Send + Sync + 'a> Adopt<'a, T> {
    /// Called after each batch with the items done, of how many (counted
    /// when the call began), and the time so far: for a log line or a
    /// progress bar.
    pub fn on_progress(
        mut self,
        f: impl FnMut(crate::progress::Progress) + Send + Sync + 'static,
    ) -> Self {
        self.args.progress = Some(Box::new(f));
        self
    }

    /// Adopts only the keys that have an item matching `filter` (a query
    /// on the source), each with all its items: the catch-up pass of a
    /// switch-over, for the keys written to during the first (see the
    /// [guide](crate::guide#on-live-data)).
    pub fn only_keys_of(mut self, filter: Document) -> Self {
        self.args.only = Some(filter);
        self
    }

    /// Items one `$merge` takes, 50,000 by default (a key with more goes
    /// alone): the server holds a batch's items to sort and group them,
    /// and progress is reported after each.
    pub fn batch_items(mut self, n: u64) -> Self {
        self.args.batch = n.max(1);
        self
    }
}

/// [`Buckets::stream`]: every item of a key, oldest first. Read options
/// and `session` apply; given a session, the stream borrows it until
/// dropped (its cursor's `getMore`s run in it).
#[must_use = "streams do nothing unless polled"]
pub struct ItemStream<'a, T> {
    repo: &'a Buckets<T>,
    key: Option<Result<Bson>>,
    options: Given,
    session: Option<&'a mut ClientSession>,
    inner: Option<BoxStream<'a, Result<T>>>,
    /// The stream's span, from its first poll.
    span: tracing::Span,
}

impl<'a, T: Bucketed> ItemStream<'a, T> {
    pub(super) fn new(repo: &'a Buckets<T>, key: Result<Bson>) -> Self {
        ItemStream {
            repo,
            key: Some(key),
            options: Given::default(),
            session: None,
            inner: None,
            span: tracing::Span::none(),
        }
    }

    crate::action::setters!('a; read);
}

impl<'a, T: Bucketed> Stream for ItemStream<'a, T> {
    type Item = Result<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<T>>> {
        // Every field is Unpin (the inner stream is boxed).
        let this = &mut *self;
        if this.inner.is_none() {
            let key = this
                .key
                .take()
                .unwrap_or_else(|| Err(Error::invalid("stream", "polled after its end")));
            let (repo, options, session) = (
                this.repo,
                std::mem::take(&mut this.options),
                this.session.take(),
            );
            this.span = crate::action::span("bucket", "stream", repo.coll.name());
            let items = futures::stream::once(async move {
                let mut cx = Call::new(&repo.defaults, options, session, true).await;
                repo.stream_in(key?, &mut cx).await
            });
            this.inner = Some(items.try_flatten().boxed());
        }
        // Every poll in the span: the cursor's `aggregate`, then each
        // `getMore`.
        let _in = this.span.enter();
        match this.inner.as_mut() {
            Some(s) => s.as_mut().poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::push`], in `cx`: through its key's queue, or alone.
    async fn push_in(&self, item: &T, cx: &mut Call<'_>) -> Result<()> {
        let key = self.key_bson(item.bucket_key())?;
        let doc = self.item_doc(item)?;
        // Boxed: a push's future holds it across every `.await`.
        let p = Box::new(Pushed {
            len: item_len(&doc)?,
            slot: key_bytes(&key),
            key,
            doc,
            // One id for every attempt: once one is applied, no other can be.
            op: mongodb::bson::oid::ObjectId::new(),
        });
        if self.queues(cx) {
            return Box::pin(self.push_queued(p)).await;
        }
        self.push_one(&p, cx).await
    }

    /// Appends `item` to its key's open bucket, opening the next bucket when
    /// the open one is full.
    ///
    /// For a model without `order`, a push is one `findAndModify` of the
    /// key's open bucket as last seen and the few after it, which the
    /// server resolves to the lowest one still open (one round trip). The
    /// push that lands first in a bucket also opens the next one, empty (a
    /// key's first bucket at half), and reads the bucket before to check
    /// its own `start`: 1 + 2/`size` round trips, and writers racing at a
    /// rollover land in the bucket opened ahead. A key this repository has
    /// not seen starts with the insert of its first bucket (the whole push
    /// for a new key) and moves on to an indexed read of the newest. With
    /// `order`, in a transaction, or after a bucket closed by bytes, a push
    /// is an `update` of the open bucket by `_id`, and, once every `size`
    /// pushes, a `find` of the full bucket, an `update` closing it by a
    /// filter naming its `count` and `start` (with `order`; without, only
    /// a bucket closed short), and an `insert` of the next. Clones share
    /// what the repository remembers.
    ///
    /// A late item (with `order`, below the last bucket's floor, as items
    /// dated at the call by racing tasks or processes are at a rollover):
    /// into the last bucket in one update when it belongs there (up to
    /// twice `size` items); otherwise into the bucket that covers its
    /// value, with every later bucket's `start` moved, in one transaction
    /// (four round trips near the end; a split adds two to four). See the
    /// module docs, and [`Error::NoTransactions`] on a standalone server.
    ///
    /// In a caller's session every command runs in it. Inside the caller's
    /// transaction the same commands join it, late items included; a race
    /// that a push would retry (its insert of the next bucket losing to
    /// another writer's, its bucket changing under it, a write conflict)
    /// is returned with the `TransientTransactionError` label instead, for
    /// `and_run2` to run the transaction again. What the repository
    /// remembers of the open bucket is only a hint that every write's
    /// filter checks: after an aborted transaction it costs one `find`
    /// more, never a wrong write.
    ///
    /// Many tasks on one key: pushes through clones of one repository with
    /// no session and no options of their own queue per key while a
    /// command for that key is out, and what queued goes in one update
    /// when it returns (sorted by `order`, if any; a batch the open bucket
    /// cannot take whole goes in up to three updates): a push then costs
    /// well under one round trip, and a key takes more pushes per second
    /// from many tasks than from one. A push still returns only once its
    /// item is stored, and its item is stored once even if the caller stops
    /// waiting.
    ///
    /// Bounded: lost races are retried for at most 120 s, and a
    /// transaction of the push's own runs for at most 120 s more (the
    /// driver's convenient API); then [`Error::Contended`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database, trade: Trade) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// trades.push(&trade).await?; // one update on the hot path
    /// # Ok(()) }
    /// ```
    pub fn push<'a>(&'a self, item: &'a T) -> Push<'a, T> {
        Push::new(self, item)
    }

    /// Appends `items`, each to its own key's buckets (the key is read from
    /// the item, as [`push`](Self::push) reads it): per key, in the order
    /// given (sorted by `order`, if any), it fills the open bucket, then
    /// writes new full buckets with one `insert`. Two or three round trips
    /// a key, however many items; keys go one after another, in the order
    /// they first appear. An error stops the call: the keys before it are
    /// stored, and of the failing key's items a prefix (see the module
    /// docs). Items below the key's last bucket go one by one, as late
    /// pushes do (each one transaction). In a caller's transaction it
    /// behaves as [`Buckets::push`] does (all of it joins; races
    /// transient).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer")]
    /// # struct Trade { customer: i64, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let fills = [Trade { customer: 7, qty: 10 }, Trade { customer: 9, qty: 5 }];
    /// Trade::buckets(&db).push_many(&fills).await?; // customers 7 and 9
    /// # Ok(()) }
    /// ```
    pub fn push_many<'a>(&'a self, items: &'a [T]) -> PushMany<'a, T> {
        PushMany::new(self, items)
    }

    /// Page `req.page` of `req.page_size` items of `key`. Oldest first it is
    /// one `aggregate` (one round trip) that seeks by `start` to the buckets
    /// the page overlaps and slices them on the server. Newest first it is
    /// one `aggregate` that reads the newest bucket, for the total, and
    /// looks up by `_id` the buckets that hold the page if those between
    /// are full; a second reads the page by position when a shorter bucket
    /// (after a removal, a close by bytes, a late item) lies between. In a
    /// caller's session its reads run in it (and see the transaction's
    /// writes). Positions are never stale: whatever moves them does so in
    /// one transaction, which a page sees whole or not at all.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database, trade: Trade) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// let page = trades.page(&7, PageRequest::page(1).page_size(25).newest_first()).await?;
    /// let more = page.has_more;
    /// # Ok(()) }
    /// ```
    pub fn page<'a, Q>(&'a self, key: &Q, req: PageRequest) -> FetchPage<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        FetchPage::new(self, self.key_bson(key), req)
    }

    /// How many items `key` has: one indexed `find` of its newest bucket,
    /// in the caller's session when one is given.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database, trade: Trade) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// let n = trades.count(&7).await?;
    /// # Ok(()) }
    /// ```
    pub fn count<'a, Q>(&'a self, key: &Q) -> Count<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        Count::new(self, self.key_bson(key))
    }

    /// [`count`](Self::count), under its old name.
    #[deprecated(since = "0.1.0", note = "renamed `count`, as keyset queries name it")]
    pub fn total<'a, Q>(&'a self, key: &Q) -> Count<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        self.count(key)
    }

    /// Every item of `key`, oldest first, from one cursor over its buckets.
    /// It is not one snapshot: beside a late push that splits a bucket it
    /// can miss or repeat the items being moved, which a page cannot.
    /// In a caller's session it reads there (and inside a transaction sees
    /// its writes); the stream then borrows the session (see
    /// [`ItemStream`]).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer")]
    /// # struct Trade { customer: i64, qty: i32 }
    /// # async fn f(client: Client, db: Database) -> mongo_patterns::Result<()> {
    /// let mut s = client.start_session().await?;
    /// let all: Vec<Trade> = Trade::buckets(&db).stream(&7).session(&mut s).try_collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn stream<'a, Q>(&'a self, key: &Q) -> ItemStream<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        ItemStream::new(self, self.key_bson(key))
    }

    /// Recomputes every bucket's `start` from the counts, in one
    /// transaction: a `find` of every bucket's count (which refuses a key
    /// with a damaged bucket, `Damaged`, before anything is written), one
    /// `update` for every bucket whose `start` is wrong, and the commit.
    /// Nothing of the repository's leaves positions wrong; call it after
    /// editing buckets by hand. Inside a caller's transaction it joins it;
    /// on a deployment without transactions it fails with
    /// [`NoTransactions`](crate::Error::NoTransactions).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database, trade: Trade) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// trades.reindex(&7).await?; // after editing buckets by hand
    /// # Ok(()) }
    /// ```
    pub fn reindex<'a, Q>(&'a self, key: &Q) -> Reindex<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        Reindex::new(self, self.key_bson(key))
    }

    /// Removes the items of `key` that match `matching`, and returns how
    /// many items it removed. See the filter's rules at
    /// [`FIELD_OPERATORS`](super::FIELD_OPERATORS).
    ///
    /// In one transaction, one `aggregate` finds the buckets with matching
    /// items (and any damaged bucket of the key, which makes the call fail
    /// before it writes); each matching bucket is rewritten by `_id` in one
    /// pipeline `update` that filters the array, fixes `count` and closes
    /// the bucket (so no push fills the gap out of order), and one `update`
    /// moves the `start` of the buckets after it; a read of the key's last
    /// two buckets and the commit end it. Readers see the removal whole or
    /// not at all. The work runs as a task of its own: a caller that stops
    /// waiting does not cut it (it finishes, and its count is lost with the
    /// call). Inside a caller's transaction it joins it instead. On a
    /// deployment without transactions it fails with
    /// [`NoTransactions`](crate::Error::NoTransactions). Write concern and
    /// comment apply (the write concern to the commit).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database, trade: Trade) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// let deleted = trades.delete(&7, doc! {"ticker": "MDB", "qty": {"$lt": 10}}).await?;
    /// # Ok(()) }
    /// ```
    pub fn delete<'a, Q>(&'a self, key: &Q, matching: Document) -> Delete<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        Delete::new(self, self.key_bson(key), matching)
    }

    /// Retention: removes the items of `key` whose `order` field is below
    /// `cutoff` (`$lt`, in BSON order), as [`delete`](Self::delete) with
    /// the filter `{<order>: {$lt: cutoff}}` would, and the buckets they
    /// filled: a bucket left empty is removed (not the key's last, which
    /// its pushes go on from), the one on the boundary trimmed and closed,
    /// the positions after them moved back. Returns how many items it
    /// removed. One transaction, as `delete`'s: `count` and every page,
    /// both directions, are exact before and after, and a concurrent push
    /// to a bucket it writes conflicts with it and one of them is rerun.
    /// Needs `order` (`InvalidArgument` otherwise) and transactions
    /// (`NoTransactions` on a standalone).
    ///
    /// A TTL index cannot do this: it removes whole documents by one date
    /// field, so it would drop a bucket holding newer items too, and leave
    /// every later bucket's `start` (and so `count` and pages) wrong.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// let cutoff = DateTime::from_millis(DateTime::now().timestamp_millis() - 90 * 86_400_000);
    /// let removed = trades.delete_before(&7, cutoff).await?;
    /// # Ok(()) }
    /// ```
    pub fn delete_before<'a, Q>(&'a self, key: &Q, cutoff: impl Into<Bson>) -> DeleteBefore<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        DeleteBefore::new(self, self.key_bson(key), cutoff.into())
    }

    /// [`delete_before`](Self::delete_before) for every key: rounds of at
    /// most 1,000 keys that hold an item below `cutoff` (one aggregation on
    /// the primary each), then one transaction per key, until a round
    /// finds none; memory holds one round's keys. Returns how many items
    /// it removed. A call cut short leaves every key it finished cut and
    /// the others whole (each key's transaction commits or not). Run it
    /// from a scheduled job.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let cutoff = DateTime::from_millis(DateTime::now().timestamp_millis() - 90 * 86_400_000);
    /// let removed = Trade::buckets(&db).delete_all_before(cutoff).await?;
    /// # Ok(()) }
    /// ```
    pub fn delete_all_before(&self, cutoff: impl Into<Bson>) -> DeleteAllBefore<'_, T> {
        DeleteAllBefore::new(self, cutoff.into())
    }

    /// Copies a flat collection, one document per item (what
    /// `Collection<T>::insert_one` stores: the model's fields, the key
    /// among them), into this repository's buckets, for an application
    /// that has such a collection and moves to buckets. Returns how many
    /// items it copied; `on_progress` hears after each batch.
    ///
    /// It runs on the server: the keys are read 1,000 at a time in BSON
    /// order (one aggregation each), and each batch of keys is one
    /// aggregation ending in `$merge` that numbers a key's items by
    /// `order` (then `_id`; by `_id` alone without `order`), groups them
    /// `size` at a time and writes the buckets `push_many` would have
    /// written (`start`, `count`, `bytes`, floors; every bucket but the
    /// last closed). Items keep their `_id` only if the model has one. The
    /// source is only read. An index on the source's key field (with the
    /// `order` field after it) spares each round a sort of the whole
    /// collection.
    ///
    /// A batch's buckets depend only on the source, and `$merge` replaces
    /// them by `_id`: running it again writes the same buckets, so a call
    /// cut short (a crash, a timeout) is finished by calling it again, and
    /// items are stored once however often it runs. A key whose buckets
    /// the repository has written to (the application pushed to it) is
    /// refused with [`Error::AlreadyBucketed`] before its batch writes:
    /// adopting again never overwrites pushes. How to switch an
    /// application's writes over without losing the items written during
    /// the copy: the [guide](crate::guide#on-live-data).
    ///
    /// Needs `$setWindowFields` (MongoDB 5.0). Not in a transaction
    /// (`$merge` refuses one). A bucket of `size` items past the byte
    /// limit fails its batch with [`Error::DocumentTooLarge`] (declare a
    /// smaller `size`). On a sharded collection the `$merge` matches on
    /// the document key (`_id` and the shard key), which `mongos` targets;
    /// that is checked against `mongos`'s rules by the test kit's routing
    /// checker, not on a sharded cluster.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let copied = Trade::buckets(&db)
    ///     .adopt_from("trades_flat")
    ///     .on_progress(|p| eprintln!("{} of {} trades, {:.0}/s", p.done, p.of, p.rate()))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn adopt_from(&self, source: &str) -> Adopt<'_, T> {
        Adopt::new(
            self,
            AdoptArgs {
                source: source.to_owned(),
                only: None,
                batch: ITEMS_A_BATCH,
                progress: None,
            },
        )
    }

    /// Writes `key`'s buckets again under the declaration as it is now,
    /// and returns how many items they hold: the migration after `size`
    /// was lowered over stored buckets (reads refuse a bucket over the
    /// new limit as [`Damaged`](crate::Error::Damaged)) or `order` was
    /// declared over buckets filled in arrival order (pages would read
    /// them as stored). [`Model::plan`](crate::Model::plan) lists such
    /// buckets; [`rebucket_all`](Self::rebucket_all) moves every key that
    /// has one.
    ///
    /// One transaction: every bucket of the key read, its items in stored
    /// order (sorted by `order`, stably, with one), the buckets deleted
    /// and new ones inserted as `push_many` lays them out (each `size`
    /// full, every one but the last closed), unless they are laid out so
    /// already (write ids aside). A push to the key meanwhile
    /// makes it conflict and run again; a call cut short leaves the key
    /// as it was or moved whole. A bucket whose items are not an array of
    /// documents is `Damaged`, and nothing is written. Inside a caller's
    /// transaction it joins it; on a deployment without transactions it
    /// fails with [`NoTransactions`](crate::Error::NoTransactions). The
    /// key's items are held in memory, and written in one transaction, so
    /// a key of more than [`max_items`](Rebucket::max_items) (100,000 by
    /// default) is moved bucket by bucket instead: each bucket the
    /// declaration refuses (or that holds items under `items_from`)
    /// split on its own, in a transaction, between its neighbours (no
    /// other bucket's `_id` or `start` changes), then every `start`
    /// checked against the counts. Memory holds one bucket; a call cut
    /// short leaves some buckets split and the others as they were, and
    /// calling it again finishes. Only a key whose buckets must be sorted
    /// across (`order` declared over buckets filled in arrival order)
    /// cannot be moved so: it is refused with
    /// [`KeyTooLarge`](crate::Error::KeyTooLarge) before anything is
    /// written; copy it to a flat collection and adopt it
    /// ([`adopt_from`](Self::adopt_from)), or raise `max_items`.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 500, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// // `size` lowered from 1000 to 500 over stored buckets.
    /// let items = Trade::buckets(&db).rebucket(&7).await?;
    /// # Ok(()) }
    /// ```
    pub fn rebucket<'a, Q>(&'a self, key: &Q) -> Rebucket<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        Rebucket::new(self, self.key_bson(key), None, MAX_ITEMS)
    }

    /// [`rebucket`](Self::rebucket) for every key that has a bucket the
    /// declaration refuses (over the limit, a `count` unlike its items,
    /// a `start` below 0) or whose items are out of `order`, and reports
    /// the keys and items moved ([`Rebucketed`]). The keys are found by an
    /// aggregation (a collection scan), read 1,000 at a time in BSON order,
    /// and moved one transaction each; `on_progress` hears after each
    /// 1,000 keys. A key over [`max_items`](RebucketAll::max_items) is
    /// moved bucket by bucket, or, when it must be sorted across buckets,
    /// left as it was and named in the report; any other error stops the
    /// call. Keys already as declared are not written, so a call cut short
    /// is finished by calling it again; a key another service moved after
    /// this call found it is read in its transaction and left as it is,
    /// so two services running this at once write each key once.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 500, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let moved = Trade::buckets(&db)
    ///     .rebucket_all()
    ///     .on_progress(|p| eprintln!("{} of {} customers", p.done, p.of))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn rebucket_all(&self) -> RebucketAll<'_, T> {
        RebucketAll::new(self, None, None, MAX_ITEMS)
    }

    /// Replaces the first item of `key` that matches `matching` with `item`,
    /// in its bucket, and returns whether one matched. Without `order` the
    /// item keeps its position; with `order` the bucket is sorted again in
    /// the same write, so an item whose order field changed moves within
    /// its bucket (never to another bucket: a value moved past a
    /// neighbouring bucket's breaks the order across buckets; delete and
    /// push it instead). One `findAndModify`; when nothing matched, two
    /// `find`s more: one for this write's id (a retry by the driver after a
    /// lost reply finds the write applied), one that reports a damaged
    /// bucket of the key rather than `false`. It moves no positions, so in
    /// a caller's session and transaction all of it runs there.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer", order = "at")]
    /// # struct Trade { customer: i64, at: DateTime, ticker: String, qty: i32 }
    /// # async fn f(db: Database, trade: Trade) -> mongo_patterns::Result<()> {
    /// let trades = Trade::buckets(&db);
    /// let fixed = Trade { qty: 12, ..trade.clone() };
    /// let matched = trades.replace(&7, doc! {"at": trade.at}, &fixed).await?;
    /// # Ok(()) }
    /// ```
    pub fn replace<'a, Q>(&'a self, key: &Q, matching: Document, item: &'a T) -> Replace<'a, T>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: serde::Serialize + ?Sized,
    {
        Replace::new(self, self.key_bson(key), matching, item)
    }
}
