//! The counter's operations as actions: `incr`, `incr_by`, `estimate`,
//! `flush` and `shutdown` return values that setters configure and `.await`
//! runs.
//!
//! `incr` is the hot path: a sampled increment that does not write is a
//! random draw and nothing else, so its future is not boxed: [`IncrFuture`]
//! is ready at once, and holds a boxed future only when the call writes.

use std::borrow::Borrow;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use mongodb::bson::{doc, Bson};
use mongodb::ClientSession;
use serde::Serialize;

use super::write::{amount_bson, number};
use super::{ApproxCounted, Counter, Inner, Mode};
use crate::action::{action, Call, Given, Options};
use crate::error::{Error, Result};
use crate::util::key_bytes;

impl<T> crate::action::Repository for Counter<T> {
    const PATTERN: &'static str = "approx_counter";

    fn defaults(&self) -> &crate::action::Options {
        &self.inner.defaults
    }

    fn collection_name(&self) -> &str {
        self.inner.coll.name()
    }
}

/// `incr` / `incr_by`: counts increments of one key's counter.
///
/// Setters: `session`, `write_concern`, `comment`, `max_time`. What a
/// session or a write concern does depends on the mode: see
/// [`Counter::incr_by`].
#[must_use = "does nothing unless awaited"]
pub struct Incr<'a, T, Q: ?Sized> {
    counter: &'a Counter<T>,
    id: &'a Q,
    n: u64,
    options: Given,
    session: Option<&'a mut ClientSession>,
}

impl<'a, T: ApproxCounted, Q: ?Sized> Incr<'a, T, Q> {
    crate::action::setters!('a; write);
}

/// The future of an [`Incr`]: ready at once when the call does not write,
/// one boxed future when it does (or failed). One word, with nothing to
/// drop on the path that does not write.
#[must_use = "futures do nothing unless polled"]
pub struct IncrFuture<'a>(Option<BoxFuture<'a, Result<()>>>);

impl<'a> IncrFuture<'a> {
    #[inline(always)]
    fn done() -> Self {
        IncrFuture(None)
    }

    #[cold]
    fn failed(e: Error) -> Self {
        IncrFuture(Some(Box::pin(std::future::ready(Err(e)))))
    }

    /// A call that writes, in its span (an increment that sends nothing
    /// gets none: the hot path stays a load and a draw).
    fn writing(collection: &str, f: impl Future<Output = Result<()>> + Send + 'a) -> Self {
        let span = crate::action::span("approx_counter", "incr", collection);
        IncrFuture(Some(crate::action::boxed_in(f, span)))
    }
}

impl Future for IncrFuture<'_> {
    type Output = Result<()>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        match &mut this.0 {
            None => Poll::Ready(Ok(())),
            Some(f) => {
                let r = f.as_mut().poll(cx);
                if r.is_ready() {
                    // Done: a later poll finds nothing to do.
                    this.0 = None;
                }
                r
            }
        }
    }
}

