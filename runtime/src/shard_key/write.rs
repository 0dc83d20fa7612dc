//! The write path: inserts, and the replace, upsert, update and delete
//! that carry the full shard key in their filter. Each operation's action
//! (its setters, run by `.await`) is here, beside the method that returns it.

use std::borrow::Borrow;

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::{
    DeleteOptions, FindOneOptions, InsertManyOptions, InsertOneOptions, ReplaceOptions,
    UpdateOptions,
};
use serde::Serialize;

use super::audit::check_stored;
use super::time::{seconds, truncate};
use super::{
    key_fields, key_projection, stored_key_filter, ShardKeyed, ShardSpec, Sharded, TimeRepr,
};
use crate::action::{action, run, Call};
use crate::error::code::DUPLICATE_KEY;
use crate::error::{server_codes, Error, Found, Result};

action! {
    /// [`Sharded::insert`]: write options (`write_concern`, `comment`,
    /// `max_time`) and `session`.
    Insert<'a, T: ShardKeyed> on Sharded, "insert", write, guarded;
    { item: &'a T } -> ();
    |this, cx| this.repo.insert_in(this.item, cx).await
}

action! {
    /// [`Sharded::insert_many`]: write options and `session`.
    InsertMany<'a, T: ShardKeyed> on Sharded, "insert_many", write, guarded;
    { items: &'a [T] } -> ();
    |this, cx| this.repo.insert_many_in(this.items, cx).await
}

action! {
    /// [`Sharded::replace`]: write options and `session`. The lookup by
    /// `_id` after a miss always reads the primary: it decides the write.
    Replace<'a, T: ShardKeyed> on Sharded, "replace", write, guarded;
    { item: &'a T } -> bool;
    |this, cx| this.repo.replace_in(this.item, cx).await
}

action! {
    /// [`Sharded::upsert`]: as [`Replace`].
    Upsert<'a, T: ShardKeyed> on Sharded, "upsert", write, guarded;
    { item: &'a T } -> bool;
    |this, cx| this.repo.upsert_in(this.item, cx).await
}

action! {
    /// [`Sharded::update`]: as [`Replace`].
    Update<'a, T: ShardKeyed> on Sharded, "update", write, guarded;
    { point: Result<Document>, filter: Document, update: Document } -> u64;
    |this, cx| this.repo.update_in(this.point, this.filter, this.update, cx).await
}

action! {
    /// [`Sharded::delete`]: as [`Replace`].
    Delete<'a, T: ShardKeyed> on Sharded, "delete", write, guarded;
    { point: Result<Document>, filter: Document } -> u64;
    |this, cx| this.repo.delete_in(this.point, this.filter, cx).await
}

impl<T: ShardKeyed> Sharded<T> {
    /// The document as stored: serialized, with the derived coarse field
    /// filled in from its timestamp.
    pub fn to_document(&self, item: &T) -> Result<Document> {
        let mut d = crate::compat::to_document(item)?;
        fill(&self.spec, &mut d, self.coll.name())?;
        Ok(d)
    }

    /// The full shard key of a stored document, plus its `_id`: the filter
    /// MongoDB requires for an upsert or a replace on a sharded collection.
    pub fn key_filter(&self, stored: &Document) -> Result<Document> {
        let Some(id) = stored.get("_id") else {
            return Err(Error::invalid(
                "item",
                "it serializes without an `_id`; an upsert or a replace needs one to find the document",
            ));
        };
        Ok(stored_key_filter(&self.spec, id, stored))
    }

    /// Inserts `item`, its coarse field derived: one `insert`. When its
    /// outcome is unknown after the driver's retry (two failovers in a row)
    /// and the document has its `_id`, it is sent once more (an `_id` is
    /// stored once at most), and a duplicate `_id` holding this very
    /// document is taken as stored: `Ok`. Without an `_id` of its own it
    /// is [`Error::OutcomeUnknown`].
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
    /// logs.insert(&log).await?; // `month` derived from `ts`
    /// # Ok(()) }
    /// ```
    pub fn insert<'a>(&'a self, item: &'a T) -> Insert<'a, T> {
        Insert::new(self, item)
    }

    pub(super) async fn insert_in(&self, item: &T, mut cx: Call<'_>) -> Result<()> {
        let d = self.to_document(item)?;
        let o = cx.opts.driver::<InsertOneOptions>();
        let sent = run!(
            self.coll.insert_one(d.clone()).with_options(o),
            cx.session.as_deref_mut()
        );
        match sent {
            Ok(_) => Ok(()),
            Err(e) => Box::pin(self.insert_unknown(d, e.into(), &mut cx)).await,
        }
    }

    /// An insert that failed with `e` after the driver's own retry. With
    /// its `_id` in the document and its outcome unknown (two failovers in
    /// a row: the driver's retry met the second), it is sent once more: an
    /// `_id` cannot be stored twice, so that is safe. A duplicate `_id`
    /// then is the first attempt, stored, when the document read on the
    /// primary is this one (`Ok`); another document under the `_id` is
    /// the duplicate-key error a plain insert gets. Anything else is `e`.
    async fn insert_unknown(&self, d: Document, e: Error, cx: &mut Call<'_>) -> Result<()> {
        use crate::failover::{outcome, Outcome};
        let unknown = e.mongo().is_some_and(|m| outcome(m) == Outcome::Unknown);
        let Some(id) = d.get("_id").filter(|_| unknown && !cx.txn).cloned() else {
            return Err(e);
        };
        let o = cx.opts.driver::<InsertOneOptions>();
        let again = run!(
            self.coll.insert_one(d.clone()).with_options(o),
            cx.session.as_deref_mut()
        );
        match again.map_err(Error::from) {
            Ok(_) => Ok(()),
            Err(dup) if dup.is_duplicate_key() => {
                let mut lookup = cx.opts.clone();
                lookup.read_concern = None;
                lookup.selection_criteria = Some(crate::util::primary());
                let o = lookup.driver::<FindOneOptions>();
                let filter = stored_key_filter(&self.spec, &id, &d);
                let found = run!(
                    self.coll.find_one(filter).with_options(o),
                    cx.session.as_deref_mut()
                );
                match found {
                    Ok(Some(stored)) if stored == d => Ok(()),
                    // Another document holds the `_id`: this insert was
                    // not stored and cannot be, as a plain insert says.
                    Ok(Some(_)) => Err(dup),
                    _ => Err(e),
                }
            }
            Err(_) => Err(e),
        }
    }

    /// Inserts `items` in one `insert` (`insertMany`, ordered), their coarse
    /// fields derived. Sends nothing for no items.
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
    /// logs.insert_many(&more).await?;
    /// # Ok(()) }
    /// ```
    pub fn insert_many<'a>(&'a self, items: &'a [T]) -> InsertMany<'a, T> {
        InsertMany::new(self, items)
    }

    pub(super) async fn insert_many_in(&self, items: &[T], mut cx: Call<'_>) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let docs = items
            .iter()
            .map(|i| self.to_document(i))
            .collect::<Result<Vec<_>>>()?;
        let o = cx.opts.driver::<InsertManyOptions>();
        run!(
            self.coll.insert_many(docs).with_options(o),
            cx.session.as_deref_mut()
        )?;
        Ok(())
    }

    /// Replaces the document with `item`'s `_id`, by a filter on the full
    /// shard key and the `_id`. Returns whether one matched.
    ///
    /// When nothing matched, the stored key is looked up by `_id` (as
    /// Spring Data's `@Sharded` does): a document stored under another key
    /// value (its timestamp moved to another month, its search value
    /// changed) is replaced by a filter on that stored key, and MongoDB
    /// moves it to the new key's chunk in the same write (4.2+, as a
    /// retryable write, which is the driver's default, or in a
    /// transaction). A stored document whose key is missing, mistyped or
    /// not derived from its own timestamp is [`Error::Damaged`], and
    /// nothing is written.
    ///
    /// Commands: an `update` (replace); on a miss, a `find` by `_id` and a
    /// second `update`. In a session, all of them run in it; in the
    /// caller's transaction the lookup and the write see one snapshot, so
    /// no round is repeated.
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
    /// let replaced = logs.replace(&log).await?; // by `_id` and the full key
    /// # Ok(()) }
    /// ```
    pub fn replace<'a>(&'a self, item: &'a T) -> Replace<'a, T> {
        Replace::new(self, item)
    }

    pub(super) async fn replace_in(&self, item: &T, cx: Call<'_>) -> Result<bool> {
        let d = self.to_document(item)?;
        Ok(self.write(&d, false, cx).await? != Written::Nothing)
    }

    /// Inserts or replaces `item`, by a filter on the full shard key and the
    /// `_id`. Returns whether it was inserted.
    ///
    /// It never inserts a second document with the same `_id` under a new
    /// key: a miss looks the `_id` up first, as [`Sharded::replace`] does,
    /// and inserts only when no document holds it. So an upsert that
    /// inserts costs three round trips (the miss, the lookup by `_id`, which
    /// a sharded cluster sends to every shard, and the insert); one that
    /// replaces under an unchanged key costs one; one that moves the
    /// document to a new key, three, of which only the last writes.
    ///
    /// Outside a transaction, a concurrent writer of the same `_id` that
    /// wins between the lookup and the write (a duplicate key, a document
    /// moved meanwhile) makes it look again, up to 5 times, then
    /// [`Error::Contended`]. Inside the caller's transaction it never looks
    /// again: the lookup and the write see one snapshot, and a concurrent
    /// writer makes the server abort the transaction, with a write
    /// conflict (labelled `TransientTransactionError` by the server) or a
    /// duplicate key (returned as [`Error::Raced`] with that label), so
    /// that the caller's `and_run2` runs the transaction again.
    ///
    /// It runs no transaction of its own: its only write is the last
    /// command (a move is one replace, which a sharded cluster performs
    /// atomically), so a crash or a cut before it leaves the old document.
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
    /// let inserted = logs.upsert(&log).await?;
    /// # Ok(()) }
    /// ```
    pub fn upsert<'a>(&'a self, item: &'a T) -> Upsert<'a, T> {
        Upsert::new(self, item)
    }

    pub(super) async fn upsert_in(&self, item: &T, cx: Call<'_>) -> Result<bool> {
        let d = self.to_document(item)?;
        Ok(self.write(&d, true, cx).await? == Written::Inserted)
    }

    /// The write behind `replace` and `upsert`: the new key first, then,
    /// on a miss, the key the `_id` is stored under.
    async fn write(&self, d: &Document, upsert: bool, mut cx: Call<'_>) -> Result<Written> {
        let filter = self.key_filter(d)?;
        let o = cx.opts.driver::<ReplaceOptions>();
        if key_fields(&self.spec) == ["_id"] {
            // The key is the `_id`: it cannot change, and the unique index
            // on `_id` keeps an upsert from doubling it.
            let r = run!(
                self.coll
                    .replace_one(filter, d)
                    .with_options(o)
                    .upsert(upsert),
                cx.session.as_deref_mut()
            )?;
            return Ok(match (r.upserted_id, r.matched_count) {
                (Some(_), _) => Written::Inserted,
                (None, 0) => Written::Nothing,
                (None, _) => Written::Replaced,
            });
        }
        let r = run!(
            self.coll
                .replace_one(filter.clone(), d)
                .with_options(o.clone()),
            cx.session.as_deref_mut()
        )?;
        if r.matched_count > 0 {
            return Ok(Written::Replaced);
        }
        let id = filter.get("_id").cloned().unwrap_or(Bson::Null);
        // Each round lost a race to a writer that moved, deleted or
        // inserted the `_id` between our lookup and our write: retried as
        // every race is (`crate::retry`). In a transaction the lookup and
        // the write share a snapshot: one round.
        let mut retry = crate::retry::Retry::new(if upsert { "upsert" } else { "replace" });
        loop {
            match self.stored_key(&id, d, &mut cx).await? {
                Some(stored) => {
                    let r = run!(
                        self.coll.replace_one(stored, d).with_options(o.clone()),
                        cx.session.as_deref_mut()
                    )?;
                    if r.matched_count > 0 {
                        return Ok(Written::Replaced);
                    }
                }
                None if !upsert => return Ok(Written::Nothing),
                None => match run!(
                    self.coll
                        .replace_one(filter.clone(), d)
                        .with_options(o.clone())
                        .upsert(true),
                    cx.session.as_deref_mut()
                ) {
                    Ok(r) if r.upserted_id.is_some() => return Ok(Written::Inserted),
                    Ok(r) if r.matched_count > 0 => return Ok(Written::Replaced),
                    Ok(_) => {}
                    // Inserted meanwhile under another key: the server has
                    // aborted the caller's transaction; the caller retries.
                    Err(e) if cx.txn && server_codes(&e).contains(&DUPLICATE_KEY) => {
                        return Err(crate::action::raced_in_transaction(e))
                    }
                    // Inserted meanwhile under another key: look again.
                    Err(e) if server_codes(&e).contains(&DUPLICATE_KEY) => {}
                    Err(e) => return Err(e.into()),
                },
            }
            if cx.txn {
                return Err(retry.contended());
            }
            retry.pause().await?;
        }
    }

    /// The filter on the `_id` and the key it is stored under, or `None`
    /// when no document holds the `_id`. `new` is the document about to be
    /// written: a key field it has and the stored one lacks, or holds as
    /// another type, is damage.
    async fn stored_key(
        &self,
        id: &Bson,
        new: &Document,
        cx: &mut Call<'_>,
    ) -> Result<Option<Document>> {
        // The lookup decides the write: it reads the primary, with the
        // default read concern (or the transaction's), whatever reads are
        // set to elsewhere.
        let mut lookup = cx.opts.clone();
        lookup.read_concern = None;
        // Set, not left unset: unset, the client's read preference would
        // apply (`secondaryPreferred` in many URIs), and a secondary that
        // has not seen the document yet would make this upsert insert a
        // second `_id` under another shard key.
        lookup.selection_criteria = Some(crate::util::primary());
        let o = lookup.driver::<FindOneOptions>();
        let found = run!(
            self.coll
                .find_one(doc! {"_id": id.clone()})
                .with_options(o)
                .projection(key_projection(&self.spec)),
            cx.session.as_deref_mut()
        )?;
        let Some(stored) = found else {
            return Ok(None);
        };
        check_stored(&self.spec, self.coll.name(), &stored, Some(new))?;
        Ok(Some(stored_key_filter(&self.spec, id, &stored)))
    }

    /// Updates the documents `filter` matches within one shard key value:
    /// `at` (the time the coarse field is derived from, or the coarse
    /// value itself when the model stores it) and `search`. Refuses an
    /// update that changes a key field or the timestamp the key derives
    /// from. Returns how many matched.
    ///
    /// When `filter` names one `_id` and nothing matched, the document is
    /// looked up: one stored under another key value is
    /// [`Error::ShardKeyMismatch`], one whose key is damaged
    /// [`Error::Damaged`], instead of `Ok(0)`.
    ///
    /// Commands: one `update` (`updateMany`); after a miss by `_id`, a
    /// `find` by it. Both run in the session when one is given; nothing is
    /// retried.
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
    /// let n = logs
    ///     .update(at, "app", doc! {"level": "debug"}, doc! {"$set": {"level": "trace"}})
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn update<'a, Q>(
        &'a self,
        at: DateTime,
        search: &Q,
        filter: Document,
        update: Document,
    ) -> Update<'a, T>
    where
        T::Search: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Update::new(self, self.point_filter(at, search), filter, update)
    }

    pub(super) async fn update_in(
        &self,
        point: Result<Document>,
        filter: Document,
        update: Document,
        mut cx: Call<'_>,
    ) -> Result<u64> {
        check_update(&self.spec, &update)?;
        let point = point?;
        let id = plain_id(&filter);
        let o = cx.opts.driver::<UpdateOptions>();
        let matched = run!(
            self.coll
                .update_many(within(&point, filter), update)
                .with_options(o),
            cx.session.as_deref_mut()
        )?
        .matched_count;
        if let (0, Some(id)) = (matched, id) {
            self.refuse_other_key(id, &point, &mut cx).await?;
        }
        Ok(matched)
    }

    /// Deletes the documents `filter` matches within one shard key value:
    /// `at` and `search`, as [`Sharded::update`] takes them. The key's
    /// values go into the filter so that `mongos` sends the delete to the
    /// one shard that holds them, not to every shard. Returns how many were
    /// deleted.
    ///
    /// When `filter` names one `_id` and nothing was deleted, the document
    /// is looked up, as `update` does: one stored under another key value
    /// is [`Error::ShardKeyMismatch`] (it is still there), one whose key is
    /// damaged [`Error::Damaged`], instead of `Ok(0)`.
    ///
    /// Commands: one `delete` (`deleteMany`, `limit: 0`); after a miss by
    /// `_id`, a `find` by it. Both run in the session when one is given;
    /// nothing is retried.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[model(collection = "logs")]
    /// # #[shard_key(coarse = "month", from = "ts", search = "type")]
    /// # struct Log {
    /// #     #[serde(rename = "_id")] id: ObjectId,
    /// #     #[serde(rename = "type")] kind: String,
    /// #     ts: i64,
    /// #     level: String,
    /// # }
    /// # async fn f(db: Database, at: DateTime) -> mongo_patterns::Result<()> {
    /// // The month of `at`, type "app": one shard.
    /// let n = Log::sharded(&db)
    ///     .delete(at, "app", doc! {"level": "debug"})
    ///     .write_concern(WriteConcern::majority())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn delete<'a, Q>(&'a self, at: DateTime, search: &Q, filter: Document) -> Delete<'a, T>
    where
        T::Search: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Delete::new(self, self.point_filter(at, search), filter)
    }

    pub(super) async fn delete_in(
        &self,
        point: Result<Document>,
        filter: Document,
        mut cx: Call<'_>,
    ) -> Result<u64> {
        let point = point?;
        let id = plain_id(&filter);
        let o = cx.opts.driver::<DeleteOptions>();
        let deleted = run!(
            self.coll
                .delete_many(within(&point, filter))
                .with_options(o),
            cx.session.as_deref_mut()
        )?
        .deleted_count;
        if let (0, Some(id)) = (deleted, id) {
            self.refuse_other_key(id, &point, &mut cx).await?;
        }
        Ok(deleted)
    }

    /// Why a write within the key value `point`, by a filter naming `id`,
    /// touched nothing (`update` and `delete` share it): the document
    /// stored under another key value is [`Error::ShardKeyMismatch`], one
    /// whose key is damaged [`Error::Damaged`]. No document, or one under
    /// `point` that the rest of the filter left out, is `Ok`.
    async fn refuse_other_key(&self, id: Bson, point: &Document, cx: &mut Call<'_>) -> Result<()> {
        let Some(stored) = self.stored_key(&id, point, cx).await? else {
            return Ok(());
        };
        let differs = point.iter().any(|(k, v)| {
            stored
                .get(k)
                .is_none_or(|s| crate::order::cmp(s, v) != std::cmp::Ordering::Equal)
        });
        if !differs {
            return Ok(());
        }
        let mut key = stored;
        key.remove("_id");
        Err(Error::ShardKeyMismatch {
            collection: self.coll.name().to_owned(),
            id: Box::new(id),
            stored: Box::new(key),
        })
    }

    fn point_filter<Q>(&self, at: DateTime, search: &Q) -> Result<Document>
    where
        Q: Serialize + ?Sized,
    {
        let mut f = doc! {};
        if let Some(c) = self.spec.coarse() {
            let v = match self.spec.derived() {
                Some(d) => truncate(at, d.granularity),
                None => at,
            };
            f.insert(c, v);
        }
        if let Some(s) = self.spec.search() {
            f.insert(s, crate::compat::to_bson(search)?);
        }
        Ok(f)
    }
}

/// What a replace or an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Replaced,
    Inserted,
    Nothing,
}

