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

pub mod analyze;

use std::borrow::Borrow;
use std::future::IntoFuture;
use std::marker::PhantomData;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::{
    CreateIndexOptions, FindOneOptions, FindOptions, IndexOptions, InsertManyOptions,
    InsertOneOptions, ReplaceOptions, UpdateOptions,
};
use mongodb::{ClientSession, Collection, Database, IndexModel};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use self::analyze::KeyAnalysis;
use crate::action::{run, Options};
use crate::error::code::{COMMAND_NOT_FOUND, DUPLICATE_KEY};
use crate::error::{server_codes, Error, Result};
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
    /// Seconds since the Unix epoch (the seed's `ts`).
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
    /// The declaration.
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
pub struct Sharded<T: ShardKeyed> {
    db: Database,
    coll: Collection<Document>,
    typed: Collection<T>,
    spec: ShardSpec,
    defaults: Options,
    _model: PhantomData<fn() -> T>,
}

impl<T: ShardKeyed> Clone for Sharded<T> {
    fn clone(&self) -> Self {
        Sharded {
            db: self.db.clone(),
            coll: self.coll.clone(),
            typed: self.typed.clone(),
            spec: self.spec,
            defaults: self.defaults.clone(),
            _model: PhantomData,
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
            _model: PhantomData,
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

    /// The shard key document, as `shardCollection` takes it:
    /// `{month: 1, type: 1}` or `{id: "hashed"}`.
    pub fn shard_spec(&self) -> Document {
        shard_spec(&self.spec)
    }

    /// The commands that shard the collection, in order: the supporting
    /// index, `enableSharding` (only MongoDB before 6.0 needs it; harmless
    /// after) and `shardCollection`.
    pub fn shard_commands(&self) -> Vec<Document> {
        let (enable, shard) = self.admin_commands();
        vec![
            doc! {
                "createIndexes": self.coll.name(),
                "indexes": [{"key": self.shard_spec(), "name": index_name(&self.spec)}],
            },
            enable,
            shard,
        ]
    }

    /// `enableSharding` and `shardCollection`.
    fn admin_commands(&self) -> (Document, Document) {
        let db = self.db.name();
        let ns = format!("{db}.{}", self.coll.name());
        (
            doc! {"enableSharding": db},
            doc! {"shardCollection": ns, "key": self.shard_spec()},
        )
    }

    /// The same commands as a mongosh script, for a DBA to review and run.
    pub fn mongosh_script(&self) -> String {
        let db = self.db.name();
        let key = shell_doc(&self.shard_spec());
        format!(
            "// Shard `{db}.{coll}` on {key} (generated by mongo-patterns).\n\
             // 1. The index the shard key needs.\n\
             db.getSiblingDB({db:?}).getCollection({coll:?}).createIndex({key}, {{ name: {name:?} }});\n\
             // 2. Needed before MongoDB 6.0 only; harmless after.\n\
             sh.enableSharding({db:?});\n\
             // 3. Shard it.\n\
             sh.shardCollection({ns:?}, {key});\n",
            coll = self.coll.name(),
            name = index_name(&self.spec),
            ns = format!("{db}.{}", self.coll.name()),
        )
    }

    /// What this repository needs in the deployment: the shard key's index,
    /// and the collection sharded on it where the deployment shards.
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        vec![crate::ensure::Declared::new(self.coll.name())
            .index(self.shard_spec(), index_name(&self.spec))
            .sharded(self.shard_spec(), false)]
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks: the shard key's index, and on a sharded cluster the
    /// collection sharded on it. The same as
    /// [`Model::ensure`] for this repository; unlike
    /// [`ensure_sharded`](Self::ensure_sharded) it succeeds on a replica
    /// set (sharding noted as not applicable).
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.db, self.declared())
    }

