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
//!
//! An index is declared with its options, and `createIndexes` is sent
//! them all: a [`Keyset`](crate::keyset::Keyset) query with a
//! [`collation`](crate::keyset::Keyset::collation) declares its index with
//! that collation, since a collated query cannot use an index of another
//! collation (the simple one included) for its string bounds and sort, and
//! would sort every page in memory. For the same reason an existing index
//! serves a declared one only with the same collation (the same locale,
//! and every field the declaration names; strength 3 when it names none),
//! either way round: a collated index does not serve an uncollated
//! declaration either.
//!
//! Sharding applies only on a sharded cluster (`hello` answers
//! `msg: "isdbgrid"`); elsewhere it is a [`Note`], and the shard key's
//! index is still created, since it serves the same queries there. On a
//! sharded cluster the collection's shard key is read from
//! `config.collections`; an entry with `unsplittable: true` (MongoDB 8.0
//! tracks unsharded collections that way) is an unsharded collection. A
//! user that may not read `config.collections` (an application's user
//! without cluster read rights: Unauthorized) gets
//! [`Note::ShardingUnknown`] for the collection, which is then neither
//! planned for sharding nor sharded, rather than an error.
//!
//! Each pattern also declares what it needs from the server ([`Need`]:
//! `$sortArray` for a bucket's `replace` with `order`, `$setWindowFields`
//! for its removals, transactions for a rank's `insert`, ...). Where any is
//! declared, both actions ask the server what it is (`hello`, `buildInfo`)
//! before anything else is sent: a feature the server lacks is listed in
//! [`Plan::unsupported`], and `ensure` then refuses with
//! [`Error::Unsupported`](crate::Error::Unsupported) before it creates
//! anything; a feature the repository can do without is a
//! [`Note::WithoutFeature`]. See [`Feature`] for how a server is judged.
//!
//! # What it creates
//!
//! Per model ([`Model::declared`](crate::Model::declared) lists it):
//!
//! | attribute | collections | indexes | sharding |
//! | --- | --- | --- | --- |
//! | every model | its collection | | |
//! | `#[keyset(sort = ...)]` | | `mp_keyset_<keys>`: `{sort keys..., _id}` in the declared direction | |
//! | `#[bucket]` | | `mp_bucket_<key>_start`: `{key: 1, start: 1}` | |
//! | `#[rank_histogram]` | the histogram's | `mp_rank_<board>_<score>`: `{board: 1, score: ±1}` (players) | the histogram's, by board: `{_id: "hashed"}` (array layout), `{"_id.b": "hashed"}` (documents); the players' collection is yours |
//! | `#[shard_key]` | | `mp_shard_<fields>`: the shard key | `shardCollection`, on a sharded cluster |
//! | `#[approx_counter]` | | (keys are `_id`s) | `{_id: "hashed"}` (a `#[shard_key]` on the struct wins) |
//!
//! The sharding column is what `shardCollection` is sent, on a sharded
//! cluster only, and why each key was chosen is in each pattern's docs
//! ([`rank_histogram`](crate::rank_histogram#sharding),
//! [`approx_counter`](crate::approx_counter#sharding)). Where two
//! declarations of one collection name different keys, the first wins:
//! `Model::declared` lists a struct's bucket, rank, `#[shard_key]` and
//! counters in that order. On an empty collection `shardCollection` builds
//! the key's index itself; a collection that already holds documents needs
//! an index on the key first (for a hashed key, `{field: "hashed"}`),
//! which `ensure` does not create on its own, or `shardCollection` fails
//! and so does `ensure`.
//!
//! Every keyset figure in `benches/` assumes the keyset index: without it,
//! each page sorts the whole filtered collection.
//!
//! - **Idempotent, and never destructive.** What exists is left alone; a
//!   second run creates nothing ([`Ensured::created_nothing`]). [`Ensured`]
//!   lists by name what this call created (`collections_created`,
//!   `indexes_created`, `sharded`), not what existed or what a concurrent
//!   call created first.
//! - **Conflicts are reported, not fixed.** An index with the declared name
//!   but other keys, or with an option that keeps it from serving every
//!   query on its keys (`partialFilterExpression`, `sparse`, `hidden`, a
//!   collation), is a [`Conflict::Index`] carrying what `listIndexes`
//!   shows; a view under the collection's name is
//!   [`Conflict::NotACollection`]; a collection sharded on another key is
//!   [`Conflict::ShardKey`]. `plan` (not `ensure`) also reads the stored
//!   documents for what an attribute changed over existing data leaves
//!   ([`Conflict::Stored`], see [`Check`]): buckets over a lowered `size`
//!   or without a renamed `items` array, histogram documents of the other
//!   `layout` or off a changed `precision`. The rest is still created. Drop what conflicts
//!   yourself if it should go (unlike ODMs that drop undeclared indexes,
//!   this never does).
//! - **Validators**: each pattern declares its invariants as a
//!   `$jsonSchema` fragment; `ensure` sets them as the collection's
//!   validator, with the collection when it creates it and by `collMod`
//!   when it exists without it or with another version or level of it.
//!   The validator is one `$jsonSchema` titled `mongo-patterns` with a
//!   part per model (`anyOf`, each part the `allOf` of one model's
//!   fragments): two models on one collection (an ordered and an
//!   arrival-order view of one history, say) each keep their part, set
//!   by either's `ensure`, in any order, by two services at once too:
//!   each registers its part in [`VALIDATOR_REGISTRY`] (a collection of
//!   the database, one document per collection) before it sets the
//!   validator, and sets it again if another registered meanwhile, since
//!   the server has no compare-and-set for a validator. A model no longer
//!   used keeps its part until you `collMod` it away and remove it from
//!   the registry; [`Validator::kept`] names such parts. The
//!   level is the last `ensure`'s. A validator of the collection's own is
//!   [`Conflict::Validator`] and left alone. See [`Validation`] for the
//!   levels and what each pattern declares, and
//!   [`Model::validate_existing`](crate::Model::validate_existing) for
//!   the documents stored before.
//! - **The same keys under another name satisfy**: nothing is created, and
//!   a [`Note::IndexUnderOtherName`] says which index serves.
//! - **Sharding only where the deployment shards**: `enableSharding`, then
//!   `shardCollection`. On a replica set or a standalone it is
//!   [`Note::ShardingNotApplicable`].
//! - `plan` returns a [`Plan`]: `create_collections`, `create_indexes`,
//!   `shard`, `conflicts`, `notes`, and [`Plan::is_up_to_date`] for a CI
//!   check.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # #[derive(Serialize, Deserialize, Model)]
//! # #[keyset(sort = "at")]
//! # struct Visit { at: DateTime }
//! # #[derive(Serialize, Deserialize, Model)]
//! # #[bucket(size = 100, key = "customer")]
//! # struct Trade { customer: i64, qty: i32 }
//! # async fn f(db: Database) -> mongo_patterns::Result<()> {
//! let done = Trade::ensure(&db)            // creates what is missing, drops nothing
//!     .write_concern(WriteConcern::majority())
//!     .comment("deploy 42")
//!     .await?;
//! assert!(done.conflicts.is_empty(), "{done}");
//! // Several models, or repositories of your own, in one call:
//! use mongo_patterns::ensure::EnsureAction;
//! EnsureAction::new(&db, Visit::declared(&db)).and(Trade::declared(&db)).await?;
//! # Ok(()) }
//! ```
//!
//! Every repository has the same call for its own declarations, under its
//! run-time collection names: `repo.ensure()` (for example one per
//! tenant's collection).
//! [`Sharded::ensure_sharded`](crate::shard_key::Sharded::ensure_sharded)
//! is the strict form for the shard key: it fails with `NotSharded` on a
//! replica set, where `ensure` notes sharding as not applicable.
//!
//! Both actions take `.session()`: the commands then run in that session.
//! A transaction refuses `listCollections` and `listIndexes`, so run them
//! outside one. Their options: the [guide](crate::guide#options).

