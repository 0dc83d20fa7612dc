//! What `plan` and `ensure` report: what to create, what was created, what
//! stands in the way, and the text a log or a terminal shows of it.

use std::fmt;

use mongodb::bson::{Bson, Document};

/// An index, by collection, name, keys and options.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Index {
    /// The collection it is on.
    pub collection: String,
    /// Its name.
    pub name: String,
    /// Its keys, as `createIndexes` takes them.
    pub keys: Document,
    /// Its other options (`collation`, `unique`, `partialFilterExpression`,
    /// ...) as `createIndexes` takes them beside `key` and `name`; empty
    /// for a plain index. An existing index serves a declared one only with
    /// the same options (see [`Conflict::Index`]).
    pub options: Document,
}

/// A collection to shard.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Shard {
    /// The collection.
    pub collection: String,
    /// `shardCollection`'s `key`.
    pub key: Document,
    /// Whether the key is unique.
    pub unique: bool,
}

/// Something in the deployment that stands where a declaration wants
/// something else. Left alone: neither `plan` nor `ensure` changes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Conflict {
    /// An index has the declared name, but other keys, or options that
    /// keep it from serving the queries the declared one serves: a
    /// narrowing option the declaration lacks (`partialFilterExpression`,
    /// `sparse`, `hidden`), another collation (a collated query cannot use
    /// an index of the simple collation for its string bounds and sort, nor
    /// the other way round), or an option the declaration names with
    /// another value. Drop it to let `ensure` create the declared one.
    Index {
        /// What was declared.
        declared: Index,
        /// The index as `listIndexes` shows it.
        found: Document,
    },
    /// The name belongs to something that is not a collection (a view):
    /// nothing is created in it.
    NotACollection {
        /// The name.
        collection: String,
        /// What `listCollections` says it is.
        kind: String,
    },
    /// The collection is sharded on another key.
    ShardKey {
        /// What was declared.
        declared: Shard,
        /// The key it is sharded on.
        found: Document,
    },
    /// The collection has a validator that is not the patterns' (its
    /// `$jsonSchema` has another `title`, or it is no `$jsonSchema`):
    /// left alone, the declared schema is not set.
    Validator {
        /// The collection.
        collection: String,
        /// Its validator, as `listCollections` shows it.
        found: Document,
    },
    /// Stored documents the declaration reads wrongly or refuses (a
    /// [`Check`](super::Check) that matched): only `plan` looks.
    Stored {
        /// The collection.
        collection: String,
        /// What they are.
        found: String,
        /// How many there are.
        count: u64,
        /// The `_id`s of the first few, in the server's order.
        ids: Vec<Bson>,
        /// What the repository does with them, and how to migrate.
        then: String,
    },
}

/// Something worth knowing that needs no action.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[allow(
    clippy::large_enum_variant,
    reason = "a report holds a few notes, built once per call; boxing would only change the public field's type"
)]
pub enum Note {
    /// An index on the declared keys, with options that serve as well (the
    /// same collation, nothing narrower), exists under another name: it
    /// serves, so none is created.
    IndexUnderOtherName {
        /// What was declared.
        declared: Index,
        /// The name of the index that serves instead.
        found: String,
    },
    /// An index this library named (`mp_...`) that no declaration of the
    /// collection in this plan lists: a keyset's `sort` or `order`, a
    /// bucket's `key`, a board or a score, or a shard key changed since it
    /// was created (or another model of the collection, not in this plan,
    /// declares it). Left in place: drop it yourself once nothing uses
    /// it, since every write keeps it up to date.
    UndeclaredIndex {
        /// The collection.
        collection: String,
        /// Its name.
        name: String,
        /// Its keys.
        keys: Document,
    },
    /// The collection is declared sharded, but the deployment does not shard
    /// (a replica set or a standalone): sharding does not apply.
    ShardingNotApplicable {
        /// The collection.
        collection: String,
    },
    /// The collection is declared sharded on a sharded cluster, but the
    /// user may not read `config.collections` (Unauthorized, as for an
    /// application's user without cluster read rights): whether and on
    /// which key it is sharded is unknown, so it is neither listed to shard
    /// nor sharded. Run `plan`/`ensure` as a user that may read the `config`
    /// database (and run `shardCollection`) to settle it.
    ShardingUnknown {
        /// The collection.
        collection: String,
    },
    /// The server lacks a feature the repository can do without, and
    /// `without` says what it does instead.
    WithoutFeature {
        /// The collection whose declaration prefers it.
        collection: String,
        /// The feature.
        feature: super::Feature,
        /// What prefers it.
        by: &'static str,
        /// What the repository does without it.
        without: &'static str,
    },
}

