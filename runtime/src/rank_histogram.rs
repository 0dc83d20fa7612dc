//! The rank histogram: real-time ranks from `{score, count}`
//! pairs, whatever the number of players.
//!
//! A board (an exam, a season) keeps how many players hold each score. The
//! rank of a score is 1 plus the players with a better score; a score change
//! is `-1` at the old score and `+1` at the new. Both cost O(distinct
//! scores), never O(players): a top student dropping to 0 writes one
//! document, where a stored-rank design rewrites every rank in between.
//!
//! Two layouts, chosen by `#[rank_histogram(layout = ...)]`; the calls are
//! the same:
//! - `"array"` (the default): one document per board,
//!   `{_id: board, scores: [{score, count}]}`, kept sorted best first. Every
//!   write is one pipeline update of that document, so a new score, a
//!   change of two scores and the removal of an emptied score are atomic
//!   with no race between writers. Each write rewrites the array: keep it
//!   to [`ARRAY_ADVISED`] distinct scores; it refuses more than
//!   [`ARRAY_LIMIT`] (about 4 MB, a quarter of the 16 MiB limit).
//! - `"documents"`: one document per (board, score),
//!   `{_id: {b: board, s: score}, count}`. A write touches one or two small
//!   documents by `_id` (one ordered `bulkWrite`, MongoDB 8.0+, which also
//!   deletes a score whose count reached 0) and `rank` sums one `_id`
//!   range, so a board can hold any number of distinct scores. A marker
//!   `{_id: {b: board, s: MinKey}, count: 0}` keeps an emptied board known.
//!   A server before 8.0 refuses `bulkWrite`; learnt from the first
//!   refusal (once per repository, clones included), the same statements
//!   then go one by one, each through the driver's `update_one` or
//!   `delete_one`: `record` still one round trip, `unrecord` three,
//!   `change` four, with the same checks. [`Ranks::bulk_write`] chooses
//!   that path up front.
//!
//! The traps of the hand-written version, and what this does instead:
//! - A score seen for the first time must be added once. An `$inc` on
//!   `scoreMap.$` followed by a `$push` lets two writers both push it.
//!   Here the whole change is one update of one document (array), or an
//!   upsert by a unique `_id` (documents).
//! - A decrement must never go negative. It only applies while the count is
//!   above 0; otherwise nothing is written and the call fails with
//!   [`Error::ScoreNotFound`].
//! - Ties share a rank (competition ranking: 1, 2, 2, 4); the dense rank
//!   (1, 2, 2, 3) comes in the same reply.
//! - Floats compare exactly, so `0.1 + 0.2` and `0.3` would be two scores.
//!   With `precision`, scores are rounded to that step, the same way on
//!   the client and in `rebuild`'s server pipeline.
//! - The histogram drifts from the per-player documents when one write
//!   lands and the other fails. [`Ranks::insert`], [`Ranks::update_score`]
//!   and [`Ranks::delete`] change both in one transaction: yours when
//!   given a session with one open, otherwise one of their own, run
//!   through the driver's `and_run` (jittered backoff, 120 s in all; not
//!   `and_run2`, whose async closure trips rust-lang/rust#96865 there); without
//!   transactions they refuse ([`Error::NoTransactions`]) unless the caller
//!   opts in with [`Ranks::allow_non_atomic`]. [`Ranks::rebuild`]
//!   recomputes a board.
//! - Many writers on one board: every transaction writes the board's
//!   histogram, and two open transactions that write one document
//!   conflict, one rerun for nothing. A quiet board costs 3 round trips a
//!   call. A call that finds its board busy waits in the board's group,
//!   and the next turn runs the whole group as one transaction whose first
//!   command writes the histogram: within a process the calls of one
//!   handle (and its clones) share the group, and other processes'
//!   transactions fail fast on that write and take turns (a jittered
//!   pause, longer while they conflict). Round trips a call and calls a
//!   second at 16 and 64 tasks, and from 4 × 16 and 16 × 4 processes, are
//!   in `benches/throughput-results.md`; see *Several processes on one
//!   board* below. A caller's transaction is neither queued nor grouped.
//! - A call dropped mid-transaction (a timeout) must not leave the
//!   transaction holding its locks: the session is killed on the server,
//!   and a session of the call's own is fenced with the next transaction
//!   number, so that a command still on its way cannot reopen it.
//! - Another client may break a board (a score twice, a negative count).
//!   Every call that meets it fails with [`Error::Damaged`] naming the
//!   document, and the writes check the board on the server before writing,
//!   so nothing is written on top of it.
//!
//! Every call that reads or writes returns an action ([`Record`],
//! [`RankOf`], [`UpdateScore`], …): setters, then `.await`. Which setters
//! each takes, what a call does in the caller's session and transaction,
//! and where options come from: the [guide](crate::guide#rank-histogram).
//!
//! On real deployments: a server without 8.0's `bulkWrite` (7.0 answers
//! 40415, 6.0 59, the documentdb engine 115, DocumentDB 303; the driver
//! itself refuses to send it below 8.0's wire version) gets the same
//! statements one by one instead, learnt from its first refusal, which
//! wrote nothing. Outside a transaction every histogram write of both
//! layouts is one of the driver's retryable writes (`Client::bulk_write`,
//! or `update_one` and `delete_one`): after an election refused or
//! interrupted it, after its reply was lost, or after a step-down reported
//! it stored, the driver sends it once more and the server answers from
//! its record of the first attempt, statement by statement, so the call
//! returns `Ok` with the write stored once. An error that still reaches
//! the call (two failovers in a row, or a client with
//! `retryWrites=false`) is [`Error::OutcomeUnknown`] where the write may
//! be stored: read the board, or [`rebuild`](Ranks::rebuild) it, before
//! sending it again. The call's own transactions and `rebuild` read the
//! primary whatever the client's read preference; `rank`, `top` and
//! `histogram` follow the caller's.
//! Plain methods send nothing: [`Ranks::rank_pipeline`],
//! [`Ranks::declared`] and the builder settings.
//!
#![doc = include_str!("rank_histogram/details.md")]

