//! The repository's actions: each holds its arguments, options and session,
//! with the setters that apply, and runs by `.await`.

use std::future::IntoFuture;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mongodb::bson::Document;
use mongodb::ClientSession;

use super::{Audit, KeyAnalysis, ShardKeyed, Sharded};
use crate::action::Options;
use crate::error::Result;

/// Whether an action of this kind writes.
macro_rules! writes {
    (write) => {
        true
    };
    (read) => {
        false
    };
}

/// An action of the repository: a struct holding the arguments, its
/// options and session, with the setters that apply, run by `.await`.
macro_rules! action {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $ty:ty),* $(,)? } -> $out:ty, $kind:ident, $run:ident, $op:expr
    ) => {
        $(#[$doc])*
        #[must_use = "does nothing unless awaited"]
        pub struct $name<'a, T: Send + Sync> {
            pub(super) repo: &'a Sharded<T>,
            $(pub(super) $field: $ty,)*
            pub(super) options: Options,
            pub(super) session: Option<&'a mut ClientSession>,
        }

        impl<'a, T: ShardKeyed> $name<'a, T> {
            crate::action::setters!('a; $kind);
        }

        impl<'a, T: ShardKeyed> IntoFuture for $name<'a, T> {
            type Output = Result<$out>;
            type IntoFuture = BoxFuture<'a, Result<$out>>;

            fn into_future(self) -> Self::IntoFuture {
                let $name { repo, $($field,)* options, session } = self;
                let span = crate::action::span("shard_key", $op, repo.coll.name());
                crate::action::boxed_in(async move {
                    let cx = repo.cx(options, session).await;
                    // A write cut in the caller's transaction has the
                    // session killed on the server (see `crate::cut`).
                    let mut cut = crate::cut::CutGuard::new(
                        cx.in_transaction && writes!($kind),
                        cx.session.as_deref(),
                    );
                    let done = repo.$run($($field,)* cx).await;
                    cut.disarm();
                    done
                }, span)
            }
        }
    };
}

action! {
    /// [`Sharded::insert`]: write options (`write_concern`, `comment`,
    /// `max_time`) and `session`.
    Insert { item: &'a T } -> (), write, insert_in, "insert"
}

action! {
    /// [`Sharded::insert_many`]: write options and `session`.
    InsertMany { items: &'a [T] } -> (), write, insert_many_in, "insert_many"
}

action! {
    /// [`Sharded::replace`]: write options and `session`. The lookup by
    /// `_id` after a miss always reads the primary: it decides the write.
    Replace { item: &'a T } -> bool, write, replace_in, "replace"
}

action! {
    /// [`Sharded::upsert`]: as [`Replace`].
    Upsert { item: &'a T } -> bool, write, upsert_in, "upsert"
}

action! {
    /// [`Sharded::update`]: as [`Replace`].
    Update { point: Result<Document>, filter: Document, update: Document } -> u64, write, update_in, "update"
}

action! {
    /// [`Sharded::delete`]: as [`Replace`].
    Delete { point: Result<Document>, filter: Document } -> u64, write, delete_in, "delete"
}

action! {
    /// [`Sharded::find`], [`Sharded::find_by_hashed`] and
    /// [`Sharded::scatter`]: read options (`read_concern`,
    /// `selection_criteria`, `comment`, `max_time`) and `session`. `.await`
    /// sends the `find` and gives the documents as a stream, as the
    /// driver's `find` gives a cursor; with a session, the stream borrows
    /// it until dropped.
    Find { filter: Result<Document>, scatter: bool } -> BoxStream<'a, Result<T>>, read, find_in, if scatter { "scatter" } else { "find" }
}

action! {
    /// [`Sharded::audit`]: read options and `session`.
    AuditKeys { max: usize } -> Audit, read, audit_in, "audit"
}

action! {
    /// [`Sharded::analyze`]: read options and `session`.
    Analyze { key: &'a [&'a str], sample: u32 } -> KeyAnalysis, read, analyze_in, "analyze"
}
