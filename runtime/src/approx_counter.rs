//! Approximate counters: a hot counter written one time in N.
//!
//! A product page viewed millions of times an hour does not need a write
//! per view. A counter field, or `#[approx_counter(field = "...", every =
//! N, ...)]` on the struct, gets `<field>_counter(&db)`: a [`Counter`]
//! handle that many tasks share (clone it into every task), addressing
//! documents by `_id`. `every` is N, from 2 (1 would be an exact counter,
//! and is refused) to [`MAX_EVERY`] (1,000,000).
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! #[derive(Debug, Clone, Serialize, Deserialize, Model)]
//! #[model(collection = "products")]
//! pub struct Product {
//!     #[serde(rename = "_id")] pub id: String,
//!     pub product_name: String,
//!     #[approx_counter(every = 100)]                     // sampled, the default
//!     pub web_page_views: i64,
//! }
//!
//! # async fn f(db: Database, session: &mut mongodb::ClientSession) -> mongo_patterns::Result<()> {
//! let views = Product::web_page_views_counter(&db);    // clone it into every task
//! views.incr("vlog7923479273").await?;                 // a write one time in 100
//! let shown = views.estimate("vlog7923479273").await?;
//! views.shutdown().await?;                             // flushes a buffered counter
//!
//! // Calls are actions, configured like the driver's own:
//! views.incr_by("vlog7923479273", 500)
//!     .write_concern(WriteConcern::majority())
//!     .comment("import")
//!     .await?;
//! let shown = views.estimate("vlog7923479273")
//!     .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
//!         options: None,
//!     }))
//!     .await?;
//! views.incr("vlog7923479273").session(session).await?; // in your transaction
//! # Ok(()) }
//! ```
//!
//! Three modes, chosen by `#[approx_counter(mode = ...)]`:
//!
//! - `"sampled"` (the default): each increment writes `$inc: N` with
//!   probability 1/N. Stateless and crash-safe: the stored value is an
//!   unbiased estimate at every moment, and a crash loses nothing
//!   systematic. Relative standard error after `n` increments:
//!   √((N−1)/n), so 1% at N = 100 and n = 10⁶, but 30% at n = 1,000: small
//!   counts are noisy. Writes: n/N on average.
//! - `"buffered"`: counts in memory and writes `$inc: pending` when a key
//!   reaches N, when its oldest pending increment is `max_delay_ms` old
//!   (default [`DEFAULT_MAX_DELAY_MS`], 1 s), when more than `max_keys` keys
//!   are pending (default [`DEFAULT_MAX_KEYS`], 10,000; the oldest go
//!   first), and on
//!   [`Counter::flush`] / [`Counter::shutdown`]. Exact once flushed, also
//!   across cut calls and writes whose outcome is unknown: each write
//!   carries a flush id that the document remembers (the field
//!   [`FLUSHES`], about 500 bytes), so a re-sent write is applied once. A
//!   crash of the process loses what a key held unwritten: at most N − 1
//!   increments whose calls returned, per key and process, at any load
//!   (and those of calls still under way). A call that brings its key to N
//!   returns once the key holds fewer again or a write carrying its
//!   increments landed: it writes them itself, or waits for the call
//!   writing them. So increments do not pile up behind a write in flight:
//!   a write carries N − 1 plus what calls under way added (at most N + 63
//!   with 64 tasks of `incr`, measured), and a hot key runs about N
//!   increments per round trip of its writes. Writes: at most one per N
//!   increments of a key, plus one per key per `max_delay_ms`.
//! - `"geometric"`: sampled while a count is small, then a write
//!   probability that falls as the count grows, for counts that span orders
//!   of magnitude. With `E` the value this process last read back for the
//!   key, an increment writes `$inc: m` with probability 1/m, where
//!   `m = max(N, ⌊E/N⌋)`: N (as `"sampled"`) until `E` passes N², then
//!   growing with `E`. Each increment adds 1 in expectation whatever `m`
//!   is, so the estimate is unbiased. Its variance is Σ(m−1): n(N−1) up to
//!   N² (the relative standard error of `"sampled"`, √((N−1)/n)), then
//!   growing by about E/N an increment, so that the relative standard
//!   error levels off towards 1/√(2N) (7.1% at N = 100) however large the
//!   count ([`Counter::relative_error`] computes it). Writes: n/N up to N²,
//!   then about N·ln(n/N²) more (about 560 for 10⁶ increments of one key at
//!   N = 100, against 10,000 sampled). Writes read the new value back
//!   (`findAndModify`), still one round trip; a document found missing
//!   (with `upsert` off) stays at the first step.
//!
//! `incr_by(id, n)` with `n` of at least the current write size writes `n`
//! exactly at once, in every mode.
//!
//! Whether a write creates a missing document is `upsert` (default `false`:
//! counting views of a product that does not exist should not invent a
//! document holding only a counter).
//!
//! The random source is SplitMix64 over the handle's per-thread count of
//! increments, under a random key per handle (a draw needs no state but
//! that count), or, with [`Counter::seeded`], one deterministic stream per
//! handle for tests.
//!
//! [`Counter::stats`] gives increments seen, writes sent and increments
//! pending, so that the saving shows ([`CounterStats::saving`]);
//! [`Counter::relative_error`] gives the documented error of a count.
//!
//! The traps of the hand-written version, and what the handle does
//! instead:
//!
//! | trap of the hand-written version | what the handle does |
//! | --- | --- |
//! | a buffered writer that does `$set: {mycounter: counter}` overwrites every other process's counts | `$inc` of what this process counted |
//! | increments lost between tasks sharing a buffer, or when a write is cut or fails | the buffer is sharded maps under locks; a key has one write in flight at a time, and its count stays pending until the server acknowledged it |
//! | a write re-sent after its reply was lost is counted twice | every flush write carries a flush id, which the document remembers for the last 16 handles: the server refuses a repeat (see *Failure behaviour*) |
//! | the buffer grows with every key ever seen | at most `max_keys` keys pending; past it the oldest eighth is written |
//! | a key seen once waits forever | a timer task writes keys older than `max_delay_ms`; it ends with the last handle |
//! | the process exits with counts in memory | `shutdown()` flushes and then writes through; the last handle dropped flushes in the background if a runtime still runs (best effort) |
//!
//! Errors: a lost connection is `Unavailable` (buffered increments stay
//! pending, none lost); a counter field holding something other than a
//! number is `UnsupportedValue`; see *Failure behaviour* below.
//!
//! # One counter per process
//!
//! `M::<field>_counter(&db)` (and [`Counter::new`]) gives, within a
//! process, the same counter for the same database, collection and
//! declaration each time, as long as a handle of it
//! lives: call it where a counter is needed (a request handler, a job)
//! rather than threading one handle through. A buffered counter's
//! guarantees are per process and handle: one buffer, writes once per N
//! of the process's increments, one flush id in the document's list of
//! recent flushes. What ends the counter is its last handle: keep one for
//! the life of the process (in the application's state) and call
//! [`Counter::shutdown`] on the way out, or what the last handle holds is
//! written by a background task only if a runtime still runs.
//! [`Counter::with_options`], [`Counter::with_collection`] and
//! [`Counter::seeded`] give handles of their own. The driver cannot tell
//! two clients apart, so a counter is named by the database's name and
//! settings: a process talking to two deployments whose databases have
//! the same name gives one of them handles of their own
//! (`with_options`), or both would write through the first.
//!
//! # Sharding
//!
//! [`Counter::declared`] shards the counter's collection on
//! `{_id: "hashed"}`, which [`Model::ensure`](crate::Model::ensure) runs as
//! `shardCollection` on a sharded cluster (a replica set notes
//! `ShardingNotApplicable`). Every write and read of a counter names one
//! document by equality on `_id` (the sampled and buffered `$inc`s, the
//! geometric `findAndModify`, `estimate`), so each carries the full shard
//! key and goes to one shard, upserts included; a buffered flush of many
//! keys is one `update` command that `mongos` splits by shard, each
//! statement to one. Why hashed and not ranged: counter keys are often
//! monotonic (`ObjectId`s, dates, sequence numbers), and under a ranged
//! `{_id: 1}` every new key lands in the last chunk, on one shard, until
//! the balancer catches up; hashing spreads consecutive keys over every
//! chunk from the first write (`shardCollection` pre-splits an empty
//! collection). A counter never needs an `_id` range, so hashing costs
//! nothing. One document is one chunk's worth of nothing: a hot key's
//! writes go to its one shard however the collection is sharded, which is
//! what the sampling (1 in N) is for; no chunk grows jumbo, since every
//! `_id` is its own hash. A `#[shard_key]` on the same struct wins over
//! this declaration; its key must then be in the counter's filter, which
//! is `_id` alone, so keep `_id` in that key or expect `mongos` to refuse
//! the upserts before 7.0 (and to run them as two-phase writes without
//! a shard key from 7.0). `benches/shard_sim-results.md` has the
//! simulated spread.
//!
//! # Actions
//!
//! `incr`, `incr_by`, `estimate`, `flush` and `shutdown` return actions
//! ([`Incr`], [`Estimate`], [`Flush`]): setters configure them, `.await`
//! runs them. A sampled `incr` that does not write allocates nothing,
//! serializes nothing and writes no memory another thread shares: a count
//! in the calling thread's own lane, and a draw at that count (a seeded
//! handle instead claims its random number with one atomic add, which also
//! counts the increment). [`Counter::stats`], [`Counter::spec`],
//! [`Counter::relative_error`], [`Counter::declared`] and
//! [`Counter::collection`] send nothing: plain methods.
//!
//! What an increment does in your session and transaction (by mode), which
//! options reach which command, and other collections per tenant: the
//! [guide](crate::guide#approximate-counter).
//!
//! # Failure behaviour
//!
//! - A call cut at any `.await` (a timeout, `select!`): buffered, its
//!   increments were counted when it was awaited and stay pending until a
//!   write is known to have landed; a write cut in flight is re-sent with
//!   the same flush id, so it lands once. Sampled or geometric, a cut
//!   call's single write may or may not have landed (the count moves by
//!   its `m` or not at all); nothing is applied twice.
//! - A server crash, a lost connection, a timeout: `Unavailable` (retry
//!   later). Buffered increments stay pending and the next flush re-sends
//!   them; a write the server applied but whose reply was lost is refused
//!   as a repeat. A flush that an election refused, or whose reply was
//!   lost, is sent again at once (its flush id makes that safe), and the
//!   check after a refused flush reads the primary.
//! - Every acknowledged write is one of the driver's retryable writes
//!   (with `max_time`, a `findAndModify`, which carries `maxTimeMS`): one
//!   failover between its send and its reply (refused, interrupted after
//!   it ran, or its reply lost) stores it once, and the call returns `Ok`.
//!   A write with `w: 0` goes through `run_command` (the driver's helpers
//!   refuse `w: 0`) and asks for no reply. The bound: the document remembers the last flush of
//!   [`HANDLES_KEPT`] handles, so a write is applied twice only if that
//!   many other handles wrote the same document between the lost reply
//!   and the re-send.
//! - A counter field holding a non-number (another client wrote it):
//!   `UnsupportedValue` naming the document's `_id`, with `dropped` the
//!   increments given up for that document only; other keys are written,
//!   later flushes succeed, and nothing is written on top of it.
//! - An `n` past `i64::MAX` (or making a key's pending count pass it) and
//!   a spec no counter can follow are `InvalidArgument`; nothing enters
//!   the buffer.
//! - A model with `#[serde(deny_unknown_fields)]` cannot read documents a
//!   buffered counter wrote: they gain [`FLUSHES`].
//! - A call's future kept but never polled again while it writes holds its
//!   key's write: a `flush` waits for it up to 30 s, then returns
//!   `Contended` with the key still pending. Drop cut futures.
//!
//! ## Measured
//!
//! Figures from `tests/counter_faults.rs` against the test server, on a
//! shared 2-core machine; "before" is the previous release.
//!
//! - **A cancelled call** (a timeout, `select!`, a dropped request): in
//!   buffered mode the call's increments enter the buffer when it is awaited,
//!   and a write cut in flight leaves them pending, to be re-sent with the
//!   same flush id. `incr_by(k, 99)` then `timeout(2 s, incr(k))` against a
//!   killed server: `stats().pending` is 100, and 100 are stored after the
//!   restart and a flush (before: 0 pending, 100 increments gone). 1,220
//!   calls on 4 keys (`incr`, `incr_by` below and above N, `flush`,
//!   `shutdown` and the writes through after it), cut at random points in a
//!   window kept at about half the calls cut (620–700 of them, windows of
//!   2–17 ms): every key exact (before, cut at 0–3 ms: key 0 stored
//!   16,840–17,747 of 17,971). In sampled and geometric modes a cut call's
//!   one write may or may not have landed (the count moves by its `m` or not
//!   at all); none is applied twice.
//! - **A server crash** (`kill -9`, restarted in place) or a lost reply: the
//!   call returns `Unavailable`; retry it or let the next flush do it. A
//!   buffered write the server applied but whose reply was lost is re-sent
//!   with its flush id and refused as a repeat: 31 + 31 + 7 counted, 69
//!   stored after a lost reply, `kill -9` and restart (before: 100, the lost
//!   31 applied twice). 8 tasks on 5 keys in every mode with the server
//!   killed and restarted 3 times: buffered exact per key (40,000–60,000
//!   increments in all) after `shutdown`, with 21–31 calls failed along the
//!   way, no panic, the same handles resumed. The bound: each document keeps
//!   `_mp_flushes`, the last flush of each of the last 16 handles that wrote
//!   it (`[{h, s}]`, 504 bytes measured with 16); a repeat slips through only
//!   if 16 other handles wrote that document between the lost reply and the
//!   re-send. So one counter per process, which
//!   `M::<field>_counter(&db)` gives (see *One counter per process*), not
//!   one per request. A crash of *your* process still loses what was pending (at
//!   most N − 1 acknowledged per key): call `shutdown()`.
//! - **Which errors to retry:** `Unavailable` (the increments stay
//!   pending); `Contended` from `flush` (another call held a key's write for
//!   30 s, as a future kept but never polled again does; the key stays
//!   pending; measured: `Contended` after 30 s, then exact once that future
//!   was dropped; or 4 tries of one write lost to concurrent changes of its
//!   document, its increments likewise pending). Do not retry
//!   `InvalidArgument`: an `n` past `i64::MAX`, or
//!   one that would take a key's pending count past it, is refused before it
//!   enters the buffer (before: `u64::MAX` panicked with "attempt to add with
//!   overflow", and an amount past `i64::MAX` stayed pending and failed every
//!   later flush); so is a spec no counter can follow, on every call of a
//!   handle from `Counter::new`, or at once from `Counter::try_new` (before:
//!   `every = 0` panicked with "attempt to divide by zero" in geometric mode
//!   and wrote every increment in the others).
//! - **Damaged data:** a counter field another client set to a non-number
//!   makes the write `UnsupportedValue` naming the document's `_id` (as BSON)
//!   with `dropped: Some(n)`, the increments given up for that document only;
//!   other keys are written in the same flush and later flushes succeed;
//!   nothing is written on top of it (before: `Database`, and the increments
//!   stayed pending, so every later flush failed). Reading it (`estimate`) is
//!   `UnsupportedValue` with `dropped: None`. A model with
//!   `#[serde(deny_unknown_fields)]` cannot read documents a buffered counter
//!   wrote, because of `_mp_flushes`.
//! - **Contention:** 16 tasks × 6,000 increments of one key in each of the
//!   three modes at once: 12 s; buffered exact after `shutdown` (644 writes),
//!   sampled (9,703 writes) and geometric (92) within 4σ of their documented
//!   error.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::{Collection, Database};

