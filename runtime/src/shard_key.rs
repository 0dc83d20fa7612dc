//! The shard key pattern: `{coarse ascending field: 1, search
//! field: 1}`, such as `{month: 1, type: 1}` for application logs, with
//! `month` derived from `ts`.
//!
//! Why this shape, and what the repository does about each trap:
//! - A fine ascending key (`ts`, an ObjectId) sends every insert to the last
//!   chunk; a coarse one (the month of `ts`) still ascends, so chunks fill
//!   and migrate in order (sequential I/O), but a whole month splits across
//!   chunks by the search field. The repository derives the coarse field on
//!   every write, from the timestamp, so no caller computes it by hand.
//! - A low-cardinality key alone (`type`) cannot split past its few values:
//!   jumbo chunks and hot shards. The derive refuses it at compile time
//!   unless told otherwise.
//! - A random key (a UUID) balances inserts but rebalancing reads documents
//!   in random order. A hashed key is available as an explicit choice.
//! - On a sharded collection every upsert and replace must carry the full
//!   shard key in its filter (MongoDB 4.2+): [`Sharded::upsert`] and
//!   [`Sharded::replace`] build that filter, and move a document whose key
//!   changed (they look up the key it is stored under, so an upsert never
//!   inserts a second document with the same `_id` on another shard);
//!   [`Sharded::update`] and [`Sharded::delete`] take the key's values. Key
//!   fields cannot be changed through `update`.
//! - A query without the key's prefix goes to every shard. [`Sharded::find`]
//!   takes the search value and a time range, so it is targeted; anything
//!   else goes through the separately named [`Sharded::scatter`].
//!
//! [`Sharded::analyze`] reports what MongoDB 7.0's `analyzeShardKey` reports
//! under `keyCharacteristics`, on any deployment, by `$sample`.
//!
//! Every method that sends a command returns an action ([`Insert`],
//! [`InsertMany`], [`Replace`], [`Upsert`], [`Update`], [`Delete`],
//! [`Find`], [`AuditKeys`], [`FillCoarse`], [`Analyze`], [`EnsureSharded`]): setters for
//! the session and the options that apply, run by `.await`. [`Sharded::find`],
//! [`Sharded::find_by_hashed`] and [`Sharded::scatter`] give a stream when
//! awaited, as the driver's `find` gives a cursor: the query is sent and
//! refused at the `.await`, and the stream then reads batch after batch.
//! [`Sharded::shard_spec`], [`Sharded::shard_commands`],
//! [`Sharded::mongosh_script`], [`Sharded::to_document`],
//! [`Sharded::key_filter`], [`Sharded::targeted_filter`] and
//! [`Sharded::declared`] send nothing, so no option could apply to them:
//! they stay plain methods.
//!
//! # Using it
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[model(collection = "logs")]
//! #[shard_key(coarse = "month", from = "ts", search = "type")]   // {month: 1, type: 1}
//! pub struct Log {
//!     #[serde(rename = "_id")] pub id: ObjectId,
//!     #[serde(rename = "type")] pub kind: String,
//!     pub ts: i64,                                   // epoch seconds
//!     pub msg: String,
//! }
//!
//! # async fn f(db: Database, log: Log) -> mongo_patterns::Result<()> {
//! let logs = Log::sharded(&db);
//! logs.insert(&log).await?;                          // `month` derived from `ts` on every write
//! let mut recent = logs                              // targeted: a stream of `Log`
//!     .find("app", TimeRange::last_days(30), doc! {})
//!     .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
//!         options: None,
//!     }))
//!     .await?;
//! while let Some(log) = recent.try_next().await? { /* ... */ }
//! let everything: Vec<Log> = logs                    // named apart
//!     .scatter(doc! {"msg": "Database crash"})
//!     .await?
//!     .try_collect()
//!     .await?;
//! logs.upsert(&log).write_concern(WriteConcern::majority()).await?;
//! logs.ensure_sharded().await?;                      // index, enableSharding, shardCollection
//! println!("{}", logs.mongosh_script());             // the same, for a DBA
//! let report = logs.analyze(&["type"], 10_000).await?;  // on any deployment, by $sample
//! # Ok(()) }
//! ```
//!
//! `coarse` names the coarse ascending field. With `from` (a `DateTime` field, or
//! an integer field of epoch seconds) the repository derives it on every write,
//! rounded down to the `granularity` (`hour`, `day`, `week` (ISO, Monday),
//! `month`, `quarter`, `year`; by default the coarse field's own name when it
//! is one of those), as a BSON date. The struct need not
//! have the field; if it has one, it must be a `DateTime` (or
//! `Option<DateTime>`), and it reads the derived value back. `search` is the
//! field queries filter by. `hashed = "id"` is the explicit alternative,
//! `{id: "hashed"}`. The model must have a field stored as `_id` (a compile
//! error otherwise): `upsert` and `replace` find a document by its `_id` and
//! its full shard key.
//!
//! | lint (compile error) | when | opt-out |
//! | --- | --- | --- |
//! | `monotonic` | a lone key on a `DateTime`, `ObjectId` or `Timestamp`, or on an integer named like a time or a counter (`ts`, `*_at`, `seq`, …): every insert goes to the last chunk | `allow(monotonic)` |
//! | `low_cardinality` | a lone key on a `bool`, or on any type of one byte (a fieldless enum, `u8`), checked by `size_of` at compile time: no more chunks than values, jumbo chunks | `allow(low_cardinality)` |
//! | `coarse_not_derived` | `coarse` names a stored field and there is no `from`: nothing keeps it coarse and ascending | `allow(coarse_not_derived)` |
//! | `missing_search` | no `search` field: a period's documents share one key value | `allow(missing_search)` |
//!
//! | call | what it sends |
//! | --- | --- |
//! | `insert`, `insert_many` | the documents with the coarse field filled |
//! | `upsert(&item)`, `replace(&item)` | `replaceOne` whose filter is `_id` plus the full shard key (MongoDB 4.2+ requires it on a sharded collection). On a miss: a `find` by `_id` (every shard), then a `replaceOne` on the stored key, which moves a document whose key changed, or (upsert) the insert. A replace under an unchanged key is 1 round trip; a move or an upsert that inserts, 3 |
//! | `update(at, search, filter, update)` | `updateMany` within one key value; refuses updates that change a key field, the timestamp it derives from, or `_id`. When `filter` names one `_id` and nothing matched, a `find` by it: `ShardKeyMismatch` if it is stored under another key |
//! | `delete(at, search, filter)` | `deleteMany` (`limit: 0`) within one key value, as `update`: when `filter` names one `_id` and nothing was deleted, a `find` by it: `ShardKeyMismatch` if it is stored under another key |
//! | `find(search, range, extra)` | `find` on `{month: {$gte, $lte}, type, ts: {$gte, $lt}, ...extra}`: the key's prefix, so `mongos` targets the shards that hold that range; the bound on `ts` is exact to the millisecond (epoch seconds: a log at second `s` is at `s × 1000` ms) |
//! | `audit(max)` | one `find` over the whole collection, projected to the key: documents whose coarse field is missing, not a date, or not their timestamp's period (targeted queries cannot see them), as `Damaged`, up to `max` |
//! | `fill_coarse()` | the same scan in `_id` order, in batches of 1,000, and per batch one `update` command (a `$dateTrunc` pipeline on the batch's `_id`s, guarded by the timestamp's type; before MongoDB 5.0, one statement per document, guarded by its timestamp as read and the coarse field not yet right) that writes the derived field on documents lacking it or holding another value (another granularity's period: the migration after the attribute changed); reports filled, migrated, unfillable (named, as `Damaged`) and progress |
//! | `find_by_hashed(value)` | `find` on the hashed field's value: one shard |
//! | `scatter(filter)` | any `find`: every shard (named so that it is never an accident) |
//! | `ensure_sharded()` | `createIndexes` on the key, then on the `admin` database of the repository's client `enableSharding` (MongoDB before 6.0 needs it; harmless after) and `shardCollection`, each with the effective write concern in its body (`run_command` inherits none) and its `writeConcernError` read; `NotSharded` on a replica set or a standalone (CommandNotFound), after the index |
//! | `shard_commands()`, `mongosh_script()` | the same commands, as documents and as a script |
//! | `shard_spec()`, `to_document`, `key_filter`, `targeted_filter`, `declared()` | nothing: pure computations, plain methods (no options could apply) |
//! | `analyze(key, n)` | one `$sample` of `n` documents: distinct values, the most common values and their frequency, monotonicity (Spearman's correlation of key order with `_id` order, monotonic at 0.7 or more, as `analyzeShardKey` decides), the same correlation within each value of the key's prefix, and a verdict in words: `{type, ts}` is "one ascending stream per {type} value" (inserts go to one chunk per type), `{month, type}` "coarse and ascending" |
//!
//! Every call in that table that sends something returns an action, as the
//! driver's calls do: setters, then `.await`. `find`, `find_by_hashed` and
//! `scatter` give a `BoxStream<Result<T>>` when awaited, as the driver's
//! `find` gives a cursor: the `find` is sent, and a refused query fails, at
//! the `.await`; the stream then holds the cursor (and the session, if one
//! was given, until it is dropped) and reads further batches as it is
//! polled. Which setters each call takes, sessions, and collections per
//! tenant: the [guide](crate::guide#shard-key).
//!
//! How candidate keys compare on a model of a cluster (inserts per shard,
//! jumbo chunks, migrations, shards per query): `benches/shard_sim-results.md`
//! and `benches/README.md`.
//!
//! # Failure behaviour
//!
//! The repository keeps no state between calls, so a cancelled call, a
//! server crash or a failover leaves at most the commands already sent; there
//! is nothing to resume or release.
//!
//! - **Cancelled calls.** `insert`, `update` and `delete` are one command
//!   each; `insert_many` one `insertMany` (ordered: a cut or failed batch may have
//!   stored a prefix, and a retry gets a duplicate key on those). `replace`
//!   and `upsert` are up to three commands (the write under the new key; on a
//!   miss, the lookup by `_id`; the write under the stored key, or the
//!   insert), and each writes the whole document: a cut call leaves the old
//!   document or the new one, never a mix, never two with one `_id`, and
//!   calling again completes it (`cancelled_moves_leave_one_whole_document`
//!   cuts 200 moves at 0–3 ms).
//! - **A changed key** (the timestamp moved to another month, the search value
//!   changed) is moved, not refused: after the miss, the document is replaced
//!   by a filter on the key it is stored under, and MongoDB 4.2+ moves it to
//!   the new key's chunk in that one write, when it is a retryable write (the
//!   driver's default) or in a transaction. This is what Spring Data's
//!   `@Sharded` does. A delete and an insert by the client would need a
//!   transaction to not lose the document on a crash between them, and a
//!   typed error would make every caller write the same lookup. With
//!   `retryWrites=false`, `mongos` refuses the change (`Database`) and nothing
//!   is written. What no client can prevent: two concurrent upserts of one
//!   new `_id` under two keys on a sharded cluster may both insert, on two
//!   shards (MongoDB enforces `_id` uniqueness per shard only); serialize the
//!   creation of an `_id` in the application, or start the key with it.
//! - **A server crash** during moves costs nothing but the write in flight:
//!   the only write of a move is its last command, so a crash before it
//!   leaves the old document, after it the new one
//!   (`crash_during_moves_leaves_one_whole_document` kills the server after 8
//!   rounds of 20 moves: each `_id` stored once, whole, at the last
//!   acknowledged version or the one in flight). That is why an upsert runs no
//!   transaction of its own: there is no second document write to protect.
//! - **In a caller's transaction** the lookup and the write see one snapshot,
//!   so no round repeats. A concurrent writer of the same `_id` surfaces as the
//!   server's `WriteConflict` (112, labelled `TransientTransactionError`), or,
//!   on a server that reports a duplicate key there, as `Raced` carrying that
//!   label: the repository never retries inside a transaction it does not
//!   own, and `is_transient()` tells the caller to run it again (`and_run2`
//!   does).
//! - **Retry** `Unavailable` (after a backoff; the outcome of the write in
//!   flight is unknown). `replace` and `upsert` are safe to repeat; an
//!   `insert` repeated after it landed is a duplicate key (`Database`, code
//!   11000), which means it is stored; an `update` is as safe to repeat as its
//!   operators (`$set` is, `$inc` is not: `updateMany` is not a retryable
//!   write); a `delete` is safe to repeat (a repeat deletes what matches by
//!   then). `Contended` (5 rounds lost to concurrent writers of one `_id`
//!   during a move) may be retried. Do not retry `Damaged`,
//!   `UnexpectedDocument`, `ShardKeyMismatch` or `InvalidArgument`: the same
//!   call fails the same way.
//!
//! ## Damaged data
//!
//! Written by another client:
//!
//! | stored document | `find` | `scatter`, `find_by_hashed` | `replace`, `upsert`, `update`, `delete` by `_id` |
//! | --- | --- | --- | --- |
//! | no coarse field, or one that is not a date or not its timestamp's period | not returned: its key is in no range (see `audit`; `fill_coarse` writes it) | returned, or `UnexpectedDocument` if the model cannot read it | `Damaged` naming the `_id` and field; nothing written |
//! | a key field missing or of another type than the model writes, a timestamp that is not one | returned only if the stored key matches the query (then `UnexpectedDocument`) | `UnexpectedDocument` | `Damaged`; nothing written |
//! | any field that does not deserialize into the model | `UnexpectedDocument { id }` | `UnexpectedDocument { id }` | written over (a replace sends the whole model) |
//! | stored under another key than `update` or `delete` named | — | — | `ShardKeyMismatch { id, stored }` |
//!
//! A targeted query cannot see a document that lacks its key, and nothing but
//! a scan can: `audit(max)` is that scan, and `fill_coarse()` the repair. The library installs no server-side
//! validator; a `$jsonSchema` requiring the coarse field is the way to make the
//! server refuse such writes.

