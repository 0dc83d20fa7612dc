//! Operations are values, as in the driver: a repository method returns an
//! action, chained setters configure it, and `.await` runs it.
//!
//! ```no_run
//! # use mongo_patterns::prelude::*;
//! # use mongo_patterns::bucket::Bucketed;
//! # async fn f<T: Bucketed>(repo: Buckets<T>, item: T, s: &mut mongodb::ClientSession)
//! # -> mongo_patterns::Result<()> {
//! repo.push(&item)
//!     .write_concern(WriteConcern::majority())
//!     .session(s)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Every action takes `.session(&mut ClientSession)`: it then runs in the
//! caller's session, and inside the caller's transaction when one is open.
//! What that means for each pattern, what a write cut inside the caller's
//! transaction does to it, and which options reach which commands, is said
//! once, in the [guide](crate::guide).
//!
//! [`Options`] set on a repository are its defaults; an action's setters
//! override them field by field, and what neither sets comes from the
//! `Database` (or the `Client`), as in the driver.

use mongodb::bson::{Bson, Document};
use mongodb::ClientSession;

use crate::error::{Error, Result};

mod options;

pub use options::Options;
pub(crate) use options::{Effective, Given};

/// The setters every action has: `session` and the [`Options`] fields
/// that apply to it (`write`, `read` or `both`). The action holds
/// `options: Options` and `session: Option<&'a mut ClientSession>`.
macro_rules! setters {
    ($a:lifetime; write) => {
        $crate::action::setters!(@session $a);
        $crate::action::setters!(@common);
        $crate::action::setters!(@write);
    };
    ($a:lifetime; read) => {
        $crate::action::setters!(@session $a);
        $crate::action::setters!(@common);
        $crate::action::setters!(@read);
    };
    ($a:lifetime; both) => {
        $crate::action::setters!(@session $a);
        $crate::action::setters!(@common);
        $crate::action::setters!(@write);
        $crate::action::setters!(@read);
    };
    (@session $a:lifetime) => {
        /// Runs in `session`, and in its transaction when one is open.
        pub fn session(mut self, session: &$a mut mongodb::ClientSession) -> Self {
            self.session = Some(session);
            self
        }
    };
    (@common) => {
        /// A comment attached to every command this sends.
        pub fn comment(mut self, comment: impl Into<mongodb::bson::Bson>) -> Self {
            self.options.comment = Some(comment.into());
            self
        }

        /// The server-side time bound of each command this sends.
        pub fn max_time(mut self, max_time: std::time::Duration) -> Self {
            self.options.max_time = Some(max_time);
            self
        }
    };
    (@write) => {
        /// The write concern of the writes this sends (not sent inside a
        /// transaction, whose own applies).
        pub fn write_concern(mut self, wc: mongodb::options::WriteConcern) -> Self {
            self.options.write_concern = Some(wc);
            self
        }
    };
    (@read) => {
        /// The read concern of the reads this sends (not sent inside a
        /// transaction, whose own applies).
        pub fn read_concern(mut self, rc: mongodb::options::ReadConcern) -> Self {
            self.options.read_concern = Some(rc);
            self
        }

        /// Where the reads this sends go (read preference).
        pub fn selection_criteria(
            mut self,
            sc: impl Into<mongodb::options::SelectionCriteria>,
        ) -> Self {
            self.options.selection_criteria = Some(sc.into());
            self
        }
    };
}
pub(crate) use setters;

/// What [`action!`] needs of a repository: its pattern's name (the span's
/// `pattern`), its collection's name and its default [`Options`].
pub(crate) trait Repository {
    const PATTERN: &'static str;
    fn defaults(&self) -> &Options;
    fn collection_name(&self) -> &str;
}