use std::borrow::Borrow;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures::future::BoxFuture;
use mongodb::bson::{doc, Bson, Document};
use mongodb::{ClientSession, Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::action::{Effective, Options};
use crate::error::{Error, Result};
use crate::model::Model;

/// Everything a driver read action's cursor gives, in the session (an
/// `Option<&mut ClientSession>`; its `getMore`s too) when there is one.
macro_rules! all_of {
    ($action:expr, $session:expr) => {
        match $session {
            None => futures::TryStreamExt::try_collect($action.await?).await?,
            Some(s) => {
                let mut cursor = $action.session(&mut *s).await?;
                futures::TryStreamExt::try_collect(cursor.stream(s)).await?
            }
        }
    };
}

mod actions;
mod adopt;
mod array;
mod combined;
mod documents;
mod group;
mod pending;
mod queue;
mod read;
mod rounding;
mod score;
mod send;
#[cfg(test)]
mod tests;
mod txn;
mod write;

pub use actions::{
    Change, Delete, Histogram, Insert, RankOf, Rebuild, RebuildAll, Record, Top, Unrecord,
    UpdateScore,
};
pub use score::{BoardKey, Number, RankScore};

use txn::SourceOp;
use write::{Delta, Txn, WriteArgs};

/// Distinct scores per board up to which the `"array"` layout is the better
/// choice: each write rewrites the board's array (about 40 bytes a score).
pub const ARRAY_ADVISED: usize = 10_000;
/// Distinct scores the `"array"` layout refuses to pass: about 4 MB, a
/// quarter of MongoDB's 16 MiB document limit.
pub const ARRAY_LIMIT: usize = 100_000;

/// How a board stores its histogram: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One document per board holding `[{score, count}]`.
    Array,
    /// One document per (board, score).
    Documents,
}

/// What `#[rank_histogram(...)]` declares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankSpec {
    /// The BSON name of the board field in the players' documents.
    pub board: &'static str,
    /// The BSON name of the score field.
    pub score: &'static str,
    /// Whether a higher score ranks first (the default).
    pub descending: bool,
    /// The step scores are rounded to, for floating-point scores.
    pub precision: Option<f64>,
    /// How the histogram is stored.
    pub layout: Layout,
    /// The collection that holds the histograms.
    pub histogram: &'static str,
}

impl RankSpec {
    /// What generated code declares after a compile error.
    #[doc(hidden)]
    pub const FALLBACK: RankSpec = RankSpec {
        board: "",
        score: "",
        descending: true,
        precision: None,
        layout: Layout::Array,
        histogram: "",
    };
}

/// A model whose documents are ranked on boards. `#[rank_histogram]`
/// implements it.
pub trait RankHistogram:
    Model + Serialize + DeserializeOwned + Send + Sync + Unpin + 'static
{
    /// The board field's type.
    type Board: Serialize + DeserializeOwned + Send + Sync;
    /// The score field's type.
    type Score: RankScore;
    /// The declaration.
    const RANK: RankSpec;
    /// This document's board.
    fn board(&self) -> &Self::Board;
    /// This document's score.
    fn score(&self) -> Self::Score;

    /// The repository over `db`.
    fn ranks(db: &Database) -> Ranks<Self> {
        Ranks::new(db)
    }
}

