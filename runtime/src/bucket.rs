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
//!   always its last.
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
//! - A removal marks the key's buckets until it has recomputed `start`; a
//!   read that meets the mark recomputes first (under the key's lease), so
//!   a removal cut short by a crash leaves no page wrong.
//! - With `order`, pages follow it across all buckets, also for late items
//!   (equal values in arrival order). A push not below the last bucket's
//!   items is in order: one update that inserts it sorted, as before. A
//!   late one goes into the bucket that covers its value, which may grow to
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
//! Every operation that reads or writes returns an action ([`Push`],
//! [`PushMany`], [`FetchPage`], [`Total`], [`Reindex`], [`Remove`],
//! [`Update`]; [`ItemStream`] for `stream`), configured by setters
//! (`session`, write/read concern, read preference, `comment`, `max_time`)
//! and run by `.await`. Each operation's doc says which commands it sends
//! and what it does in a caller's session and transaction: in-order pushes,
//! pages, totals and updates join the transaction, and a race they would
//! retry is handed back as transient; late pushes, removals and reindexing
//! move positions under the key's lease, which a caller's transaction could
//! not hold until it commits, so they are refused there. `page_pipeline`
//! sends nothing and stays a plain method.
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
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawArray, RawBsonRef, RawDocument, RawDocumentBuf};
use mongodb::{Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::action::Options;
use crate::error::{Error, Result};
use crate::keyset::id_of;
use crate::model::Model;

mod act;
mod edit;
mod order;
use act::Cx;
pub use act::{FetchPage, ItemStream, Push, PushMany, Reindex, Remove, Total, Update};
pub use edit::{FIELD_OPERATORS, LOGICAL_OPERATORS};

/// Largest bucket `#[bucket(size = ...)]` accepts. Past it, documents grow
/// into megabytes that every page read has to load: use a time-series
/// collection, or smaller buckets.
pub const MAX_SIZE: u32 = 10_000;
/// Largest page [`Buckets::page`] cuts.
pub const MAX_PER_PAGE: u32 = 10_000;
/// A bucket's items stop short of this many bytes, leaving room under
/// MongoDB's 16 MiB for the bucket's own fields.
pub const MAX_BUCKET_BYTES: i64 = 16 * 1024 * 1024 - 64 * 1024;
/// Fields the repository's reads compute beside a bucket's own: the
/// array's length, and its BSON type.
const LEN: &str = "mp_len";
const TYPE: &str = "mp_type";
const MINE: &str = "mp_mine";
/// The order values of a bucket's first and last items, as reads compute
/// them.
const LO: &str = "mp_lo";
const HI: &str = "mp_hi";
/// Each bucket keeps the ids of the last writes that changed it, so that a
/// write the driver retries after a lost reply (it does so once, for
/// example across a server restart) is recognised and not applied twice.
const OPS: &str = "mp_ops";
/// How many write ids a bucket keeps: more than the writes that can land
/// between a write and its retry (one per concurrent writer).
const OPS_KEPT: i32 = 64;
/// Set on every bucket of a key while a `remove` changes counts and has not
/// yet recomputed `start`: a read that meets it recomputes them first, so a
/// removal cut short by a crash leaves no page wrong.
const STALE: &str = "mp_stale";
/// Attempts at a push that keeps losing races before it gives up.
const MAX_ATTEMPTS: usize = 64;
/// Keys whose open bucket a repository remembers; past it, it forgets all.
const MAX_REMEMBERED: usize = 100_000;

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
}

impl BucketSpec {
    /// What generated code declares after a compile error.
    #[doc(hidden)]
    pub const FALLBACK: BucketSpec = BucketSpec {
        size: 1,
        key: "",
        order: None,
        items: "items",
    };
}

/// A model stored in buckets. `#[bucket(...)]` implements it.
pub trait Bucketed: Model + Serialize + DeserializeOwned + Send + Sync + Unpin + 'static {
    /// The key's type: the field that groups items.
    type Key: Serialize + Send + Sync;
    /// The declaration.
    const BUCKET: BucketSpec;
    /// This item's key.
    fn bucket_key(&self) -> &Self::Key;

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
pub trait BucketKey {}

/// Types an `order` field can have: times and numbers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot order a bucket's items",
    label = "not a time or a number",
    note = "`order` must name a DateTime or numeric field"
)]
pub trait OrderKey {}

use crate::util::{id_range, impls, key_bytes};
impls!(BucketKey: i8, i16, i32, i64, u8, u16, u32, u64, bool, String, bson::oid::ObjectId, bson::Uuid, bson::DateTime);
impls!(OrderKey: i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, bson::DateTime, bson::Timestamp);

/// Which page, how large, and from which end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    page: u32,
    per_page: u32,
    newest_first: bool,
}