pub mod analyze;
mod audit;
mod deploy;
mod fill;
mod read;
#[cfg(test)]
mod tests;
mod time;
mod write;

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use self::analyze::KeyAnalysis;
pub use self::audit::{Analyze, Audit, AuditKeys};
pub use self::deploy::EnsureSharded;
pub use self::fill::{Fill, FillCoarse};
pub use self::read::Find;
pub use self::time::truncate;
pub use self::write::{Delete, Insert, InsertMany, Replace, Update, Upsert};
use crate::action::Options;
use crate::model::Model;

/// How far a derived coarse field rounds its timestamp down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    /// The start of the hour (UTC).
    Hour,
    /// Midnight UTC.
    Day,
    /// Monday midnight UTC (ISO weeks).
    Week,
    /// The first of the month.
    Month,
    /// The first of January, April, July or October.
    Quarter,
    /// The first of January.
    Year,
}

/// How the timestamp a coarse field derives from is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeRepr {
    /// A BSON date.
    DateTime,
    /// Seconds since the Unix epoch, as an integer.
    EpochSeconds,
}

/// A coarse field the repository derives from a timestamp field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Derived {
    /// The BSON name of the timestamp field.
    pub from: &'static str,
    /// How it is stored.
    pub repr: TimeRepr,
    /// How far the coarse field rounds it down.
    pub granularity: Granularity,
}