/// Scores `precision` can round: floating-point ones.
#[diagnostic::on_unimplemented(
    message = "`precision` rounds floating-point scores, and `{Self}` is not one",
    label = "integer scores are exact",
    note = "remove `precision`, or store the score as an f64"
)]
pub trait FloatScore {}

impl FloatScore for f32 {}
impl FloatScore for f64 {}

/// Where a score stands on its board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Rank {
    /// Competition rank: 1 plus the players above (ties share it: 1, 2, 2, 4).
    pub rank: u64,
    /// Dense rank: 1 plus the distinct scores above (1, 2, 2, 3).
    pub dense: u64,
    /// Players with a better score.
    pub above: u64,
    /// Players with exactly this score (0 for a score nobody holds).
    pub ties: u64,
    /// Players on the board.
    pub total: u64,
}

impl Rank {
    /// The percentile rank: the share of the board below this score, with
    /// ties counted half, in percent (`(below + ties / 2) / total × 100`).
    /// `None` for an empty board.
    pub fn percentile(&self) -> Option<f64> {
        (self.total > 0).then(|| {
            let below = self.total - self.above - self.ties;
            (below as f64 + self.ties as f64 / 2.0) * 100.0 / self.total as f64
        })
    }
}

/// One score of a board and the players who hold it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ScoreCount<S> {
    /// The score (rounded to `precision`, if set).
    pub score: S,
    /// How many players hold it.
    pub count: u64,
    /// Its competition rank.
    pub rank: u64,
}

/// The typed repository a `#[rank_histogram]` model gets: see the module
/// docs.
#[derive(Debug)]
pub struct Ranks<T: Send + Sync> {
    db: Database,
    source: Collection<T>,
    hist: Collection<Document>,
    spec: RankSpec,
    /// Whether the deployment refused a transaction (a standalone): learnt
    /// from the first refusal, so a replica set or a sharded cluster pays no
    /// extra round trip to ask.
    no_transactions: Arc<AtomicBool>,
    /// Whether the deployment refused `bulkWrite` (a server before 8.0):
    /// learnt from the first refusal, shared by clones, so that the
    /// documents layout then sends `update` and `delete` commands.
    no_bulk_write: Arc<AtomicBool>,
    /// Whether the deployment refused `bulkWrite` as a transaction's first
    /// command (its `readConcern`): `insert` then sends two commands.
    no_bulk_in_transaction: Arc<AtomicBool>,
    /// Whether the documents layout may send `bulkWrite`.
    bulk_write: bool,
    /// The name `bulkWrite` is sent under (tests make a server refuse it).
    bulk_command: &'static str,
    /// Whether `insert` sends one `bulkWrite` even where the transaction's
    /// first command carries `readConcern` (tests meet the refusal).
    bulk_with_read_concern: bool,
    /// Whether `insert`, `update_score` and `delete` start transactions.
    transactions: bool,
    /// Whether they may write the player and the histogram one after the
    /// other when there is no transaction.
    allow_non_atomic: bool,
    /// Options of every operation that does not set its own.
    defaults: Arc<Options>,
    /// The boards' queues of the calls' own transactions (`queue`).
    queues: Arc<queue::Queues>,
}

impl<T: Send + Sync> Clone for Ranks<T> {
    fn clone(&self) -> Self {
        Ranks {
            db: self.db.clone(),
            source: self.source.clone(),
            hist: self.hist.clone(),
            spec: self.spec,
            no_transactions: self.no_transactions.clone(),
            no_bulk_write: self.no_bulk_write.clone(),
            no_bulk_in_transaction: self.no_bulk_in_transaction.clone(),
            bulk_write: self.bulk_write,
            bulk_command: self.bulk_command,
            bulk_with_read_concern: self.bulk_with_read_concern,
            transactions: self.transactions,
            allow_non_atomic: self.allow_non_atomic,
            defaults: self.defaults.clone(),
            queues: self.queues.clone(),
        }
    }
}

impl<T: RankHistogram> Ranks<T> {
    /// The repository for `T` in `db`.
    pub fn new(db: &Database) -> Self {
        Ranks {
            db: db.clone(),
            source: db.collection(T::COLLECTION),
            hist: db.collection(T::RANK.histogram),
            spec: T::RANK,
            no_transactions: Default::default(),
            no_bulk_write: Default::default(),
            no_bulk_in_transaction: Default::default(),
            bulk_write: true,
            bulk_command: "bulkWrite",
            bulk_with_read_concern: false,
            transactions: true,
            allow_non_atomic: false,
            defaults: Default::default(),
            queues: Default::default(),
        }
    }

