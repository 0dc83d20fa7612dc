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
//!   [`Sharded::update`] takes the key's values. Key fields cannot be
//!   changed through `update`.
//! - A query without the key's prefix goes to every shard. [`Sharded::find`]
//!   takes the search value and a time range, so it is targeted; anything
//!   else goes through the separately named [`Sharded::scatter`].
//!
//! [`Sharded::analyze`] reports what MongoDB 7.0's `analyzeShardKey` reports
//! under `keyCharacteristics`, on any deployment, by `$sample`.
//!
//! Every method that sends a command returns an action ([`Insert`],
//! [`InsertMany`], [`Replace`], [`Upsert`], [`Update`], [`Find`],
//! [`AuditKeys`], [`Analyze`], [`EnsureSharded`]): setters for the session
//! and the options that apply, run by `.await`. [`Sharded::find`],
//! [`Sharded::find_by_hashed`] and [`Sharded::scatter`] give a stream when
//! awaited, as the driver's `find` gives a cursor: the query is sent and
//! refused at the `.await`, and the stream then reads batch after batch.
//! [`Sharded::shard_spec`], [`Sharded::shard_commands`],
//! [`Sharded::mongosh_script`], [`Sharded::to_document`],
//! [`Sharded::key_filter`], [`Sharded::targeted_filter`] and
//! [`Sharded::declared`] send nothing, so no option could apply to them:
//! they stay plain methods.

mod actions;
pub mod analyze;
mod audit;
mod deploy;
mod read;
#[cfg(test)]
mod tests;
mod time;
mod write;

use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::{ClientSession, Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use self::actions::{Analyze, AuditKeys, Find, Insert, InsertMany, Replace, Update, Upsert};
pub use self::analyze::KeyAnalysis;
pub use self::audit::Audit;
pub use self::deploy::EnsureSharded;
pub use self::time::truncate;
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

/// An operation's effective options and session.
struct Cx<'a> {
    options: Options,
    session: Option<&'a mut ClientSession>,
    /// The caller's transaction is open: race handling must not retry.
    in_transaction: bool,
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

    /// The effective options of an operation (its own over the
    /// repository's), and whether `session` has a transaction open.
    async fn cx<'a>(&self, options: Options, mut session: Option<&'a mut ClientSession>) -> Cx<'a> {
        let in_transaction = match session.as_deref_mut() {
            Some(s) => crate::action::in_transaction(s).await,
            None => false,
        };
        let mut options = options.or(&self.defaults);
        if in_transaction {
            options = options.in_transaction();
        }
        Cx {
            options,
            session,
            in_transaction,
        }
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