/// One call's context, built once when the call is awaited and handed to
/// the pattern's code: the effective options, the caller's session, and
/// whether that session has a transaction open. Every pattern's actions
/// build it the same way, so "which options apply" and "are we in a
/// transaction" are answered in one place.
pub(crate) struct Call<'s> {
    /// The call's options over the repository's; inside a transaction
    /// without write and read concern, which belong to the transaction.
    pub(crate) opts: Effective<'s>,
    pub(crate) session: Option<&'s mut ClientSession>,
    /// The session has a transaction open: nothing is retried inside it,
    /// a race is handed back labelled for the caller's `and_run2`.
    pub(crate) txn: bool,
    /// A read for the caller (a page, a total, a rank): it follows the
    /// caller's read preference. A read that decides a write goes to the
    /// primary.
    pub(crate) for_caller: bool,
}

impl<'s> Call<'s> {
    pub(crate) async fn new(
        defaults: &'s Options,
        given: Given,
        mut session: Option<&'s mut ClientSession>,
        for_caller: bool,
    ) -> Call<'s> {
        // Boxed: only a call given a session asks, and inline the question
        // would take room in every operation's future.
        let txn = match session.as_deref_mut() {
            Some(s) => Box::pin(in_transaction(s)).await,
            None => false,
        };
        let mut opts = given.over(defaults);
        if txn {
            opts = opts.in_transaction();
        }
        Call {
            opts,
            session,
            txn,
            for_caller,
        }
    }

    /// The driver's options `O` for a read of this call: the call's
    /// options for a read of the caller's (a page, a total); for a read
    /// that decides a write, which goes through a handle on the primary,
    /// the same but for a read preference of the call's, which would
    /// override the handle's: the primary instead.
    pub(crate) fn read_options<O: options::DriverOptions>(&self) -> Option<O> {
        match self.for_caller || self.opts.selection_criteria.is_none() {
            true => self.opts.driver(),
            false => Some(self.opts.deciding()),
        }
    }

    /// No options, no session: for work a call does on its own behalf
    /// (under a lease, in a task of its own).
    pub(crate) fn plain() -> Call<'static> {
        Call {
            opts: Effective::Defaults(Options::none()),
            session: None,
            txn: false,
            for_caller: false,
        }
    }
}