    /// Lets [`insert`](Self::insert), [`update_score`](Self::update_score)
    /// and [`delete`](Self::delete) write the player and then the histogram
    /// when the deployment has no transactions (a standalone server).
    /// Off by default: they then fail with [`Error::NoTransactions`] and
    /// write nothing. When on, the player is written, then `+1` at the new
    /// score, then `-1` at the old one, which waits up to 30 s for a
    /// concurrent writer's `+1` there to land (`+1` first, so that no two
    /// writers wait for each other); a call cancelled or failed between the
    /// writes leaves the board off by one until [`rebuild`](Self::rebuild).
    pub fn allow_non_atomic(mut self, allow: bool) -> Self {
        self.allow_non_atomic = allow;
        self
    }

    /// Whether [`insert`](Self::insert), [`update_score`](Self::update_score)
    /// and [`delete`](Self::delete) use transactions (the default). `false`
    /// behaves as a deployment without them: see
    /// [`allow_non_atomic`](Self::allow_non_atomic).
    pub fn transactions(mut self, use_them: bool) -> Self {
        self.transactions = use_them;
        self
    }

    /// Whether writes may use the `bulkWrite` command (the default;
    /// MongoDB 8.0+): the `"documents"` layout's histogram writes, and
    /// [`insert`](Self::insert)'s two writes in one command. `false` sends
    /// what every server takes: the same statements one by one, each
    /// through the driver's `update_one` or `delete_one` (a retryable
    /// write, as the `bulkWrite` is), with the same checks and results, a
    /// round trip each: `record` one, `unrecord` three (`-1`, the board's
    /// marker, the removal of a score it emptied), `change` four (the check
    /// of the new score's count, `-1`, the removal, `+1`). Without a
    /// session they run as a task of their own, so that a call dropped
    /// between two of them leaves the rest to run; in your session they run
    /// in the call, and one cut between them can leave the board off by
    /// one until [`rebuild`](Self::rebuild). Inside a transaction they go
    /// as an `update` command and a `delete` command (one round trip each),
    /// which the transaction covers. A server that refuses `bulkWrite`
    /// (before 8.0) gets the same, learnt from its first refusal. The
    /// `"array"` layout's histogram writes are one `update` either way.
    pub fn bulk_write(mut self, use_it: bool) -> Self {
        self.bulk_write = use_it;
        self
    }

    /// Sends, in place of `bulkWrite`, a command of this name (one the
    /// server does not know), so that a test can meet a server's real
    /// refusal of a command it lacks.
    #[doc(hidden)]
    pub fn __bulk_write_command(mut self, name: &'static str) -> Self {
        self.bulk_command = name;
        self
    }

    /// Lets `insert` send one `bulkWrite` where its transaction's first
    /// command carries `readConcern`, so that a test can meet a server's
    /// refusal of it.
    #[doc(hidden)]
    pub fn __bulk_write_with_read_concern(mut self, on: bool) -> Self {
        self.bulk_with_read_concern = on;
        self
    }

    /// Options every operation of this repository (and its clones) takes
    /// unless it sets its own; what neither sets comes from the `Database`.
    pub fn with_options(mut self, defaults: Options) -> Self {
        self.defaults = Arc::new(defaults);
        self
    }

    /// The players' documents in collection `name` of the same database
    /// instead of the model's (one collection per tenant, say).
    pub fn with_collection(mut self, name: &str) -> Self {
        self.source = self.db.collection(name);
        self
    }

    /// The histograms in collection `name` of the same database instead of
    /// the one `#[rank_histogram(histogram = ...)]` names.
    pub fn with_histogram_collection(mut self, name: &str) -> Self {
        self.hist = self.db.collection(name);
        self
    }

    /// The players' collection, for commands of your own beside these.
    pub fn collection(&self) -> &Collection<T> {
        &self.source
    }

    /// The collection that holds the histograms.
    pub fn histogram_collection(&self) -> &Collection<Document> {
        &self.hist
    }

