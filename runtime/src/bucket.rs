//! The bucket pattern: many items of one key per document, and
//! pages of any size cut from those buckets.
//!
//! A bucket is
//! `{_id: {k: key, s: seq}, <key>: key, start, count, bytes, items: [...]}`:
//! `seq` numbers a key's buckets in order, `start` is how many items come
//! before the bucket, and items are stored without the key field (the
//! bucket holds it once).
//!
//! The traps of the hand-written version, and what this does instead:
//! - A string `_id` such as `"123_1700000000"` sorts wrongly and can collide
//!   when the key holds the separator. The compound `_id` sorts by key, then
//!   `seq`, for any key value.
//! - Two concurrent upserts can open two partial buckets, and their items
//!   then interleave. Only the next `seq` can be created, by an insert, and
//!   its `_id` is unique, so the losing insert fails with a duplicate key and
//!   retries into the winner's bucket: a key has at most one open bucket,
//!   always its last with items. Past it, at most one empty bucket waits,
//!   opened ahead so that writers racing at a rollover do not fail on the
//!   full one.
//! - Page arithmetic that assumes full buckets breaks after removals. Pages
//!   are cut by `start`, which removal recomputes, so partial buckets page
//!   correctly, with an index seek to the one or two buckets a page needs.
//! - A bucket must stay under 16 MB. `bytes` tracks its size; a push that
//!   would overflow it closes the bucket and opens the next.
//! - A removal leaves a gap that the next push would fill out of order. The
//!   removal is a pipeline update that closes (`sealed`) what it touched, so
//!   pushes only ever append to the newest bucket.
//!
//! Against faults (the README's "Failure behaviour" has the figures):
//! - Every write's filter matches only a sound bucket (`count` an integer
//!   equal to the array's length, within `size`; `start` a number), so a
//!   bucket another client broke is never written on; the read that follows
//!   a write that matched nothing reports it as [`Error::Damaged`].
//! - Each write carries an id that the bucket keeps (its last
//!   64): a write the driver retries after a lost reply finds its
//!   id and is not applied twice.
//! - In an election, the one-command push (sent with `run_command`, which
//!   the driver does not retry) is sent again when the server refused or
//!   interrupted it (`NotWritablePrimary`, `InterruptedDueToReplStateChange`,
//!   …: nothing stored); when its reply was lost or a step-down came after
//!   it (a `writeConcernError`), its write id, read on the primary with
//!   majority read concern, says whether it stays, and only if that read
//!   fails too is the push [`Error::OutcomeUnknown`].
//! - Every read that decides a write (the newest bucket before a push,
//!   everything under the lease, the `$merge` of a reindex) goes to the
//!   primary, whatever the client's read preference; pages, totals and
//!   streams follow the caller's.
//! - A removal marks the key's buckets until it has recomputed `start`; a
//!   read that meets the mark recomputes first (under the key's lease), so
//!   a removal cut short by a crash leaves no page wrong.
//! - With `order`, pages follow it across all buckets, also for late items
//!   (equal values in arrival order). A push not below the last bucket's
//!   items is in order: one update that inserts it sorted, as before. Each
//!   bucket opened with `order` keeps its floor (`mp_floor`, the highest
//!   value before it), and an item not below it belongs there even below
//!   the bucket's first item. A late item near the end (in the last bucket
//!   or the one before) lands without the lease: see `near` below. A
//!   late one further back goes into the bucket that covers its value, which may grow to
//!   twice `size` before it is split; since that shifts the `start` of every
//!   later bucket, it runs under the key's lease with the buckets it moves
//!   marked, as a removal does. Why a lease: two writers recomputing
//!   positions side by side could each clear the other's mark with
//!   positions that miss the other's write. Splitting moves half the
//!   items to the next bucket, or to a new one between (a fractional
//!   `seq`: no renumbering, which would mean rewriting every later `_id`),
//!   and sets them aside in the bucket they leave in the same write, so a
//!   crash between the two writes loses and doubles nothing. Transactions
//!   would do the same on servers that have them; the lease and marks work
//!   on any server.
//!
//! Hot keys (`group` and `near`, in this module's source): many tasks
//! pushing to one key, each item dated when its push is called, used to
//! meet at every rollover: items dated a moment before the one that filled
//! a bucket, or opened the next, arrived after it and took the late path
//! (lease, marks, recount: about ten round trips, and every push meeting
//! the marks waited), 13 round trips a push at 64 tasks. Two changes:
//! - Pushes of one process to one key queue while a command for the key is
//!   out and go together, sorted, when it returns: they reach the server
//!   in the order they were called, and a batch is one update. This takes
//!   away most late items and most round trips; it is the design's main
//!   answer because the cause is the race itself, which no placement rule
//!   at the server can avoid paying for.
//! - What is still late (racing processes, callers' transactions) and
//!   belongs in the last bucket or the one before lands without the
//!   lease: in the last, one update (no position after it moves; the
//!   writer opening the next bucket closes this one first by a write
//!   naming its `count` and `start`, and takes the next `start` from
//!   them); in the one before, two updates in one transaction, the second
//!   moving the last bucket's `start`. The issue's own suggestion, a
//!   `$push` with `$sort` into whichever of the last two buckets covers
//!   the item as one command, leaves the last bucket's `start` wrong when
//!   the item goes into the one before: positions after a write must move
//!   with it, which takes a second document, hence the transaction. Under
//!   load from one process that transaction is rarely needed, and it could
//!   not carry the load alone: it holds the hottest document until it
//!   commits, and with 64 tasks each sending its own push (no queue) it
//!   cut the round trips a push from 13 to 6 but not the time (90 pushes
//!   a second against 143 with the lease, in one run).
//!
//! Every operation that reads or writes returns an action ([`Push`],
//! [`PushMany`], [`FetchPage`], [`Total`], [`Reindex`], [`Delete`],
//! [`Replace`], [`ItemStream`]), configured by setters
//! (`session`, write/read concern, read preference, `comment`, `max_time`)
//! and run by `.await`. Each operation's doc says which commands it sends
//! and what it does in a caller's session and transaction: in-order pushes,
//! pages, totals and replaces join the transaction, and a race they would
//! retry is handed back as transient; a late push near the end joins the
//! transaction too (its two writes, or one); late pushes further back,
//! removals and reindexing move positions under the key's lease, which a
//! caller's transaction could not hold until it commits, so they are
//! refused there. `page_pipeline`
//! sends nothing and stays a plain method.
//!
//! # Sharding
//!
//! A key's buckets are the pattern's unit: pages span two buckets, a
//! removal or a late item moves `start` in every later bucket of the key,
//! and a late item near the end writes the last two buckets in one
//! transaction. So all of a key's buckets live on one shard: the bucket
//! collection's shard key is `{<key>: "hashed"}`, and every command the
//! repository sends names the key field (with the `_id` or the `_id`
//! range), so `mongos` sends it to that one shard: pushes (the one-command
//! push's `findAndModify` too, whose full shard key is the key field),
//! pages, totals, streams, removals, the lease's marks and recounts
//! (`$merge` on its default, the document key), and near's transactions,
//! which stay single-shard. `ensure` shards the collection on a sharded
//! cluster ([`declared`](Buckets::declared)); `plan` reports it sharded on
//! another key. The leases (`<collection>.mp_locks`, one small document
//! per key while a write moves positions, addressed by `_id`, the key)
//! stay unsharded, on the database's primary shard: they are written only
//! by removals and late items, and every write to them is by `_id`, so
//! sharding them later on `{_id: "hashed"}` needs no change here.
//!
//! Hashed by default, not ranged: bucket keys are often ids that grow (an
//! `ObjectId`, a sequence), and the newest keys are often the busiest; on a
//! ranged key all of them would land in the last chunk, on one shard. No
//! operation of the repository reads a range of keys, so hashing costs it
//! nothing. Where your own queries read ranges of keys and the keys do not
//! grow, `#[shard_key(search = "<key>")]` on the model shards on `{<key>:
//! 1}` instead ([`KeySharding`]); `#[shard_key(hashed = "<key>")]` says the
//! default. No other shard key is accepted, and the derive says why: only
//! the bucket key is shared by every item of a bucket, so only it keeps a
//! push or a page on one shard. A key with a coarse time field first
//! (`{month, customerId}`) is refused for the same reason: buckets fill by
//! count, so one bucket holds a key's items across months. The price of
//! one key on one shard is that a key cannot be split across chunks: a key
//! whose buckets outgrow a chunk (128 MB by default since MongoDB 6.0; about
//! 640 buckets of 1,000 items of 200 bytes) makes a chunk the balancer
//! cannot split. Keep keys below that, for example by making the period
//! part of the key (a customer and month).
//!
//! When to choose a time-series collection instead: when items are
//! measurements over time that you query by time range and aggregate, with
//! no need for pages by position. MongoDB buckets those itself, compresses
//! them, and has no size limit for you to pick. This pattern is for
//! histories that are read a page at a time, newest or oldest first, and
//! whose items are edited or removed now and then.

