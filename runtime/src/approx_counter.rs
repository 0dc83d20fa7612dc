//! Approximate counters: a hot counter written one time in N.
//!
//! A product page viewed millions of times an hour does not need a write
//! per view. Three modes, chosen by `#[approx_counter(mode = ...)]`:
//!
//! - `"sampled"` (the default): each increment writes `$inc: N` with
//!   probability 1/N. Stateless and crash-safe: the stored value is an
//!   unbiased estimate at every moment, and a crash loses nothing
//!   systematic. Relative standard error after `n` increments:
//!   √((N−1)/n), so 1% at N = 100 and n = 10⁶, but 30% at n = 1,000: small
//!   counts are noisy. Writes: n/N on average.
//! - `"buffered"`: counts in memory and writes `$inc: pending` when a key
//!   reaches N, when its oldest pending increment is `max_delay_ms` old, when
//!   more than `max_keys` keys are pending (the oldest go first), and on
//!   [`Counter::flush`] / [`Counter::shutdown`]. Exact once flushed, also
//!   across cut calls and writes whose outcome is unknown: each write
//!   carries a flush id that the document remembers (the field
//!   [`FLUSHES`], about 500 bytes), so a re-sent write is applied once. A
//!   crash of the process loses what was pending: up to N−1 per key and
//!   process (plus what arrived in the last `max_delay_ms`). Writes: at
//!   most one per N increments of a key, plus one per key per
//!   `max_delay_ms`.
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
//! The random source is per thread (xorshift, seeded from the OS's hasher
//! keys), or, with [`Counter::seeded`], one deterministic stream per handle
//! for tests.
//!
//! # Sessions and options
//!
//! `incr`, `incr_by`, `estimate`, `flush` and `shutdown` return actions
//! ([`Incr`], [`Estimate`], [`Flush`]): setters configure them, `.await`
//! runs them. A sampled `incr` that does not write allocates nothing.
//!
//! - `.session(&mut s)` (`incr`, `incr_by`, `estimate`): sampled and
//!   geometric increments write, when the draw says so, in the session
//!   (in its transaction when one is open; geometric then does not keep the
//!   value read back, which may be rolled back). A buffered counter cannot
//!   flush in a caller's session from its background task, so an increment
//!   in a session is written through at once in it (exact), bypassing the
//!   buffer. `estimate` reads in the session.
//! - `write_concern`, `comment`, `max_time` on every write; a write
//!   concern on one buffered `incr` writes it through at once with it.
//!   `read_concern`, `selection_criteria`, `comment`, `max_time` on
//!   `estimate`. [`Counter::with_options`] sets a handle's defaults, which
//!   its background flushes carry too. The driver sends neither `maxTimeMS`
//!   on an update nor `w: 0`: a write with either goes as the same command
//!   through `run_command`, with the effective write concern in it.
//! - A first-increment race (two upserts of one new document) is retried
//!   once as an update; inside a caller's transaction it is returned with
//!   `TransientTransactionError` instead, for the caller's `and_run2`.
//! - [`Counter::stats`], [`Counter::spec`], [`Counter::relative_error`],
//!   [`Counter::declared`] and [`Counter::collection`] send nothing: plain
//!   methods.
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
//!   as a repeat. The bound: the document remembers the last flush of
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

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{
    Acknowledgment, FindOneAndUpdateOptions, ReturnDocument, UpdateModifications, UpdateOptions,
};
use mongodb::{ClientSession, Collection, Database};
use serde::Serialize;

use crate::action::Options;
use crate::error::code::TYPE_MISMATCH;
use crate::error::{Error, Result};
use crate::model::Model;

mod action;
mod buffer;

use crate::util::{key_bytes, splitmix64};
pub use action::{Estimate, Flush, Incr, IncrFuture};
use buffer::Slot;
pub use buffer::{FLUSHES, HANDLES_KEPT};