/// What `#[shard_key(...)]` declares: a ranged key or a hashed one, never
/// both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSpec {
    /// `{coarse: 1, search: 1}`, or either field alone.
    Ranged {
        /// The coarse ascending prefix.
        coarse: Option<Coarse>,
        /// The search field's BSON name.
        search: Option<&'static str>,
    },
    /// `{field: "hashed"}`, by the field's BSON name.
    Hashed(&'static str),
}

/// The coarse ascending field of a ranged shard key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coarse {
    /// Its BSON name.
    pub field: &'static str,
    /// Where it comes from; `None` when the model stores it.
    pub derived: Option<Derived>,
}

impl ShardSpec {
    /// What generated code declares after a compile error: nothing.
    #[doc(hidden)]
    pub const FALLBACK: ShardSpec = ShardSpec::Ranged {
        coarse: None,
        search: None,
    };

    /// The coarse field's BSON name.
    pub const fn coarse(&self) -> Option<&'static str> {
        match self {
            ShardSpec::Ranged {
                coarse: Some(c), ..
            } => Some(c.field),
            _ => None,
        }
    }

    /// Where the coarse field comes from, when the repository derives it.
    pub const fn derived(&self) -> Option<Derived> {
        match self {
            ShardSpec::Ranged {
                coarse: Some(c), ..
            } => c.derived,
            _ => None,
        }
    }

    /// The search field's BSON name.
    pub const fn search(&self) -> Option<&'static str> {
        match self {
            ShardSpec::Ranged { search, .. } => *search,
            ShardSpec::Hashed(_) => None,
        }
    }

    /// The hashed field's BSON name.
    pub const fn hashed(&self) -> Option<&'static str> {
        match self {
            ShardSpec::Hashed(f) => Some(f),
            ShardSpec::Ranged { .. } => None,
        }
    }
}