/// An operation of a repository as an action, the one shape every
/// pattern's operations take: a struct holding the repository, the
/// arguments, its own [`Options`] and the caller's session, with the
/// [`setters`] of its kind (`read`, `write` or `both`) and `new`; awaited,
/// it runs `body` with `cx`, the call's [`Call`], in the operation's
/// [`span`], as one boxed future.
///
/// A `guarded` write run inside the caller's transaction has a
/// [`CutGuard`](crate::cut::CutGuard) armed around `body`, so that a call
/// cut before its last reply has the session killed on the server (see
/// [`crate::cut`]). Only those actions pay for the guard: wrapping every
/// one would take reads' futures past a small allocation.
///
/// What is not made by it, and why: a counter's `incr` (its future is not
/// boxed: an increment that does not write is a draw and nothing else) and
/// `flush` (no session: it carries every caller's increments); the
/// `Stream`s (`Keyset::items`/`pages`, bucket and shard-key streams),
/// which build the same [`Call`] on their first poll; and `ensure`'s
/// `EnsureAction` and `PlanAction` and the shard key's `EnsureSharded`,
/// which run on a database's declarations rather than a repository (no
/// defaults to take, no session: a transaction refuses what they send).
macro_rules! action {
    (
        $(#[$m:meta])*
        $name:ident<$a:lifetime, T: $bound:path> on $repo:ident, $op:expr, $kind:ident $(, $guarded:ident)?;
        { $($f:ident: $t:ty),* $(,)? } -> $out:ty;
        |$this:ident, $cx:ident| $body:expr
    ) => {
        $(#[$m])*
        #[must_use = "does nothing unless awaited"]
        pub struct $name<$a, T: Send + Sync> {
            repo: &$a $repo<T>,
            $($f: $t,)*
            options: $crate::action::Given,
            session: Option<&$a mut mongodb::ClientSession>,
        }

        impl<$a, T: $bound + Send + Sync + $a> $name<$a, T> {
            pub(super) fn new(repo: &$a $repo<T>, $($f: $t),*) -> Self {
                $name {
                    repo,
                    $($f,)*
                    options: $crate::action::Given::default(),
                    session: None,
                }
            }

            $crate::action::setters!($a; $kind);
        }

        impl<$a, T: $bound + Send + Sync + $a> std::future::IntoFuture for $name<$a, T> {
            type Output = $crate::error::Result<$out>;
            type IntoFuture = futures::future::BoxFuture<$a, $crate::error::Result<$out>>;

            fn into_future(self) -> Self::IntoFuture {
                // Bound outside the future, so that the future holds it once.
                let $this = self;
                let span = $crate::action::span(
                    <$repo<T> as $crate::action::Repository>::PATTERN,
                    $op,
                    $crate::action::Repository::collection_name($this.repo),
                );
                $crate::action::boxed_in(
                    async move {
                        #[allow(unused_mut)]
                        let mut $cx = $crate::action::Call::new(
                            $crate::action::Repository::defaults($this.repo),
                            $this.options,
                            $this.session,
                            $crate::action::action!(@for_caller $kind),
                        )
                        .await;
                        let txn = $cx.txn;
                        let done = $crate::action::action!(@run $cx, $body $(, $guarded)?);
                        $crate::action::action!(@settle $kind, $op, txn, done)
                    },
                    span,
                )
            }
        }
    };
    (@for_caller read) => { true };
    (@for_caller write) => { false };
    (@for_caller both) => { false };
    // A write's error that leaves it perhaps stored says so (see
    // `crate::failover`); a read's is as it is.
    (@settle read, $op:expr, $txn:ident, $done:ident) => {{
        let _ = $txn;
        $done
    }};
    (@settle $kind:ident, $op:expr, $txn:ident, $done:ident) => {
        $crate::failover::settle($op, $txn, $done)
    };
    (@run $cx:ident, $body:expr) => { $body };
    (@run $cx:ident, $body:expr, guarded) => {{
        let mut cut = $crate::cut::CutGuard::new($cx.txn, $cx.session.as_deref());
        let done = async { $body }.await;
        cut.disarm();
        done
    }};
}
pub(crate) use action;

/// The span an operation runs in: target and name `mongo_patterns`, at
/// DEBUG, with the pattern (`"bucket"`, `"keyset"`, `"rank_histogram"`,
/// `"approx_counter"`, `"shard_key"`, `"ensure"`), the operation as the
/// caller names it (`"push"`, `"page"`, `"update_score"`, ...) and the
/// collection; `retries` is recorded when the call
/// pauses (see [`crate::retry`]). What it carries and how to read it: the
/// [guide](crate::guide#tracing).
///
/// Without a subscriber that wants it, this is a check of a static and one
/// of an atomic, and no allocation: `collection` is borrowed, recorded
/// only by a subscriber that takes the span.
#[inline]
pub(crate) fn span(
    pattern: &'static str,
    operation: &'static str,
    collection: &str,
) -> tracing::Span {
    tracing::debug_span!(
        target: "mongo_patterns",
        "mongo_patterns",
        pattern,
        operation,
        collection,
        retries = tracing::field::Empty,
    )
}

/// `fut`, boxed, running in `span`: instrumented only when a subscriber
/// took the span, so that without one the future is the size it was (the
/// operations' futures are held to a small allocation, see [`Effective`]);
/// with one it is the span's 40 bytes larger.
pub(crate) fn boxed_in<'a, F>(
    fut: F,
    span: tracing::Span,
) -> futures::future::BoxFuture<'a, F::Output>
where
    F: std::future::Future + Send + 'a,
{
    if span.is_disabled() {
        Box::pin(fut)
    } else {
        Box::pin(tracing::Instrument::instrument(fut, span))
    }
}

/// Marks a fallback learnt (`flag`, shared by a repository's clones) and,
/// the first time, says so at INFO (target `mongo_patterns::fallback`):
/// what the deployment refused, and what the repository sends instead
/// from now on.
pub(crate) fn learnt(
    flag: &std::sync::atomic::AtomicBool,
    fallback: &'static str,
    collection: &str,
    instead: &'static str,
) {
    if !flag.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::info!(
            target: "mongo_patterns::fallback",
            fallback,
            collection,
            "{instead}"
        );
    }
}

