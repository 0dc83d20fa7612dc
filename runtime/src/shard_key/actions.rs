//! The repository's actions: each holds its arguments, options and session,
//! with the setters that apply, and runs by `.await`.

use futures::stream::BoxStream;
use mongodb::bson::Document;

use super::{Audit, KeyAnalysis, ShardKeyed, Sharded};
use crate::action::action;
use crate::error::Result;

impl<T: Send + Sync> crate::action::Repository for Sharded<T> {
    const PATTERN: &'static str = "shard_key";

    fn defaults(&self) -> &crate::action::Options {
        &self.defaults
    }

    fn collection_name(&self) -> &str {
        self.coll.name()
    }
}

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

action! {
    /// [`Sharded::audit`]: read options and `session`.
    AuditKeys<'a, T: ShardKeyed> on Sharded, "audit", read;
    { max: usize } -> Audit;
    |this, cx| this.repo.audit_in(this.max, cx).await
}

action! {
    /// [`Sharded::analyze`]: read options and `session`.
    Analyze<'a, T: ShardKeyed> on Sharded, "analyze", read;
    { key: &'a [&'a str], sample: u32 } -> KeyAnalysis;
    |this, cx| this.repo.analyze_in(this.key, this.sample, cx).await
}