    /// Creates the key's index and shards the collection: `createIndexes`,
    /// then on the `admin` database of the repository's client
    /// `enableSharding` (which MongoDB before 6.0 needs) and
    /// `shardCollection`. Fails with [`Error::NotSharded`] on a deployment
    /// without sharding (a replica set or a standalone answers
    /// CommandNotFound), after creating the index, which serves targeted
    /// queries there too.
    ///
    /// The two admin commands go through `run_command`, which inherits no
    /// write concern: the effective one (the action's, the repository's,
    /// else the collection's) is sent in each. It takes no session: neither
    /// command may run in a transaction, and outside one a session changes
    /// nothing for them.
    pub fn ensure_sharded(&self) -> EnsureSharded<'_, T> {
        EnsureSharded {
            repo: self,
            options: Options::default(),
        }
    }

    async fn ensure_sharded_in(&self, o: Options) -> Result<()> {
        let index = IndexModel::builder()
            .keys(self.shard_spec())
            .options(IndexOptions::builder().name(index_name(&self.spec)).build())
            .build();
        self.coll
            .create_index(index)
            .with_options(o.driver::<CreateIndexOptions>())
            .await?;
        let admin = self.db.client().database("admin");
        let (enable, shard) = self.admin_commands();
        for (name, mut command) in [("enableSharding", enable), ("shardCollection", shard)] {
            o.command_fields(&mut command, self.coll.write_concern(), true)?;
            match admin.run_command(command).await {
                Ok(reply) => crate::action::command_write_errors(&reply)?,
                Err(e) if server_codes(&e).contains(&COMMAND_NOT_FOUND) => {
                    return Err(Error::NotSharded { command: name })
                }
                // Sharding already enabled for the database.
                Err(e)
                    if name == "enableSharding"
                        && server_codes(&e).contains(&crate::error::code::ALREADY_INITIALIZED) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

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
        let mut f = doc! {};
        match stored.get("_id") {
            Some(id) => f.insert("_id", id.clone()),
            None => {
                return Err(Error::invalid(
                    "item",
                    "it serializes without an `_id`; an upsert or a replace needs one to find the document",
                ))
            }
        };
        for field in key_fields(&self.spec) {
            f.insert(field, stored.get(field).cloned().unwrap_or(Bson::Null));
        }
        Ok(f)
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

    /// Inserts `item`, its coarse field derived: one `insert`.
    pub fn insert<'a>(&'a self, item: &'a T) -> Insert<'a, T> {
        Insert {
            repo: self,
            item,
            options: Options::default(),
            session: None,
        }
    }

    async fn insert_in(&self, item: &T, mut cx: Cx<'_>) -> Result<()> {
        let d = self.to_document(item)?;
        let o = cx.options.driver::<InsertOneOptions>();
        run!(
            self.coll.insert_one(d).with_options(o),
            cx.session.as_deref_mut()
        )?;
        Ok(())
    }

    /// Inserts `items` in one `insert` (`insertMany`, ordered), their coarse
    /// fields derived. Sends nothing for no items.
    pub fn insert_many<'a>(&'a self, items: &'a [T]) -> InsertMany<'a, T> {
        InsertMany {
            repo: self,
            items,
            options: Options::default(),
            session: None,
        }
    }

    async fn insert_many_in(&self, items: &[T], mut cx: Cx<'_>) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let docs = items
            .iter()
            .map(|i| self.to_document(i))
            .collect::<Result<Vec<_>>>()?;
        let o = cx.options.driver::<InsertManyOptions>();
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
    pub fn replace<'a>(&'a self, item: &'a T) -> Replace<'a, T> {
        Replace {
            repo: self,
            item,
            options: Options::default(),
            session: None,
        }
    }

    async fn replace_in(&self, item: &T, cx: Cx<'_>) -> Result<bool> {
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
    pub fn upsert<'a>(&'a self, item: &'a T) -> Upsert<'a, T> {
        Upsert {
            repo: self,
            item,
            options: Options::default(),
            session: None,
        }
    }

    async fn upsert_in(&self, item: &T, cx: Cx<'_>) -> Result<bool> {
        let d = self.to_document(item)?;
        Ok(self.write(&d, true, cx).await? == Written::Inserted)
    }

    /// The write behind `replace` and `upsert`: the new key first, then,
    /// on a miss, the key the `_id` is stored under.
    async fn write(&self, d: &Document, upsert: bool, mut cx: Cx<'_>) -> Result<Written> {
        let filter = self.key_filter(d)?;
        let o = cx.options.driver::<ReplaceOptions>();
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
        // inserted the `_id` between our lookup and our write. In a
        // transaction the lookup and the write share a snapshot: one round.
        let rounds = if cx.in_transaction { 1 } else { WRITE_ROUNDS };
        for _ in 0..rounds {
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
                    Err(e) if cx.in_transaction && server_codes(&e).contains(&DUPLICATE_KEY) => {
                        return Err(crate::action::raced_in_transaction(e))
                    }
                    // Inserted meanwhile under another key: look again.
                    Err(e) if server_codes(&e).contains(&DUPLICATE_KEY) => {}
                    Err(e) => return Err(e.into()),
                },
            }
        }
        Err(Error::Contended {
            operation: if upsert { "upsert" } else { "replace" },
            attempts: rounds,
        })
    }

    /// The filter on the `_id` and the key it is stored under, or `None`
    /// when no document holds the `_id`. `new` is the document about to be
    /// written: a key field it has and the stored one lacks, or holds as
    /// another type, is damage.
    async fn stored_key(
        &self,
        id: &Bson,
        new: &Document,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Document>> {
        let mut projection = doc! {"_id": 1};
        for f in key_fields(&self.spec)
            .into_iter()
            .chain(self.spec.derived().map(|d| d.from))
        {
            projection.insert(f, 1);
        }
        // The lookup decides the write: it reads the primary, with the
        // default read concern (or the transaction's), whatever reads are
        // set to elsewhere.
        let mut lookup = cx.options.clone();
        lookup.read_concern = None;
        lookup.selection_criteria = None;
        let o = lookup.driver::<FindOneOptions>();
        let found = run!(
            self.coll
                .find_one(doc! {"_id": id.clone()})
                .with_options(o)
                .projection(projection),
            cx.session.as_deref_mut()
        )?;
        let Some(stored) = found else {
            return Ok(None);
        };
        check_stored(&self.spec, self.coll.name(), &stored, Some(new))?;
        let mut f = doc! {"_id": id.clone()};
        for field in key_fields(&self.spec) {
            f.insert(field, stored.get(field).cloned().unwrap_or(Bson::Null));
        }
        Ok(Some(f))
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
        Update {
            repo: self,
            point: self.point_filter(at, search),
            filter,
            update,
            options: Options::default(),
            session: None,
        }
    }

    async fn update_in(
        &self,
        point: Result<Document>,
        filter: Document,
        update: Document,
        mut cx: Cx<'_>,
    ) -> Result<u64> {
        check_update(&self.spec, &update)?;
        let point = point?;
        let id = filter
            .get("_id")
            .filter(|v| {
                !v.as_document()
                    .is_some_and(|d| d.keys().any(|k| k.starts_with('$')))
            })
            .cloned();
        let mut f = point.clone();
        for (k, v) in filter {
            f.insert(k, v);
        }
        let o = cx.options.driver::<UpdateOptions>();
        let matched = run!(
            self.coll.update_many(f, update).with_options(o),
            cx.session.as_deref_mut()
        )?
        .matched_count;
        if let (0, Some(id)) = (matched, id) {
            if let Some(stored) = self.stored_key(&id, &point, &mut cx).await? {
                let differs = point.iter().any(|(k, v)| {
                    stored
                        .get(k)
                        .is_none_or(|s| analyze::cmp_bson(s, v) != std::cmp::Ordering::Equal)
                });
                if differs {
                    let mut key = stored;
                    key.remove("_id");
                    return Err(Error::ShardKeyMismatch {
                        collection: self.coll.name().to_owned(),
                        id: Box::new(id),
                        stored: Box::new(key),
                    });
                }
            }
        }
        Ok(matched)
    }

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
        Find {
            repo: self,
            filter,
            scatter: false,
            options: Options::default(),
            session: None,
        }
    }

    /// A query by the hashed key's value: targeted to one shard. One
    /// `find`, streamed as [`Sharded::find`].
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
        Find {
            repo: self,
            filter,
            scatter: false,
            options: Options::default(),
            session: None,
        }
    }

    /// Any query, sent to every shard that holds the collection. Named
    /// apart so that a scatter-gather is never an accident. One `find`,
    /// streamed as [`Sharded::find`].
    pub fn scatter(&self, filter: Document) -> Find<'_, T> {
        Find {
            repo: self,
            filter: Ok(filter),
            scatter: true,
            options: Options::default(),
            session: None,
        }
    }

    /// Every document `filter` matches, as a stream that holds the cursor
    /// (and the session, when there is one), each document deserialized on
    /// its own so that one that does not fit the model is named by its
    /// `_id`.
    async fn find_in<'a>(
        &self,
        filter: Result<Document>,
        scatter: bool,
        cx: Cx<'a>,
    ) -> Result<BoxStream<'a, Result<T>>> {
        let filter = filter?;
        if scatter {
            tracing::debug!(collection = self.coll.name(), "scatter-gather query");
        }
        let o = cx.options.driver::<FindOptions>();
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

    /// Checks every document's shard key (a scatter-gather over the whole
    /// collection, projected to the key fields): the coarse field present,
    /// and, when derived, a date equal to its timestamp's period. Such a
    /// document is invisible to [`Sharded::find`], and writes to it are
    /// refused. Reports up to `max` of them, as [`Error::Damaged`], in
    /// `_id` order. One `find` and its `getMore`s, in the session when one
    /// is given.
    pub fn audit(&self, max: usize) -> AuditKeys<'_, T> {
        AuditKeys {
            repo: self,
            max,
            options: Options::default(),
            session: None,
        }
    }

    async fn audit_in(&self, max: usize, mut cx: Cx<'_>) -> Result<Audit> {
        let mut projection = doc! {"_id": 1};
        for f in key_fields(&self.spec)
            .into_iter()
            .chain(self.spec.derived().map(|d| d.from))
        {
            projection.insert(f, 1);
        }
        let o = cx.options.driver::<FindOptions>();
        let find = self
            .coll
            .find(doc! {})
            .with_options(o)
            .projection(projection)
            .sort(doc! {"_id": 1});
        let mut audit = Audit {
            scanned: 0,
            damaged: Vec::new(),
        };
        let mut check = |d: &Document| {
            audit.scanned += 1;
            if audit.damaged.len() < max {
                if let Err(e) = check_stored(&self.spec, self.coll.name(), d, None) {
                    audit.damaged.push(e);
                }
            }
        };
        match cx.session.as_deref_mut() {
            None => {
                let mut cursor = find.await?;
                while let Some(d) = cursor.try_next().await? {
                    check(&d);
                }
            }
            Some(s) => {
                let mut cursor = find.session(&mut *s).await?;
                while let Some(d) = cursor.next(&mut *s).await.transpose()? {
                    check(&d);
                }
            }
        }
        Ok(audit)
    }

    /// Analyses a candidate shard key (BSON field names, in key order) on a
    /// `$sample` of up to `sample` documents: see [`analyze`]. One
    /// `aggregate`, in the session when one is given.
    pub fn analyze<'a>(&'a self, key: &'a [&'a str], sample: u32) -> Analyze<'a, T> {
        Analyze {
            repo: self,
            key,
            sample,
            options: Options::default(),
            session: None,
        }
    }

    async fn analyze_in(&self, key: &[&str], sample: u32, mut cx: Cx<'_>) -> Result<KeyAnalysis> {
        // A read: a write concern among the repository's defaults does not
        // apply to it.
        cx.options.write_concern = None;
        analyze::analyze_with(&self.coll, key, sample, &cx.options, cx.session).await
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

/// A cursor's current document as the model, or
/// [`Error::UnexpectedDocument`] naming its `_id`.
fn current<T>(
    item: mongodb::error::Result<T>,
    raw: &mongodb::bson::RawDocument,
    collection: &str,
) -> Result<T> {
    item.map_err(|e| match crate::compat::deserialization(e) {
        Ok(source) => Error::UnexpectedDocument {
            collection: collection.to_owned(),
            id: Box::new(crate::keyset::id_of(raw)),
            source,
        },
        Err(e) => Error::from(e),
    })
}

/// An action of the repository: a struct holding the arguments, its
/// options and session, with the setters that apply, run by `.await`.
macro_rules! action {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $ty:ty),* $(,)? } -> $out:ty, $kind:ident, $run:ident
    ) => {
        $(#[$doc])*
        #[must_use = "does nothing unless awaited"]
        pub struct $name<'a, T: ShardKeyed> {
            repo: &'a Sharded<T>,
            $($field: $ty,)*
            options: Options,
            session: Option<&'a mut ClientSession>,
        }

        impl<'a, T: ShardKeyed> $name<'a, T> {
            crate::action::setters!('a; $kind);
        }

        impl<'a, T: ShardKeyed> IntoFuture for $name<'a, T> {
            type Output = Result<$out>;
            type IntoFuture = BoxFuture<'a, Result<$out>>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin(async move {
                    let $name { repo, $($field,)* options, session } = self;
                    let cx = repo.cx(options, session).await;
                    repo.$run($($field,)* cx).await
                })
            }
        }
    };
}