use mongodb::bson;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::action::Options;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::util::impls;

// Submodules in layers, bottom up; each imports only from the layers
// below it (`scripts/modgraph runtime/src/bucket` checks it):
// `stored`, `filter`, `cx` (what a bucket holds, filters, a call's
// context) < `read` < `lease` < `fresh` (reads that repair first),
// `ahead`, `late` < `near` < `write` < `many`, `group` < `edit` < `act`.
mod act;
mod ahead;
mod cx;
mod edit;
mod filter;
mod fresh;
mod group;
mod late;
mod lease;
mod many;
mod near;
mod read;
mod stored;
mod write;

pub use act::{Delete, FetchPage, ItemStream, Push, PushMany, Reindex, Replace, Total};
pub use filter::{FIELD_OPERATORS, LOGICAL_OPERATORS};
pub use read::{key_of, KeyInItem};

/// Largest bucket `#[bucket(size = ...)]` accepts. Past it, documents grow
/// into megabytes that every page read has to load: use a time-series
/// collection, or smaller buckets.
pub const MAX_SIZE: u32 = 10_000;
/// Largest page [`Buckets::page`] cuts.
pub const MAX_PER_PAGE: u32 = 10_000;
/// A bucket's items stop short of this many bytes, leaving room under
/// MongoDB's 16 MiB for the bucket's own fields.
pub const MAX_BUCKET_BYTES: i64 = 16 * 1024 * 1024 - 64 * 1024;
/// What `#[bucket(...)]` declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSpec {
    /// Items per bucket.
    pub size: u32,
    /// The BSON name of the field that groups items.
    pub key: &'static str,
    /// A field to keep each bucket's items sorted by; `None` for insertion
    /// order.
    pub order: Option<&'static str>,
    /// The array field that holds the items.
    pub items: &'static str,
    /// The collection's shard key: the bucket key, hashed unless
    /// `#[shard_key(search = "<key>")]` asks for ranges.
    pub sharding: KeySharding,
}

