//! The read path: targeted queries by the key's prefix, and the
//! separately named scatter-gather; their action, [`Find`], beside them.

use std::borrow::Borrow;

use futures::stream::BoxStream;
use futures::StreamExt;
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::FindOptions;
use serde::Serialize;

use super::time::{ceil_seconds, truncate};
use super::{ShardKeyed, Sharded, TimeRange, TimeRepr};
use crate::action::{action, Call};
use crate::error::{Error, Result};

action! {
    /// [`Sharded::find`], [`Sharded::find_by_hashed`] and
    /// [`Sharded::scatter`]: read options (`read_concern`,
    /// `selection_criteria`, `comment`, `max_time`) and `session`. `.await`
    /// sends the `find` and gives the documents as a stream, as the
    /// driver's `find` gives a cursor; with a session, the stream borrows
    /// it until dropped.
    Find<'a, T: ShardKeyed> on Sharded, if this.scatter { "scatter" } else { "find" }, read;
    { filter: Result<Document>, scatter: bool } -> BoxStream<'a, Result<T>>;
    |this, cx| this.repo.find_in(this.filter, this.scatter, cx).await
}

impl<T: ShardKeyed> Sharded<T> {
    /// The filter of a targeted query: the search value and the coarse
    /// values `range` spans, then the exact time range on the timestamp.
    pub fn targeted_filter<Q>(&self, search: &Q, range: TimeRange) -> Result<Document>
    where
        T::Search: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        if range.end <= range.start {
            return Err(Error::invalid("range", "its end is not after its start"));
        }
        let mut f = doc! {};
        let Some(coarse) = self.spec.coarse() else {
            return Err(Error::invalid(
                "range",
                "this model's shard key has no coarse field; use `find_by_hashed` or `scatter`",
            ));
        };
        let last = DateTime::from_millis(range.end.timestamp_millis() - 1);
        match self.spec.derived() {
            Some(d) => {
                f.insert(
                    coarse,
                    doc! {"$gte": truncate(range.start, d.granularity), "$lte": truncate(last, d.granularity)},
                );
            }
            None => {
                f.insert(coarse, doc! {"$gte": range.start, "$lt": range.end});
            }
        }
        if let Some(s) = self.spec.search() {
            f.insert(s, crate::compat::to_bson(search)?);
        }
        if let Some(d) = self.spec.derived() {
            let (lo, hi) = match d.repr {
                TimeRepr::DateTime => (Bson::DateTime(range.start), Bson::DateTime(range.end)),
                // A log at second `s` happened at `s * 1000` ms: it is in
                // `[start, end)` when `s >= ceil(start / 1000)` and
                // `s < ceil(end / 1000)`. Rounding the start down would let in
                // the start's own second before the start.
                TimeRepr::EpochSeconds => (
                    Bson::Int64(ceil_seconds(range.start)),
                    Bson::Int64(ceil_seconds(range.end)),
                ),
            };
            f.insert(d.from, doc! {"$gte": lo, "$lt": hi});
        }
        Ok(f)
    }

    /// A targeted query: documents with `search` in `range`, and `extra`
    /// conditions, routed by the shard key's prefix to the shards that hold
    /// that range. One `find` (then `getMore`s as the stream is read).
    ///
    /// A targeted query sees only documents that carry the key: one written
    /// by another client without the coarse field, or with one that is not
    /// its timestamp's period, is in no range and never returned.
    /// [`Sharded::scatter`] sees it, and [`Sharded::audit`] lists such
    /// documents. A document that does not deserialize is
    /// [`Error::UnexpectedDocument`], named by its `_id`, and ends the
    /// stream.
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
    /// let recent: Vec<Log> = logs
    ///     .find("app", TimeRange::last_days(7), doc! {"level": "error"})
    ///     .await? // one shard per month
    ///     .try_collect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn find<'a, Q>(&'a self, search: &Q, range: TimeRange, extra: Document) -> Find<'a, T>
    where
        T::Search: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let filter = self.targeted_filter(search, range).map(|mut f| {
            for (k, v) in extra {
                f.insert(k, v);
            }
            f
        });
        Find::new(self, filter, false)
    }

    /// A query by the hashed key's value: targeted to one shard. One
    /// `find`, streamed as [`Sharded::find`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[shard_key(hashed = "user")]
    /// # struct Event { #[serde(rename = "_id")] id: ObjectId, user: String, kind: String }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ada: Vec<Event> = Event::sharded(&db).find_by_hashed("ada").await?.try_collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn find_by_hashed<'a, Q: Serialize + ?Sized>(&'a self, value: &Q) -> Find<'a, T> {
        let filter = match self.spec.hashed() {
            Some(h) => crate::compat::to_bson(value)
                .map(|v| doc! {h: v})
                .map_err(Error::from),
            None => Err(Error::invalid(
                "value",
                "this model's shard key is not hashed",
            )),
        };
        Find::new(self, filter, false)
    }

    /// Any query, sent to every shard that holds the collection. Named
    /// apart so that a scatter-gather is never an accident. One `find`,
    /// streamed as [`Sharded::find`].
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
    /// let all_errors: Vec<Log> = logs.scatter(doc! {"level": "error"}).await?.try_collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn scatter(&self, filter: Document) -> Find<'_, T> {
        Find::new(self, Ok(filter), true)
    }

    /// Every document `filter` matches, as a stream that holds the cursor
    /// (and the session, when there is one), each document deserialized on
    /// its own so that one that does not fit the model is named by its
    /// `_id`.
    pub(super) async fn find_in<'a>(
        &self,
        filter: Result<Document>,
        scatter: bool,
        cx: Call<'a>,
    ) -> Result<BoxStream<'a, Result<T>>> {
        let filter = filter?;
        if scatter {
            tracing::debug!(collection = self.coll.name(), "scatter-gather query");
        }
        let o = cx.opts.driver::<FindOptions>();
        let name = self.coll.name().to_owned();
        Ok(match cx.session {
            None => {
                let cursor = self.typed.find(filter).with_options(o).await?;
                futures::stream::try_unfold((cursor, name), |(mut c, name)| async move {
                    if !c.advance().await? {
                        return Ok(None);
                    }
                    let item = current(c.deserialize_current(), c.current(), &name)?;
                    Ok(Some((item, (c, name))))
                })
                .boxed()
            }
            Some(s) => {
                let cursor = self
                    .typed
                    .find(filter)
                    .with_options(o)
                    .session(&mut *s)
                    .await?;
                futures::stream::try_unfold((cursor, s, name), |(mut c, s, name)| async move {
                    if !c.advance(&mut *s).await? {
                        return Ok(None);
                    }
                    let item = current(c.deserialize_current(), c.current(), &name)?;
                    Ok(Some((item, (c, s, name))))
                })
                .boxed()
            }
        })
    }
}

/// A cursor's current document as the model, or
/// [`Error::UnexpectedDocument`] naming its `_id`.
fn current<T>(
    item: mongodb::error::Result<T>,
    raw: &mongodb::bson::RawDocument,
    collection: &str,
) -> Result<T> {
    item.map_err(|e| Error::unexpected_document(collection, raw, e))
}