/// Largest `every`: past it, a counter's error is over 0.1% only after 10⁹
/// increments, and a buffered key holds that much in memory before writing.
pub const MAX_EVERY: u32 = 1_000_000;
/// `max_delay_ms` when the attribute leaves it out: a buffered increment
/// reaches the server within a second.
pub const DEFAULT_MAX_DELAY_MS: u64 = 1_000;
/// `max_keys` when the attribute leaves it out: keys a buffer holds before
/// it flushes early.
pub const DEFAULT_MAX_KEYS: usize = 10_000;
/// Buffer shards: tasks bumping different keys rarely meet on a lock.
const SHARDS: usize = 16;
/// Concurrent writes in a flush.
const FLUSH_CONCURRENCY: usize = 16;

/// How a counter trades writes for precision: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One write of `$inc: N` with probability 1/N.
    Sampled,
    /// Counted in memory, written every N per key or after `max_delay_ms`.
    Buffered,
    /// Write probability falling with the count.
    Geometric,
}

/// What `#[approx_counter(...)]` declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSpec {
    /// The BSON name of the counter field.
    pub field: &'static str,
    /// N: writes happen about one time in N (1 to [`MAX_EVERY`]).
    pub every: u32,
    /// The mode.
    pub mode: Mode,
    /// Buffered: the longest an increment waits in memory, in milliseconds.
    pub max_delay_ms: u64,
    /// Buffered: the most keys pending at once (at least 1); past it the
    /// oldest are written.
    pub max_keys: usize,
    /// Whether a write creates a missing document.
    pub upsert: bool,
}

impl CounterSpec {
    /// What generated code declares after a compile error.
    #[doc(hidden)]
    pub const FALLBACK: CounterSpec = CounterSpec {
        field: "",
        every: 2,
        mode: Mode::Sampled,
        max_delay_ms: 1,
        max_keys: 1,
        upsert: false,
    };

    /// `InvalidArgument` for a declaration no counter can follow.
    fn check(&self) -> Result<()> {
        if self.every == 0 || self.every > MAX_EVERY {
            return Err(Error::invalid(
                "every",
                format!("{} is outside 1..={MAX_EVERY}", self.every),
            ));
        }
        let f = self.field;
        if f.is_empty() || f.starts_with('$') || f.contains('.') || f == "_id" || f == FLUSHES {
            return Err(Error::invalid(
                "field",
                format!("{f:?} cannot be a counter field"),
            ));
        }
        if self.mode == Mode::Buffered && self.max_keys == 0 {
            return Err(Error::invalid("max_keys", "a buffer holds at least 1 key"));
        }
        Ok(())
    }
}

/// A model with approximate counters, addressed by `_id`.
/// `#[approx_counter]` implements it.
pub trait ApproxCounted: Model + Send + Sync + 'static {
    /// The `_id` field's type.
    type Id: Serialize + Send + Sync;
}

/// Field types a counter can have.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an approximate counter",
    label = "not a number",
    note = "a counter must be an integer (i32, i64, u32, u64) or an f64"
)]
pub trait CounterValue {}

use crate::util::impls;
impls!(CounterValue: i32, i64, u32, u64, f64);

/// What a counter handle has seen and sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterStats {
    /// Increments counted (the sum of every accepted `incr_by`'s `n`).
    pub increments: u64,
    /// Writes the server acknowledged.
    pub writes: u64,
    /// Increments held in memory, not known to be written (buffered mode):
    /// not yet sent, or sent by a write whose outcome is unknown.
    pub pending: u64,
}

impl CounterStats {
    /// Increments per write: what the counter saved, as a factor.
    pub fn saving(&self) -> f64 {
        self.increments as f64 / self.writes.max(1) as f64
    }
}

/// The handle a counter field gets: clone it freely, clones share the
/// buffer, the statistics and the random stream.
#[derive(Debug)]
pub struct Counter<T: ApproxCounted> {
    inner: Arc<Inner>,
    _model: PhantomData<fn() -> T>,
}