use crate::action::Options;
use crate::error::{Error, Result};
use crate::util::Bounded;

mod action;
mod buffer;
mod geometric;
mod sampling;
mod shared;
mod spec;
mod tally;
mod write;

pub use action::{Estimate, Flush, Incr, IncrFuture};
use buffer::Slot;
pub use buffer::{FLUSHES, HANDLES_KEPT};
pub use spec::{
    ApproxCounted, CounterSpec, CounterStats, CounterValue, Mode, DEFAULT_MAX_DELAY_MS,
    DEFAULT_MAX_KEYS, MAX_EVERY,
};

/// Buffer shards: tasks bumping different keys rarely meet on a lock.
const SHARDS: usize = 16;
/// Concurrent writes in a flush.
const FLUSH_CONCURRENCY: usize = 16;

/// The handle a counter field gets: clone it freely, clones share the
/// buffer, the statistics and the random stream.
///
/// `T` is bound only where methods need it, as in the driver's
/// `Collection<T>`: a struct or a generic function that holds a
/// `Counter<T>` need not repeat [`ApproxCounted`].
#[derive(Debug)]
pub struct Counter<T> {
    inner: Arc<Inner>,
    _model: PhantomData<fn() -> T>,
}

impl<T> Clone for Counter<T> {
    fn clone(&self) -> Self {
        Counter {
            inner: self.inner.clone(),
            _model: PhantomData,
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// For `run_command` writes (`w: 0`).
    db: Database,
    coll: Collection<Document>,
    /// The handle's default options ([`Counter::with_options`]).
    defaults: Options,
    spec: CounterSpec,
    /// Why `spec` cannot be followed: every call then returns it.
    invalid: Option<(&'static str, String)>,
    /// This handle's random id in the flush markers (buffered).
    handle: u64,
    /// The next flush sequence number.
    seq: AtomicU64,
    /// Sampled, unseeded, valid and not shut down: N, which the hot path
    /// of `incr` compares `n` with, in one load; 0 otherwise.
    hot: AtomicU64,
    /// The same for a seeded handle: one check of the seed fewer on the
    /// unseeded path.
    hot_seeded: AtomicU64,
    increments: tally::Tally,
    writes: AtomicU64,
    pending: AtomicU64,
    /// `Some((seed, draws))` for a seeded handle.
    seed: Option<(u64, AtomicU64)>,
    /// Buffered: pending increments per key, in shards.
    shards: Vec<Mutex<HashMap<Vec<u8>, Slot>>>,
    /// Buffered: told when a key's writer ends.
    idle: tokio::sync::Notify,
    /// Geometric: the last value read back per key, in shards, each
    /// holding its share of `max_keys`.
    seen: Vec<Bounded<Vec<u8>, i64>>,
    /// Buffered: keys pending, over all shards.
    keys: AtomicUsize,
    /// After `shutdown`, increments are written through.
    closed: AtomicBool,
}

impl<T: ApproxCounted> Counter<T> {
    /// The counter `spec` over `T`'s collection in `db`. In buffered mode,
    /// inside a Tokio runtime, it starts a task that writes keys whose
    /// increments waited `max_delay_ms`; the task ends with the last handle.
    ///
    /// A `spec` no counter can follow (`every` of 0 or past [`MAX_EVERY`],
    /// a `field` that is empty, `_id`, dotted or `$`-prefixed, a buffered
    /// `max_keys` of 0) gives a handle whose every call is
    /// `InvalidArgument`; [`Counter::try_new`] says so at once. The derive
    /// checks its declarations at compile time.
    ///
    /// Within a process, every call for the same database (name and
    /// settings), collection and declaration gives the same counter (clones of one
    /// state), as long as a handle of it lives: `M::<field>_counter(&db)`
    /// may be called wherever one is needed, and a buffered counter still
    /// has one buffer per process (see *One counter per process* in the
    /// module docs).
    pub fn new(db: &Database, spec: CounterSpec) -> Self {
        let (inner, new) = shared::shared(db, T::COLLECTION, &spec, || {
            let coll = db.collection(T::COLLECTION);
            Inner::new(db.clone(), coll, spec, None, Options::new())
        });
        let counter = Counter {
            inner,
            _model: PhantomData,
        };
        if new {
            counter.start_flusher();
        }
        counter
    }

    /// [`Counter::new`], refusing an invalid `spec` with `InvalidArgument`.
    pub fn try_new(db: &Database, spec: CounterSpec) -> Result<Self> {
        spec.check()?;
        Ok(Self::new(db, spec))
    }

    /// What this counter needs in the deployment: its collection (keys are
    /// `_id`s, which need no other index), sharded on `{_id: "hashed"}`
    /// (see *Sharding* in the module's docs; a `#[shard_key]` on the same
    /// struct wins); in buffered mode, pipeline updates (MongoDB 4.2) for
    /// its flushes.
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        use crate::ensure::{Feature, Need};
        let decl = crate::ensure::Declared::new(self.inner.coll.name())
            .sharded(mongodb::bson::doc! {"_id": "hashed"}, false);
        if self.inner.spec.mode != Mode::Buffered {
            return vec![decl];
        }
        vec![decl.needs([Need::needs(
            Feature::PipelineUpdate,
            "buffered counter flush",
        )])]
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks (the collection). The same as
    /// [`Model::ensure`](crate::Model::ensure) for this counter.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// Ticker::volume_counter(&db).ensure().await?;
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.inner.db, self.declared())
    }

    /// The same counter drawing from a deterministic random stream, for
    /// tests. Call it on a fresh handle (it replaces the handle's state).
    pub fn seeded(self, seed: u64) -> Self {
        self.rebuilt(
            self.inner.coll.clone(),
            self.inner.defaults.clone(),
            Some(seed),
        )
    }

    /// The same counter with `options` as its defaults: every write and
    /// read it sends carries them where a call sets nothing else, the
    /// writes of buffered flushes (timed, crowded, final) included. Over
    /// what the `Database` carries.
    ///
    /// It gives a handle of its own (buffer, statistics, random stream;
    /// a seed is kept): call it on a fresh handle, before counting, and
    /// clone the result. Clones made before keep theirs.
    pub fn with_options(self, options: Options) -> Self {
        let seed = self.inner.seed.as_ref().map(|(s, _)| *s);
        self.rebuilt(self.inner.coll.clone(), options, seed)
    }

    /// The same counter over the collection `name` of the same database,
    /// for an application with a collection per tenant (the model's
    /// collection stays the default). A handle of its own, as
    /// [`Counter::with_options`] gives: what this one holds pending stays
    /// with it, for its own collection.
    pub fn with_collection(self, name: &str) -> Self {
        let seed = self.inner.seed.as_ref().map(|(s, _)| *s);
        let coll = self.inner.db.collection(name);
        self.rebuilt(coll, self.inner.defaults.clone(), seed)
    }

    /// The collection this counter writes, for commands of your own next
    /// to the counter's.
    pub fn collection(&self) -> &Collection<Document> {
        &self.inner.coll
    }

    /// A new handle's state with this one's declaration. `self` is dropped
    /// (if it was the last handle, what it held pending is written).
    fn rebuilt(&self, coll: Collection<Document>, defaults: Options, seed: Option<u64>) -> Self {
        let db = self.inner.db.clone();
        Self::with_inner(Inner::new(db, coll, self.inner.spec, seed, defaults))
    }

    fn with_inner(inner: Inner) -> Self {
        let counter = Counter {
            inner: Arc::new(inner),
            _model: PhantomData,
        };
        counter.start_flusher();
        counter
    }

    /// The declaration this handle follows.
    pub fn spec(&self) -> CounterSpec {
        self.inner.spec
    }

    /// Increments seen, writes acknowledged and increments pending.
    pub fn stats(&self) -> CounterStats {
        CounterStats {
            increments: self.inner.increments_seen(),
            writes: self.inner.writes.load(Ordering::Relaxed),
            pending: self.inner.pending.load(Ordering::Relaxed),
        }
    }

    /// The documented relative standard error of this counter's value
    /// after `n` increments (0 for a flushed buffered counter; NaN for an
    /// invalid `spec`).
    pub fn relative_error(&self, n: u64) -> f64 {
        if self.inner.invalid.is_some() {
            return f64::NAN;
        }
        let every = f64::from(self.inner.spec.every);
        let n = n.max(1) as f64;
        match self.inner.spec.mode {
            Mode::Sampled => ((every - 1.0) / n).sqrt(),
            Mode::Buffered => 0.0,
            Mode::Geometric => geometric::relative_error(every, n),
        }
    }

    fn start_flusher(&self) {
        if self.inner.spec.mode != Mode::Buffered || self.inner.invalid.is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no Tokio runtime: buffered counter without a timed flush");
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let delay = Duration::from_millis(self.inner.spec.max_delay_ms.max(1));
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(delay / 2);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let due = |p: &buffer::Slot| p.since.elapsed() >= delay;
                if let Err(e) = inner.flush_where(due, &inner.defaults).await {
                    tracing::warn!(error = %e, "timed counter flush failed; kept pending");
                }
            }
        });
    }
}