impl<T: ApproxCounted> Counter<T> {
    /// Counts one increment of `id`'s counter: [`Counter::incr_by`] of 1.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let volume = Ticker::volume_counter(&db);
    /// volume.incr("MDB").await?; // one in 100 calls writes
    /// # Ok(()) }
    /// ```
    pub fn incr<'a, Q>(&'a self, id: &'a Q) -> Incr<'a, T, Q>
    where
        T::Id: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        self.incr_by(id, 1)
    }

    /// Counts `n` increments of `id`'s counter. Writes only when the mode
    /// says so (one `update`; geometric, one `findAndModify`). An `n` past
    /// `i64::MAX`, or one that would take what is pending for `id` past
    /// it, is `InvalidArgument` and counts nothing.
    ///
    /// Buffered, the increments are counted when the call is awaited: a
    /// write error is returned with them still pending, and a call cut
    /// while it writes (a timeout, `select!`) leaves them pending too.
    ///
    /// In a session (`.session(&mut s)`), by mode:
    /// - sampled: the draw as ever; a write, if it hits, runs in the
    ///   session (in its transaction when one is open);
    /// - buffered: the background flush cannot run in the caller's
    ///   session, so the call writes `$inc: n` through at once in it,
    ///   bypassing the buffer (exact; what the buffer holds for `id` stays
    ///   there);
    /// - geometric: as sampled; inside a transaction the value read back is
    ///   not remembered (it may be rolled back), so the next write size
    ///   comes from the last value read outside one.
    ///
    /// With `.write_concern(..)` on the call, a buffered counter also
    /// writes through at once, with that write concern: the caller asked
    /// for this increment's durability, which a later flush cannot give.
    /// Its `comment` and `max_time` reach the write the call sends, if any
    /// (buffered: the flush of a key the call filled).
    ///
    /// Race: two first increments of a missing document with `upsert` on
    /// can both try to insert it; the loser is retried once as an update.
    /// Inside a caller's transaction it is not retried: the error carries
    /// `TransientTransactionError`, for the caller's `and_run2` to run the
    /// transaction again.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let volume = Ticker::volume_counter(&db);
    /// volume.incr_by("MDB", 250).await?;
    /// # Ok(()) }
    /// ```
    pub fn incr_by<'a, Q>(&'a self, id: &'a Q, n: u64) -> Incr<'a, T, Q>
    where
        T::Id: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Incr {
            counter: self,
            id,
            n,
            options: Given::default(),
            session: None,
        }
    }

    /// The counter's value: the stored value plus what this handle holds
    /// for `id` (buffered; a write whose outcome is unknown is counted as
    /// pending, so the value can be over by it until it is re-sent). `0`
    /// for a missing document. One `find`, in the session if one is given
    /// (inside its transaction it sees the transaction's own writes).
    ///
    /// Setters: `session`, `read_concern`, `selection_criteria`,
    /// `comment`, `max_time`.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let volume = Ticker::volume_counter(&db);
    /// let about = volume.estimate("MDB").await?;
    /// # Ok(()) }
    /// ```
    pub fn estimate<Q>(&self, id: &Q) -> Estimate<'_, T>
    where
        T::Id: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let id = self
            .inner
            .check()
            .and_then(|()| crate::compat::to_bson(id).map_err(Error::from));
        Estimate::new(self, id)
    }

    /// Writes every pending increment (buffered mode; a no-op otherwise),
    /// waiting for writes other tasks have under way: one `update` per
    /// key, 16 at a time. Every key is tried; on an error the failed keys
    /// stay pending (except as `UnsupportedValue` says) and the first
    /// error is returned.
    ///
    /// Setters: `write_concern`, `comment`, `max_time` (no session: the
    /// writes carry increments of every caller).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let volume = Ticker::volume_counter(&db);
    /// volume.flush().await?; // what a buffered counter holds, written
    /// # Ok(()) }
    /// ```
    pub fn flush(&self) -> Flush<'_, T> {
        Flush {
            counter: self,
            shutdown: false,
            options: Options::default(),
        }
    }

    /// Flushes, then writes every later increment straight through (exact).
    /// Call it before the process exits: what is pending at exit is lost.
    /// Setters as [`Counter::flush`].
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # struct Ticker { #[serde(rename = "_id")] id: String, #[approx_counter(every = 100)] volume: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let volume = Ticker::volume_counter(&db);
    /// volume.shutdown().await?; // flushed; later increments write through
    /// # Ok(()) }
    /// ```
    pub fn shutdown(&self) -> Flush<'_, T> {
        Flush {
            counter: self,
            shutdown: true,
            options: Options::default(),
        }
    }
}

impl<'a, T: ApproxCounted, Q: Serialize + ?Sized> IntoFuture for Incr<'a, T, Q> {
    type Output = Result<()>;
    type IntoFuture = IncrFuture<'a>;

    /// The hot path, inline: a sampled increment below N that does not
    /// hit is one load, a count in this thread's lane and a draw (a
    /// seeded handle adds a load and one atomic add). Everything else is
    /// out of line.
    #[inline(always)]
    fn into_future(self) -> IncrFuture<'a> {
        let inner = &*self.counter.inner;
        // N while sampled, unseeded, valid and open; 0 otherwise.
        let every = inner.hot.load(Ordering::Acquire);
        let amount = if self.n < every {
            // n < N ≤ MAX_EVERY: no amount to refuse.
            inner.count_and_draw_unseeded(self.n, every)
        } else {
            // The same, seeded.
            let every = inner.hot_seeded.load(Ordering::Acquire);
            if self.n >= every {
                return self.start().unwrap_or_else(IncrFuture::failed);
            }
            inner.count_and_draw(self.n, every)
        };
        if amount == 0 {
            return IncrFuture::done();
        }
        self.sampled_write(amount)
    }
}

impl<'a, T: ApproxCounted, Q: Serialize + ?Sized> Incr<'a, T, Q> {
    /// A sampled write of `amount`, in the call's session.
    #[inline(never)]
    fn sampled_write(self, amount: u64) -> IncrFuture<'a> {
        let inner = &*self.counter.inner;
        match crate::compat::to_bson(self.id) {
            Ok(id) => write_through(inner, id, amount, self.options, self.session),
            Err(e) => IncrFuture::failed(e.into()),
        }
    }

    /// Everything else up to the write, synchronously: checks, the draw,
    /// the buffer. Only a call that writes gets a boxed future.
    #[inline(never)]
    fn start(self) -> Result<IncrFuture<'a>> {
        let Incr {
            counter,
            id,
            n,
            options,
            session,
        } = self;
        let inner = &*counter.inner;
        inner.check()?;
        if n == 0 {
            return Ok(IncrFuture::done());
        }
        amount_bson(n)?;
        let closed = inner.closed.load(Ordering::Acquire);
        match inner.spec.mode {
            Mode::Buffered if session.is_some() || options.write_concern.is_some() => {
                let id = crate::compat::to_bson(id)?;
                inner.increments.add(n);
                Ok(write_through(inner, id, n, options, session))
            }
            Mode::Buffered => buffered(inner, crate::compat::to_bson(id)?, n, options),
            Mode::Sampled => {
                // The draw first: the id is serialized only for a write.
                let every = u64::from(inner.spec.every);
                let amount = if closed || n >= every {
                    inner.increments.add(n);
                    n
                } else {
                    inner.count_and_draw(n, every)
                };
                if amount == 0 {
                    return Ok(IncrFuture::done());
                }
                let id = crate::compat::to_bson(id)?;
                Ok(write_through(inner, id, amount, options, session))
            }
            Mode::Geometric => {
                let at = inner.increments.add(n);
                let id = crate::compat::to_bson(id)?;
                if closed {
                    return Ok(write_through(inner, id, n, options, session));
                }
                Ok(geometric(inner, id, at, n, options, session))
            }
        }
    }
}

