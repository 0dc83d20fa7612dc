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
//! With `order`, pages follow it across all buckets, also for late items
//! (a trade dated yesterday pushed after today's; equal values keep their
//! arrival order). A push not below the last bucket's floor (`mp_floor`,
//! the highest value before the bucket when it opened) is in order: one
//! update that inserts it sorted into the last bucket. A late one goes
//! into the bucket that covers its value, which may grow to twice `size`
//! before it is split, and every later bucket's `start` moves by one.
//!
//! # Writes that move positions, and many instances
//!
//! A late item, a split, a [`delete`](Buckets::delete) and a
//! [`reindex`](Buckets::reindex) change the `start` of every later bucket
//! of the key. Each runs as one transaction (the caller's, when the call
//! runs in one; otherwise one of its own, through the driver's convenient
//! API, as a task that a caller who stops waiting does not cut), and
//! nothing else coordinates them: no lease, no marks, nothing held in
//! memory. A reader sees such a write whole or not at all, two of them on
//! one key conflict on the server, which reruns one, and a process that
//! dies in the middle leaves nothing half done. Every other write changes
//! one bucket. This is what lets several instances of a service (each
//! with its own clients and memory) write one key at once: no write of
//! the repository waits for another writer while it holds a transaction
//! open, so a slow, cut or dead instance cannot stall the others. They
//! need transactions, which a standalone server does not run: there they
//! fail with [`Error::NoTransactions`] (pushes in order, pages, totals,
//! streams and `replace` need none).
//!
//! Pushes of one process to one key queue while a command for the key is
//! out and go together, sorted, when it returns (see [`Buckets::push`]):
//! they reach the server in the order they were called, a batch is one
//! update, and few items are late. Across processes, items dated a moment
//! apart still race at rollovers; a late one near the end costs one update
//! when it belongs in the last bucket, and a transaction of four round
//! trips when it belongs in the one before. That transaction also writes
//! the last bucket (its `start`), which every push writes: while other
//! instances keep pushing to the key, it is rerun until it gets through,
//! and the pushes queued behind it wait, seconds at worst (see the
//! guide's "Several instances").
//!
//! # Against faults
//!
//! - Every write's filter matches only a sound bucket (`count` an integer
//!   equal to the array's length, within the limit; `start` a number), so
//!   a bucket another client broke is never written on; the read that
//!   follows a write that matched nothing reports it as
//!   [`Error::Damaged`].
//! - Each write carries an id that the bucket keeps (its last 64): a write
//!   the driver retries after a lost reply finds its id and is not applied
//!   twice.
//! - In an election, the one-command push (sent with `run_command`, which
//!   the driver does not retry) is sent again when the server refused or
//!   interrupted it (nothing stored); when its reply was lost or a
//!   step-down came after it, its write id, read on the primary, says
//!   whether it stays, and only if that read fails too is the push
//!   [`Error::OutcomeUnknown`]. A transaction of the call's own is rerun
//!   whole after a transient failure, and its commit retried.
//! - Every read that decides a write (the newest bucket before a push,
//!   everything inside a move's transaction) goes to the primary,
//!   whatever the client's read preference; pages, totals and streams
//!   follow the caller's.
//!
//! Every operation that reads or writes returns an action ([`Push`],
//! [`PushMany`], [`FetchPage`], [`Count`], [`DeleteBefore`], [`DeleteAllBefore`], [`Reindex`], [`Delete`],
//! [`Replace`], [`Adopt`], [`ItemStream`]), configured by setters (`session`,
//! write/read concern, read preference, `comment`, `max_time`) and run by
//! `.await`. Given a session with a transaction open, every operation
//! joins it, and a race it would retry is handed back as transient for
//! the caller's `and_run2` to run again. `page_pipeline` sends nothing and
//! stays a plain method.
//!
//! # Sharding
//!
//! A key's buckets are the pattern's unit: pages span two buckets, and a
//! removal or a late item moves `start` in every later bucket of the key,
//! in one transaction. So all of a key's buckets live on one shard: the
//! bucket collection's shard key is `{<key>: "hashed"}`, and every command
//! the repository sends names the key field (with the `_id` or the `_id`
//! range), so `mongos` sends it to that one shard: pushes (the one-command
//! push's `findAndModify` too, whose full shard key is the key field),
//! pages, totals, streams, and every statement of the transactions that
//! move positions, which stay single-shard. `ensure` shards the collection
//! on a sharded cluster ([`declared`](Buckets::declared)); `plan` reports
//! it sharded on another key.
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
use std::marker::PhantomData;
use std::sync::Arc;

use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::action::Options;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::util::{impls, Bounded};