impl<T> Drop for Counter<T> {
    /// The last handle hands what is pending to a final background write,
    /// if a runtime is still running. Best effort: call `shutdown`.
    fn drop(&mut self) {
        if Arc::strong_count(&self.inner) != 1 || self.inner.pending.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            runtime.spawn(async move {
                if let Err(e) = inner.flush_where(|_| true, &inner.defaults).await {
                    tracing::warn!(error = %e, "final counter flush failed");
                }
            });
        }
    }
}

impl Inner {
    fn new(
        db: Database,
        coll: Collection<Document>,
        spec: CounterSpec,
        seed: Option<u64>,
        defaults: Options,
    ) -> Self {
        let invalid = match spec.check() {
            Err(Error::InvalidArgument { name, reason }) => Some((name, reason)),
            _ => None,
        };
        let hot = if spec.mode == Mode::Sampled && invalid.is_none() {
            u64::from(spec.every)
        } else {
            0
        };
        let handle = sampling::random_handle();
        Inner {
            db,
            coll,
            defaults,
            spec,
            invalid,
            handle,
            seq: AtomicU64::new(1),
            hot: AtomicU64::new(if seed.is_none() { hot } else { 0 }),
            hot_seeded: AtomicU64::new(if seed.is_some() { hot } else { 0 }),
            increments: tally::Tally::new(handle),
            writes: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            seed: seed.map(|s| (s, AtomicU64::new(0))),
            shards: buffer::shards(),
            idle: tokio::sync::Notify::new(),
            seen: (0..SHARDS)
                .map(|_| Bounded::new(spec.max_keys.div_ceil(SHARDS)))
                .collect(),
            keys: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// After `shutdown`: every increment is written through.
    fn close(&self) {
        self.hot.store(0, Ordering::Release);
        self.hot_seeded.store(0, Ordering::Release);
        self.closed.store(true, Ordering::Release);
    }

    fn check(&self) -> Result<()> {
        match &self.invalid {
            Some((name, reason)) => Err(Error::invalid(name, reason.clone())),
            None => Ok(()),
        }
    }
}

/// A shard's map, also after a thread panicked holding it: every update
/// under these locks leaves the map consistent, so it stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn shard_of(key: &[u8]) -> usize {
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}