action! {
    /// [`Sharded::insert`]: write options (`write_concern`, `comment`,
    /// `max_time`) and `session`.
    Insert { item: &'a T } -> (), write, insert_in
}

action! {
    /// [`Sharded::insert_many`]: write options and `session`.
    InsertMany { items: &'a [T] } -> (), write, insert_many_in
}

action! {
    /// [`Sharded::replace`]: write options and `session`. The lookup by
    /// `_id` after a miss always reads the primary: it decides the write.
    Replace { item: &'a T } -> bool, write, replace_in
}

action! {
    /// [`Sharded::upsert`]: as [`Replace`].
    Upsert { item: &'a T } -> bool, write, upsert_in
}

action! {
    /// [`Sharded::update`]: as [`Replace`].
    Update { point: Result<Document>, filter: Document, update: Document } -> u64, write, update_in
}

action! {
    /// [`Sharded::find`], [`Sharded::find_by_hashed`] and
    /// [`Sharded::scatter`]: read options (`read_concern`,
    /// `selection_criteria`, `comment`, `max_time`) and `session`. `.await`
    /// sends the `find` and gives the documents as a stream, as the
    /// driver's `find` gives a cursor; with a session, the stream borrows
    /// it until dropped.
    Find { filter: Result<Document>, scatter: bool } -> BoxStream<'a, Result<T>>, read, find_in
}

action! {
    /// [`Sharded::audit`]: read options and `session`.
    AuditKeys { max: usize } -> Audit, read, audit_in
}

action! {
    /// [`Sharded::analyze`]: read options and `session`.
    Analyze { key: &'a [&'a str], sample: u32 } -> KeyAnalysis, read, analyze_in
}

/// [`Sharded::ensure_sharded`]: write concern, `comment` and `max_time`,
/// sent in each of its commands. No session (see there).
#[must_use = "does nothing unless awaited"]
pub struct EnsureSharded<'a, T: ShardKeyed> {
    repo: &'a Sharded<T>,
    options: Options,
}

impl<T: ShardKeyed> EnsureSharded<'_, T> {
    crate::action::setters!(@common);
    crate::action::setters!(@write);
}

impl<'a, T: ShardKeyed> IntoFuture for EnsureSharded<'a, T> {
    type Output = Result<()>;
    type IntoFuture = BoxFuture<'a, Result<()>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let o = self.options.or(&self.repo.defaults);
            self.repo.ensure_sharded_in(o).await
        })
    }
}