/// How a bucket collection shards: on the bucket key alone, the one field
/// every item of a bucket shares, so that each push and each page names
/// the shard key and goes to one shard. See [Sharding](self#sharding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySharding {
    /// `{<key>: "hashed"}`, the default: keys spread over the shards even
    /// when new keys grow (customer numbers, ObjectIds), but a range of
    /// keys is read from every shard, and one key's buckets cannot be
    /// split between chunks.
    Hashed,
    /// `{<key>: 1}`, with `#[shard_key(search = "<key>")]`: neighbouring
    /// keys share a chunk, so a range of keys reads few shards; keys that
    /// only grow send every new key's pushes to the last chunk (the
    /// derive's `monotonic` lint asks you to say they do not).
    Ranged,
}

impl BucketSpec {
    /// What generated code declares after a compile error.
    #[doc(hidden)]
    pub const FALLBACK: BucketSpec = BucketSpec {
        size: 1,
        key: "",
        order: None,
        items: "items",
        sharding: KeySharding::Hashed,
    };
}

/// A model stored in buckets. `#[bucket(...)]` implements it.
pub trait Bucketed: Model + Serialize + DeserializeOwned + Send + Sync + Unpin + 'static {
    /// The key's type: the field that groups items.
    type Key: BucketKey + Serialize + Send + Sync;
    /// The declaration.
    const BUCKET: BucketSpec;
    /// This item's key.
    fn bucket_key(&self) -> &Self::Key;

    /// Decodes one stored item, which lacks the key: `field: key` is its
    /// own. The derive overrides this, where the model's serde attributes
    /// allow, with a decoder for the model without its key field, which
    /// reads an item as fast as a type that never had one.
    #[doc(hidden)]
    fn __decode_item<'de, D: serde::Deserializer<'de>>(
        key: &Bson,
        field: &'static str,
        d: D,
    ) -> core::result::Result<Self, D::Error> {
        read::with_key(key, field, d)
    }

    /// The repository over `db`.
    fn buckets(db: &Database) -> Buckets<Self> {
        Buckets::new(db)
    }
}