impl PageRequest {
    /// Page `page` (from 1) of `per_page` items, oldest first.
    pub fn new(page: u32, per_page: u32) -> Self {
        PageRequest {
            page,
            per_page,
            newest_first: false,
        }
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
    coll: Collection<Document>,
    raw: Collection<RawDocumentBuf>,
    locks: Collection<Document>,
    spec: BucketSpec,
    heads: Arc<Mutex<HashMap<Vec<u8>, i64>>>,
    _items: PhantomData<fn() -> T>,
}

impl<T> Clone for Buckets<T> {
    fn clone(&self) -> Self {
        Buckets {
            db: self.db.clone(),
            defaults: self.defaults.clone(),
            coll: self.coll.clone(),
            raw: self.raw.clone(),
            locks: self.locks.clone(),
            spec: self.spec,
            heads: self.heads.clone(),
            _items: PhantomData,
        }
    }
}

/// The newest bucket of a key, as a push or a page needs it.
#[derive(Debug, Clone, Default)]
struct Head {
    /// The bucket's `_id`, and its `seq` as stored (a double between two
    /// integers after a split); `seq` is its integer part.
    id: Bson,
    raw_seq: Bson,
    /// The order values of its first and last items (its floor when empty).
    lo: Option<Bson>,
    hi: Option<Bson>,
    seq: i64,
    start: i64,
    count: i64,
    bytes: i64,
    sealed: bool,
    exists: bool,
    /// The bucket holds the write id the read asked about.
    mine: bool,
    /// A removal has not finished recomputing `start` (see [`STALE`]).
    stale: bool,
}

impl<T: Bucketed> Buckets<T> {
    /// The repository for `T` in `db`.
    pub fn new(db: &Database) -> Self {
        Buckets {
            db: db.clone(),
            defaults: Arc::default(),
            coll: db.collection(T::COLLECTION),
            raw: db.collection(T::COLLECTION),
            locks: db.collection(&format!("{}.mp_locks", T::COLLECTION)),
            spec: T::BUCKET,
            heads: Arc::default(),
            _items: PhantomData,
        }
    }

    /// The same repository with `options` as its defaults (an action's
    /// setters override them; what neither sets comes from the
    /// `Database`). Clones share them.
    pub fn with_options(mut self, options: Options) -> Self {
        self.defaults = Arc::new(options);
        self
    }

