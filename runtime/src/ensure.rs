//! What a model needs in the deployment (collections, indexes, sharding),
//! declared by each pattern, so that one call prepares it and a dry run
//! says what differs.

use mongodb::bson::Document;
use mongodb::IndexModel;

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