/// What [`Model::plan`](crate::Model::plan) found: what `ensure` would
/// create, and what differs from the declarations.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Plan {
    /// Collections that do not exist.
    pub create_collections: Vec<String>,
    /// Indexes that do not exist, under their name or any other.
    pub create_indexes: Vec<Index>,
    /// Collections a sharded cluster has not sharded yet.
    pub shard: Vec<Shard>,
    /// What stands in the way; `ensure` leaves it alone.
    pub conflicts: Vec<Conflict>,
    /// Features the declarations need and the server lacks: `ensure`
    /// refuses with the first, before it creates anything.
    pub unsupported: Vec<super::Unsupported>,
    /// Validators to set (with the collection, when it is created; else
    /// by `collMod`): the declared schema, or its level, differs from
    /// what the collection has.
    pub validators: Vec<Validator>,
    /// What needs no action.
    pub notes: Vec<Note>,
}

/// A collection's validator as declared: what `ensure` sets.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Validator {
    /// The collection.
    pub collection: String,
    /// `{$jsonSchema: {title: "mongo-patterns", anyOf: [{title: <model>,
    /// allOf: [...]}, ...]}}`: a document passes if it meets one model's
    /// fragments.
    pub validator: Document,
    /// `validationLevel`.
    pub level: &'static str,
    /// `validationAction`.
    pub action: &'static str,
    /// The patterns' validator it replaces, if any.
    pub replaces: Option<Document>,
    /// The models whose parts of the replaced validator it keeps: models
    /// this call does not declare on the collection (another service's,
    /// or one no longer used, which `collMod` would remove).
    pub kept: Vec<String>,
    /// The parts this call declares, which `ensure` makes sure are stored.
    pub(super) own: Vec<String>,
}

impl fmt::Display for Validator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.replaces.is_some() {
            "replace"
        } else {
            "set"
        };
        write!(
            f,
            "{how} the validator of `{}` (level {}, action {}",
            self.collection, self.level, self.action
        )?;
        if !self.kept.is_empty() {
            write!(f, "; keeping the parts of {}", self.kept.join(", "))?;
        }
        write!(f, "): {}", self.validator)
    }
}

/// Stored documents that break a collection's declared schema:
/// what [`Model::validate_existing`](crate::Model::validate_existing)
/// finds.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Invalid {
    /// The collection.
    pub collection: String,
    /// How many.
    pub count: u64,
    /// The `_id`s of the first few, in the server's order.
    pub ids: Vec<Bson>,
}

impl Plan {
    /// Nothing to create, nothing to shard, no conflict, nothing the
    /// server lacks: the deployment holds what the declarations need.
    pub fn is_up_to_date(&self) -> bool {
        self.create_collections.is_empty()
            && self.create_indexes.is_empty()
            && self.shard.is_empty()
            && self.validators.is_empty()
            && self.conflicts.is_empty()
            && self.unsupported.is_empty()
    }
}

/// What [`Model::ensure`](crate::Model::ensure) did. Lists only what this
/// call created: what existed, or what a concurrent call created first, is
/// not in it, as far as the server's replies tell: for two calls racing on
/// the same deployment, the server may let both claim an index built at
/// the same moment, or a collection that needs no index (`create` succeeds
/// on an existing collection). The deployment ends up right either way.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Ensured {
    /// Collections it created.
    pub collections_created: Vec<String>,
    /// Indexes it created.
    pub indexes_created: Vec<Index>,
    /// Collections it sharded.
    pub sharded: Vec<String>,
    /// Collections whose validator it set or replaced.
    pub validators_set: Vec<String>,
    /// What it left alone because it stands where a declaration wants
    /// something else.
    pub conflicts: Vec<Conflict>,
    /// What needed no action.
    pub notes: Vec<Note>,
}