    /// Creates what [`declared`](Self::declared) lists and the deployment
    /// lacks: `{board: 1, score: ±1}` on the players' collection, which
    /// [`rebuild`](Self::rebuild) reads by, and both collections. The same
    /// as [`Model::ensure`] for this repository
    /// (under its run-time collection names).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// Trader::ranks(&db).with_histogram_collection("desk_ranks").ensure().await?;
    /// # Ok(()) }
    /// ```
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.db, self.declared())
    }

    /// What this repository needs in the deployment: the players'
    /// collection with its `{board, score}` index (which `rebuild` and
    /// `update_score` read through), and the histogram's collection,
    /// sharded on [`histogram_shard_key`](Self::histogram_shard_key) (the
    /// players' collection is yours: no shard key is declared for it). From
    /// the server: `$isNumber` (MongoDB 4.4) in every histogram write's
    /// checks (and pipeline updates, 4.2, on the `"array"` layout); what it
    /// can do without is noted, not refused: the `bulkWrite` command
    /// (8.0; see [`bulk_write`](Self::bulk_write)) on the `"documents"`
    /// layout, and transactions for [`insert`](Self::insert),
    /// [`update_score`](Self::update_score) and [`delete`](Self::delete)
    /// (see [`allow_non_atomic`](Self::allow_non_atomic)).
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        use crate::ensure::{Feature, Need};
        let (board, score) = (self.spec.board, self.spec.score);
        let dir = if self.spec.descending { -1 } else { 1 };
        let mut needs = vec![Need::needs(Feature::IsNumber, "rank histogram writes")];
        match self.spec.layout {
            Layout::Array => needs.push(Need::needs(
                Feature::PipelineUpdate,
                "rank histogram writes (array layout)",
            )),
            Layout::Documents if self.bulk_write => needs.push(Need::prefers(
                Feature::BulkWrite,
                "rank change and remove (documents layout)",
                "send each statement on its own: up to four round trips instead of one",
            )),
            Layout::Documents => {}
        }
        if self.transactions {
            needs.push(Need::prefers(
                Feature::Transactions,
                "rank insert, update_score and delete",
                if self.allow_non_atomic {
                    "write the player, then the histogram, without a transaction"
                } else {
                    "fail with Error::NoTransactions before writing, unless allow_non_atomic"
                },
            ));
        }
        let declared = vec![
            crate::ensure::Declared::new(self.source.name())
                .index(
                    doc! {board: 1, score: dir},
                    format!("mp_rank_{board}_{score}"),
                )
                .needs(needs),
            self.stored_checks().into_iter().fold(
                crate::ensure::Declared::new(self.hist.name())
                    .sharded(self.histogram_shard_key(), false)
                    .schema(self.histogram_schema()),
                crate::ensure::Declared::check,
            ),
        ];
        // The model's level, when the repository's own `ensure` runs too.
        crate::ensure::for_model::<T>(declared, T::VALIDATION)
    }

    /// The histogram's `$jsonSchema`, for the server to enforce (see
    /// [`Validation`](crate::ensure::Validation)): counts integers not
    /// below 0; the array layout's `scores` an array of `{score, count}`,
    /// the documents layout's `_id` a `{b, s}`.
    fn histogram_schema(&self) -> Document {
        let count = doc! {"bsonType": ["int", "long"], "minimum": 0};
        match self.spec.layout {
            Layout::Array => doc! {
                "required": ["_id", "scores"],
                "properties": {"scores": {
                    "bsonType": "array",
                    "items": {
                        "bsonType": "object",
                        "required": ["score", "count"],
                        "properties": {"count": count},
                    },
                }},
            },
            Layout::Documents => doc! {
                "required": ["_id", "count"],
                "properties": {
                    "_id": {"bsonType": "object", "required": ["b", "s"]},
                    "count": count,
                },
            },
        }
    }

    /// What `plan` looks for in the histogram: the other layout's
    /// documents (a `layout` changed over stored histograms) and, with
    /// `precision`, scores between two of its steps (a `precision`
    /// changed).
    fn stored_checks(&self) -> Vec<crate::ensure::Check> {
        use crate::ensure::Check;
        let rebuild =
            "run `rebuild_all()` under this declaration (it rebuilds every board from the players)";
        let mut checks = vec![match self.spec.layout {
            Layout::Array => Check::new(
                doc! {"scores": {"$exists": false}},
                "histogram documents without `scores` (the documents layout's, or another writer's)",
                format!("the array layout never reads them, and counts only what it wrote itself: {rebuild}, then delete them"),
            ),
            Layout::Documents => Check::new(
                doc! {"scores": {"$exists": true}},
                "histogram documents with `scores` (the array layout's)",
                format!("the documents layout never reads them, and counts only what it wrote itself: {rebuild}, then delete them"),
            ),
        }];
        if self.spec.precision.is_some() {
            let off = |path: &str| {
                doc! {"$and": [
                    {"$isNumber": path},
                    {"$ne": [path, rounding::rounded(path.to_owned(), self.spec.precision)]},
                ]}
            };
            let filter = match self.spec.layout {
                Layout::Array => doc! {"$expr": {"$anyElementTrue": [{"$map": {
                    "input": {"$cond": [{"$isArray": "$scores"}, "$scores", []]},
                    "in": off("$$this.score"),
                }}]}},
                Layout::Documents => doc! {"$expr": off("$_id.s")},
            };
            checks.push(Check::new(
                filter,
                "histogram entries whose score is not a step of `precision` (another `precision`)",
                format!("a player's score rounds to another step than the one that counts it: ranks are off and writes that reach them are refused; {rebuild}"),
            ));
        }
        checks
    }

    /// The histogram collection's shard key, which
    /// [`declared`](Self::declared) lists and `ensure` shards on a sharded
    /// cluster: the board, hashed. `{_id: "hashed"}` on the `"array"`
    /// layout (`_id` is the board), `{"_id.b": "hashed"}` on the
    /// `"documents"` layout (every score of a board on the board's shard).
    /// See the module's *Sharding*.
    pub fn histogram_shard_key(&self) -> Document {
        match self.spec.layout {
            Layout::Array => doc! {"_id": "hashed"},
            Layout::Documents => doc! {"_id.b": "hashed"},
        }
    }

    /// Counts one more player at `score` on `board`; creates the board and
    /// the score when they are new. One `update` command (one round trip;
    /// `bulkWrite` on the `"documents"` layout, or `update` without it),
    /// a retryable write outside a transaction (see the module docs: a
    /// failover after it was sent still ends in `Ok`, stored once). Its
    /// write concern and comment are the call's; `max_time` does not reach
    /// it there (the driver's `update_one` and `bulk_write` take no
    /// `maxTimeMS`).
    /// In a session without a transaction a lost upsert race is retried
    /// here; inside a caller's transaction it is returned as
    /// [`Error::Raced`] labelled `TransientTransactionError`, for the
    /// caller's `and_run2` to rerun the transaction.
    ///
    /// Inside a caller's transaction the documents layout sends `update`
    /// and `delete` commands rather than `bulkWrite`, which refuses the
    /// `readConcern` the driver adds to a transaction's first command; and
    /// [`change`](Self::change) and [`unrecord`](Self::unrecord) first read
    /// the counts they change (one `find`), so that a score nobody holds
    /// ([`Error::ScoreNotFound`]), a board never written
    /// ([`Error::UnknownBoard`]) or a damaged count ([`Error::Damaged`])
    /// fails the call with nothing sent that fails, and your transaction
    /// goes on (the `"array"` layout's update matches nothing for a score
    /// nobody holds or a board never written, to the same effect). Two
    /// round trips then, three when the `-1` empties a score. A write the
    /// server refuses (a damaged count at `score` for `record`, a damaged
    /// board on the `"array"` layout) has aborted your transaction: return
    /// the error from your closure.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// ranks.record("desk-1", 120).await?; // a player not stored here
    /// # Ok(()) }
    /// ```
    pub fn record<'a, Q>(&'a self, board: &Q, score: T::Score) -> Record<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self.board_bson(board).and_then(|board| {
            Ok(Box::new(WriteArgs {
                board,
                dec: None,
                inc: Some(self.score_bson(score)?),
            }))
        });
        Record::new(self, args)
    }

    /// Moves one player from `old` to `new`: both counts change together or
    /// neither does. One round trip, also when `new` is new to the board
    /// (four on the `"documents"` layout without `bulkWrite`: see
    /// [`bulk_write`](Self::bulk_write)).
    /// Fails with [`Error::ScoreNotFound`] when nobody holds `old`, writing
    /// nothing. Races, retries and your transaction as
    /// [`record`](Self::record).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// ranks.change("desk-1", 120, 135).await?; // 120 -> 135, both counts or neither
    /// # Ok(()) }
    /// ```
    pub fn change<'a, Q>(&'a self, board: &Q, old: T::Score, new: T::Score) -> Change<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self.board_bson(board).and_then(|board| {
            Ok(Box::new(WriteArgs {
                board,
                dec: Some(self.score_bson(old)?),
                inc: Some(self.score_bson(new)?),
            }))
        });
        Change::new(self, args)
    }

    /// Counts one player fewer at `score` (the opposite of
    /// [`record`](Self::record); [`delete`](Self::delete) deletes a
    /// player's document and uncounts it together). Fails with
    /// [`Error::ScoreNotFound`] when nobody holds it: a count never goes
    /// below 0, and nothing is written. One round trip (three on the
    /// `"documents"` layout without `bulkWrite`). Races, retries and your
    /// transaction as [`record`](Self::record).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// ranks.unrecord("desk-1", 135).await?; // one player fewer at 135
    /// # Ok(()) }
    /// ```
    pub fn unrecord<'a, Q>(&'a self, board: &Q, score: T::Score) -> Unrecord<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self.board_bson(board).and_then(|board| {
            Ok(Box::new(WriteArgs {
                board,
                dec: Some(self.score_bson(score)?),
                inc: None,
            }))
        });
        Unrecord::new(self, args)
    }

    /// Where `score` stands on `board`: ranks, ties, total. The sums run on
    /// the server, in one `aggregate` (one round trip), over the board's
    /// distinct scores. A score nobody holds still ranks (`ties` is 0).
    /// Fails with [`Error::UnknownBoard`] for a board never written, and
    /// with [`Error::Damaged`] for a board another client broke (a score
    /// listed twice, a count below 1). In a caller's transaction it reads
    /// the transaction's writes.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// let r = ranks.rank("desk-1", 135).await?;
    /// println!("#{} of {} ({} tied)", r.rank, r.total, r.ties);
    /// # Ok(()) }
    /// ```
    pub fn rank<'a, Q>(&'a self, board: &Q, score: T::Score) -> RankOf<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self
            .board_bson(board)
            .and_then(|b| Ok(Box::new((b, self.score_bson(score)?))));
        RankOf::new(self, args)
    }

    /// The aggregation [`rank`](Self::rank) runs, for `explain` or a review.
    pub fn rank_pipeline(&self, board: &Bson, score: &Bson) -> Vec<Document> {
        self.store().rank_pipeline(&self.spec, board, score)
    }

    /// The scores of the first `places` places, best first, ties included
    /// (`top(board, 3)` on 100, 90, 90, 80 gives 100, 90 ×2: places 1 to 3).
    /// One round trip (`aggregate`, or `find` on the `"documents"`
    /// layout), reading at most `places` scores.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// for s in ranks.top("desk-1", 3).await? {
    ///     println!("{} x{}", s.score, s.count);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn top<'a, Q>(&'a self, board: &Q, places: u32) -> Top<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Top::new(self, self.board_bson(board).map(|b| (b, places)))
    }

    /// Every score of `board` with its count and rank, best first. One round
    /// trip (up to 100,000 scores; a larger `"documents"` board continues
    /// with `getMore`s, in the same session).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// let all = ranks.histogram("desk-1").await?; // best first
    /// # Ok(()) }
    /// ```
    pub fn histogram<'a, Q>(&'a self, board: &Q) -> Histogram<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Histogram::new(self, self.board_bson(board))
    }

    /// Inserts a player's document and counts its score, in one transaction:
    /// two round trips where the server takes a cross-collection
    /// `bulkWrite` (MongoDB 8.0+) carrying both writes, then the commit;
    /// three otherwise (`insert`, the histogram's write, commit), also in
    /// your session or under a read concern: the transaction's first
    /// command may then carry `readConcern`, which some servers refuse on
    /// `bulkWrite`. A refusal is
    /// learnt once per repository (clones included): that call reruns its
    /// transaction, nothing written twice.
    ///
    /// Given a session with a transaction open, it joins that transaction
    /// (two round trips; the caller commits) and never retries: a lost race
    /// comes back labelled `TransientTransactionError`, and a histogram
    /// write the server refuses (a damaged count; for `update_score` and
    /// `delete`, an old score the histogram does not hold) has aborted your
    /// transaction: return the error from your closure. Given a session
    /// without one, it runs its own transaction in that session; without
    /// a session, in one of its own. A transaction of its own runs through
    /// the driver's `and_run` (jittered backoff, 120 s in all). Dropped while its own transaction is open in your session,
    /// the call has the server kill that session (which frees what it
    /// locked); the session still shows the transaction open: abort it or
    /// drop the session.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// let ada = Trader { id: "ada".into(), desk: "desk-1".into(), profit: 120 };
    /// ranks.insert(&ada).await?; // the player and its count, together
    /// # Ok(()) }
    /// ```
    pub fn insert<'a>(&'a self, doc: &'a T) -> Insert<'a, T> {
        Insert::new(self, doc)
    }

    /// Sets the score of the first player document `filter` matches and
    /// moves it on the histogram, in one transaction (`findAndModify`, the
    /// histogram's write, commit). Returns whether a document matched.
    /// Sessions and transactions as [`insert`](Self::insert).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// let matched = ranks.update_score(doc! {"_id": "ada"}, 135).await?;
    /// # Ok(()) }
    /// ```
    pub fn update_score(&self, filter: Document, new: T::Score) -> UpdateScore<'_, T> {
        UpdateScore::new(self, (filter, Box::new(new)))
    }

    /// Deletes the first player document `filter` matches and uncounts its
    /// score, in one transaction (`findAndModify`, the histogram's write,
    /// commit). Returns whether a document matched. Sessions and
    /// transactions as [`insert`](Self::insert).
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// let deleted = ranks.delete(doc! {"_id": "ada"}).await?; // and uncounted
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, filter: Document) -> Delete<'_, T> {
        Delete::new(self, filter)
    }

    /// Recomputes `board`'s histogram from the players' documents, for
    /// repair, and returns how many players it counted. Scores are grouped
    /// on the server (rounded as `precision` says); documents whose score is
    /// missing, not a number, NaN or infinite (also once rounded) are not
    /// counted. Run it while no writes to this board are in flight: one that
    /// lands between the read and the write is lost from the histogram.
    /// Sends an `aggregate` of the players, then an `update` (array) or a
    /// `delete` and an `insert` (documents); in a caller's session and
    /// transaction when given one.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let ranks = Trader::ranks(&db);
    /// let players = ranks.rebuild("desk-1").await?; // after a repair by hand
    /// # Ok(()) }
    /// ```
    pub fn rebuild<'a, Q>(&'a self, board: &Q) -> Rebuild<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Rebuild::new(self, self.board_bson(board))
    }

    /// [`rebuild`](Self::rebuild) for every board of the players'
    /// collection, for adopting a collection that exists already (or after
    /// a change of layout): the boards are counted, then taken 1,000 at a
    /// time in BSON order, each rebuilt as `rebuild` does, so memory holds
    /// one round of boards and one board's scores whatever the number of
    /// boards. Returns how many players it counted; `on_progress` hears
    /// after each board (boards done, of how many, time so far). A call
    /// cut short leaves the boards it finished rebuilt; running it again
    /// rebuilds them all again, with the same result. As with `rebuild`,
    /// run it while no writes to the boards are in flight. Boards that
    /// have a histogram but no player any more are left as they are.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[rank_histogram(board = "desk", score = "profit")]
    /// # struct Trader { #[serde(rename = "_id")] id: String, desk: String, profit: i64 }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let players = Trader::ranks(&db)
    ///     .rebuild_all()
    ///     .on_progress(|p| eprintln!("{} of {} boards, {:.0}/s", p.done, p.of, p.rate()))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn rebuild_all(&self) -> RebuildAll<'_, T> {
        RebuildAll::new(self, None)
    }

    /// The one choice of layout: everything that differs between the two
    /// lives behind [`Store`], the rest is written once.
    fn store(&self) -> &'static dyn Store<T> {
        match self.spec.layout {
            Layout::Array => &array::ArrayStore,
            Layout::Documents => &documents::DocumentStore,
        }
    }

    fn board_bson<Q: Serialize + ?Sized>(&self, board: &Q) -> Result<Bson> {
        Ok(crate::compat::to_bson(board)?)
    }

    fn unknown_board(&self, board: &Bson) -> Error {
        Error::UnknownBoard {
            collection: self.hist.name().to_owned(),
            board: Box::new(board.clone()),
        }
    }
}