    /// The same repository on collection `name` (its leases in
    /// `<name>.mp_locks`), for one collection per tenant. It forgets the
    /// open buckets it remembered, which belong to the other collection.
    pub fn with_collection(mut self, name: &str) -> Self {
        self.coll = self.db.collection(name);
        self.raw = self.db.collection(name);
        self.locks = self.db.collection(&format!("{name}.mp_locks"));
        self.heads = Arc::default();
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
            raw: self.db.collection_with_options(name, co.clone()),
            locks: self.db.collection_with_options(self.locks.name(), co),
            ..self.clone()
        }
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks: the collection and the index pages are cut by, `{key: 1,
    /// start: 1}`. The same as [`Model::ensure`] for
    /// this repository (under its run-time collection name). Pushes need no
    /// index beyond `_id`: they address buckets by `_id`, and no field they
    /// change is indexed.
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.db, self.declared())
    }

    /// [`ensure`](Self::ensure), under its older name.
    pub fn ensure_indexes(&self) -> crate::ensure::EnsureAction<'_> {
        self.ensure()
    }

    /// What this repository needs in the deployment: its collection, with
    /// the `{key, start}` index that page reads seek on.
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        let key = self.spec.key;
        vec![crate::ensure::Declared::new(self.coll.name())
            .index(doc! {key: 1, "start": 1}, format!("mp_bucket_{key}_start"))]
    }

    /// [`Buckets::push`], in `cx`.
    async fn push_in(&self, item: &T, cx: &mut Cx<'_>) -> Result<()> {
        let key = self.key_bson(item.bucket_key())?;
        let doc = self.item_doc(item)?;
        let len = item_len(&doc)?;
        let slot = key_bytes(&key);
        let v = self.order_of(&doc);
        // One id for every attempt: once one is applied, no other can be.
        let op = ObjectId::new();
        let mut hops = 0;
        for _ in 0..MAX_ATTEMPTS {
            // A key not seen yet starts by creating its first bucket: for a
            // new key that is the whole push. Writes to a bucket that exists
            // are updates whose filter refuses a damaged bucket; an upsert
            // cannot carry that filter, so none is sent.
            let mut known = self.remembered(&slot);
            if known.is_none() && cx.txn {
                // In a caller's transaction a failed insert aborts it: an
                // unseen key is read first rather than guessed new.
                let head = self.head(&key, None, cx).await?;
                if head.exists {
                    self.remember(slot.clone(), head.seq);
                    known = Some(head.seq);
                }
            }
            let seq = known.unwrap_or(0);
            let result = match known {
                None => self
                    .open_next(&key, &Head::default(), vec![doc.clone()], len, op, cx)
                    .await
                    .map(|s| s.is_some()),
                Some(seq) => {
                    let mut filter = doc! {"_id": {"k": key.clone(), "s": seq}};
                    filter.extend(self.open_filter(&key, 1, len, op, v.as_ref()));
                    let update = match &v {
                        Some(v) => mongodb::options::UpdateModifications::from(
                            self.insert_sorted(&doc, v, len, op),
                        ),
                        None => self.append(vec![doc.clone()], len, op).into(),
                    };
                    let update = self
                        .coll
                        .update_one(filter, update)
                        .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
                    crate::action::run!(update, cx.session.as_deref_mut())
                        .map(|r| r.matched_count == 1)
                        .map_err(Error::from)
                }
            };
            match result {
                Ok(true) => {
                    self.remember(slot, seq);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) if is_duplicate_key(&e) && cx.txn => return Err(raced(e)),
                Err(e) if is_duplicate_key(&e) => {}
                Err(e) => return Err(e),
            }
            if cx.txn && hops >= 3 {
                // The bucket keeps changing under the transaction's
                // snapshot: another writer's; the caller runs it again.
                return Err(raced(contended("push")));
            }
            // Full, closed, or not there, late, or this very write applied
            // already (a retry by the driver found its id). A point read
            // says which; after a few hops forward, ask for the newest
            // bucket instead.
            hops += 1;
            let head = if known.is_none() {
                // The key has buckets this handle had not seen: go to its
                // newest, by the index.
                let head = self.head(&key, Some(op), cx).await?;
                if head.mine {
                    self.remember(slot, head.seq);
                    return Ok(());
                }
                head
            } else {
                let at = self.bucket(&key, seq, Some(op), cx).await?;
                if at.as_ref().is_some_and(|h| h.mine) {
                    self.remember(slot, seq);
                    return Ok(());
                }
                match at {
                    Some(h) if hops <= 2 => h,
                    _ => self.head(&key, None, cx).await?,
                }
            };
            let late = |bound: &Option<Bson>| {
                v.as_ref()
                    .is_some_and(|v| order_cmp(Some(v), bound.as_ref()) == std::cmp::Ordering::Less)
            };
            // An empty last bucket without a floor (a removal emptied it)
            // says nothing of the values before it: the late path finds the
            // bucket that covers the item among those with items.
            let unbounded = v.is_some() && head.exists && head.count == 0 && head.hi.is_none();
            if head.exists
                && !head.sealed
                && !unbounded
                && !late(&head.lo)
                && self.fits(&head, &[(Document::new(), len)]) == 1
            {
                // The bucket has room (another writer opened it, or this
                // repository had not seen the key): append to it.
                self.remember(slot.clone(), head.seq);
                continue;
            }
            if head.exists && (late(&head.hi) || unbounded) {
                // Below what the last bucket holds: it goes into the bucket
                // that covers it (an item in order never lands behind it).
                // Another writer's copy of this push may have landed first.
                cx.outside_transaction("a late push")?;
                return self
                    .scoped(&cx.opts)
                    .push_late(&key, doc.clone(), len, op)
                    .await;
            }
            match self
                .open_next(&key, &head, vec![doc.clone()], len, op, cx)
                .await
            {
                Ok(Some(seq)) => {
                    self.remember(slot, seq);
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) if is_duplicate_key(&e) && cx.txn => return Err(raced(e)),
                Err(e) if is_duplicate_key(&e) => {
                    // Another writer opened it first: append to theirs.
                    self.remember(slot.clone(), head.seq + 1);
                }
                Err(e) => return Err(e),
            }
        }
        Err(contended("push"))
    }

    /// An item's `order` value (null when it has none), if the model has
    /// `order`.
    fn order_of(&self, doc: &Document) -> Option<Bson> {
        self.spec
            .order
            .map(|o| doc.get(o).cloned().unwrap_or(Bson::Null))
    }

    fn remembered(&self, slot: &[u8]) -> Option<i64> {
        self.heads.lock().ok()?.get(slot).copied()
    }

    fn remember(&self, slot: Vec<u8>, seq: i64) {
        if let Ok(mut heads) = self.heads.lock() {
            if heads.len() >= MAX_REMEMBERED {
                heads.clear();
            }
            heads.insert(slot, seq);
        }
    }

    /// [`Buckets::push_many`], in `cx`.
    async fn push_many_in(&self, key_b: &Bson, items: &[T], cx: &mut Cx<'_>) -> Result<()> {
        let key_b = key_b.clone();
        let mut docs = Vec::with_capacity(items.len());
        for item in items {
            if self.key_bson(item.bucket_key())? != key_b {
                return Err(Error::invalid(
                    "items",
                    "every item must have the key given",
                ));
            }
            let d = self.item_doc(item)?;
            let len = item_len(&d)?;
            docs.push((d, len));
        }
        if let Some(order) = self.spec.order {
            // Stable: items with equal order values keep the order given.
            docs.sort_by(|(a, _), (b, _)| order_cmp(a.get(order), b.get(order)));
        }
        let mut rest: &[(Document, i64)] = &docs;
        let mut attempts = 0;
        let mut known: Option<Head> = None;
        while !rest.is_empty() {
            attempts += 1;
            if attempts > MAX_ATTEMPTS {
                return Err(contended("push_many"));
            }
            if cx.txn && attempts > 4 {
                return Err(raced(contended("push_many")));
            }
            let head = match known.take() {
                Some(h) => h,
                None => self.fresh_head(&key_b, cx).await?,
            };
            // Items below what the last bucket holds are late: each goes
            // into the bucket that covers it (they come first, the batch
            // being sorted).
            let late = rest
                .iter()
                .take_while(|(d, _)| {
                    head.exists
                        && self.order_of(d).is_some_and(|v| {
                            (head.count == 0 && head.hi.is_none())
                                || order_cmp(Some(&v), head.hi.as_ref()) == std::cmp::Ordering::Less
                        })
                })
                .count();
            if late > 0 {
                cx.outside_transaction("a late push")?;
                let scoped = self.scoped(&cx.opts);
                for (d, len) in &rest[..late] {
                    scoped
                        .push_late(&key_b, d.clone(), *len, ObjectId::new())
                        .await?;
                }
                rest = &rest[late..];
                continue;
            }
            // Fill what room the open bucket has, if it is open.
            if head.exists && !head.sealed {
                let n = self.fits(&head, rest);
                if n > 0 {
                    let len: i64 = rest[..n].iter().map(|(_, l)| l).sum();
                    let filter = doc! {
                        "_id": {"k": key_b.clone(), "s": head.seq},
                        "count": head.count,
                        "sealed": Bson::Null,
                        "$expr": self.sound(),
                    };
                    let mut filter = filter;
                    let op = ObjectId::new();
                    filter.insert(OPS, doc! {"$ne": op});
                    let items = rest[..n].iter().map(|(d, _)| d.clone()).collect();
                    let update = self
                        .coll
                        .update_one(filter, self.append(items, len, op))
                        .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
                    let r = crate::action::run!(update, cx.session.as_deref_mut())?;
                    // Not matched: changed by a concurrent push, or applied
                    // already and retried by the driver (its id is there).
                    let applied = r.matched_count == 1
                        || self
                            .bucket(&key_b, head.seq, Some(op), cx)
                            .await?
                            .is_some_and(|h| h.mine);
                    if applied {
                        let hi = rest[n - 1].0.clone();
                        rest = &rest[n..];
                        known = Some(Head {
                            count: head.count + n as i64,
                            bytes: head.bytes + len,
                            hi: self.order_of(&hi).or(head.hi.clone()),
                            ..head
                        });
                    }
                    // Otherwise a concurrent push changed the bucket: look again.
                    continue;
                }
            }
            // The open bucket has no room for the next item: close it if
            // only bytes filled it, so that nothing lands behind the new ones.
            if head.exists && !head.sealed && !self.seal_if_unchanged(&head, cx).await? {
                continue;
            }
            // New buckets for the rest, in one ordered insert.
            let (mut seq, mut start) = if head.exists {
                (head.seq + 1, head.total())
            } else {
                (0, 0)
            };
            let mut buckets = Vec::new();
            let mut taken = 0;
            let op = ObjectId::new();
            while taken < rest.len() {
                // Never 0: `item_len` refused items that fit no bucket.
                let n = self.fits(&Head::default(), &rest[taken..]).max(1);
                let chunk = &rest[taken..taken + n];
                let mut b = self.new_bucket(&key_b, seq, start);
                b.insert("count", n as i64);
                b.insert("bytes", chunk.iter().map(|(_, l)| l).sum::<i64>());
                b.insert(OPS, vec![op]);
                if head.stale {
                    // Opened from a marked bucket: marked too.
                    b.insert(STALE, true);
                }
                b.insert(
                    self.spec.items,
                    chunk
                        .iter()
                        .map(|(d, _)| Bson::Document(d.clone()))
                        .collect::<Vec<_>>(),
                );
                taken += n;
                if taken < rest.len() && (n as u32) < self.spec.size {
                    // Closed by bytes before it was full.
                    b.insert("sealed", true);
                }
                buckets.push((b, n));
                seq += 1;
                start += n as i64;
            }
            let docs = buckets.iter().map(|(b, _)| b);
            let insert = self
                .coll
                .insert_many(docs)
                .with_options(cx.opts.driver::<mongodb::options::InsertManyOptions>())
                .ordered(true);
            match crate::action::run!(insert, cx.session.as_deref_mut()) {
                Ok(_) => {
                    rest = &[];
                    self.remember(key_bytes(&key_b), seq - 1);
                }
                Err(e) => {
                    let e = Error::from(e);
                    if !is_duplicate_key(&e) {
                        return Err(e);
                    }
                    if cx.txn {
                        return Err(raced(e));
                    }
                    // Another writer opened the next bucket first, or the
                    // driver retried an insert that had gone in: the
                    // buckets carrying this insert's id are what went in (a
                    // prefix, as the insert is ordered). Go again with the rest.
                    let mut mine = id_range("k", &key_b);
                    mine.insert(OPS, op);
                    let seqs: Vec<i64> = self
                        .scoped(&cx.opts)
                        .raw
                        .find(mine)
                        .projection(doc! {"_id": 1})
                        .await?
                        .try_collect::<Vec<_>>()
                        .await?
                        .iter()
                        .filter_map(|d| match d.get("_id") {
                            Ok(Some(RawBsonRef::Document(id))) => raw_int(id, "s").ok(),
                            _ => None,
                        })
                        .collect();
                    let stored: usize = buckets
                        .iter()
                        .filter(|(b, _)| {
                            b.get_document("_id")
                                .ok()
                                .and_then(|id| id.get_i64("s").ok())
                                .is_some_and(|s| seqs.contains(&s))
                        })
                        .map(|(_, n)| n)
                        .sum();
                    rest = &rest[stored..];
                }
            }
        }
        Ok(())
    }

    /// [`Buckets::page`], in `cx`.
    async fn page_in(
        &self,
        key_b: &Bson,
        req: PageRequest,
        cx: &mut Cx<'_>,
    ) -> Result<BucketPage<T>> {
        req.check()?;
        let key_b = key_b.clone();
        // A read that meets a removal's mark recomputes `start` and reads
        // again, once: a page is never cut by stale positions.
        let mut page = self.page_once(&key_b, req, cx).await?;
        if page.is_none() {
            cx.outside_transaction("repairing positions a removal left")?;
            // Under the lease, no write can mark the key again before the
            // page is read.
            let scoped = self.scoped(&cx.opts);
            let (scoped, key_b, cx) = (&scoped, &key_b, &mut *cx);
            page = scoped
                .leased(key_b, |_| async move {
                    scoped.finish_moves(key_b).await?;
                    scoped.reindex_now(key_b, None).await?;
                    self.page_once(key_b, req, cx).await
                })
                .await?;
        }
        // Marked again at once: a removal is running on this key.
        page.ok_or(Error::Contended {
            operation: "page",
            attempts: 2,
        })
    }

    /// The page, or `None` if a bucket it read was marked stale.
    async fn page_once(
        &self,
        key: &Bson,
        req: PageRequest,
        cx: &mut Cx<'_>,
    ) -> Result<Option<BucketPage<T>>> {
        let per = i64::from(req.per_page);
        let skip = (i64::from(req.page) - 1) * per;
        if !req.newest_first {
            // One more than the page, to know whether another follows.
            let Some(mut items) = self.range(key, skip, per + 1, cx).await? else {
                return Ok(None);
            };
            let has_more = items.len() as i64 > per;
            items.truncate(per as usize);
            return Ok(Some(BucketPage { items, has_more }));
        }
        let head = self.head(key, None, cx).await?;
        if head.stale {
            return Ok(None);
        }
        let end = head.total() - skip;
        if end <= 0 {
            return Ok(Some(BucketPage {
                items: Vec::new(),
                has_more: false,
            }));
        }
        let from = (end - per).max(0);
        let Some(mut items) = self.range(key, from, end - from, cx).await? else {
            return Ok(None);
        };
        items.reverse();
        Ok(Some(BucketPage {
            items,
            has_more: from > 0,
        }))
    }

    /// [`Buckets::total`], in `cx`.
    async fn total_in(&self, key_b: &Bson, cx: &mut Cx<'_>) -> Result<u64> {
        Ok(self.fresh_head(key_b, cx).await?.total() as u64)
    }

    /// The newest bucket, with `start` recomputed first if a removal left
    /// it stale.
    async fn fresh_head(&self, key: &Bson, cx: &mut Cx<'_>) -> Result<Head> {
        let head = self.head(key, None, cx).await?;
        if !head.stale {
            return Ok(head);
        }
        cx.outside_transaction("repairing positions a removal left")?;
        let scoped = self.scoped(&cx.opts);
        let scoped = &scoped;
        scoped
            .leased(key, |_| async move {
                scoped.finish_moves(key).await?;
                scoped.reindex_now(key, None).await?;
                self.head(key, None, cx).await
            })
            .await
    }

    /// [`Buckets::stream`] with options `opts`.
    fn stream_in(&self, key_b: Result<Bson>, opts: Options) -> BoxStream<'static, Result<T>> {
        let this = self.scoped(&opts);
        futures::stream::once(async move {
            let key_b = key_b?;
            let cursor = this
                .raw
                .find(id_range("k", &key_b))
                .with_options(opts.driver::<mongodb::options::FindOptions>())
                .sort(doc! {"_id": 1})
                .await?;
            let items = cursor.map_err(Error::from).map(move |bucket| {
                let bucket = bucket?;
                let len = match bucket.get(this.spec.items) {
                    Ok(Some(RawBsonRef::Array(a))) => Some(a.into_iter().count() as i64),
                    _ => None,
                };
                this.check(&bucket, len)?;
                let items = this.items_of(&bucket, &key_b, i64::MAX)?;
                Ok::<_, Error>(futures::stream::iter(items.into_iter().map(Ok)))
            });
            Ok::<_, Error>(items.try_flatten())
        })
        .try_flatten()
        .boxed()
    }

    /// The aggregation an oldest-first page sends.
    pub fn page_pipeline<Q>(&self, key: &Q, req: PageRequest) -> Result<Vec<Document>>
    where
        T::Key: std::borrow::Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        req.check()?;
        let key_b = self.key_bson(key)?;
        let per = i64::from(req.per_page);
        Ok(self.range_pipeline(&key_b, (i64::from(req.page) - 1) * per, per + 1))
    }

    // ---- internals ----

    fn key_bson<Q: Serialize + ?Sized>(&self, key: &Q) -> Result<Bson> {
        Ok(crate::compat::to_bson(key)?)
    }

    /// The item as stored: without the key field, which the bucket holds.
    fn item_doc(&self, item: &T) -> Result<Document> {
        let mut doc = crate::compat::to_document(item)?;
        doc.remove(self.spec.key);
        Ok(doc)
    }

    /// The open bucket of `key` with room for `n` more items of `len` bytes.
    /// With `v`, only if its lowest item is not above `v`: a lower value
    /// is late, and belongs in an earlier bucket.
    fn open_filter(
        &self,
        key: &Bson,
        n: i64,
        len: i64,
        op: ObjectId,
        v: Option<&Bson>,
    ) -> Document {
        let expr = match v {
            Some(v) => doc! {"$and": [self.sound(), {"$lte": [self.lo_expr(), {"$literal": v}]}]},
            None => self.sound(),
        };
        doc! {
            OPS: {"$ne": op},
            self.spec.key: key.clone(),
            "sealed": Bson::Null,
            "count": {"$lte": i64::from(self.spec.size) - n},
            "bytes": {"$lte": MAX_BUCKET_BYTES - len},
            "$expr": expr,
        }
    }

    /// True for a bucket whose bookkeeping holds: `items` an array, `count`
    /// its length, within `size`, and `start` a number. Every write's filter
    /// carries it, so a damaged bucket is never written to; the read that
    /// follows a write that matched nothing says what is wrong.
    fn sound(&self) -> Document {
        let items = format!("${}", self.spec.items);
        let is_array = doc! {"$isArray": [&items]};
        doc! {"$and": [
            &is_array,
            {"$eq": [{"$size": {"$cond": [&is_array, &items, []]}}, "$count"]},
            {"$lte": ["$count", self.cap()]},
            {"$isNumber": "$start"},
        ]}
    }

    /// The array's length, or null when `items` is not an array: read
    /// beside `count` so that a bucket's bookkeeping can be checked.
    fn len_expr(&self) -> Document {
        let items = format!("${}", self.spec.items);
        doc! {"$cond": [{"$isArray": [&items]}, {"$size": &items}, Bson::Null]}
    }

    /// Checks a bucket's bookkeeping as read (`len` is the array's length,
    /// `None` when `items` is not an array): the [`Error::Damaged`] that
    /// names it, or its `(start, count)`.
    fn check(&self, d: &RawDocument, len: Option<i64>) -> Result<(i64, i64)> {
        let damaged = |field: &str, problem: String| {
            Error::damaged(self.coll.name(), id_of(d), field, problem)
        };
        let Some(len) = len else {
            // The server's name for what it holds, where a read asked for it.
            let found = match (d.get_str(TYPE), d.get(self.spec.items)) {
                (Ok(t), _) => t.to_owned(),
                (_, Ok(Some(v))) => format!("{:?}", v.element_type()),
                _ => "missing".to_owned(),
            };
            return Err(damaged(
                self.spec.items,
                format!("is {found}, not an array"),
            ));
        };
        let count = raw_int(d, "count")
            .map_err(|found| damaged("count", format!("is {found}, not an integer")))?;
        if count != len {
            return Err(damaged(
                "count",
                format!("is {count}, but the array holds {len} items"),
            ));
        }
        if count > self.cap() {
            return Err(damaged(
                "count",
                format!("is {count}, over the bucket's limit {}", self.cap()),
            ));
        }
        let start = raw_int(d, "start")
            .map_err(|found| damaged("start", format!("is {found}, not an integer")))?;
        if start < 0 {
            return Err(damaged("start", format!("is {start}, below 0")));
        }
        Ok((start, count))
    }

    fn append(&self, items: Vec<Document>, len: i64, op: ObjectId) -> Document {
        let n = items.len() as i64;
        // With `order`, callers append only items not below the bucket's
        // last (and sorted): the array stays sorted, and equal values keep
        // their arrival order.
        let each = doc! {"$each": items};
        doc! {
            "$push": {
                self.spec.items: each,
                OPS: {"$each": [op], "$slice": -OPS_KEPT},
            },
            "$inc": {"count": n, "bytes": len},
        }
    }

    fn new_bucket(&self, key: &Bson, seq: i64, start: i64) -> Document {
        doc! {
            "_id": {"k": key.clone(), "s": seq},
            self.spec.key: key.clone(),
            "start": start,
        }
    }

    /// Opens the bucket after `head` with `items` (one item, or items in
    /// order) in it: an insert, which fails with a duplicate key when
    /// another writer opened it first (then the caller retries, and appends
    /// to that one).
    async fn open_next(
        &self,
        key: &Bson,
        head: &Head,
        items: Vec<Document>,
        len: i64,
        op: ObjectId,
        cx: &mut Cx<'_>,
    ) -> Result<Option<i64>> {
        if head.exists && !head.sealed && !self.seal_if_unchanged(head, cx).await? {
            // It changed since it was read: the caller reads it again.
            return Ok(None);
        }
        // The new bucket's `start` comes from the head's: never from one a
        // write that moves positions left stale.
        let fresh;
        let head = if head.stale {
            cx.outside_transaction("repairing positions a removal left")?;
            let scoped = self.scoped(&cx.opts);
            let (scoped, cx) = (&scoped, &mut *cx);
            fresh = scoped
                .leased(key, |_| async move {
                    scoped.finish_moves(key).await?;
                    scoped.reindex_now(key, None).await?;
                    self.bucket(key, head.seq, None, cx).await
                })
                .await?
                .unwrap_or_else(|| head.clone());
            &fresh
        } else {
            head
        };
        if let (Some(first), true) = (items.first(), head.exists) {
            let v = self.order_of(first);
            if v.is_some() && order_cmp(v.as_ref(), head.hi.as_ref()) == std::cmp::Ordering::Less {
                // A split or a late item changed it: decide again.
                return Ok(None);
            }
        }
        let (seq, start) = if head.exists {
            (head.seq + 1, head.total())
        } else {
            (0, 0)
        };
        let mut bucket = self.new_bucket(key, seq, start);
        bucket.insert("count", items.len() as i64);
        bucket.insert("bytes", len);
        bucket.insert(self.spec.items, items);
        bucket.insert(OPS, vec![op]);
        if head.stale {
            // Opened from a marked bucket: marked too, until the write that
            // marked them has recomputed `start`.
            bucket.insert(STALE, true);
        }
        let insert = self
            .coll
            .insert_one(bucket)
            .with_options(cx.opts.driver::<mongodb::options::InsertOneOptions>());
        crate::action::run!(insert, cx.session.as_deref_mut())?;
        Ok(Some(seq))
    }

    /// Seals `head` if it is still as read (count and mark), and says
    /// whether it is closed now; a full bucket needs no seal.
    async fn seal_if_unchanged(&self, head: &Head, cx: &mut Cx<'_>) -> Result<bool> {
        if head.count < i64::from(self.spec.size) {
            let stale = if head.stale {
                Bson::Boolean(true)
            } else {
                Bson::Document(doc! {"$ne": true})
            };
            let update = self
                .coll
                .update_one(
                    doc! {
                        "_id": head.id.clone(),
                        "count": head.count,
                        "sealed": Bson::Null,
                        STALE: stale,
                        "$expr": self.sound(),
                    },
                    doc! {"$set": {"sealed": true}},
                )
                .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
            let r = crate::action::run!(update, cx.session.as_deref_mut())?;
            return Ok(r.matched_count == 1);
        }
        Ok(true)
    }

    /// How many of `items` fit in `head`.
    fn fits(&self, head: &Head, items: &[(Document, i64)]) -> usize {
        let room = (i64::from(self.spec.size) - head.count).max(0) as usize;
        let mut bytes = head.bytes;
        let mut n = 0;
        for (_, len) in items.iter().take(room) {
            if bytes + len > MAX_BUCKET_BYTES {
                break;
            }
            bytes += len;
            n += 1;
        }
        n
    }

    /// The key's newest bucket: an indexed read of the `_id` range.
    /// `mine` says whether write `op` is among its last writes.
    async fn head(&self, key: &Bson, op: Option<ObjectId>, cx: &mut Cx<'_>) -> Result<Head> {
        let find = self
            .raw
            .find_one(id_range("k", key))
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .sort(doc! {"_id": -1})
            .projection(self.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        match found {
            Some(d) => self.head_of(&d),
            None => Ok(Head::default()),
        }
    }

    /// Bucket `seq` of `key`, by `_id`.
    /// Bucket `seq` of `key`, by `_id`; `mine` says whether write `op` is
    /// among the bucket's last writes.
    async fn bucket(
        &self,
        key: &Bson,
        seq: i64,
        op: Option<ObjectId>,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Head>> {
        let find = self
            .raw
            .find_one(doc! {"_id": {"k": key.clone(), "s": seq}})
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .projection(self.head_projection(op));
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        found.map(|d| self.head_of(&d)).transpose()
    }

    fn head_projection(&self, op: Option<ObjectId>) -> Document {
        let mut p = doc! {
            "start": 1, "count": 1, "bytes": 1, "sealed": 1, STALE: 1,
            LEN: self.len_expr(),
            TYPE: {"$type": format!("${}", self.spec.items)},
        };
        if self.spec.order.is_some() {
            p.insert(LO, self.lo_expr());
            p.insert(HI, self.hi_expr());
        }
        if let Some(op) = op {
            let ops = format!("${OPS}");
            p.insert(
                MINE,
                doc! {"$in": [op, {"$cond": [{"$isArray": [&ops]}, &ops, []]}]},
            );
        }
        p
    }

    fn head_of(&self, d: &RawDocument) -> Result<Head> {
        let seq = match d.get("_id") {
            Ok(Some(RawBsonRef::Document(id))) => match id.get("s") {
                Ok(Some(RawBsonRef::Double(v))) if v.is_finite() && v.abs() < 9.0e15 => {
                    Some((v.floor() as i64, Bson::Double(v)))
                }
                _ => raw_int(id, "s").ok().map(|s| (s, Bson::Int64(s))),
            },
            _ => None,
        }
        .ok_or_else(|| {
            Error::damaged(
                self.coll.name(),
                id_of(d),
                "_id",
                "is not {k: key, s: integer}",
            )
        })?;
        let len = raw_int(d, LEN).ok();
        let (start, count) = self.check(d, len)?;
        let value = |f: &str| {
            d.get(f)
                .ok()
                .flatten()
                .and_then(|v| Bson::try_from(crate::compat::to_raw_bson(v)).ok())
        };
        Ok(Head {
            id: id_of(d),
            raw_seq: seq.1,
            lo: value(LO),
            hi: value(HI),
            seq: seq.0,
            start,
            count,
            bytes: raw_int(d, "bytes").unwrap_or(0),
            sealed: matches!(d.get("sealed"), Ok(Some(RawBsonRef::Boolean(true)))),
            exists: true,
            mine: matches!(d.get(MINE), Ok(Some(RawBsonRef::Boolean(true)))),
            stale: is_stale(d),
        })
    }

    /// Items `[from, from + n)` of `key`, oldest first, in one aggregation;
    /// `None` if a bucket it read was marked stale.
    async fn range(
        &self,
        key: &Bson,
        from: i64,
        n: i64,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Vec<T>>> {
        let agg = self
            .raw
            .aggregate(self.range_pipeline(key, from, n))
            .with_options(cx.opts.driver::<mongodb::options::AggregateOptions>())
            .with_type::<RawDocumentBuf>();
        // The page's one or two buckets, sliced.
        let buckets: Vec<RawDocumentBuf> = match cx.session.as_deref_mut() {
            Some(s) => {
                let mut cursor = agg.session(&mut *s).await?;
                let mut out = Vec::new();
                while let Some(b) = cursor.next(&mut *s).await {
                    out.push(b?);
                }
                out
            }
            None => agg.await?.try_collect().await?,
        };
        let mut out = Vec::with_capacity(n.min(4096) as usize);
        // The server sliced each bucket to the range already. Every bucket
        // it sends is checked, even past the page's end: a damaged one in
        // the range makes the page an error, never a page with a hole.
        let mut stale = false;
        for bucket in buckets {
            let len = raw_int(&bucket, LEN).ok();
            self.check(&bucket, len)?;
            stale |= is_stale(&bucket);
            let want = n - out.len() as i64;
            if want > 0 && !stale {
                out.extend(self.items_of(&bucket, key, want)?);
            }
        }
        Ok((!stale).then_some(out))
    }

    fn range_pipeline(&self, key: &Bson, from: i64, n: i64) -> Vec<Document> {
        let size = self.cap();
        let items = format!("${}", self.spec.items);
        vec![
            // A bucket holds at most `cap` items, so only buckets starting
            // in (from - size, from + n) can overlap: an index seek.
            // A bucket whose `start` is not a number is sent too (its index
            // keys sort apart from numbers), to be reported as damaged.
            doc! {"$match": {
                self.spec.key: key.clone(),
                "$or": [
                    {"start": {"$gt": from - size, "$lt": from + n}},
                    {"start": {"$not": {"$type": "number"}}},
                ],
            }},
            doc! {"$sort": {"start": 1, "_id": 1}},
            doc! {"$project": {
                "start": 1,
                "count": 1,
                STALE: 1,
                LEN: self.len_expr(),
                TYPE: {"$type": &items},
                // From the page's first item in this bucket, no further
                // than the page's end: two buckets return one page of items.
                self.spec.items: {"$cond": [
                    {"$and": [{"$isArray": [&items]}, {"$isNumber": "$start"}]},
                    {"$slice": [
                        &items,
                        {"$max": [0, {"$subtract": [from, "$start"]}]},
                        {"$subtract": [from + n, {"$max": [from, "$start"]}]},
                    ]},
                    Bson::Null,
                ]},
            }},
        ]
    }

    /// Up to `take` items of a bucket, typed, with the key put back.
    /// Errors name the bucket by its `_id`, and the item by its index in
    /// the array as sent (the page's slice for a page).
    fn items_of(&self, bucket: &RawDocument, key: &Bson, take: i64) -> Result<Vec<T>> {
        let damaged = |field: String, problem: String| {
            Error::damaged(self.coll.name(), id_of(bucket), field, problem)
        };
        let arr: &RawArray = match bucket.get(self.spec.items) {
            Ok(Some(RawBsonRef::Array(a))) => a,
            _ => {
                return Err(damaged(
                    self.spec.items.to_owned(),
                    "is not an array".into(),
                ))
            }
        };
        let key_raw = bson::RawBson::try_from(key.clone())
            .map_err(|e| Error::invalid("key", e.to_string()))?;
        let mut out = Vec::new();
        for (i, el) in arr.into_iter().take(take.max(0) as usize).enumerate() {
            let field = || format!("{}.{i}", self.spec.items);
            let el = el.map_err(|e| damaged(field(), e.to_string()))?;
            let RawBsonRef::Document(d) = el else {
                return Err(damaged(
                    field(),
                    format!("is {:?}, not a document", el.element_type()),
                ));
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())
                .map_err(|e| damaged(field(), e.to_string()))?;
            crate::compat::append(&mut item, self.spec.key, key_raw.clone());
            out.push(
                crate::compat::from_slice(item.as_bytes()).map_err(|source| {
                    Error::UnexpectedDocument {
                        collection: self.coll.name().to_owned(),
                        id: Box::new(id_of(bucket)),
                        source,
                    }
                })?,
            );
        }
        Ok(out)
    }

    /// Refuses a key with a damaged bucket first: positions summed from a
    /// damaged count would be wrong for every later bucket.
    /// With `from`, writes only the buckets from that `_id` on (the others'
    /// positions did not change).
    async fn reindex_now(&self, key: &Bson, from: Option<&Bson>) -> Result<()> {
        self.refuse_damaged(key).await?;
        let mut pipeline = vec![
            doc! {"$match": id_range("k", key)},
            doc! {"$setWindowFields": {
                "sortBy": {"_id": 1},
                "output": {"start": {"$sum": "$count", "window": {"documents": ["unbounded", -1]}}},
            }},
        ];
        if let Some(from) = from {
            pipeline.push(doc! {"$match": {"_id": {"$gte": from.clone()}}});
        }
        pipeline.extend([
            // Clears a removal's mark: positions are right again.
            doc! {"$project": {"start": 1, STALE: {"$literal": false}}},
            doc! {"$merge": {
                "into": self.coll.name(),
                "on": "_id",
                "whenMatched": "merge",
                "whenNotMatched": "discard",
            }},
        ]);
        self.coll
            .aggregate(pipeline)
            .await?
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }
}

impl Head {
    fn total(&self) -> i64 {
        if self.exists {
            self.start + self.count
        } else {
            0
        }
    }
}

/// An item's size inside the array: its document plus the element header
/// (type byte, index digits, NUL).
fn item_len(doc: &Document) -> Result<i64> {
    let mut buf = Vec::new();
    doc.to_writer(&mut buf)?;
    let len = buf.len() as i64 + 8;
    if len > MAX_BUCKET_BYTES {
        return Err(Error::DocumentTooLarge {
            bytes: Some(len as usize),
        });
    }
    Ok(len)
}

/// An integer field of a raw document (an integral double counts, as the
/// shell writes numbers so), or what was found instead.
fn raw_int(d: &RawDocument, field: &str) -> std::result::Result<i64, String> {
    match d.get(field) {
        Ok(Some(RawBsonRef::Int32(v))) => Ok(i64::from(v)),
        Ok(Some(RawBsonRef::Int64(v))) => Ok(v),
        Ok(Some(RawBsonRef::Double(v))) if v.fract() == 0.0 && v.abs() < 9.0e15 => Ok(v as i64),
        Ok(Some(RawBsonRef::Double(v))) => Err(format!("{v}")),
        Ok(Some(v)) => Err(format!("{:?}", v.element_type())),
        Ok(None) => Err("missing".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// MongoDB's order for the values an `order` field holds: a missing or
/// null value first, then numbers (NaN below every other number), dates,
/// timestamps.
fn order_cmp(a: Option<&Bson>, b: Option<&Bson>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    fn rank(v: Option<&Bson>) -> u8 {
        match v {
            None | Some(Bson::Null) => 0,
            Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)) => 1,
            Some(Bson::DateTime(_)) => 2,
            Some(Bson::Timestamp(_)) => 3,
            Some(_) => 4,
        }
    }
    fn num(v: &Bson) -> Option<f64> {
        match v {
            Bson::Int32(n) => Some(f64::from(*n)),
            Bson::Int64(n) => Some(*n as f64),
            Bson::Double(n) => Some(*n),
            _ => None,
        }
    }
    match (a, b) {
        (Some(Bson::Int32(x)), Some(Bson::Int32(y))) => x.cmp(y),
        (Some(Bson::Int64(x)), Some(Bson::Int64(y))) => x.cmp(y),
        (Some(Bson::DateTime(x)), Some(Bson::DateTime(y))) => x.cmp(y),
        (Some(Bson::Timestamp(x)), Some(Bson::Timestamp(y))) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Some(x), Some(y)) if rank(a) == 1 && rank(b) == 1 => match (num(x), num(y)) {
            (Some(x), Some(y)) if x.is_nan() || y.is_nan() => y.is_nan().cmp(&x.is_nan()),
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        },
        _ => rank(a).cmp(&rank(b)),
    }
}

fn is_stale(d: &RawDocument) -> bool {
    matches!(d.get(STALE), Ok(Some(RawBsonRef::Boolean(true))))
}

fn is_duplicate_key(e: &Error) -> bool {
    matches!(e, Error::Database(e) if crate::error::server_codes(e).contains(&crate::error::code::DUPLICATE_KEY))
}

/// A race lost inside a caller's transaction, labelled for its `and_run2`.
fn raced(e: Error) -> Error {
    match e {
        Error::Database(e) => crate::action::raced_in_transaction(e),
        other => {
            crate::action::raced_in_transaction(mongodb::error::Error::custom(other.to_string()))
        }
    }
}

fn contended(operation: &'static str) -> Error {
    Error::Contended {
        operation,
        attempts: MAX_ATTEMPTS,
    }
}