impl Ensured {
    /// It created and sharded nothing (the deployment was prepared already,
    /// or conflicts stood in the way: see [`Ensured::conflicts`]).
    pub fn created_nothing(&self) -> bool {
        self.collections_created.is_empty()
            && self.indexes_created.is_empty()
            && self.sharded.is_empty()
            && self.validators_set.is_empty()
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "index `{}` {}", self.name, self.keys)?;
        if !self.options.is_empty() {
            write!(f, " {}", self.options)?;
        }
        write!(f, " on `{}`", self.collection)
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::Index { declared, found } => {
                write!(
                    f,
                    "{declared} is declared, but the index of that name is {found}"
                )
            }
            Conflict::NotACollection { collection, kind } => {
                write!(f, "`{collection}` is a {kind}, not a collection")
            }
            Conflict::ShardKey { declared, found } => write!(
                f,
                "`{}` should be sharded on {}, and is sharded on {found}: `ensure` does not change a shard key; an administrator does, with `reshardCollection` (MongoDB 5.0+), or `refineCollectionShardKey` (4.4+) when the declared key only adds fields after the old one, once every document holds the new fields (`fill_coarse` for a derived one)",
                declared.collection, declared.key
            ),
            Conflict::Validator { collection, found } => write!(
                f,
                "`{collection}` has a validator of its own, left in place: {found}"
            ),
            Conflict::Stored {
                collection,
                found,
                count,
                ids,
                then,
            } => {
                let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "`{collection}` holds {count} {found} (_id {}): {then}",
                    ids.join(", ")
                )
            }
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::IndexUnderOtherName { declared, found } => {
                write!(
                    f,
                    "{declared} is served by index `{found}` on the same keys"
                )
            }
            Note::UndeclaredIndex {
                collection,
                name,
                keys,
            } => write!(
                f,
                "index `{name}` {keys} on `{collection}` is no longer declared (an attribute changed?): left in place"
            ),
            Note::ShardingNotApplicable { collection } => write!(
                f,
                "`{collection}` would be sharded, but the deployment does not shard"
            ),
            Note::ShardingUnknown { collection } => write!(
                f,
                "whether `{collection}` is sharded is unknown: this user may not read `config.collections`"
            ),
            Note::WithoutFeature {
                collection,
                feature,
                by,
                without,
            } => write!(
                f,
                "the server lacks {feature}: {by} on `{collection}` {without}"
            ),
        }
    }
}

/// One line per item, each under a heading: `create`, `shard`,
/// `conflict`, `note`.
fn lines(f: &mut fmt::Formatter<'_>, head: &str, items: &[impl fmt::Display]) -> fmt::Result {
    for i in items {
        writeln!(f, "{head}: {i}")?;
    }
    Ok(())
}

struct Named<'a>(&'a str, &'a str);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.0, self.1)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_up_to_date() && self.notes.is_empty() {
            return writeln!(f, "up to date");
        }
        let colls: Vec<Named> = self
            .create_collections
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "create", &colls)?;
        lines(f, "create", &self.create_indexes)?;
        let shards: Vec<Named> = self
            .shard
            .iter()
            .map(|s| Named("collection", &s.collection))
            .collect();
        lines(f, "shard", &shards)?;
        lines(f, "validate", &self.validators)?;
        lines(f, "conflict", &self.conflicts)?;
        lines(f, "unsupported", &self.unsupported)?;
        lines(f, "note", &self.notes)
    }
}

impl fmt::Display for Ensured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.created_nothing() && self.conflicts.is_empty() && self.notes.is_empty() {
            return writeln!(f, "nothing to do");
        }
        let colls: Vec<Named> = self
            .collections_created
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "created", &colls)?;
        lines(f, "created", &self.indexes_created)?;
        let shards: Vec<Named> = self
            .sharded
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "sharded", &shards)?;
        let set: Vec<Named> = self
            .validators_set
            .iter()
            .map(|c| Named("collection", c))
            .collect();
        lines(f, "validator set", &set)?;
        lines(f, "left alone", &self.conflicts)?;
        lines(f, "note", &self.notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    #[test]
    fn a_shard_key_conflict_names_the_migration() {
        let c = Conflict::ShardKey {
            declared: Shard {
                collection: "logs".into(),
                key: doc! {"month": 1, "type": 1},
                unique: false,
            },
            found: doc! {"ts": 1},
        };
        let text = c.to_string();
        for part in [
            "`logs` should be sharded on",
            "reshardCollection",
            "refineCollectionShardKey",
            "fill_coarse",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