/// A model in a sharded collection. `#[shard_key]` implements it.
pub trait ShardKeyed: Model + Serialize + DeserializeOwned + Send + Sync + Unpin + 'static {
    /// The search field's type (`()` without one).
    type Search: Serialize + Send + Sync;
    /// What `#[shard_key(...)]` declares.
    const SHARD: ShardSpec;

    /// The repository over `db`.
    fn sharded(db: &Database) -> Sharded<Self> {
        Sharded::new(db)
    }
}

/// Types a coarse field can derive from: a BSON date, or epoch seconds.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a timestamp a coarse shard key field can derive from",
    label = "not a DateTime or epoch seconds",
    note = "`from` must name a `bson::DateTime` field, or an integer field holding seconds since the Unix epoch"
)]
pub trait Timestamp {
    /// How the type stores time.
    const REPR: TimeRepr;
}

impl Timestamp for DateTime {
    const REPR: TimeRepr = TimeRepr::DateTime;
}

macro_rules! epoch_seconds {
    ($($t:ty),*) => {$(
        impl Timestamp for $t {
            const REPR: TimeRepr = TimeRepr::EpochSeconds;
        }
    )*};
}
epoch_seconds!(i32, i64, u32, u64);

/// Types a struct field can have when the repository derives its value (a
/// date): the field reads the derived value back.
#[diagnostic::on_unimplemented(
    message = "the derived coarse field is a date, and `{Self}` cannot hold one",
    label = "the repository stores a DateTime here",
    note = "make the field a `DateTime` (or `Option<DateTime>`), or remove it: the repository adds the field to every stored document"
)]
pub trait CoarseSlot {}