impl<T: ApproxCounted> Clone for Counter<T> {
    fn clone(&self) -> Self {
        Counter {
            inner: self.inner.clone(),
            _model: PhantomData,
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// For `run_command` writes (`maxTimeMS`, `w: 0`).
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
    increments: AtomicU64,
    writes: AtomicU64,
    pending: AtomicU64,
    /// `Some((seed, draws))` for a seeded handle.
    seed: Option<(u64, AtomicU64)>,
    /// Buffered: pending increments per key, in shards.
    shards: Vec<Mutex<HashMap<Vec<u8>, Slot>>>,
    /// Buffered: told when a key's writer ends.
    idle: tokio::sync::Notify,
    /// Geometric: the last value read back per key, in shards.
    seen: Vec<Mutex<HashMap<Vec<u8>, i64>>>,
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
    pub fn new(db: &Database, spec: CounterSpec) -> Self {
        let coll = db.collection(T::COLLECTION);
        Self::with_inner(Inner::new(db.clone(), coll, spec, None, Options::new()))
    }

    /// [`Counter::new`], refusing an invalid `spec` with `InvalidArgument`.
    pub fn try_new(db: &Database, spec: CounterSpec) -> Result<Self> {
        spec.check()?;
        Ok(Self::new(db, spec))
    }

    /// What this counter needs in the deployment: its collection (keys are
    /// `_id`s, which need no other index).
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        vec![crate::ensure::Declared::new(self.inner.coll.name())]
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks (the collection). The same as
    /// [`Model::ensure`] for this counter.
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
            increments: self.inner.increments.load(Ordering::Relaxed),
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
            Mode::Geometric => {
                // Σ(m−1): N−1 an increment up to N², then about E/N.
                let knee = every * every;
                let var = if n <= knee {
                    n * (every - 1.0)
                } else {
                    knee * (every - 1.0) + (n * n - knee * knee) / (2.0 * every) - (n - knee)
                };
                var.max(0.0).sqrt() / n
            }
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

impl<T: ApproxCounted> Drop for Counter<T> {
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
        Inner {
            db,
            coll,
            defaults,
            spec,
            invalid,
            handle: random_handle(),
            seq: AtomicU64::new(1),
            increments: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            seed: seed.map(|s| (s, AtomicU64::new(0))),
            shards: buffer::shards(),
            idle: tokio::sync::Notify::new(),
            seen: (0..SHARDS).map(|_| Mutex::default()).collect(),
            keys: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    fn check(&self) -> Result<()> {
        match &self.invalid {
            Some((name, reason)) => Err(Error::invalid(name, reason.clone())),
            None => Ok(()),
        }
    }

    /// True with probability 1/n.
    #[inline]
    fn one_in(&self, n: u64) -> bool {
        n <= 1 || ((u128::from(self.random()) * u128::from(n)) >> 64) == 0
    }

    #[inline]
    fn random(&self) -> u64 {
        match &self.seed {
            Some((seed, draws)) => seeded_draw(*seed, draws.fetch_add(1, Ordering::Relaxed)),
            None => THREAD_RNG.with(|state| {
                // xorshift64*
                let mut x = state.get();
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                state.set(x);
                x.wrapping_mul(0x2545_F491_4F6C_DD1D)
            }),
        }
    }

    /// The options a call runs with (its own over the handle's defaults),
    /// and whether it runs inside the caller's transaction: asked only when
    /// a session is given; there, write and read concern are the
    /// transaction's.
    pub(super) async fn effective(
        &self,
        options: &Options,
        session: Option<&mut ClientSession>,
    ) -> (Options, bool) {
        let opts = options.or(&self.defaults);
        let txn = match session {
            Some(s) => crate::action::in_transaction(s).await,
            None => false,
        };
        if txn {
            (opts.in_transaction(), true)
        } else {
            (opts, false)
        }
    }

    /// Whether writes with `opts` go unacknowledged (`w: 0`, the call's,
    /// the handle's or the collection's), which the driver's own write
    /// helpers refuse to send. Never inside a transaction.
    fn unacknowledged(&self, opts: &Options, txn: bool) -> bool {
        !txn && opts
            .write_concern
            .as_ref()
            .or(self.coll.write_concern())
            .is_some_and(|wc| wc.w == Some(Acknowledgment::Nodes(0)) && wc.journal != Some(true))
    }

    /// One `update` of a document: the driver's `update_one`, or, for what
    /// that cannot send (`maxTimeMS`, `w: 0`), the same `update` command
    /// through `run_command` (which the driver does not retry on a lost
    /// connection), with the effective write concern written into it.
    pub(super) async fn update(
        &self,
        filter: Document,
        update: UpdateModifications,
        opts: &Options,
        txn: bool,
        session: Option<&mut ClientSession>,
    ) -> Result<Updated> {
        let upsert = self.spec.upsert;
        if opts.max_time.is_none() && !self.unacknowledged(opts, txn) {
            let action = self
                .coll
                .update_one(filter, update)
                .with_options(opts.driver::<UpdateOptions>())
                .upsert(upsert);
            let r = crate::action::run!(action, session)?;
            return Ok(Updated {
                matched: r.matched_count,
                upserted: r.upserted_id.is_some(),
                acknowledged: true,
            });
        }
        let mut cmd = doc! {
            "update": self.coll.name(),
            "updates": [{"q": filter, "u": crate::compat::to_bson(&update)?, "upsert": upsert}],
        };
        let inherited = if txn { None } else { self.coll.write_concern() };
        opts.command_fields(&mut cmd, inherited, true)?;
        let reply = crate::action::run!(self.db.run_command(cmd), session)?;
        crate::action::command_write_errors(&reply)?;
        let upserted = reply.get_array("upserted").map_or(0, |a| a.len() as u64);
        Ok(match reply.get("n").and_then(bson_count) {
            Some(n) => Updated {
                matched: n.saturating_sub(upserted),
                upserted: upserted > 0,
                acknowledged: true,
            },
            // Unacknowledged: no counts in the reply.
            None => Updated {
                matched: 0,
                upserted: false,
                acknowledged: false,
            },
        })
    }

    /// An `$inc` of `amount` on `id`: sampled and geometric writes, all
    /// writes after `shutdown` but buffered mode's (which keeps its flush
    /// ids), and a buffered counter's write-through.
    pub(super) async fn write(
        &self,
        id: &Bson,
        amount: u64,
        opts: &Options,
        txn: bool,
        mut session: Option<&mut ClientSession>,
    ) -> Result<()> {
        let field = self.spec.field;
        let inc = doc! {"$inc": {field: amount_bson(amount)?}};
        let mut retried = false;
        loop {
            let res = self
                .update(
                    doc! {"_id": id},
                    inc.clone().into(),
                    opts,
                    txn,
                    session.as_deref_mut(),
                )
                .await;
            match res {
                Ok(u) => {
                    if u.acknowledged {
                        self.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                Err(e) => match self.upsert_race(e, txn, &mut retried) {
                    None => continue,
                    Some(e) => return Err(self.refused(id, amount, e).await),
                },
            }
        }
    }

    /// Writes and reads the new value back (geometric mode): one
    /// `findAndModify`; with `w: 0` through `run_command` (then nothing
    /// may come back).
    async fn write_returning(
        &self,
        id: &Bson,
        amount: u64,
        opts: &Options,
        txn: bool,
        mut session: Option<&mut ClientSession>,
    ) -> Result<Option<i64>> {
        let field = self.spec.field;
        let inc = doc! {"$inc": {field: amount_bson(amount)?}};
        let mut retried = false;
        loop {
            let res = self
                .find_and_inc(id, &inc, opts, txn, session.as_deref_mut())
                .await;
            match res {
                Ok((after, acknowledged)) => {
                    if acknowledged {
                        self.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    return after
                        .map(|d| number(&d, field, self.coll.name()))
                        .transpose();
                }
                Err(e) => match self.upsert_race(e, txn, &mut retried) {
                    None => continue,
                    Some(e) => return Err(self.refused(id, amount, e).await),
                },
            }
        }
    }

    async fn find_and_inc(
        &self,
        id: &Bson,
        inc: &Document,
        opts: &Options,
        txn: bool,
        session: Option<&mut ClientSession>,
    ) -> Result<(Option<Document>, bool)> {
        let field = self.spec.field;
        if !self.unacknowledged(opts, txn) {
            let action = self
                .coll
                .find_one_and_update(doc! {"_id": id}, inc.clone())
                .with_options(opts.driver::<FindOneAndUpdateOptions>())
                .upsert(self.spec.upsert)
                .return_document(ReturnDocument::After)
                .projection(doc! {field: 1});
            return Ok((crate::action::run!(action, session)?, true));
        }
        let mut cmd = doc! {
            "findAndModify": self.coll.name(),
            "query": {"_id": id},
            "update": inc.clone(),
            "upsert": self.spec.upsert,
            "new": true,
            "fields": {field: 1},
        };
        opts.command_fields(&mut cmd, self.coll.write_concern(), true)?;
        let reply = crate::action::run!(self.db.run_command(cmd), session)?;
        crate::action::command_write_errors(&reply)?;
        let acknowledged = reply.contains_key("lastErrorObject");
        Ok((reply.get_document("value").ok().cloned(), acknowledged))
    }

    /// Two first increments of one missing document (`upsert` on) both try
    /// to insert it, and one gets a duplicate key. `None`: try again, as an
    /// update now (once). Inside a caller's transaction, which the server
    /// has aborted, the error carries `TransientTransactionError` instead.
    fn upsert_race(&self, e: Error, txn: bool, retried: &mut bool) -> Option<Error> {
        if !self.spec.upsert || !e.is_duplicate_key() {
            return Some(e);
        }
        match e {
            Error::Database(m) | Error::Raced(m) if txn => {
                Some(crate::action::raced_in_transaction(m))
            }
            Error::Database(m) | Error::Raced(m) if *retried => Some(Error::Raced(m)),
            _ => {
                *retried = true;
                None
            }
        }
    }

    /// A failed `$inc` as the caller should see it: `UnsupportedValue`
    /// naming the document when the server refused its field (the write's
    /// `amount` is then dropped), the error as it came otherwise.
    async fn refused(&self, id: &Bson, amount: u64, e: Error) -> Error {
        if e.code() != Some(TYPE_MISMATCH) {
            return e;
        }
        let field = self.spec.field;
        let found = self
            .coll
            .find_one(doc! {"_id": id})
            .projection(doc! {field: 1})
            .await;
        match found.map(|d| d.map(|d| number(&d, field, self.coll.name()))) {
            Ok(Some(Err(Error::UnsupportedValue {
                collection,
                id,
                field,
                found,
                why,
                ..
            }))) => Error::UnsupportedValue {
                collection,
                id,
                field,
                found,
                why,
                dropped: Some(amount),
            },
            // Fixed (or deleted) since: the original error stands.
            _ => e,
        }
    }
}

/// What an `update` did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Updated {
    pub(super) matched: u64,
    pub(super) upserted: bool,
    /// False for `w: 0`: the reply says nothing.
    pub(super) acknowledged: bool,
}

fn bson_count(v: &Bson) -> Option<u64> {
    match v {
        Bson::Int32(i) => u64::try_from(*i).ok(),
        Bson::Int64(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// A shard's map, also after a thread panicked holding it: every update
/// under these locks leaves the map consistent, so it stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handle's id in the flush markers: random, so that two handles (in one
/// process or many) meet with probability 2⁻⁶⁴.
fn random_handle() -> u64 {
    static HANDLES: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    HANDLES.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    splitmix64(h.finish())
}

fn amount_bson(amount: u64) -> Result<Bson> {
    i64::try_from(amount)
        .map(Bson::Int64)
        .map_err(|_| Error::invalid("n", format!("{amount} is past i64::MAX")))
}

/// A counter field's value as an integer.
fn number(d: &Document, field: &str, collection: &str) -> Result<i64> {
    let value = d.get(field);
    if let Some(n) = value.and_then(crate::util::int) {
        return Ok(n);
    }
    match value {
        None | Some(Bson::Null) => Ok(0),
        // A double another client added to: counted to the nearest unit.
        Some(Bson::Double(f)) if f.is_finite() => Ok(f.round() as i64),
        Some(other) => Err(Error::UnsupportedValue {
            collection: collection.to_owned(),
            id: Box::new(d.get("_id").cloned().unwrap_or(Bson::Null)),
            field: field.to_owned(),
            found: format!("{:?}", other.element_type()),
            why: "counted",
            dropped: None,
        }),
    }
}

/// `m` for geometric mode: `N` until the value passes N², then `⌊E/N⌋`.
fn geometric_step(seen: i64, every: u32) -> u64 {
    let every = u64::from(every);
    (u64::try_from(seen).unwrap_or(0) / every).max(every)
}

fn shard_of(key: &[u8]) -> usize {
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

/// Draw `i` of the stream `seed`: SplitMix64 over a counter, so that tasks
/// sharing a seeded handle never draw the same number.
fn seeded_draw(seed: u64, i: u64) -> u64 {
    splitmix64(seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

thread_local! {
    /// Seeded from the process's random hasher keys and the thread, never 0.
    static THREAD_RNG: Cell<u64> = Cell::new({
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        std::thread::current().id().hash(&mut h);
        Instant::now().hash(&mut h);
        splitmix64(h.finish()) | 1
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_stream_is_uniform_enough() {
        let hits = (0..1_000_000_u64)
            .filter(|&i| ((u128::from(seeded_draw(42, i)) * 100) >> 64) == 0)
            .count();
        // Binomial(10⁶, 1/100): σ ≈ 99.5.
        assert!((9_700..=10_300).contains(&hits), "{hits}");
    }

    fn spec(field: &'static str, every: u32, mode: Mode, max_keys: usize) -> CounterSpec {
        CounterSpec {
            field,
            every,
            mode,
            max_delay_ms: 1,
            max_keys,
            upsert: false,
        }
    }

    #[test]
    fn specs_no_counter_can_follow_are_invalid_arguments() {
        let name = |s: CounterSpec| match s.check() {
            Err(Error::InvalidArgument { name, .. }) => Some(name),
            _ => None,
        };
        for mode in [Mode::Sampled, Mode::Buffered, Mode::Geometric] {
            assert_eq!(name(spec("v", 0, mode, 1)), Some("every"));
            assert_eq!(name(spec("v", MAX_EVERY + 1, mode, 1)), Some("every"));
            for f in ["", "_id", "a.b", "$v", FLUSHES] {
                assert_eq!(name(spec(f, 10, mode, 1)), Some("field"), "{f:?}");
            }
            assert_eq!(name(spec("v", 1, mode, 1)), None);
            assert_eq!(name(spec("v", MAX_EVERY, mode, 1)), None);
        }
        assert_eq!(name(spec("v", 10, Mode::Buffered, 0)), Some("max_keys"));
        assert_eq!(name(spec("v", 10, Mode::Sampled, 0)), None);
    }

    #[test]
    fn geometric_step_never_divides_by_zero() {
        assert_eq!(geometric_step(i64::MAX, 1), i64::MAX as u64);
        assert_eq!(geometric_step(-5, 10), 10);
    }

    #[test]
    fn keys_are_canonical() {
        assert_eq!(key_bytes(&Bson::from("a")), key_bytes(&Bson::from("a")));
        assert_ne!(key_bytes(&Bson::from("a")), key_bytes(&Bson::from("b")));
        assert_ne!(key_bytes(&Bson::Int32(1)), key_bytes(&Bson::Int64(1)));
    }
}