use mongodb::bson::{doc, Document};
use mongodb::IndexModel;

mod action;
mod compare;
mod needs;
mod nested;
mod report;

pub use crate::feature::Feature;
pub use action::{EnsureAction, PlanAction, ValidateExisting, VALIDATOR_REGISTRY};
pub(crate) use needs::ServerFacts;
pub use needs::{Need, Unsupported};
#[doc(hidden)]
pub use nested::{probe, variant};
pub use nested::{Nested, Schema, Wrap};
pub use report::{Conflict, Ensured, Index, Invalid, Note, Plan, Shard, Validator};

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
    /// What the pattern's repository needs from the server (see
    /// [`Feature`]).
    pub needs: Vec<Need>,
    /// Documents the declaration cannot read as it stands, which `plan`
    /// looks for in a collection that holds data.
    pub checks: Vec<Check>,
    /// `$jsonSchema` fragments every document must satisfy: the pattern's
    /// invariants, which `ensure` has the server enforce (see
    /// [`Validation`]).
    pub schemas: Vec<Document>,
    /// How the server enforces `schemas`.
    pub validation: Validation,
    /// The model `schemas` describe (its type's name), set by
    /// [`for_model`]. A collection's validator admits a document that
    /// meets every fragment of one model's: two models on one collection
    /// (an ordered and an arrival-order view of one history, say) each
    /// have their own part, and neither model's `ensure` replaces the
    /// other's.
    pub model: Option<String>,
}