impl CoarseSlot for DateTime {}
impl CoarseSlot for Option<DateTime> {}

/// A time range for a targeted query: from `start` (inclusive) to `end`
/// (exclusive), exact to the millisecond on the timestamp field (a
/// timestamp in epoch seconds is at its second's first millisecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    /// Inclusive.
    pub start: DateTime,
    /// Exclusive.
    pub end: DateTime,
}

impl TimeRange {
    /// `[start, end)`.
    pub fn between(start: DateTime, end: DateTime) -> Self {
        TimeRange { start, end }
    }

    /// The last `days` days up to now.
    pub fn last_days(days: u32) -> Self {
        let end = DateTime::now();
        let start = DateTime::from_millis(end.timestamp_millis() - i64::from(days) * 86_400_000);
        TimeRange { start, end }
    }
}

/// The typed repository a `#[shard_key]` model gets: see the module docs.
#[derive(Debug)]
pub struct Sharded<T: Send + Sync> {
    db: Database,
    coll: Collection<Document>,
    typed: Collection<T>,
    spec: ShardSpec,
    defaults: Options,
}

impl<T: Send + Sync> Clone for Sharded<T> {
    fn clone(&self) -> Self {
        Sharded {
            db: self.db.clone(),
            coll: self.coll.clone(),
            typed: self.typed.clone(),
            spec: self.spec,
            defaults: self.defaults.clone(),
        }
    }
}