/// Types that can group items into buckets: BSON scalars with one order.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a bucket key",
    label = "not an orderable BSON scalar",
    note = "a bucket key must be an integer, a String, an ObjectId, a Uuid, a bool or a DateTime; implement `mongo_patterns::bucket::BucketKey` for a newtype that serializes to one"
)]
pub trait BucketKey {
    /// The key as bucket documents store it, from its serde form: the
    /// same value for the BSON scalars; `foreign.rs` turns the optional
    /// types' strings into the BSON date or UUID their field stores.
    #[doc(hidden)]
    fn __stored(serde_form: Bson) -> Result<Bson> {
        Ok(serde_form)
    }
}

/// Types an `order` field can have: times and numbers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot order a bucket's items",
    label = "not a time or a number",
    note = "`order` must name a DateTime or numeric field"
)]
pub trait OrderKey {}

impls!(BucketKey: i8, i16, i32, i64, u8, u16, u32, u64, bool, String, bson::oid::ObjectId, bson::Uuid, bson::DateTime);
impls!(OrderKey: i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, bson::DateTime, bson::Timestamp);

/// Which page, how large, and from which end: named at the call, as in
/// `PageRequest::page(3).per_page(25).newest_first()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    page: u32,
    per_page: u32,
    newest_first: bool,
}

/// Items a page holds unless [`PageRequest::per_page`] says otherwise.
pub const DEFAULT_PER_PAGE: u32 = 20;

impl PageRequest {
    /// Page `page`, counted from 1, of [`DEFAULT_PER_PAGE`] items, oldest
    /// first.
    pub fn page(page: u32) -> Self {
        PageRequest {
            page,
            per_page: DEFAULT_PER_PAGE,
            newest_first: false,
        }
    }

    /// Items a page holds, 1 to [`MAX_PER_PAGE`].
    pub fn per_page(mut self, per_page: u32) -> Self {
        self.per_page = per_page;
        self
    }

    /// Count pages from the newest item (a trading app's history view).
    pub fn newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }

    fn check(&self) -> Result<()> {
        if self.page == 0 {
            return Err(Error::invalid("page", "pages are numbered from 1"));
        }
        if !(1..=MAX_PER_PAGE).contains(&self.per_page) {
            return Err(Error::invalid(
                "per_page",
                format!("{} is not in 1..={MAX_PER_PAGE}", self.per_page),
            ));
        }
        Ok(())
    }
}

/// One page cut from the buckets.
#[derive(Debug, Clone)]
pub struct BucketPage<T> {
    /// The items, in the requested direction.
    pub items: Vec<T>,
    /// Whether a further page exists in that direction.
    pub has_more: bool,
}

/// The typed repository a `#[bucket]` model gets: see the module docs.
#[derive(Debug)]
pub struct Buckets<T> {
    db: Database,
    defaults: Arc<Options>,
    /// Writes, and the collection handed to callers.
    coll: Collection<Document>,
    /// Every read that decides a write, and everything done under the
    /// lease: the primary's, whatever the client's read preference (a
    /// secondary's copy can lag behind the write being decided).
    raw: Collection<RawDocumentBuf>,
    /// Reads for the caller (pages, streams): the caller's read
    /// preference.
    reads: Collection<RawDocumentBuf>,
    locks: Collection<Document>,
    spec: BucketSpec,
    paths: Arc<Paths>,
    heads: Arc<Mutex<HashMap<Vec<u8>, i64>>>,
    /// The deployment refused a transaction (a standalone server): late
    /// items near the end take the lease instead (see [`near`]).
    no_transactions: Arc<AtomicBool>,
    /// Pushes queued per key while a batch of the key is out
    /// (see [`group`]).
    queues: Arc<group::Queues>,
    /// A test seam: milliseconds added to this client's clock wherever the
    /// repository reads it (see [`Buckets::__skew_clock`]). Nothing does
    /// now: the lease is on the server's clock.
    #[allow(dead_code)]
    clock_skew_ms: i64,
    _items: PhantomData<fn() -> T>,
}