/// What [`Sharded::audit`] found.
#[derive(Debug)]
#[non_exhaustive]
pub struct Audit {
    /// Documents checked: the whole collection.
    pub scanned: u64,
    /// Up to the asked number of documents whose key is missing or wrong,
    /// each an [`Error::Damaged`] naming its `_id` and field.
    pub damaged: Vec<Error>,
}

/// What a replace or an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Replaced,
    Inserted,
    Nothing,
}

/// Lookups and writes a replace or an upsert tries after its first miss,
/// each lost to a concurrent writer of the same `_id`, before it gives up
/// with [`Error::Contended`].
const WRITE_ROUNDS: usize = 5;

/// BSON types that compare as one in a filter: numbers, and null with a
/// missing value.
fn same_bracket(a: &Bson, b: &Bson) -> bool {
    let bracket = |v: &Bson| match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 0x01,
        Bson::Null | Bson::Undefined => 0x0a,
        other => other.element_type() as u8,
    };
    bracket(a) == bracket(b)
}

fn type_name(v: Option<&Bson>) -> String {
    v.map_or("nothing".to_owned(), |b| format!("{:?}", b.element_type()))
}

/// Checks a stored document's shard key: each key field that `new` (the
/// document about to be written, or, for an audit, the derived coarse
/// field alone) has must be stored, as the same type; a derived coarse
/// field must be its stored timestamp's period.
fn check_stored(
    spec: &ShardSpec,
    collection: &str,
    stored: &Document,
    new: Option<&Document>,
) -> Result<()> {
    let id = || stored.get("_id").cloned().unwrap_or(Bson::Null);
    let damaged = |field: &str, problem: String| Error::damaged(collection, id(), field, problem);
    for field in key_fields(spec) {
        let want = match new {
            Some(n) => n.get(field),
            // An audit knows only that the coarse field is always stored.
            None if Some(field) == spec.coarse() => Some(&Bson::Null),
            None => None,
        };
        let Some(want) = want else { continue };
        match stored.get(field) {
            None => {
                return Err(damaged(
                    field,
                    "is missing: it is part of the shard key, and the model always stores it"
                        .to_owned(),
                ))
            }
            Some(got) if new.is_some() && !same_bracket(got, want) => {
                return Err(damaged(
                    field,
                    format!(
                        "holds {}, where the model stores {}",
                        type_name(Some(got)),
                        type_name(Some(want))
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    let (Some(coarse), Some(derived)) = (spec.coarse(), spec.derived()) else {
        return Ok(());
    };
    let Some(Bson::DateTime(month)) = stored.get(coarse) else {
        return Err(damaged(
            coarse,
            format!(
                "holds {}, not the date derived from `{}`",
                type_name(stored.get(coarse)),
                derived.from
            ),
        ));
    };
    let at = match (stored.get(derived.from), derived.repr) {
        (Some(Bson::DateTime(t)), _) => Some(*t),
        (Some(Bson::Int64(s)), TimeRepr::EpochSeconds) => seconds(*s).ok(),
        (Some(Bson::Int32(s)), TimeRepr::EpochSeconds) => seconds(i64::from(*s)).ok(),
        _ => None,
    };
    let Some(at) = at else {
        return Err(damaged(
            derived.from,
            format!(
                "holds {}, not a timestamp the shard key derives from",
                type_name(stored.get(derived.from))
            ),
        ));
    };
    let want = truncate(at, derived.granularity);
    if *month != want {
        return Err(damaged(
            coarse,
            format!(
                "is {month}, but `{}` is in the {} of {want}",
                derived.from,
                format!("{:?}", derived.granularity).to_lowercase()
            ),
        ));
    }
    Ok(())
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

/// Fills the derived coarse field of a stored document.
fn fill(spec: &ShardSpec, d: &mut Document, collection: &str) -> Result<()> {
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
                found: other.map_or("nothing".to_owned(), |b| format!("{:?}", b.element_type())),
                why: "a timestamp to derive the shard key from",
                dropped: None,
            })
        }
    };
    d.insert(coarse, truncate(at, derived.granularity));
    Ok(())
}

/// The first whole second at or after `t`, in epoch seconds.
fn ceil_seconds(t: DateTime) -> i64 {
    let ms = t.timestamp_millis();
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0)
}

fn seconds(s: i64) -> Result<DateTime> {
    s.checked_mul(1000)
        .map(DateTime::from_millis)
        .ok_or_else(|| Error::invalid("timestamp", format!("{s} seconds is out of range")))
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
fn check_update(spec: &ShardSpec, update: &Document) -> Result<()> {
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

/// `t` rounded down to the start of its hour, day, ISO week, month,
/// quarter or year, in UTC.
pub fn truncate(t: DateTime, g: Granularity) -> DateTime {
    const HOUR: i64 = 3_600_000;
    const DAY: i64 = 24 * HOUR;
    let ms = t.timestamp_millis();
    let days = ms.div_euclid(DAY);
    let at_day = |d: i64| DateTime::from_millis(d * DAY);
    match g {
        Granularity::Hour => DateTime::from_millis(ms.div_euclid(HOUR) * HOUR),
        Granularity::Day => at_day(days),
        // 1970-01-01 was a Thursday: Monday is 3 days before.
        Granularity::Week => at_day(days - (days + 3).rem_euclid(7)),
        Granularity::Month | Granularity::Quarter | Granularity::Year => {
            let (y, m, _) = civil_from_days(days);
            let m = match g {
                Granularity::Month => m,
                Granularity::Quarter => (m - 1) / 3 * 3 + 1,
                _ => 1,
            };
            at_day(days_from_civil(y, m, 1))
        }
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 → (y, m, d).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse: (y, m, d) → days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A key document in mongosh's syntax: `{ month: 1, type: 1 }`.
fn shell_doc(d: &Document) -> String {
    let fields: Vec<String> = d
        .iter()
        .map(|(k, v)| {
            let key = if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                k.clone()
            } else {
                format!("{k:?}")
            };
            let value = match v {
                Bson::String(s) => format!("{s:?}"),
                other => other.to_string(),
            };
            format!("{key}: {value}")
        })
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGS: ShardSpec = ShardSpec::Ranged {
        coarse: Some(Coarse {
            field: "month",
            derived: Some(Derived {
                from: "ts",
                repr: TimeRepr::EpochSeconds,
                granularity: Granularity::Month,
            }),
        }),
        search: Some("type"),
    };

    fn at(s: &str) -> DateTime {
        DateTime::parse_rfc3339_str(s).unwrap()
    }

    #[test]
    fn truncation() {
        let t = at("2021-10-25T03:34:59.123Z"); // the seed's ts, 1635132899
        assert_eq!(t.timestamp_millis() / 1000, 1_635_132_899);
        let cases = [
            (Granularity::Hour, "2021-10-25T03:00:00Z"),
            (Granularity::Day, "2021-10-25T00:00:00Z"),
            (Granularity::Week, "2021-10-25T00:00:00Z"), // a Monday
            (Granularity::Month, "2021-10-01T00:00:00Z"),
            (Granularity::Quarter, "2021-10-01T00:00:00Z"),
            (Granularity::Year, "2021-01-01T00:00:00Z"),
        ];
        for (g, want) in cases {
            assert_eq!(truncate(t, g), at(want), "{g:?}");
        }
        assert_eq!(
            truncate(at("2024-02-29T23:59:59Z"), Granularity::Week),
            at("2024-02-26T00:00:00Z")
        );
        assert_eq!(
            truncate(at("2024-05-31T12:00:00Z"), Granularity::Quarter),
            at("2024-04-01T00:00:00Z")
        );
        assert_eq!(
            truncate(at("1969-12-31T23:00:00Z"), Granularity::Month),
            at("1969-12-01T00:00:00Z")
        );
        for days in -800_000..800_000 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn key_and_commands() {
        assert_eq!(shard_spec(&LOGS), doc! {"month": 1, "type": 1});
        let hashed = ShardSpec::Hashed("id");
        assert_eq!(shard_spec(&hashed), doc! {"id": "hashed"});
        assert_eq!(shell_doc(&shard_spec(&LOGS)), "{ month: 1, type: 1 }");
        assert_eq!(shell_doc(&shard_spec(&hashed)), "{ id: \"hashed\" }");
        assert_eq!(index_name(&LOGS), "mp_shard_month_type");
    }

    #[test]
    fn derived_field_and_filters() {
        let mut d = doc! {"_id": "4df16cf0", "type": "app", "ts": 1_635_132_899_i64};
        fill(&LOGS, &mut d, "logs").unwrap();
        assert_eq!(
            d.get_datetime("month").unwrap(),
            &at("2021-10-01T00:00:00Z")
        );
        let mut bad = doc! {"_id": 1, "ts": "yesterday"};
        assert!(matches!(
            fill(&LOGS, &mut bad, "logs"),
            Err(Error::UnsupportedValue { .. })
        ));
    }

    #[test]
    fn updates_cannot_touch_the_key() {
        let ok = doc! {"$set": {"msg": "x"}, "$inc": {"retries": 1}};
        assert!(check_update(&LOGS, &ok).is_ok());
        for bad in [
            doc! {"$set": {"type": "web"}},
            doc! {"$set": {"month": 1}},
            doc! {"$inc": {"ts": 1}},
            doc! {"$rename": {"msg": "type"}},
            doc! {"$unset": {"type.sub": ""}},
            doc! {"$set": {"_id": 2}},
            doc! {"msg": "replacement"},
            doc! {"$where": "1"},
        ] {
            assert!(
                matches!(
                    check_update(&LOGS, &bad),
                    Err(Error::InvalidArgument { .. })
                ),
                "{bad}"
            );
        }
    }
}