/// The `_id` `filter` names as a plain value (not an operator such as
/// `$in`): the one document a miss is looked up by.
fn plain_id(filter: &Document) -> Option<Bson> {
    filter
        .get("_id")
        .filter(|v| {
            !v.as_document()
                .is_some_and(|d| d.keys().any(|k| k.starts_with('$')))
        })
        .cloned()
}

/// `filter` within the key value `point`: the point's fields first, so
/// that `mongos` sees the key (a field of `filter` of the same name wins).
fn within(point: &Document, filter: Document) -> Document {
    let mut f = point.clone();
    for (k, v) in filter {
        f.insert(k, v);
    }
    f
}

/// Fills the derived coarse field of a stored document.
pub(super) fn fill(spec: &ShardSpec, d: &mut Document, collection: &str) -> Result<()> {
    let (Some(coarse), Some(derived)) = (spec.coarse(), spec.derived()) else {
        return Ok(());
    };
    let at = match (d.get(derived.from), derived.repr) {
        (Some(Bson::DateTime(t)), _) => *t,
        (Some(Bson::Int64(s)), TimeRepr::EpochSeconds) => seconds(*s)?,
        (Some(Bson::Int32(s)), TimeRepr::EpochSeconds) => seconds(i64::from(*s))?,
        (other, _) => {
            return Err(Error::UnsupportedValue {
                collection: collection.to_owned(),
                id: Box::new(d.get("_id").cloned().unwrap_or(Bson::Null)),
                field: derived.from.to_owned(),
                found: Found::of(other),
                why: "a timestamp to derive the shard key from",
                dropped: None,
            })
        }
    };
    d.insert(coarse, truncate(at, derived.granularity));
    Ok(())
}