/// The declaration's fields as expression paths, spelt once per
/// repository rather than formatted in every command.
#[derive(Debug)]
struct Paths {
    /// `$<items>`.
    items: String,
    /// `$$this.<order>`: an item's order value inside `$filter`.
    this_order: String,
    /// `$$mp_e.<order>`: an end item's order value.
    end_order: String,
}

impl Paths {
    fn new(spec: &BucketSpec) -> Self {
        let order = spec.order.unwrap_or("_");
        Paths {
            items: format!("${}", spec.items),
            this_order: format!("$$this.{order}"),
            end_order: format!("$$mp_e.{order}"),
        }
    }
}

impl<T> Clone for Buckets<T> {
    fn clone(&self) -> Self {
        Buckets {
            db: self.db.clone(),
            defaults: self.defaults.clone(),
            coll: self.coll.clone(),
            raw: self.raw.clone(),
            reads: self.reads.clone(),
            locks: self.locks.clone(),
            spec: self.spec,
            paths: self.paths.clone(),
            heads: self.heads.clone(),
            no_transactions: self.no_transactions.clone(),
            queues: self.queues.clone(),
            clock_skew_ms: self.clock_skew_ms,
            _items: PhantomData,
        }
    }
}

impl<T: Bucketed> Buckets<T> {
    /// The repository for `T` in `db`.
    pub fn new(db: &Database) -> Self {
        Buckets {
            db: db.clone(),
            defaults: Arc::default(),
            coll: db.collection(T::COLLECTION),
            raw: on_primary(db, T::COLLECTION, None),
            reads: db.collection(T::COLLECTION),
            locks: on_primary(db, &format!("{}.mp_locks", T::COLLECTION), None),
            spec: T::BUCKET,
            paths: Arc::new(Paths::new(&T::BUCKET)),
            heads: Arc::default(),
            no_transactions: Arc::default(),
            queues: Arc::default(),
            clock_skew_ms: 0,
            _items: PhantomData,
        }
    }

    /// The same repository with `options` as its defaults (an action's
    /// setters override them; what neither sets comes from the
    /// `Database`). Clones share them.
    pub fn with_options(mut self, options: Options) -> Self {
        self.defaults = Arc::new(options);
        // Its pushes queue apart: a queue sends with its repository's
        // options.
        self.queues = Arc::default();
        self
    }

    /// The same repository on collection `name` (its leases in
    /// `<name>.mp_locks`), for one collection per tenant. It forgets the
    /// open buckets it remembered, which belong to the other collection.
    pub fn with_collection(mut self, name: &str) -> Self {
        self.coll = self.db.collection(name);
        self.raw = on_primary(&self.db, name, None);
        self.reads = self.db.collection(name);
        self.locks = on_primary(&self.db, &format!("{name}.mp_locks"), None);
        self.heads = Arc::default();
        // A queue sends to its repository's collection.
        self.queues = Arc::default();
        self
    }

    /// A test seam, not API: the same repository on a host whose clock is
    /// `ms` milliseconds ahead (negative: behind) of the others', so that
    /// a test can run two application hosts with skewed clocks in one
    /// process. The lease reads the server's clock (`$$NOW`), not this
    /// client's, so the skew changes nothing; the skew tests
    /// (`tests/bucket_lease.rs`) run through this seam to keep proving it.
    #[doc(hidden)]
    pub fn __skew_clock(mut self, ms: i64) -> Self {
        self.clock_skew_ms = ms;
        self
    }

    /// The collection the buckets are in, to run your own commands beside
    /// the repository's.
    pub fn collection(&self) -> &Collection<Document> {
        &self.coll
    }

