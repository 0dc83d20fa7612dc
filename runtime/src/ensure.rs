//! What a model needs in the deployment (collections, indexes, sharding),
//! declared by each pattern, so that one call prepares it and a dry run
//! says what differs.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Serialize, Deserialize, Model)]
//! # #[keyset(sort = "at")]
//! # struct Visit { at: DateTime }
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let plan = Visit::plan(&db).await?; // reads only
//! println!("{plan}");
//! let done = Visit::ensure(&db).await?; // creates what is missing
//! assert!(done.conflicts.is_empty(), "{done}");
//! # Ok(()) }
//! ```
//!
//! [`Model::ensure`](crate::Model::ensure) creates what is missing and
//! never drops or changes what exists: an index that has the declared name
//! but other keys or options is reported as a [`Conflict`] and left in
//! place (drop it yourself if it should go). An index with the declared
//! keys under another name serves as well, and is reported as a [`Note`].
//! Sharding applies only on a sharded cluster (`hello` answers
//! `msg: "isdbgrid"`); elsewhere it is a [`Note`], and the shard key's
//! index is still created, since it serves the same queries there.
//!
//! Both actions take `.session()`: the commands then run in that session.
//! A transaction refuses `listCollections` and `listIndexes`, so run them
//! outside one.

use mongodb::bson::Document;
use mongodb::{Database, IndexModel};

use crate::keyset::{Keyset, KeysetSpec};

mod action;
mod compare;
mod report;

pub use action::{EnsureAction, PlanAction};
pub use report::{Conflict, Ensured, Index, Note, Plan, Shard};

/// What one pattern needs in one collection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Declared {
    /// The collection's name.
    pub collection: String,
    /// Indexes it needs, each with its name set.
    pub indexes: Vec<IndexModel>,
    /// `shardCollection`'s `key` and whether it is unique, where the
    /// pattern shards the collection.
    pub shard_key: Option<(Document, bool)>,
}

impl Declared {
    /// `collection`, with nothing in it yet.
    pub fn new(collection: impl Into<String>) -> Self {
        Declared {
            collection: collection.into(),
            indexes: Vec::new(),
            shard_key: None,
        }
    }

    /// Adds an index on `keys` named `name`.
    pub fn index(mut self, keys: Document, name: impl Into<String>) -> Self {
        let options = mongodb::options::IndexOptions::builder()
            .name(name.into())
            .build();
        self.indexes
            .push(IndexModel::builder().keys(keys).options(options).build());
        self
    }

    /// Shards the collection on `key`.
    pub fn sharded(mut self, key: Document, unique: bool) -> Self {
        self.shard_key = Some((key, unique));
        self
    }
}

/// What a model's keyset paging needs: its collection, and the index
/// `{sort keys..., _id}` when it sorts by more than `_id`.
pub fn keyset_declared(db: &Database, collection: &str, spec: KeysetSpec) -> Vec<Declared> {
    Keyset::<Document>::new(db, collection, spec).declared()
}