// Submodules in layers, bottom up; each imports only from the layers
// below it (`scripts/modgraph` checks it): `shape` (the stored format) and
// `filter` (callers' item filters) < `read` < `moves` (writes that move
// positions, each one transaction) < `ahead` (the one-command push) <
// `late` (late items, a move) < `push` (a push, in order) < `queue` (a
// key's pushes from many tasks) < `many` (`push_many`) < `edit` (delete,
// replace) < `act` (the actions and the public methods). `adopt` (a flat
// collection copied into buckets on the server) uses `shape` alone.
mod act;
mod adopt;
mod ahead;
mod edit;
mod filter;
mod late;
mod many;
mod moves;
mod push;
mod queue;
mod read;
mod rebucket;
mod shape;

pub use act::{
    Adopt, Count, Delete, DeleteAllBefore, DeleteBefore, FetchPage, ItemStream, Push, PushMany,
    Rebucket, RebucketAll, Reindex, Replace,
};
pub use filter::{FIELD_OPERATORS, LOGICAL_OPERATORS};
pub use read::{key_of, KeyInItem};
pub use rebucket::Rebucketed;
pub use shape::RESERVED;

/// Largest bucket `#[bucket(size = ...)]` accepts. Past it, documents grow
/// into megabytes that every page read has to load: use a time-series
/// collection, or smaller buckets.
pub const MAX_SIZE: u32 = 10_000;
pub use crate::paging::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
/// A bucket's items stop short of this many bytes, leaving room under
/// MongoDB's 16 MiB for the bucket's own fields.
pub const MAX_BUCKET_BYTES: i64 = 16 * 1024 * 1024 - 64 * 1024;
/// Keys whose open bucket a repository remembers; past it, it forgets all.
const REMEMBERED: usize = 100_000;

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
/// `PageRequest::page(3).page_size(25).newest_first()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    page: u32,
    page_size: u32,
    newest_first: bool,
}

impl PageRequest {
    /// Page `page`, counted from 1, of [`DEFAULT_PAGE_SIZE`] items, oldest
    /// first.
    pub fn page(page: u32) -> Self {
        PageRequest {
            page,
            page_size: DEFAULT_PAGE_SIZE,
            newest_first: false,
        }
    }

    /// Items a page holds, 1 to [`MAX_PAGE_SIZE`], as a keyset page's.
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n;
        self
    }

    /// [`page_size`](Self::page_size), under its old name.
    #[deprecated(since = "0.1.0", note = "renamed `page_size`, as keyset pages name it")]
    pub fn per_page(self, n: u32) -> Self {
        self.page_size(n)
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
        if !(1..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return Err(Error::invalid(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            ));
        }
        Ok(())
    }
}

/// One page cut from the buckets. Serializes (for a handler's JSON) as
/// `{items, has_more}`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct BucketPage<T> {
    /// The items, in the requested direction.
    pub items: Vec<T>,
    /// Whether a further page exists in that direction.
    pub has_more: bool,
}

/// The typed repository a `#[bucket]` model gets: see the module docs.
///
/// Clones share its state: the queue of pushes per key of this process,
/// and what it remembers of each key's open bucket (a hint that every
/// write's filter checks).
#[derive(Debug)]
pub struct Buckets<T> {
    db: Database,
    defaults: Arc<Options>,
    /// Writes, and the collection handed to callers.
    coll: Collection<Document>,
    /// Every read that decides a write: the primary's, whatever the
    /// client's read preference (a secondary's copy can lag behind the
    /// write being decided).
    raw: Collection<RawDocumentBuf>,
    /// Reads for the caller (pages, streams): the caller's read
    /// preference.
    reads: Collection<RawDocumentBuf>,
    shape: Arc<shape::Shape>,
    /// Each key's open bucket as this handle last saw it: its `seq`, and
    /// how many items it held at least (0 when not known).
    heads: Arc<Bounded<Vec<u8>, (i64, i64)>>,
    /// Pushes queued per key while a batch of the key is out.
    queue: Arc<queue::PushQueue>,
    _items: PhantomData<fn() -> T>,
}