/// What a layout does its own way: how a board is read, written, checked
/// and replaced. `array.rs` and `documents.rs` implement it.
trait Store<T: RankHistogram>: Sync {
    /// The aggregation behind `rank`: one document with `above`,
    /// `distinctAbove`, `ties` and `total`, and what the board check found.
    fn rank_pipeline(&self, spec: &RankSpec, board: &Bson, score: &Bson) -> Vec<Document>;

    /// The damage that a reply of [`rank_pipeline`](Store::rank_pipeline)
    /// reports, if any.
    fn rank_damage<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        reply: &'a Document,
    ) -> BoxFuture<'a, Option<Error>>;

    /// One attempt at `delta`: a race lost to a concurrent writer comes
    /// back as [`Error::Raced`], for the caller to retry or to label.
    fn write<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        delta: Delta<'a>,
        o: &'a Options,
        session: Option<&'a mut ClientSession>,
        txn: Txn,
    ) -> BoxFuture<'a, Result<()>>;

    /// The board's scores best first, at most `limit`, each as the `_id`
    /// of the document it was read from and `{score, count}`.
    fn rows<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        limit: Option<u32>,
        o: Effective<'a>,
        session: Option<&'a mut ClientSession>,
    ) -> BoxFuture<'a, Result<Vec<(Bson, Document)>>>;

    /// Replaces the board's histogram with `scores`, best first.
    fn replace<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        scores: Vec<(Bson, u64)>,
        o: Options,
        session: Option<&'a mut ClientSession>,
    ) -> BoxFuture<'a, Result<()>>;
}