    /// This repository with its collections carrying the write concern,
    /// read concern and read preference of `o`: for the operations that
    /// are not on the hot path (removals, edits, late pushes, repairs),
    /// whose every command then gets them.
    /// The read preference applies to the caller's reads only: the reads
    /// behind writes and repairs stay on the primary.
    fn scoped(&self, o: &Options) -> Buckets<T> {
        if o.write_concern.is_none() && o.read_concern.is_none() && o.selection_criteria.is_none() {
            return self.clone();
        }
        let co = mongodb::options::CollectionOptions::builder()
            .write_concern(o.write_concern.clone())
            .read_concern(o.read_concern.clone())
            .selection_criteria(o.selection_criteria.clone())
            .build();
        let name = self.coll.name();
        Buckets {
            coll: self.db.collection_with_options(name, co.clone()),
            raw: on_primary(&self.db, name, Some(co.clone())),
            reads: self.db.collection_with_options(name, co.clone()),
            locks: on_primary(&self.db, self.locks.name(), Some(co)),
            ..self.clone()
        }
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks: the collection and the index pages are cut by, `{key: 1,
    /// start: 1}`. The same as [`Model::ensure`] for
    /// this repository (under its run-time collection name). Pushes need no
    /// index beyond `_id`: they address buckets by `_id`, and no field they
    /// change is indexed.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[bucket(size = 1000, key = "customer")]
    /// # struct Trade { customer: i64, qty: i32 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// // A tenant's trades, in a collection named at run time.
    /// Trade::buckets(&db).with_collection("trades_acme").ensure().await?;
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.db, self.declared())
    }

    /// What this repository needs in the deployment: its collection, with
    /// the `{key, start}` index that page reads seek on, sharded on
    /// `{key: "hashed"}` where the deployment shards (see
    /// [Sharding](self#sharding)); and from the
    /// server: `$isNumber` and `$bsonSize` (MongoDB 4.4) for every push and
    /// page (the soundness checks), `$setWindowFields` (5.0) with `$merge`
    /// into the same collection (4.4) for [`delete`](Self::delete),
    /// [`reindex`](Self::reindex), the repair a read or a push makes after
    /// an interrupted removal, and with `order` a late item's push; with
    /// `order`, `$sortArray` (5.2) for [`replace`](Self::replace).
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        use crate::ensure::{Feature, Need};
        let key = self.spec.key;
        let moves = if self.spec.order.is_some() {
            "bucket delete, reindex and late push (with order)"
        } else {
            "bucket delete and reindex"
        };
        let mut needs = vec![
            Need::needs(Feature::IsNumber, "bucket push and page"),
            Need::needs(Feature::SetWindowFields, moves),
            Need::needs(Feature::MergeIntoSelf, moves),
        ];
        if self.spec.order.is_some() {
            needs.push(Need::needs(
                Feature::SortArray,
                "bucket replace (with order)",
            ));
        }
        vec![crate::ensure::Declared::new(self.coll.name())
            .index(doc! {key: 1, "start": 1}, format!("mp_bucket_{key}_start"))
            .sharded(self.shard_key(), false)
            .needs(needs)]
    }

    /// The collection's shard key, which [`declared`](Self::declared) lists
    /// and `ensure` shards with on a sharded cluster: the bucket key,
    /// hashed or ranged (see [`KeySharding`]).
    pub fn shard_key(&self) -> Document {
        let key = self.spec.key;
        match self.spec.sharding {
            KeySharding::Hashed => doc! {key: "hashed"},
            KeySharding::Ranged => doc! {key: 1},
        }
    }

    fn key_bson<Q: Serialize + ?Sized>(&self, key: &Q) -> Result<Bson> {
        T::Key::__stored(crate::compat::to_bson(key)?)
    }

    /// The item as stored: without the key field, which the bucket holds.
    fn item_doc(&self, item: &T) -> Result<Document> {
        let mut doc = crate::compat::to_document(item)?;
        doc.remove(self.spec.key);
        Ok(doc)
    }
}

/// Collection `name` of `db` (with `co`, if given) reading from the
/// primary, whatever the client's read preference.
fn on_primary<D: Send + Sync>(
    db: &Database,
    name: &str,
    co: Option<mongodb::options::CollectionOptions>,
) -> Collection<D> {
    let mut co = co.unwrap_or_default();
    co.selection_criteria = Some(crate::util::primary());
    db.collection_with_options(name, co)
}