impl<T> Clone for Buckets<T> {
    fn clone(&self) -> Self {
        Buckets {
            db: self.db.clone(),
            defaults: self.defaults.clone(),
            coll: self.coll.clone(),
            raw: self.raw.clone(),
            reads: self.reads.clone(),
            shape: self.shape.clone(),
            heads: self.heads.clone(),
            queue: self.queue.clone(),
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
            raw: on_primary(db, T::COLLECTION),
            reads: db.collection(T::COLLECTION),
            shape: Arc::new(shape::Shape::new(T::BUCKET, T::COLLECTION)),
            heads: Arc::new(Bounded::new(REMEMBERED)),
            queue: Arc::default(),
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
        self.queue = Arc::default();
        self
    }

    /// The same repository on collection `name`, for one collection per
    /// tenant. It forgets the open buckets it remembered, which belong to
    /// the other collection.
    pub fn with_collection(mut self, name: &str) -> Self {
        self.coll = self.db.collection(name);
        self.raw = on_primary(&self.db, name);
        self.reads = self.db.collection(name);
        self.shape = Arc::new(shape::Shape::new(T::BUCKET, name));
        self.heads = Arc::new(Bounded::new(REMEMBERED));
        // A queue sends to its repository's collection.
        self.queue = Arc::default();
        self
    }

    /// The collection the buckets are in, to run your own commands beside
    /// the repository's.
    pub fn collection(&self) -> &Collection<Document> {
        &self.coll
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
    /// [Sharding](self#sharding)); and from the server: `$isNumber` and
    /// `$bsonSize` (MongoDB 4.4) for every push and page (the soundness
    /// checks); transactions (a replica set or a sharded cluster) for
    /// [`delete`](Self::delete), [`reindex`](Self::reindex) and, with
    /// `order`, a late item's push, which fail with
    /// [`NoTransactions`](crate::Error::NoTransactions) without them (the
    /// rest works on a standalone); with `order`, `$sortArray` (5.2) for
    /// [`replace`](Self::replace).
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        use crate::ensure::{Feature, Need};
        let key = self.shape.spec.key;
        let moves = if self.shape.spec.order.is_some() {
            "bucket delete, reindex and late push (with order)"
        } else {
            "bucket delete and reindex"
        };
        let mut needs = vec![
            Need::needs(Feature::IsNumber, "bucket push and page"),
            Need::prefers(Feature::Transactions, moves, "NoTransactions"),
        ];
        if self.shape.spec.order.is_some() {
            needs.push(Need::needs(
                Feature::SortArray,
                "bucket replace (with order)",
            ));
        }
        let damaged = crate::ensure::Check::new(
            self.shape.damaged_filter(),
            format!(
                "buckets this declaration refuses (`{}` not an array, `count` over {} or unlike the array's length, `start` below 0: a `size` lowered or `items` renamed over stored buckets, or another writer)",
                self.shape.spec.items,
                self.shape.cap(),
            ),
            "every read and push that reaches one fails with Error::Damaged naming it: restore the old declaration, or run Buckets::rebucket_all under this one (after `items` was renamed, with .items_from(\"<old name>\"))",
        );
        let unordered = self.shape.unordered_filter().map(|filter| {
            crate::ensure::Check::new(
                filter,
                format!(
                    "buckets whose items are not in `{}` (filled before `order` was declared, or by another writer)",
                    self.shape.spec.order.unwrap_or_default()
                ),
                "pages read their items as stored, out of order: run Buckets::rebucket_all under this declaration",
            )
        });
        // The model's level, when the repository's own `ensure` runs too.
        let declared = vec![crate::ensure::Declared::new(self.coll.name())
            .index(doc! {key: 1, "start": 1}, format!("mp_bucket_{key}_start"))
            .sharded(self.shard_key(), false)
            .needs(needs)
            .check(damaged)
            .checks(unordered)
            .schema(self.shape.schema())
            .schemas(self.fields_schema())];
        crate::ensure::for_model::<T>(declared, T::VALIDATION)
    }

    /// The model's fields' types ([`Model::FIELDS`](crate::Model::FIELDS)),
    /// where a bucket holds them: the key once at the top, the rest in
    /// each item.
    fn fields_schema(&self) -> Vec<Document> {
        let (key, items) = (self.shape.spec.key, self.shape.spec.items);
        let mut out = Vec::new();
        let key_only: Vec<_> = T::FIELDS
            .iter()
            .copied()
            .filter(|f| f.name == key)
            .collect();
        let nested = T::nested();
        let key_nested: Vec<_> = nested.iter().filter(|n| n.name == key).cloned().collect();
        out.extend(crate::ensure::fields_schema(&key_only, &key_nested, None));
        if let Some(item) = crate::ensure::fields_schema(T::FIELDS, &nested, Some(key)) {
            out.push(doc! {"properties": {items: {"items": item}}});
        }
        out
    }

    /// The collection's shard key, which [`declared`](Self::declared) lists
    /// and `ensure` shards with on a sharded cluster: the bucket key,
    /// hashed or ranged (see [`KeySharding`]).
    pub fn shard_key(&self) -> Document {
        let key = self.shape.spec.key;
        match self.shape.spec.sharding {
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
        doc.remove(self.shape.spec.key);
        Ok(doc)
    }
}

/// Collection `name` of `db` reading from the primary, whatever the
/// client's read preference.
fn on_primary<D: Send + Sync>(db: &Database, name: &str) -> Collection<D> {
    let co = mongodb::options::CollectionOptions::builder()
        .selection_criteria(crate::util::primary())
        .build();
    db.collection_with_options(name, co)
}