/// Runs a driver action in `session` (an `Option<&mut ClientSession>`,
/// e.g. `session.as_deref_mut()`) when there is one.
macro_rules! run {
    ($action:expr, $session:expr) => {
        match $session {
            Some(s) => $action.session(s).await,
            None => $action.await,
        }
    };
}
pub(crate) use run;

/// True when `session` has a transaction open. The driver does not say,
/// so this asks it to start one: refused when one is in progress;
/// otherwise started locally (nothing is sent) and aborted at once, which
/// is also local.
pub(crate) async fn in_transaction(session: &mut ClientSession) -> bool {
    match session.start_transaction().await {
        Ok(()) => {
            let _ = session.abort_transaction().await;
            false
        }
        Err(e) => {
            matches!(&*e.kind, mongodb::error::ErrorKind::Transaction { message, .. }
                if message.contains("already in progress"))
        }
    }
}

/// A race lost inside a caller's transaction: the server has aborted that
/// transaction, so the error carries `TransientTransactionError` and the
/// caller's `and_run2` runs it again.
pub(crate) fn raced_in_transaction(e: mongodb::error::Error) -> Error {
    Error::Raced(crate::error::with_transient_label(e))
}

/// The errors in a `run_command` write's reply, which `run_command`
/// returns as a success: the first of `writeErrors` (see
/// [`first_write_error`]), else `writeConcernError`, as the driver's own
/// error (code and labels kept).
pub(crate) fn command_write_errors(reply: &Document) -> Result<()> {
    use mongodb::error::{ErrorKind, WriteConcernError, WriteFailure};
    if let Some((_, e)) = first_write_error(reply) {
        return Err(e.into());
    }
    if let Ok(wce) = reply.get_document("writeConcernError") {
        if let Ok(w) = crate::compat::from_document::<WriteConcernError>(wce.clone()) {
            return Err(mongodb::error::Error::from(ErrorKind::Write(
                WriteFailure::WriteConcernError(w),
            ))
            .into());
        }
    }
    Ok(())
}

/// The first failed statement of a write command's reply (`insert`,
/// `update`, `delete`, ...): its `index` among the command's statements,
/// and the server's error. `None` when `writeErrors` lists none.
pub(crate) fn first_write_error(reply: &Document) -> Option<(usize, mongodb::error::Error)> {
    let errors = reply.get_array("writeErrors").ok()?;
    if errors.is_empty() {
        return None;
    }
    let first = errors
        .iter()
        .filter_map(Bson::as_document)
        .min_by_key(|e| e.get("index").and_then(crate::util::int).unwrap_or(0));
    Some(match first {
        Some(e) => write_error_at(e, "index"),
        None => (
            0,
            mongodb::error::Error::custom("the reply listed a write error it did not describe"),
        ),
    })
}

/// A failed statement of a reply (an entry of `writeErrors`, or of a
/// `bulkWrite`'s cursor) as (its index, read from `index_field`, the
/// driver's write error): its code, code name, message and details kept.
pub(crate) fn write_error_at(
    entry: &Document,
    index_field: &str,
) -> (usize, mongodb::error::Error) {
    use mongodb::error::{ErrorKind, WriteError, WriteFailure};
    let index = entry
        .get(index_field)
        .and_then(crate::util::int)
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(0);
    let code = entry
        .get("code")
        .and_then(crate::util::int)
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or_default();
    let mut w = mongodb::bson::doc! {
        "code": code,
        "errmsg": entry.get_str("errmsg").unwrap_or("write error"),
    };
    for field in ["codeName", "errInfo"] {
        if let Some(v) = entry.get(field) {
            w.insert(field, v.clone());
        }
    }
    let e = match crate::compat::from_document::<WriteError>(w) {
        Ok(w) => ErrorKind::Write(WriteFailure::WriteError(w)).into(),
        Err(e) => mongodb::error::Error::custom(format!("unreadable write error {entry}: {e}")),
    };
    (index, e)
}