impl<T: Send + Sync> crate::action::Repository for Sharded<T> {
    const PATTERN: &'static str = "shard_key";

    fn defaults(&self) -> &crate::action::Options {
        &self.defaults
    }

    fn collection_name(&self) -> &str {
        self.coll.name()
    }
}

impl<T: ShardKeyed> Sharded<T> {
    /// The repository for `T` in `db`, on the collection the model names.
    pub fn new(db: &Database) -> Self {
        Sharded {
            db: db.clone(),
            coll: db.collection(T::COLLECTION),
            typed: db.collection(T::COLLECTION),
            spec: T::SHARD,
            defaults: Options::default(),
        }
    }

    /// The same repository on the collection `name` (one collection per
    /// tenant, say). The model's name stays the default.
    pub fn with_collection(mut self, name: &str) -> Self {
        self.coll = self.db.collection(name);
        self.typed = self.db.collection(name);
        self
    }

    /// The same repository with `options` as the defaults of every
    /// operation; an operation's own setters override them field by field,
    /// and what neither sets comes from the `Database`.
    pub fn with_options(mut self, options: Options) -> Self {
        self.defaults = options;
        self
    }

    /// The collection, typed as the model, for commands of your own beside
    /// the repository's. Documents read back as `T`; a write of your own
    /// must store the derived coarse field, or targeted queries will not
    /// see the document: write [`Sharded::to_document`] through
    /// `collection().clone_with_type::<Document>()`.
    pub fn collection(&self) -> &Collection<T> {
        &self.typed
    }

    /// The repository's default options ([`Sharded::with_options`]).
    pub fn options(&self) -> &Options {
        &self.defaults
    }
}

/// `{coarse: 1, search: 1}`, or `{field: "hashed"}`.
pub fn shard_spec(spec: &ShardSpec) -> Document {
    let mut d = doc! {};
    if let Some(h) = spec.hashed() {
        d.insert(h, "hashed");
        return d;
    }
    for f in spec.coarse().iter().chain(spec.search().iter()) {
        d.insert(*f, 1);
    }
    d
}

fn key_fields(spec: &ShardSpec) -> Vec<&'static str> {
    spec.hashed()
        .iter()
        .chain(spec.coarse().iter())
        .chain(spec.search().iter())
        .copied()
        .collect()
}

fn index_name(spec: &ShardSpec) -> String {
    format!("mp_shard_{}", key_fields(spec).join("_"))
}

/// The projection that reads a stored document's key: the `_id`, the key
/// fields and the timestamp a coarse field derives from.
fn key_projection(spec: &ShardSpec) -> Document {
    let mut projection = doc! {"_id": 1};
    for f in key_fields(spec)
        .into_iter()
        .chain(spec.derived().map(|d| d.from))
    {
        projection.insert(f, 1);
    }
    projection
}

/// The filter on `id` and the key `stored` holds (null where a field is
/// missing, as the server compares it).
fn stored_key_filter(spec: &ShardSpec, id: &Bson, stored: &Document) -> Document {
    let mut f = doc! {"_id": id.clone()};
    for field in key_fields(spec) {
        f.insert(field, stored.get(field).cloned().unwrap_or(Bson::Null));
    }
    f
}