/// How the server enforces a collection's schema:
/// `#[model(validate = "...")]`. What is declared is the struct's fields'
/// BSON types as serde stores them ([`FieldType`]; none required) and each
/// pattern's own invariants (a bucket's `_id` shape, `count` and `start`,
/// its items array no longer than the bucket's limit; a histogram's counts
/// integers not below 0; a derived shard key field a date), which another
/// writer (a service, a person in the shell) could otherwise break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Validation {
    /// Inserts, and updates of documents that pass, are checked; a
    /// document stored before that already breaks the schema can still be
    /// updated (`validationLevel: "moderate"`), so a migration can mend it.
    #[default]
    Moderate,
    /// Every insert and update is checked (`validationLevel: "strict"`).
    Strict,
    /// Nothing is refused; the server logs each write that breaks the
    /// schema (`validationAction: "warn"`, level strict).
    Warn,
    /// No validator is declared. One set before is left in place (`ensure`
    /// drops nothing): remove it with `collMod` yourself.
    Off,
}

impl Validation {
    /// `validationLevel` and `validationAction`.
    pub fn level_and_action(self) -> (&'static str, &'static str) {
        match self {
            Validation::Moderate => ("moderate", "error"),
            Validation::Strict | Validation::Off => ("strict", "error"),
            Validation::Warn => ("strict", "warn"),
        }
    }
}

/// One stored field of a model and the BSON types its Rust type stores and
/// reads (`items`: its elements', for a sequence): `Model::FIELDS`, which
/// the derive writes for every field whose type decides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldType {
    /// The BSON name.
    pub name: &'static str,
    /// `$jsonSchema` `bsonType` aliases.
    pub types: &'static [&'static str],
    /// The elements' aliases, for an array; empty when open.
    pub items: &'static [&'static str],
}

/// The `$jsonSchema` fragment of `fields` (each one's type where present;
/// none is required: a counter's upsert, or a partial write, stores some
/// fields only) and of `nested` (the fields whose type implements
/// [`Schema`], which say more than their entry in `fields`), leaving out
/// `without` (a bucket's key, which its items do not hold). `None` when
/// nothing is left.
pub fn fields_schema(
    fields: &[FieldType],
    nested: &[Nested],
    without: Option<&str>,
) -> Option<Document> {
    let mut properties = Document::new();
    for f in fields.iter().filter(|f| Some(f.name) != without) {
        let mut t = doc! {"bsonType": f.types.to_vec()};
        if !f.items.is_empty() {
            t.insert("items", doc! {"bsonType": f.items.to_vec()});
        }
        properties.insert(f.name, t);
    }
    for n in nested.iter().filter(|n| Some(n.name) != without) {
        properties.insert(n.name, n.schema.clone());
    }
    (!properties.is_empty()).then(|| doc! {"properties": properties})
}

/// Adds what a model's fields declare ([`fields_schema`]) to the first
/// declaration of `collection` in `declared` (or a new one).
pub fn with_fields(
    mut declared: Vec<Declared>,
    collection: &str,
    fields: &[FieldType],
    nested: &[Nested],
) -> Vec<Declared> {
    let Some(schema) = fields_schema(fields, nested, None) else {
        return declared;
    };
    match declared.iter_mut().find(|d| d.collection == collection) {
        Some(d) => d.schemas.push(schema),
        None => declared.push(Declared::new(collection).schema(schema)),
    }
    declared
}