/// Update operators whose argument names fields to change.
const FIELD_OPERATORS: &[&str] = &[
    "$set",
    "$unset",
    "$inc",
    "$mul",
    "$rename",
    "$min",
    "$max",
    "$currentDate",
    "$setOnInsert",
    "$push",
    "$pull",
    "$addToSet",
    "$pop",
    "$pullAll",
    "$bit",
];

/// Refuses an update that would change a shard key field or the timestamp
/// a key field derives from.
pub(super) fn check_update(spec: &ShardSpec, update: &Document) -> Result<()> {
    let mut protected = key_fields(spec);
    protected.extend(spec.derived().map(|d| d.from));
    protected.push("_id");
    let touches = |path: &str| {
        protected
            .iter()
            .any(|p| path == *p || path.starts_with(&format!("{p}.")))
    };
    if update.keys().any(|k| !k.starts_with('$')) {
        return Err(Error::invalid(
            "update",
            "a replacement document; use `replace`, which keeps the shard key",
        ));
    }
    for (op, args) in update {
        if !FIELD_OPERATORS.contains(&op.as_str()) {
            return Err(Error::invalid(
                "update",
                format!("unsupported operator `{op}`"),
            ));
        }
        let Some(args) = args.as_document() else {
            continue;
        };
        for (path, value) in args {
            let renamed_to = (op == "$rename").then(|| value.as_str()).flatten();
            if touches(path) || renamed_to.is_some_and(touches) {
                return Err(Error::invalid(
                    "update",
                    format!("`{op}` changes `{path}`, part of the shard key (or what it derives from); a key changes by delete and insert, or `replace`"),
                ));
            }
        }
    }
    Ok(())
}