/// A write of `amount` to `id` in the call's session: how every mode
/// writes an increment through.
fn write_through<'a>(
    inner: &'a Inner,
    id: Bson,
    amount: u64,
    options: Given,
    session: Option<&'a mut ClientSession>,
) -> IncrFuture<'a> {
    IncrFuture::writing(inner.coll.name(), async move {
        let cx = Call::new(&inner.defaults, options, session, false).await;
        let txn = cx.txn;
        let r = inner.write(&id, amount, &cx.opts, txn, cx.session).await;
        crate::failover::settle("incr", txn, r)
    })
}

/// A buffered increment of `n` to `id` without a session or a write
/// concern of its own: added to the buffer; a write only when the key is
/// due (it holds N or more) or the buffer is crowded.
fn buffered(inner: &Inner, id: Bson, n: u64, options: Given) -> Result<IncrFuture<'_>> {
    let key = key_bytes(&id);
    let (due, crowded, mark) = inner.buffer(&key, id, n)?;
    if !due && !crowded {
        return Ok(IncrFuture::done());
    }
    Ok(IncrFuture::writing(inner.coll.name(), async move {
        let opts = options.or(&inner.defaults);
        if due {
            // The key holds N or more: this call returns once it
            // holds fewer, writing them itself or waiting for
            // the call writing them. So increments do not pile
            // up behind a write in flight, and at most N − 1
            // acknowledged ones are ever unwritten. Cut while
            // waiting, its increments stay counted.
            inner.settle(&key, mark, &opts).await?;
        }
        if crowded {
            inner.evict_oldest(&opts).await?;
        }
        Ok(())
    }))
}

/// A geometric increment of `n` to `id`, the counter at `at` increments
/// seen: drawn at the key's step, and a write that reads the value back
/// to learn the next step.
fn geometric<'a>(
    inner: &'a Inner,
    id: Bson,
    at: u64,
    n: u64,
    options: Given,
    session: Option<&'a mut ClientSession>,
) -> IncrFuture<'a> {
    let key = key_bytes(&id);
    let m = inner.geometric_step(&key);
    let amount = if n >= m { n } else { inner.draw(at, n, m) };
    if amount == 0 {
        return IncrFuture::done();
    }
    IncrFuture::writing(inner.coll.name(), async move {
        let cx = Call::new(&inner.defaults, options, session, false).await;
        let txn = cx.txn;
        // A missing document (upsert off) reads back nothing,
        // and stays at the first step; a value read inside a
        // transaction may be rolled back, so it is not kept.
        let back = inner
            .write_returning(&id, amount, &cx.opts, txn, cx.session)
            .await?;
        if let (Some(v), false) = (back, txn) {
            inner.remember(&key, v);
        }
        Ok(())
    })
}

action! {
    /// `estimate`: reads one key's counter.
    Estimate<'a, T: ApproxCounted> on Counter, "estimate", read;
    { id: Result<Bson> } -> i64;
    |this, cx| {
        let id = this.id?;
        let inner = &*this.repo.inner;
        let field = inner.spec.field;
        let find = inner
            .coll
            .find_one(doc! {"_id": &id})
            .with_options(cx.opts.driver::<mongodb::options::FindOneOptions>())
            .projection(doc! {field: 1});
        let stored = crate::action::run!(find, cx.session)?
            .map(|d| number(&d, field, inner.coll.name()))
            .transpose()?
            .unwrap_or(0);
        let pending = inner.held(&key_bytes(&id));
        Ok(stored.saturating_add_unsigned(pending))
    }
}

/// `flush` / `shutdown`: writes what a buffered counter holds.
#[must_use = "does nothing unless awaited"]
pub struct Flush<'a, T> {
    counter: &'a Counter<T>,
    shutdown: bool,
    options: Options,
}

impl<T: ApproxCounted> Flush<'_, T> {
    crate::action::setters!(@common);
    crate::action::setters!(@write);
}

impl<'a, T: ApproxCounted> IntoFuture for Flush<'a, T> {
    type Output = Result<()>;
    type IntoFuture = BoxFuture<'a, Result<()>>;

    fn into_future(self) -> Self::IntoFuture {
        let inner = &*self.counter.inner;
        let operation = if self.shutdown { "shutdown" } else { "flush" };
        let span = crate::action::span("approx_counter", operation, inner.coll.name());
        crate::action::boxed_in(
            async move {
                inner.check()?;
                if self.shutdown {
                    inner.close();
                }
                let opts = self.options.or(&inner.defaults);
                inner.flush_where(|_| true, &opts).await
            },
            span,
        )
    }
}