/// The `$jsonSchema` of a struct with named fields, for its
/// [`Schema`] impl: an object with the properties [`fields_schema`]
/// gives.
pub fn object_schema(fields: &[FieldType], nested: &[Nested]) -> Document {
    let mut s = doc! {"bsonType": "object"};
    if let Some(p) = fields_schema(fields, nested, None) {
        s.extend(p);
    }
    s
}

/// The `title` of the `$jsonSchema` the patterns declare: a validator with
/// another title (or none) is someone else's, and left alone.
pub const SCHEMA_TITLE: &str = "mongo-patterns";

/// Sets how the server enforces every schema in `declared`; with
/// [`Validation::Off`], declares none. What `#[model(validate)]` expands
/// to.
pub fn with_validation(mut declared: Vec<Declared>, v: Validation) -> Vec<Declared> {
    for d in &mut declared {
        d.validation = v;
        if v == Validation::Off {
            d.schemas.clear();
        }
    }
    declared
}

/// [`with_validation`] at the model's level (`M::VALIDATION`), and each
/// declaration's schemas marked as the model `M`'s (see
/// [`Declared::model`]). What the derive's `declared` and the
/// repositories' own end with.
pub fn for_model<M: ?Sized>(declared: Vec<Declared>, level: Validation) -> Vec<Declared> {
    let name = model_name::<M>();
    let mut declared = with_validation(declared, level);
    for d in &mut declared {
        d.model = Some(name.to_owned());
    }
    declared
}

/// A model's name in its validator's part: its type's, without the module
/// path (moving a struct between modules keeps its part) or generics.
fn model_name<M: ?Sized>() -> &'static str {
    let full = std::any::type_name::<M>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// Stored documents that a declaration reads wrongly or refuses: what an
/// attribute changed over existing data leaves behind (a bucket `size`
/// lowered, a rank histogram's `layout` changed), or another writer's
/// documents. [`Model::plan`](crate::Model::plan) counts them and names a
/// few by `_id` ([`Conflict::Stored`]); `ensure` does not look (it would
/// scan the collection at every start).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Check {
    /// Matches the documents that break the declaration (a `$match`
    /// stage's filter; most need a collection scan).
    pub filter: Document,
    /// What such a document is, in words.
    pub found: String,
    /// What the repository does with them, and how to migrate.
    pub then: String,
}

impl Check {
    /// Documents matching `filter` are `found`; `then` says what happens.
    pub fn new(filter: Document, found: impl Into<String>, then: impl Into<String>) -> Check {
        Check {
            filter,
            found: found.into(),
            then: then.into(),
        }
    }
}

impl Declared {
    /// `collection`, with nothing in it yet.
    pub fn new(collection: impl Into<String>) -> Self {
        Declared {
            collection: collection.into(),
            indexes: Vec::new(),
            shard_key: None,
            needs: Vec::new(),
            checks: Vec::new(),
            schemas: Vec::new(),
            validation: Validation::default(),
            model: None,
        }
    }

    /// Adds a `$jsonSchema` fragment every document must satisfy.
    pub fn schema(mut self, fragment: Document) -> Self {
        self.schemas.push(fragment);
        self
    }

    /// Adds `$jsonSchema` fragments every document must satisfy.
    pub fn schemas(mut self, fragments: impl IntoIterator<Item = Document>) -> Self {
        self.schemas.extend(fragments);
        self
    }

    /// Adds a check of the stored documents (see [`Check`]).
    pub fn check(mut self, check: Check) -> Self {
        self.checks.push(check);
        self
    }

    /// Adds checks of the stored documents (see [`Check`]).
    pub fn checks(mut self, checks: impl IntoIterator<Item = Check>) -> Self {
        self.checks.extend(checks);
        self
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

    /// Adds what the pattern needs from the server.
    pub fn needs(mut self, needs: impl IntoIterator<Item = Need>) -> Self {
        self.needs.extend(needs);
        self
    }

    /// Shards the collection on `key`.
    pub fn sharded(mut self, key: Document, unique: bool) -> Self {
        self.shard_key = Some((key, unique));
        self
    }
}
