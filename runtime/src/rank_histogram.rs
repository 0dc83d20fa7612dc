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
//! - `"array"` (the default, and the seed's): one document per board,
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
//!   then go as an `update` command and a `delete` command for the emptied
//!   score: `change` and `remove` cost two round trips instead of one,
//!   `record` still one, with the same checks. [`Ranks::bulk_write`]
//!   chooses that path up front.
//!
//! The traps of the hand-written version, and what this does instead:
//! - A score seen for the first time must be added once. The seed's
//!   `$inc` on `scoreMap.$` followed by a `$push` lets two writers both
//!   push it. Here the whole change is one update of one document (array),
//!   or an upsert by a unique `_id` (documents).
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
//!   and [`Ranks::delete`] change both in one transaction, retried as the
//!   driver's convenient API does (jittered backoff, 120 s in all); without
//!   transactions they refuse ([`Error::NoTransactions`]) unless the caller
//!   opts in with [`Ranks::allow_non_atomic`]. [`Ranks::rebuild`]
//!   recomputes a board.
//! - A call dropped mid-transaction (a timeout) must not leave the
//!   transaction holding its locks: the session is killed on the server.
//! - Another client may break a board (a score twice, a negative count).
//!   Every call that meets it fails with [`Error::Damaged`] naming the
//!   document, and the writes check the board on the server before writing,
//!   so nothing is written on top of it.
//!
//! Every call that reads or writes returns an action ([`Record`],
//! [`RankOf`], [`UpdateScore`], …): set `session`, `comment`, `max_time`,
//! and `write_concern` or `read_concern` + `selection_criteria` on it, then
//! `.await` it. Given a session, a call runs in it, and in its transaction
//! when one is open; there it never retries a lost race but returns it
//! labelled `TransientTransactionError`, for the caller's `and_run2` to
//! rerun the transaction. Options the action leaves unset come from
//! [`Ranks::with_options`], then from the `Database`. The documents
//! layout's `run_command` writes carry the effective write concern and
//! `maxTimeMS` themselves, and report a `writeConcernError` as an error.
//! Plain methods send nothing: [`Ranks::rank_pipeline`],
//! [`Ranks::declared`] and the builder settings.

use mongodb::bson;
use std::borrow::Borrow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::TRANSIENT_TRANSACTION_ERROR;
use mongodb::{ClientSession, Collection, Database};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::action::Options;
use crate::error::code::{COMMAND_NOT_FOUND, DUPLICATE_KEY, REFUSED, WRITE_CONFLICT};
use crate::error::{server_codes, Error, Result};
use crate::model::Model;

mod actions;
pub use actions::{
    Change, Delete, Histogram, Insert, RankOf, Rebuild, Record, Remove, Top, UpdateScore,
};

/// Everything a driver read action's cursor gives, in the session (an
/// `Option<&mut ClientSession>`; its `getMore`s too) when there is one.
macro_rules! all_of {
    ($action:expr, $session:expr) => {
        match $session {
            None => $action.await?.try_collect().await?,
            Some(s) => {
                let mut cursor = $action.session(&mut *s).await?;
                cursor.stream(s).try_collect().await?
            }
        }
    };
}

/// Distinct scores per board up to which the `"array"` layout is the better
/// choice: each write rewrites the board's array (about 40 bytes a score).
pub const ARRAY_ADVISED: usize = 10_000;
/// Distinct scores the `"array"` layout refuses to pass: about 4 MB, a
/// quarter of MongoDB's 16 MiB document limit.
pub const ARRAY_LIMIT: usize = 100_000;
/// How long a write retries lost races (a concurrent upsert, a
/// transaction's write conflict) before it returns [`Error::Contended`]:
/// the bound of the driver's convenient transaction API.
const RETRY_BOUND: Duration = Duration::from_secs(120);
/// How long a non-atomic write waits for a concurrent writer's `+1` to
/// land.
const NON_ATOMIC_WAIT: Duration = Duration::from_secs(30);

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

/// Types a board field can have: BSON scalars that compare by value.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a rank board",
    label = "not a board key",
    note = "a board must be a String, an integer, an ObjectId or a Uuid; implement `mongo_patterns::rank_histogram::BoardKey` for a newtype that serializes to one"
)]
pub trait BoardKey {}

/// Numeric types a score field can have.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a rank score",
    label = "not a number",
    note = "a score must be an integer (i8 to i64, u8 to u64) or a float (f32, f64)"
)]
pub trait RankScore: Copy + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Whether the type is an integer (stored as BSON int64) or a float
    /// (stored as a double).
    const INTEGER: bool;
    /// The score as the number MongoDB compares.
    fn to_number(self) -> Number;
}

/// Scores `precision` can round: floating-point ones.
#[diagnostic::on_unimplemented(
    message = "`precision` rounds floating-point scores, and `{Self}` is not one",
    label = "integer scores are exact",
    note = "remove `precision`, or store the score as an f64"
)]
pub trait FloatScore {}

/// A score as a number: integers stay integers, so that they compare and
/// store exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer score (an unsigned one past `i64::MAX` is refused).
    Int(i128),
    /// A floating-point score.
    Float(f64),
}

macro_rules! int_scores {
    ($($t:ty),*) => {$(
        impl RankScore for $t {
            const INTEGER: bool = true;
            fn to_number(self) -> Number {
                Number::Int(self as i128)
            }
        }
    )*};
}
int_scores!(i8, i16, i32, i64, u8, u16, u32, u64);

impl RankScore for f64 {
    const INTEGER: bool = false;
    fn to_number(self) -> Number {
        Number::Float(self)
    }
}

impl RankScore for f32 {
    const INTEGER: bool = false;
    fn to_number(self) -> Number {
        Number::Float(f64::from(self))
    }
}

impl FloatScore for f32 {}
impl FloatScore for f64 {}

use crate::util::impls;
impls!(BoardKey: i8, i16, i32, i64, u8, u16, u32, u64, String, bson::oid::ObjectId, bson::Uuid);

/// Where a score stands on its board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq)]
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
pub struct Ranks<T: RankHistogram> {
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
    /// Whether the documents layout may send `bulkWrite`.
    bulk_write: bool,
    /// The name `bulkWrite` is sent under (tests make a server refuse it).
    bulk_command: &'static str,
    /// Whether `insert`, `update_score` and `delete` start transactions.
    transactions: bool,
    /// Whether they may write the player and the histogram one after the
    /// other when there is no transaction.
    allow_non_atomic: bool,
    /// Options of every operation that does not set its own.
    defaults: Arc<Options>,
}

impl<T: RankHistogram> Clone for Ranks<T> {
    fn clone(&self) -> Self {
        Ranks {
            db: self.db.clone(),
            source: self.source.clone(),
            hist: self.hist.clone(),
            spec: self.spec,
            no_transactions: self.no_transactions.clone(),
            no_bulk_write: self.no_bulk_write.clone(),
            bulk_write: self.bulk_write,
            bulk_command: self.bulk_command,
            transactions: self.transactions,
            allow_non_atomic: self.allow_non_atomic,
            defaults: self.defaults.clone(),
        }
    }
}

/// A write to the players' collection that the histogram follows.
enum SourceOp<'a, T: RankHistogram> {
    Insert(&'a T),
    Update(Document, T::Score),
    Delete(Document),
}

impl<T: RankHistogram> SourceOp<'_, T> {
    fn name(&self) -> &'static str {
        match self {
            SourceOp::Insert(_) => "insert",
            SourceOp::Update(..) => "update_score",
            SourceOp::Delete(_) => "delete",
        }
    }
}

/// What the histogram must do after a player's write.
struct Move {
    board: Bson,
    dec: Option<Bson>,
    inc: Option<Bson>,
}

impl Move {
    fn delta(&self) -> Delta<'_> {
        Delta {
            dec: self.dec.as_ref(),
            inc: self.inc.as_ref(),
        }
    }
}

/// Whether a histogram write runs in a transaction, and whose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Txn {
    /// None: races are retried here.
    No,
    /// After the player's write in the same transaction.
    AfterPlayer,
    /// The caller's, perhaps as its first command.
    Callers,
}

/// A write to a histogram: `-1` at `dec`, then `+1` at `inc`.
#[derive(Debug, Clone, Copy)]
struct Delta<'a> {
    dec: Option<&'a Bson>,
    inc: Option<&'a Bson>,
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
            bulk_write: true,
            bulk_command: "bulkWrite",
            transactions: true,
            allow_non_atomic: false,
            defaults: Default::default(),
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

    /// Whether the `"documents"` layout writes with one `bulkWrite` command
    /// (the default; MongoDB 8.0+). `false` sends what every server takes:
    /// an `update` command, then a `delete` command for a score emptied by
    /// a `-1`, so a `change` or `remove` costs two round trips instead of
    /// one, with the same checks and results; a call cancelled between the
    /// two may leave the emptied score at count 0, which reads skip and
    /// [`rebuild`](Self::rebuild) removes. A server that refuses
    /// `bulkWrite` (before 8.0) gets the same, learnt from its first
    /// refusal. The `"array"` layout sends one `update` either way.
    pub fn bulk_write(mut self, use_it: bool) -> Self {
        self.bulk_write = use_it;
        self
    }

    /// Sends `bulkWrite` under another name, so that a test can meet a
    /// server's real refusal of a command it does not know.
    #[doc(hidden)]
    pub fn __bulk_write_command(mut self, name: &'static str) -> Self {
        self.bulk_command = name;
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
    pub fn ensure(&self) -> crate::ensure::EnsureAction<'_> {
        crate::ensure::EnsureAction::new(&self.db, self.declared())
    }

    /// [`ensure`](Self::ensure), under its older name.
    pub fn ensure_indexes(&self) -> crate::ensure::EnsureAction<'_> {
        self.ensure()
    }

    /// What this repository needs in the deployment: the players'
    /// collection with its `{board, score}` index (which `rebuild` and
    /// `update_score` read through), and the histogram's collection.
    pub fn declared(&self) -> Vec<crate::ensure::Declared> {
        let (board, score) = (self.spec.board, self.spec.score);
        let dir = if self.spec.descending { -1 } else { 1 };
        vec![
            crate::ensure::Declared::new(self.source.name()).index(
                doc! {board: 1, score: dir},
                format!("mp_rank_{board}_{score}"),
            ),
            crate::ensure::Declared::new(self.hist.name()),
        ]
    }

    /// Counts one more player at `score` on `board`; creates the board and
    /// the score when they are new. One `update` command (one round trip;
    /// `bulkWrite` on the `"documents"` layout, or `update` without it).
    /// In a session without a transaction a lost upsert race is retried
    /// here; inside a caller's transaction it is returned as
    /// [`Error::Raced`] labelled `TransientTransactionError`, for the
    /// caller's `and_run2` to rerun the transaction. There the documents
    /// layout sends `update` (and `delete`, for `change` and `remove`)
    /// rather than `bulkWrite`, which refuses the `readConcern` the driver
    /// adds to a transaction's first command.
    pub fn record<'a, Q>(&'a self, board: &Q, score: T::Score) -> Record<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self
            .board_bson(board)
            .and_then(|b| Ok((b, self.score_bson(score)?)));
        Record::new(self, args)
    }

    /// Moves one player from `old` to `new`: both counts change together or
    /// neither does. One round trip, also when `new` is new to the board
    /// (two on the `"documents"` layout without `bulkWrite`).
    /// Fails with [`Error::ScoreNotFound`] when nobody holds `old`. Races
    /// as [`record`](Self::record).
    pub fn change<'a, Q>(&'a self, board: &Q, old: T::Score, new: T::Score) -> Change<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self
            .board_bson(board)
            .and_then(|b| Ok((b, self.score_bson(old)?, self.score_bson(new)?)));
        Change::new(self, args)
    }

    /// Counts one player fewer at `score`. Fails with
    /// [`Error::ScoreNotFound`] when nobody holds it: a count never goes
    /// below 0. One round trip (two on the `"documents"` layout without
    /// `bulkWrite`). Races as [`record`](Self::record).
    pub fn remove<'a, Q>(&'a self, board: &Q, score: T::Score) -> Remove<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self
            .board_bson(board)
            .and_then(|b| Ok((b, self.score_bson(score)?)));
        Remove::new(self, args)
    }

    /// Where `score` stands on `board`: ranks, ties, total. The sums run on
    /// the server, in one `aggregate` (one round trip), over the board's
    /// distinct scores. A score nobody holds still ranks (`ties` is 0).
    /// Fails with [`Error::UnknownBoard`] for a board never written, and
    /// with [`Error::Damaged`] for a board another client broke (a score
    /// listed twice, a count below 1). In a caller's transaction it reads
    /// the transaction's writes.
    pub fn rank<'a, Q>(&'a self, board: &Q, score: T::Score) -> RankOf<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let args = self
            .board_bson(board)
            .and_then(|b| Ok((b, self.score_bson(score)?)));
        RankOf::new(self, args)
    }

    async fn run_write(
        &self,
        args: Result<(Bson, Option<Bson>, Option<Bson>)>,
        o: Options,
        session: Option<&mut ClientSession>,
    ) -> Result<()> {
        let (b, dec, inc) = args?;
        let delta = Delta {
            dec: dec.as_ref(),
            inc: inc.as_ref(),
        };
        match session {
            None => self.write(&b, delta, &o, None, Txn::No).await,
            Some(s) => {
                let joined = crate::action::in_transaction(s).await;
                let (o, txn) = if joined {
                    (o.in_transaction(), Txn::Callers)
                } else {
                    (o, Txn::No)
                };
                self.write(&b, delta, &o, Some(s), txn).await
            }
        }
    }

    async fn run_rank(
        &self,
        args: Result<(Bson, Bson)>,
        o: Options,
        session: Option<&mut ClientSession>,
    ) -> Result<Rank> {
        let (b, s) = args?;
        let pipeline = self.rank_pipeline(&b, &s);
        let Some(d) = first_of(&self.hist, pipeline, o, session).await? else {
            return Err(self.unknown_board(&b));
        };
        match self.spec.layout {
            Layout::Array if d.get_bool("valid").ok() != Some(true) => {
                return Err(self.damage_or(&b, "the board check").await);
            }
            Layout::Documents => {
                if let Ok(bad) = d.get_document("bad") {
                    let id = bad.get("_id").cloned().unwrap_or(Bson::Null);
                    let (field, problem) = document_problem(bad)
                        .unwrap_or_else(|| ("count".into(), "fails the count check".into()));
                    return Err(Error::damaged(self.hist.name(), id, field, problem));
                }
            }
            Layout::Array => {}
        }
        let get = |f: &str| self.reply_count(&d, f, &b);
        let (above, distinct_above, ties, total) = (
            get("above")?,
            get("distinctAbove")?,
            get("ties")?,
            get("total")?,
        );
        Ok(Rank {
            rank: above + 1,
            dense: distinct_above + 1,
            above,
            ties,
            total,
        })
    }

    /// The aggregation [`rank`](Self::rank) runs, for `explain` or a review.
    pub fn rank_pipeline(&self, board: &Bson, score: &Bson) -> Vec<Document> {
        let better = if self.spec.descending { "$gt" } else { "$lt" };
        match self.spec.layout {
            Layout::Array => {
                let sum_where = |cond: Document| {
                    doc! {"$sum": {"$map": {
                        "input": {"$filter": {"input": "$scores", "as": "e", "cond": cond}},
                        "as": "e", "in": "$$e.count",
                    }}}
                };
                vec![
                    doc! {"$match": {"_id": board}},
                    // A damaged board is reported, not summed.
                    doc! {"$set": {"valid": valid_board(self.spec.descending)}},
                    doc! {"$set": {"scores": {"$cond": ["$valid", {"$ifNull": ["$scores", []]}, []]}}},
                    doc! {"$project": {
                        "_id": 0,
                        "valid": 1,
                        "above": sum_where(doc! {better: ["$$e.score", score]}),
                        "distinctAbove": {"$size": {"$filter": {
                            "input": "$scores", "as": "e",
                            "cond": {"$and": [{better: ["$$e.score", score]}, {"$gt": ["$$e.count", 0]}]},
                        }}},
                        "ties": sum_where(doc! {"$eq": ["$$e.score", score]}),
                        "total": {"$sum": {"$map": {"input": "$scores", "as": "e", "in": "$$e.count"}}},
                    }},
                ]
            }
            Layout::Documents => {
                let when = |cond: Document, then: Bson| doc! {"$sum": {"$cond": [cond, then, 0]}};
                vec![
                    doc! {"$match": crate::util::id_range("b", board)},
                    doc! {"$group": {
                        "_id": Bson::Null,
                        "above": when(doc! {better: ["$_id.s", score]}, "$count".into()),
                        "distinctAbove": when(
                            doc! {"$and": [{better: ["$_id.s", score]}, {"$gt": ["$count", 0]}]},
                            1.into(),
                        ),
                        "ties": when(doc! {"$eq": ["$_id.s", score]}, "$count".into()),
                        "total": {"$sum": "$count"},
                        // One damaged document, if any (`$max` skips nulls).
                        "bad": {"$max": {"$cond": [valid_document(), Bson::Null, "$$ROOT"]}},
                    }},
                ]
            }
        }
    }

    /// The scores of the first `places` places, best first, ties included
    /// (`top(board, 3)` on 100, 90, 90, 80 gives 100, 90 ×2: places 1 to 3).
    /// One round trip (`aggregate`, or `find` on the `"documents"`
    /// layout), reading at most `places` scores.
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
    pub fn histogram<'a, Q>(&'a self, board: &Q) -> Histogram<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Histogram::new(self, self.board_bson(board))
    }

    /// Inserts a player's document and counts its score, in one transaction
    /// (three round trips: `insert`, the histogram's write, commit).
    ///
    /// Given a session with a transaction open, it joins that transaction
    /// (two round trips; the caller commits) and never retries: a lost race
    /// comes back labelled `TransientTransactionError`. Given a session
    /// without one, it runs its own transaction in that session; without
    /// a session, in one of its own. A transaction of its own is retried
    /// as the driver's convenient API does (jittered backoff, 120 s in
    /// all). Dropped while its own transaction is open in your session,
    /// the call has the server kill that session (which frees what it
    /// locked); the session still shows the transaction open: abort it or
    /// drop the session.
    pub fn insert<'a>(&'a self, doc: &'a T) -> Insert<'a, T> {
        Insert::new(self, doc)
    }

    /// Sets the score of the first player document `filter` matches and
    /// moves it on the histogram, in one transaction (`findAndModify`, the
    /// histogram's write, commit). Returns whether a document matched.
    /// Sessions and transactions as [`insert`](Self::insert).
    pub fn update_score(&self, filter: Document, new: T::Score) -> UpdateScore<'_, T> {
        UpdateScore::new(self, (filter, new))
    }

    /// Deletes the first player document `filter` matches and uncounts its
    /// score, in one transaction (`findAndModify`, the histogram's write,
    /// commit). Returns whether a document matched. Sessions and
    /// transactions as [`insert`](Self::insert).
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
    pub fn rebuild<'a, Q>(&'a self, board: &Q) -> Rebuild<'a, T>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        Rebuild::new(self, self.board_bson(board))
    }

    async fn run_top(
        &self,
        args: Result<(Bson, u32)>,
        o: Options,
        session: Option<&mut ClientSession>,
    ) -> Result<Vec<ScoreCount<T::Score>>> {
        let (b, places) = args?;
        if places == 0 {
            return Ok(Vec::new());
        }
        let mut all = self.read(&b, Some(places), o, session).await?;
        all.retain(|s| s.rank <= u64::from(places));
        Ok(all)
    }

    async fn run_histogram(
        &self,
        board: Result<Bson>,
        o: Options,
        session: Option<&mut ClientSession>,
    ) -> Result<Vec<ScoreCount<T::Score>>> {
        self.read(&board?, None, o, session).await
    }

    async fn run_rebuild(
        &self,
        board: Result<Bson>,
        o: Options,
        mut session: Option<&mut ClientSession>,
    ) -> Result<u64> {
        let b = board?;
        let joined = match session.as_deref_mut() {
            Some(s) => crate::action::in_transaction(s).await,
            None => false,
        };
        let o = if joined { o.in_transaction() } else { o };
        let score = format!("${}", self.spec.score);
        let key = match quantum(self.spec.precision) {
            Quantum::Exact => Bson::String(score),
            Quantum::Inverse(k) => bson::bson!({"$divide": [
                {"$floor": {"$add": [{"$multiply": [score, k]}, 0.5]}}, k]}),
            Quantum::Step(p) => bson::bson!({"$multiply": [
                {"$floor": {"$add": [{"$divide": [score, p]}, 0.5]}}, p]}),
        };
        let dir = if self.spec.descending { -1 } else { 1 };
        let pipeline = vec![
            doc! {"$match": {
                self.spec.board: &b,
                self.spec.score: {"$type": "number", "$gt": f64::NEG_INFINITY, "$lt": f64::INFINITY},
            }},
            doc! {"$group": {"_id": key, "count": {"$sum": 1}}},
            // A score that rounding would take past the largest double.
            doc! {"$match": {"_id": {"$gt": f64::NEG_INFINITY, "$lt": f64::INFINITY}}},
            doc! {"$sort": {"_id": dir}},
        ];
        let reads = Options {
            write_concern: None,
            ..o.clone()
        };
        let players = self.source.clone_with_type::<Document>();
        let aggregate = players.aggregate(pipeline).with_options(reads.driver());
        let groups: Vec<Document> = all_of!(aggregate, session.as_deref_mut());
        let mut total = 0;
        let mut scores = Vec::with_capacity(groups.len());
        for g in &groups {
            let s = g.get("_id").cloned().unwrap_or(Bson::Null);
            let n = g
                .get("count")
                .and_then(crate::util::int)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or_default();
            total += n;
            scores.push((self.normalize(s), n));
        }
        let writes = Options {
            read_concern: None,
            selection_criteria: None,
            ..o
        };
        match self.spec.layout {
            Layout::Array => {
                let arr: Vec<Bson> = scores
                    .iter()
                    .map(|(s, n)| Bson::Document(doc! {"score": s, "count": *n as i64}))
                    .collect();
                let replace = self
                    .hist
                    .replace_one(doc! {"_id": &b}, doc! {"_id": &b, "scores": arr})
                    .with_options(writes.driver())
                    .upsert(true);
                crate::action::run!(replace, session.as_deref_mut())?;
            }
            Layout::Documents => {
                let delete = self
                    .hist
                    .delete_many(crate::util::id_range("b", &b))
                    .with_options(writes.driver());
                crate::action::run!(delete, session.as_deref_mut())?;
                let mut docs: Vec<Document> = scores
                    .iter()
                    .map(|(s, n)| doc! {"_id": {"b": &b, "s": s}, "count": *n as i64})
                    .collect();
                // The marker that keeps an emptied board known.
                docs.push(doc! {"_id": {"b": &b, "s": Bson::MinKey}, "count": 0_i64});
                let insert = self.hist.insert_many(docs).with_options(writes.driver());
                crate::action::run!(insert, session)?;
            }
        }
        Ok(total)
    }

    /// `op` in a transaction: the caller's, when `session` has one open;
    /// otherwise one of its own (in `session`, or in a session of its own),
    /// through the driver's convenient API: a transient failure (a write
    /// conflict with another writer of the same board, a lost upsert race,
    /// a dropped connection) reruns it after a jittered backoff, and an
    /// unknown commit result retries the commit, for up to 120 s in all. A
    /// call dropped while its own transaction is open has the server abort
    /// it at once (`killSessions`), so the players and board it touched are
    /// free for the next writer.
    async fn run_atomically(
        &self,
        op: SourceOp<'_, T>,
        o: Options,
        mut session: Option<&mut ClientSession>,
    ) -> Result<bool> {
        let no_txn = !self.transactions || self.no_transactions.load(Ordering::Relaxed);
        let joined = match session.as_deref_mut() {
            Some(s) => crate::action::in_transaction(s).await,
            None => false,
        };
        let mut txn = match session {
            Some(s) if joined => return self.source_op(&op, &o.in_transaction(), s).await,
            Some(s) if no_txn => return self.non_atomic(&op, &o, Some(s)).await,
            None if no_txn => return self.non_atomic(&op, &o, None).await,
            Some(s) => OpenTransaction::new(Held::Borrowed(s)),
            None => OpenTransaction::new(Held::Owned(Some(Box::new(
                self.db.client().start_session().await?,
            )))),
        };
        match self.own_transaction(&op, &o, &mut txn).await {
            // A standalone refuses on the first write, before writing.
            Err(Error::NoTransactions { .. }) => {
                self.no_transactions.store(true, Ordering::Relaxed);
                self.non_atomic(&op, &o, txn.session()).await
            }
            other => other,
        }
    }

    /// `op` in a transaction of its own in `txn`'s session, through
    /// `and_run2`. `NoTransactions` when the deployment refused one.
    async fn own_transaction(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        txn: &mut OpenTransaction<'_>,
    ) -> Result<bool> {
        let Some(session) = txn.session() else {
            // Only `Drop` takes the session out.
            return Err(Error::invalid("session", "no session"));
        };
        let inside = o.clone().in_transaction();
        let mut stashed: Option<Error> = None;
        let mut attempts = 0;
        let result = session
            .start_transaction()
            .with_options(transaction_options(o))
            // `and_run` rather than `and_run2`: the latter's async closure
            // trips rust-lang/rust#96865 here ("implementation of `Send` is
            // not general enough" for `&Ranks<T>`, `&Options`, … when the
            // action boxes this future as `Send`), even with owned captures.
            // Same retries, backoff and 120 s bound.
            .and_run(
                (self, op, &inside, &mut stashed, &mut attempts),
                |s, (this, op, inside, stashed, attempts)| {
                    Box::pin(async move {
                        **attempts += 1;
                        match this.source_op(op, inside, s).await {
                            Ok(r) => Ok(r),
                            Err(e) => Err(to_driver(e, stashed)),
                        }
                    })
                },
            )
            .await;
        if matches!(txn.session, Held::Borrowed(_)) {
            // `and_run` has committed or aborted: the caller's session is
            // only killed when this call is dropped mid-transaction.
            txn.armed = false;
        }
        let e = match result {
            Ok(r) => {
                txn.armed = false;
                return Ok(r);
            }
            Err(e) => e,
        };
        if e.get_custom::<Stashed>().is_some() {
            // The callback's own error; `and_run2` aborted the transaction.
            txn.armed = false;
            return Err(stashed.unwrap_or_else(|| Error::Database(e)));
        }
        if matches!(*e.kind, mongodb::error::ErrorKind::Transaction { .. })
            && e.to_string().contains("maximum time")
        {
            return Err(Error::Contended {
                operation: op.name(),
                attempts,
            });
        }
        let e = Error::from(e);
        if refused_transaction(&e) {
            txn.armed = false;
            return Err(Error::NoTransactions {
                operation: op.name(),
            });
        }
        Err(e)
    }

    /// `op` without a transaction, where the caller allowed it.
    async fn non_atomic(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        mut session: Option<&mut ClientSession>,
    ) -> Result<bool> {
        if !self.allow_non_atomic {
            return Err(Error::NoTransactions {
                operation: op.name(),
            });
        }
        let Some(m) = self.player_write(op, o, session.as_deref_mut()).await? else {
            return Ok(false);
        };
        // `+1` first: it cannot fail for want of a count, so no two writers
        // can each wait for the other's.
        if let Some(i) = &m.inc {
            let inc = Delta {
                dec: None,
                inc: Some(i),
            };
            self.write(&m.board, inc, o, session.as_deref_mut(), Txn::No)
                .await?;
        }
        let Some(d) = &m.dec else { return Ok(true) };
        let dec = Delta {
            dec: Some(d),
            inc: None,
        };
        // A concurrent writer may have moved this player onto the old score
        // with its `+1` still to land.
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            match self
                .write(&m.board, dec, o, session.as_deref_mut(), Txn::No)
                .await
            {
                Err(Error::ScoreNotFound { .. }) if start.elapsed() < NON_ATOMIC_WAIT => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other.map(|()| true),
            }
        }
    }

    /// One write to the players' collection and the matching histogram
    /// write, in `session`'s transaction; `false` when the filter matched
    /// nothing.
    async fn source_op(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        session: &mut ClientSession,
    ) -> Result<bool> {
        let Some(m) = self.player_write(op, o, Some(&mut *session)).await? else {
            return Ok(false);
        };
        self.write(&m.board, m.delta(), o, Some(session), Txn::AfterPlayer)
            .await?;
        Ok(true)
    }

    /// The player's half of `op`; what the histogram must then do, or
    /// `None` when the filter matched nothing. Scores are checked before
    /// anything is sent.
    async fn player_write(
        &self,
        op: &SourceOp<'_, T>,
        o: &Options,
        session: Option<&mut ClientSession>,
    ) -> Result<Option<Move>> {
        let (old, new) = match op {
            SourceOp::Insert(doc) => {
                let board = self.board_bson(doc.board())?;
                let s = self.score_bson(doc.score())?;
                let insert = self.source.insert_one(*doc).with_options(o.driver());
                crate::action::run!(insert, session)?;
                return Ok(Some(Move {
                    board,
                    dec: None,
                    inc: Some(s),
                }));
            }
            SourceOp::Update(filter, new) => {
                let n = self.score_bson(*new)?;
                let set = doc! {"$set": {self.spec.score: crate::compat::to_bson(new)?}};
                let update = self
                    .source
                    .find_one_and_update(filter.clone(), set)
                    .with_options(o.driver());
                (crate::action::run!(update, session)?, Some(n))
            }
            SourceOp::Delete(filter) => {
                let delete = self
                    .source
                    .find_one_and_delete(filter.clone())
                    .with_options(o.driver());
                (crate::action::run!(delete, session)?, None)
            }
        };
        let Some(old) = old else { return Ok(None) };
        Ok(Some(Move {
            board: self.board_bson(old.board())?,
            dec: Some(self.score_bson(old.score())?),
            inc: new,
        }))
    }

    /// Applies `delta` to `board`'s histogram. Outside a transaction a lost
    /// upsert race is retried here, after a jittered backoff, for up to
    /// 120 s; inside one (`in_txn`) the whole transaction is, by whoever
    /// owns it: the error carries `TransientTransactionError`.
    async fn write(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        o: &Options,
        mut session: Option<&mut ClientSession>,
        txn: Txn,
    ) -> Result<()> {
        if txn != Txn::No {
            return match self.write_once(board, delta, o, session, txn).await {
                Err(Error::Raced(e)) => Err(crate::action::raced_in_transaction(e)),
                other => other,
            };
        }
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            match self
                .write_once(board, delta, o, session.as_deref_mut(), Txn::No)
                .await
            {
                Err(Error::Raced(_)) if start.elapsed() < RETRY_BOUND => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(Error::Raced(_)) => {
                    return Err(Error::Contended {
                        operation: "rank write",
                        attempts: attempt as usize + 1,
                    })
                }
                other => return other,
            }
        }
    }

    async fn write_once(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        o: &Options,
        session: Option<&mut ClientSession>,
        txn: Txn,
    ) -> Result<()> {
        match self.spec.layout {
            Layout::Array => self.write_array(board, delta, o, session).await,
            Layout::Documents => self.write_documents(board, delta, o, session, txn).await,
        }
    }

    async fn write_array(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        o: &Options,
        session: Option<&mut ClientSession>,
    ) -> Result<()> {
        let mut filter = doc! {"_id": board};
        if let Some(d) = delta.dec {
            filter.insert(
                "scores",
                doc! {"$elemMatch": {"score": d, "count": {"$gt": 0}}},
            );
        }
        if let Some(i) = delta.inc {
            // The score is there already, or there is room for one more.
            let last = format!("scores.{}", ARRAY_LIMIT - 1);
            filter.insert(
                "$or",
                vec![doc! {"scores.score": i}, doc! {last: {"$exists": false}}],
            );
        }
        let pipeline = array_update(delta, self.spec.descending);
        let update = self
            .hist
            .update_one(filter, pipeline)
            .with_options(o.driver())
            .upsert(delta.dec.is_none());
        let result = crate::action::run!(update, session);
        match result {
            Ok(r) if r.matched_count > 0 || r.upserted_id.is_some() => Ok(()),
            Ok(_) => Err(self.why_not_written(board, delta).await),
            // The upsert of a board that exists: it is full, or a concurrent
            // writer created it (retried).
            Err(e) if is_duplicate_mongo(&e) => {
                if let Some(i) = delta.inc {
                    if self.array_full(board, i).await? {
                        return Err(Error::invalid(
                            "score",
                            format!("board {board} holds {ARRAY_LIMIT} distinct scores, the limit of `layout = \"array\"`; use `layout = \"documents\"`"),
                        ));
                    }
                }
                Err(Error::Raced(e))
            }
            Err(e) if e.contains_label(TRANSIENT_TRANSACTION_ERROR) => Err(e.into()),
            // The pipeline refused a damaged board.
            Err(e) if server_codes(&e).contains(&REFUSED) => {
                Err(self.damage_or(board, "the board check").await)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The documents layout's write, in order: check the target of `+1`
    /// when a `-1` comes first, `-1` (refused, writing nothing, when nobody
    /// holds the score), the board's marker, the removal of a score that
    /// reached 0, then `+1`. One `bulkWrite` command (one round trip) on
    /// MongoDB 8.0+; on an older server, which refuses `bulkWrite`, an
    /// `update` command with the update statements, then a `delete` command
    /// for the emptied score (two round trips when a `-1` is sent, one
    /// otherwise).
    async fn write_documents(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        o: &Options,
        session: Option<&mut ClientSession>,
        txn: Txn,
    ) -> Result<()> {
        let in_transaction = txn != Txn::No;
        let id = |s: &Bson| doc! {"b": board, "s": s};
        let valid = doc! {"$and": [
            {"$in": [{"$type": "$count"}, ["int", "long"]]},
            {"$gte": ["$count", 0]},
        ]};
        let set = |s: &Bson, set: Bson, upsert: bool| Statement::Update {
            filter: doc! {"_id": id(s)},
            update: bson::bson!([{"$set": {"count": set}}]),
            upsert,
        };
        let mut ops = Vec::new();
        if let Some(d) = delta.dec {
            if let Some(i) = delta.inc {
                // Nothing is written when the `+1` would land on a damaged
                // count.
                let same = bson::bson!({"$cond": [&valid, "$count", refuse()]});
                ops.push(set(i, same, false));
            }
            let minus = bson::bson!({"$cond": [
                {"$and": [&valid, {"$gt": ["$count", 0]}]},
                {"$add": ["$count", -1_i64]},
                refuse(),
            ]});
            // An upsert, so that a missing score is refused rather than
            // matching nothing while the `+1` goes ahead.
            ops.push(set(d, minus, true));
            ops.push(Statement::Update {
                filter: doc! {"_id": id(&Bson::MinKey)},
                update: bson::bson!({"$setOnInsert": {"count": 0_i64}}),
                upsert: true,
            });
            ops.push(Statement::Delete {
                filter: doc! {"_id": id(d), "count": 0},
            });
        }
        if let Some(i) = delta.inc {
            let plus = bson::bson!({"$cond": [
                {"$eq": [{"$type": "$count"}, "missing"]},
                1_i64,
                {"$cond": [&valid, {"$add": ["$count", 1_i64]}, refuse()]},
            ]});
            ops.push(set(i, plus, true));
        }
        // The fallback's order: the updates, then the delete. A `+1` that
        // lands before the delete leaves its count above 0, so the delete
        // (of a count of 0 only) removes the same scores.
        // Chosen once per call, so that a clone learning of a refusal
        // meanwhile does not change the order under a resumed call.
        // Not as a caller's transaction's possibly first command: the driver
        // adds `readConcern` to that one, which `bulkWrite` refuses.
        let mut bulk = self.uses_bulk_write() && txn != Txn::Callers;
        if !bulk {
            ops.sort_by_key(|op| matches!(op, Statement::Delete { .. }));
        }
        let mut session = session;
        let (mut from, mut resumed, started) = (0, 0, Instant::now());
        loop {
            let failed = if bulk {
                match self
                    .bulk_write_once(&ops[from..], o, session.as_deref_mut(), in_transaction)
                    .await
                {
                    Err(e) if refused_bulk_write(&e) => {
                        // Nothing was written: the server does not know the
                        // command. Inside a transaction the whole
                        // transaction is rerun, as the server may have
                        // aborted it.
                        self.no_bulk_write.store(true, Ordering::Relaxed);
                        if in_transaction {
                            return Err(Error::Raced(e));
                        }
                        bulk = false;
                        ops[from..].sort_by_key(|op| matches!(op, Statement::Delete { .. }));
                        continue;
                    }
                    r => r?,
                }
            } else {
                self.commands_once(&ops[from..], o, session.as_deref_mut(), in_transaction)
                    .await?
            };
            let Some((idx, e)) = failed else {
                return Ok(());
            };
            match server_codes(&e).first().copied().unwrap_or_default() {
                // Inside a transaction the server aborted it: it is rerun.
                DUPLICATE_KEY | WRITE_CONFLICT if in_transaction => return Err(Error::Raced(e)),
                // A concurrent writer created the document first (that
                // upsert is now an update), or wrote it at the same time:
                // what came before is written, so go on from there.
                DUPLICATE_KEY | WRITE_CONFLICT if started.elapsed() < RETRY_BOUND => {
                    from += idx;
                    tokio::time::sleep(backoff(resumed)).await;
                    resumed += 1;
                }
                DUPLICATE_KEY | WRITE_CONFLICT => {
                    return Err(Error::Contended {
                        operation: "rank write",
                        attempts: resumed as usize + 1,
                    })
                }
                REFUSED => return Err(self.why_not_written(board, delta).await),
                _ => return Err(Error::Database(e)),
            }
        }
    }

    /// Whether the documents layout sends `bulkWrite`: allowed, and not
    /// refused by this deployment yet.
    fn uses_bulk_write(&self) -> bool {
        self.bulk_write && !self.no_bulk_write.load(Ordering::Relaxed)
    }

    /// `ops` as one ordered `bulkWrite` command; the first failed one, as
    /// (index in `ops`, the server's error). A `writeConcernError` is the
    /// error of the whole command.
    async fn bulk_write_once(
        &self,
        ops: &[Statement],
        o: &Options,
        session: Option<&mut ClientSession>,
        in_transaction: bool,
    ) -> std::result::Result<Option<(usize, mongodb::error::Error)>, mongodb::error::Error> {
        let ops: Vec<Document> = ops
            .iter()
            .map(|op| match op {
                Statement::Update {
                    filter,
                    update,
                    upsert,
                } => doc! {
                    "update": 0, "filter": filter, "multi": false, "upsert": upsert,
                    "updateMods": update,
                },
                Statement::Delete { filter } => {
                    doc! {"delete": 0, "filter": filter, "multi": false}
                }
            })
            .collect();
        let ns = format!("{}.{}", self.db.name(), self.hist.name());
        let mut command = doc! {
            self.bulk_command: 1, "ops": ops, "nsInfo": [{"ns": &ns}],
            "ordered": true, "errorsOnly": true,
        };
        self.command_options(&mut command, o, in_transaction)?;
        let admin = self.db.client().database("admin");
        let reply = crate::action::run!(admin.run_command(command), session)?;
        if let Some(failed) = first_bulk_error(&reply) {
            return Ok(Some(failed));
        }
        crate::action::command_write_errors(&reply)?;
        Ok(None)
    }

    /// `o` on a `run_command` write, which inherits nothing: the effective
    /// write concern (the operation's, else the histogram collection's,
    /// which has the database's and the client's), except inside a
    /// transaction, whose own applies.
    fn command_options(&self, command: &mut Document, o: &Options, in_txn: bool) -> Result<()> {
        let inherited = if in_txn {
            None
        } else {
            self.hist.write_concern()
        };
        o.command_fields(command, inherited, true)
    }

    /// `ops` as the commands every server takes: one ordered `update`
    /// command with the update statements, then one `delete` command (the
    /// fallback sorts the delete last). The first failed statement, as
    /// (index in `ops`, code, message).
    async fn commands_once(
        &self,
        ops: &[Statement],
        o: &Options,
        mut session: Option<&mut ClientSession>,
        in_transaction: bool,
    ) -> Result<Option<(usize, mongodb::error::Error)>> {
        let split = ops
            .iter()
            .position(|op| matches!(op, Statement::Delete { .. }))
            .unwrap_or(ops.len());
        let (updates, deletes) = ops.split_at(split);
        let mut commands = Vec::new();
        if !updates.is_empty() {
            let stmts: Vec<Document> = updates
                .iter()
                .filter_map(|op| match op {
                    Statement::Update {
                        filter,
                        update,
                        upsert,
                    } => Some(doc! {"q": filter, "u": update, "upsert": upsert, "multi": false}),
                    Statement::Delete { .. } => None,
                })
                .collect();
            commands.push((
                0,
                doc! {"update": self.hist.name(), "updates": stmts, "ordered": true},
            ));
        }
        if !deletes.is_empty() {
            let stmts: Vec<Document> = deletes
                .iter()
                .filter_map(|op| match op {
                    Statement::Delete { filter } => Some(doc! {"q": filter, "limit": 1}),
                    Statement::Update { .. } => None,
                })
                .collect();
            commands.push((
                split,
                doc! {"delete": self.hist.name(), "deletes": stmts, "ordered": true},
            ));
        }
        for (offset, mut command) in commands {
            self.command_options(&mut command, o, in_transaction)?;
            let run = self.db.run_command(command);
            let reply = crate::action::run!(run, session.as_deref_mut())?;
            if let Some((idx, e)) = first_write_error(&reply) {
                return Ok(Some((offset + idx, e)));
            }
            crate::action::command_write_errors(&reply)?;
        }
        Ok(None)
    }

    /// After a write that matched nothing or was refused: a damaged board,
    /// an unknown board, or a score nobody holds.
    async fn why_not_written(&self, board: &Bson, delta: Delta<'_>) -> Error {
        match self.board_damage(board).await {
            Err(e) => return e,
            Ok(Some(e)) => return e,
            Ok(None) => {}
        }
        let exists = match self.spec.layout {
            Layout::Array => self.hist.find_one(doc! {"_id": board}).await,
            Layout::Documents => self.hist.find_one(crate::util::id_range("b", board)).await,
        };
        match exists {
            Err(e) => e.into(),
            Ok(None) => self.unknown_board(board),
            Ok(Some(_)) => Error::ScoreNotFound {
                board: board.to_string(),
                score: delta.dec.map(Bson::to_string).unwrap_or_default(),
            },
        }
    }

    /// The damage the server saw on `board`, named by a look at it; `check`
    /// says which server-side check failed if the look finds nothing.
    async fn damage_or(&self, board: &Bson, check: &str) -> Error {
        match self.board_damage(board).await {
            Err(e) | Ok(Some(e)) => e,
            Ok(None) => Error::damaged(
                self.hist.name(),
                board.clone(),
                "scores",
                format!("fails {check}"),
            ),
        }
    }

    /// [`Error::Damaged`] for the first broken document of `board`, if any.
    async fn board_damage(&self, board: &Bson) -> Result<Option<Error>> {
        let found = match self.spec.layout {
            Layout::Array => match self.hist.find_one(doc! {"_id": board}).await? {
                None => None,
                Some(d) => array_problem(&d, self.spec.descending).map(|p| (board.clone(), p)),
            },
            Layout::Documents => {
                let mut filter = crate::util::id_range("b", board);
                filter.insert(
                    "$or",
                    vec![
                        doc! {"count": {"$not": {"$type": ["int", "long"]}}},
                        doc! {"count": {"$lt": 0}},
                        doc! {"_id.s": {"$not": {"$type": "number"}}},
                    ],
                );
                let suspects: Vec<Document> = self
                    .hist
                    .find(filter)
                    .limit(16)
                    .await?
                    .try_collect()
                    .await?;
                suspects.iter().find_map(|d| {
                    let p = document_problem(d)?;
                    Some((d.get("_id").cloned().unwrap_or(Bson::Null), p))
                })
            }
        };
        Ok(
            found
                .map(|(id, (field, problem))| Error::damaged(self.hist.name(), id, field, problem)),
        )
    }

    async fn array_full(&self, board: &Bson, score: &Bson) -> Result<bool> {
        let last = format!("scores.{}", ARRAY_LIMIT - 1);
        let full = self
            .hist
            .find_one(doc! {"_id": board, last: {"$exists": true}, "scores.score": {"$ne": score}})
            .projection(doc! {"_id": 1})
            .await?;
        Ok(full.is_some())
    }

    /// A board's scores best first, with ranks; at most `limit` scores.
    async fn read(
        &self,
        board: &Bson,
        limit: Option<u32>,
        o: Options,
        mut session: Option<&mut ClientSession>,
    ) -> Result<Vec<ScoreCount<T::Score>>> {
        let dir = if self.spec.descending { -1 } else { 1 };
        let rows: Vec<(Bson, Document)> = match self.spec.layout {
            Layout::Array => {
                // A valid board is sorted best first, every count at least 1.
                let all = bson::bson!({"$ifNull": ["$scores", []]});
                let scores = match limit {
                    Some(n) => bson::bson!({"$slice": [all, i64::from(n)]}),
                    None => all,
                };
                // One document back, whatever `limit`: the first batch holds
                // the answer.
                let pipeline = vec![
                    doc! {"$match": {"_id": board}},
                    doc! {"$set": {"valid": valid_board(self.spec.descending)}},
                    doc! {"$project": {"valid": 1, "scores": {"$cond": ["$valid", scores, []]}}},
                ];
                let Some(d) = first_of(&self.hist, pipeline, o, session).await? else {
                    return Err(self.unknown_board(board));
                };
                if d.get_bool("valid").ok() != Some(true) {
                    return Err(self.damage_or(board, "the board check").await);
                }
                let entries = d.get_array("scores").map_err(|_| {
                    Error::damaged(self.hist.name(), board.clone(), "scores", "is not an array")
                })?;
                entries
                    .iter()
                    .filter_map(Bson::as_document)
                    .map(|e| (board.clone(), e.clone()))
                    .collect()
            }
            Layout::Documents => {
                let mut filter = crate::util::id_range("b", board);
                // Count 0: the board's marker (and emptied scores a former
                // version kept); anything else is checked below.
                filter.insert("count", doc! {"$ne": 0});
                let o = read_options(o, session.as_deref_mut()).await;
                let find = self
                    .hist
                    .find(filter)
                    .with_options(o.driver())
                    .sort(doc! {"_id": dir})
                    .batch_size(limit.unwrap_or(ARRAY_LIMIT as u32));
                let find = match limit {
                    Some(n) => find.limit(i64::from(n)),
                    None => find,
                };
                let docs: Vec<Document> = all_of!(find, session.as_deref_mut());
                let mut rows = Vec::with_capacity(docs.len());
                for d in docs {
                    let id = d.get("_id").cloned().unwrap_or(Bson::Null);
                    if let Some((field, problem)) = document_problem(&d) {
                        return Err(Error::damaged(self.hist.name(), id, field, problem));
                    }
                    let s = d
                        .get_document("_id")
                        .ok()
                        .and_then(|i| i.get("s").cloned())
                        .unwrap_or(Bson::Null);
                    let count = d.get("count").cloned().unwrap_or(Bson::Null);
                    rows.push((id, doc! {"score": s, "count": count}));
                }
                if rows.is_empty() {
                    let any = self
                        .hist
                        .find_one(crate::util::id_range("b", board))
                        .with_options(o.driver());
                    if crate::action::run!(any, session)?.is_none() {
                        return Err(self.unknown_board(board));
                    }
                }
                rows
            }
        };
        let mut out = Vec::with_capacity(rows.len());
        let mut above = 0;
        for (id, row) in rows {
            let n = self.reply_count(&row, "count", &id)?;
            let s = row.get("score").cloned().unwrap_or(Bson::Null);
            let score = crate::compat::from_bson::<T::Score>(s.clone()).map_err(|e| {
                Error::UnexpectedDocument {
                    collection: self.hist.name().to_owned(),
                    id: Box::new(id.clone()),
                    source: e,
                }
            })?;
            out.push(ScoreCount {
                score,
                count: n,
                rank: above + 1,
            });
            above += n;
        }
        Ok(out)
    }

    /// A count in a reply about document `id`.
    fn reply_count(&self, d: &Document, field: &str, id: &Bson) -> Result<u64> {
        d.get(field)
            .and_then(crate::util::int)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| {
                let found = d.get(field).map_or("nothing".to_owned(), Bson::to_string);
                Error::damaged(
                    self.hist.name(),
                    id.clone(),
                    "count",
                    format!("sums to {found}, not a count"),
                )
            })
    }

    fn unknown_board(&self, board: &Bson) -> Error {
        Error::UnknownBoard {
            collection: self.hist.name().to_owned(),
            board: board.to_string(),
        }
    }

    fn board_bson<Q: Serialize + ?Sized>(&self, board: &Q) -> Result<Bson> {
        Ok(crate::compat::to_bson(board)?)
    }

    /// The score as stored on the histogram: checked, rounded to the
    /// precision, and of one BSON type per model.
    fn score_bson(&self, score: T::Score) -> Result<Bson> {
        match score.to_number() {
            Number::Int(i) => i64::try_from(i).map(Bson::Int64).map_err(|_| {
                Error::invalid(
                    "score",
                    format!("{i} is past i64::MAX, which BSON cannot hold"),
                )
            }),
            Number::Float(f) if !f.is_finite() => Err(Error::invalid(
                "score",
                format!("{f} cannot be ranked: scores must be finite numbers"),
            )),
            Number::Float(f) => match round(f, self.spec.precision) {
                r if r.is_finite() => Ok(Bson::Double(r)),
                _ => Err(Error::invalid(
                    "score",
                    format!(
                        "{f} rounded to precision {} passes the largest double",
                        self.spec.precision.unwrap_or_default()
                    ),
                )),
            },
        }
    }

    /// A score from `rebuild`'s grouping, in the BSON type `score_bson` uses.
    fn normalize(&self, s: Bson) -> Bson {
        match (s, T::Score::INTEGER) {
            (Bson::Int32(i), true) => Bson::Int64(i.into()),
            (Bson::Int32(i), false) => Bson::Double(f64::from(i)),
            (Bson::Int64(i), false) => Bson::Double(i as f64),
            (Bson::Double(f), false) => Bson::Double(f + 0.0),
            (other, _) => other,
        }
    }
}

/// The options of a transaction of the call's own: its write concern
/// (sent with the commit), read concern, read preference and the commit's
/// time bound; `None` when none is set.
fn transaction_options(o: &Options) -> Option<mongodb::options::TransactionOptions> {
    if o.write_concern.is_none()
        && o.read_concern.is_none()
        && o.selection_criteria.is_none()
        && o.max_time.is_none()
    {
        return None;
    }
    let mut t = mongodb::options::TransactionOptions::default();
    t.write_concern = o.write_concern.clone();
    t.read_concern = o.read_concern.clone();
    t.selection_criteria = o.selection_criteria.clone();
    t.max_commit_time = o.max_time;
    Some(t)
}

/// `o` for a read in `session`: inside its transaction without the read
/// concern, which belongs to the transaction. Asks only when there is one
/// to drop.
async fn read_options(o: Options, session: Option<&mut ClientSession>) -> Options {
    match session {
        Some(s) if o.read_concern.is_some() => {
            if crate::action::in_transaction(s).await {
                o.in_transaction()
            } else {
                o
            }
        }
        _ => o,
    }
}

/// The first document `pipeline` gives on `coll`, read with `o`, in
/// `session` when there is one.
async fn first_of(
    coll: &Collection<Document>,
    pipeline: Vec<Document>,
    o: Options,
    mut session: Option<&mut ClientSession>,
) -> Result<Option<Document>> {
    let o = read_options(o, session.as_deref_mut()).await;
    let aggregate = coll.aggregate(pipeline).with_options(o.driver());
    Ok(match session {
        None => aggregate.await?.try_next().await?,
        Some(s) => {
            let mut cursor = aggregate.session(&mut *s).await?;
            cursor.next(s).await.transpose()?
        }
    })
}

/// A transaction a call has open. Dropped while armed (the call's future
/// was dropped: a timeout, a `select!`), it has the server kill the session,
/// which aborts the transaction and frees what it locked, before the
/// session goes back to the pool. The driver alone would not: a session
/// whose first command of the transaction was still in flight is pooled as
/// it is, and its transaction holds its locks until the server's
/// transaction lifetime (60 s by default) runs out. A caller's session is
/// killed on the server too; the caller still holds it, with the
/// transaction open locally, to abort or drop.
struct OpenTransaction<'s> {
    session: Held<'s>,
    armed: bool,
}

/// The session a call's own transaction runs in.
enum Held<'s> {
    /// A session of the call's own (`None` once `Drop` took it), boxed:
    /// a session is large, a borrowed one a pointer.
    Owned(Option<Box<ClientSession>>),
    /// The caller's.
    Borrowed(&'s mut ClientSession),
}

impl<'s> OpenTransaction<'s> {
    fn new(session: Held<'s>) -> Self {
        OpenTransaction {
            session,
            armed: true,
        }
    }

    fn session(&mut self) -> Option<&mut ClientSession> {
        match &mut self.session {
            Held::Owned(s) => s.as_deref_mut(),
            Held::Borrowed(s) => Some(&mut **s),
        }
    }
}

impl Drop for OpenTransaction<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The driver runs on tokio; outside a runtime there is nothing to
        // spawn on, and the server's transaction lifetime still applies.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, id, owned) = match &mut self.session {
            Held::Owned(s) => match s.take() {
                Some(s) => (s.client(), s.id().clone(), Some(s)),
                None => return,
            },
            Held::Borrowed(s) => (s.client(), s.id().clone(), None),
        };
        runtime.spawn(async move {
            let kill = doc! {"killSessions": [id]};
            let _ = client.database("admin").run_command(kill).await;
            drop(owned);
        });
    }
}

/// The marker of an error of ours carried through `and_run2`.
struct Stashed;

/// An error of the transaction's callback as `and_run2` needs it: the
/// driver's own (with its labels), a lost race labelled transient so that
/// it is rerun, or a marker for an error of ours, kept in `stashed`.
fn to_driver(e: Error, stashed: &mut Option<Error>) -> mongodb::error::Error {
    match e {
        Error::Database(m) | Error::Unavailable(m) => m,
        Error::Raced(m) => crate::error::with_transient_label(m),
        other => {
            *stashed = Some(other);
            mongodb::error::Error::custom(Stashed)
        }
    }
}

/// The first failed operation of a `bulkWrite` reply: (index, the server's
/// error).
fn first_bulk_error(reply: &Document) -> Option<(usize, mongodb::error::Error)> {
    if reply.get("nErrors").and_then(crate::util::int).unwrap_or(0) == 0 {
        return None;
    }
    let batch = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok());
    let failed = batch
        .into_iter()
        .flatten()
        .filter_map(Bson::as_document)
        .find(|r| r.get("ok").and_then(Bson::as_f64) == Some(0.0) || r.contains_key("code"));
    Some(match failed {
        Some(r) => (index_of(r, "idx"), write_error(r)),
        None => (
            0,
            mongodb::error::Error::custom("bulkWrite reported an error it did not list"),
        ),
    })
}

fn index_of(entry: &Document, field: &str) -> usize {
    entry
        .get(field)
        .and_then(crate::util::int)
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(0)
}

/// A failed statement of a reply as the driver's write error: its code,
/// code name, message and details kept.
fn write_error(entry: &Document) -> mongodb::error::Error {
    use mongodb::error::{ErrorKind, WriteError, WriteFailure};
    let code = entry
        .get("code")
        .and_then(crate::util::int)
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or_default();
    let mut w = doc! {"code": code, "errmsg": entry.get_str("errmsg").unwrap_or("write error")};
    for field in ["codeName", "errInfo"] {
        if let Some(v) = entry.get(field) {
            w.insert(field, v.clone());
        }
    }
    match crate::compat::from_document::<WriteError>(w) {
        Ok(w) => ErrorKind::Write(WriteFailure::WriteError(w)).into(),
        Err(e) => mongodb::error::Error::custom(format!("unreadable write error {entry}: {e}")),
    }
}

/// One statement of a documents-layout write.
enum Statement {
    Update {
        filter: Document,
        update: Bson,
        upsert: bool,
    },
    Delete {
        filter: Document,
    },
}

/// The first failed statement of an `update` or `delete` command's reply:
/// (index, the server's error).
fn first_write_error(reply: &Document) -> Option<(usize, mongodb::error::Error)> {
    let errors = reply.get_array("writeErrors").ok()?;
    let first = errors
        .iter()
        .filter_map(Bson::as_document)
        .min_by_key(|e| e.get("index").and_then(crate::util::int).unwrap_or(0));
    Some(match first {
        Some(e) => (index_of(e, "index"), write_error(e)),
        None => (
            0,
            mongodb::error::Error::custom("the reply listed a write error it did not describe"),
        ),
    })
}

/// Whether the server refused `bulkWrite` as a command it does not know
/// (CommandNotFound, code 59: "no such command: 'bulkWrite'" on mongod
/// before 8.0).
fn refused_bulk_write(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => {
            let m = c.message.to_ascii_lowercase();
            c.code == COMMAND_NOT_FOUND
                || m.contains("no such command")
                || m.contains("no such cmd")
                || m.contains("unrecognized command")
        }
        _ => false,
    }
}

/// A jittered exponential backoff, as the driver's convenient transaction
/// API sleeps: 5 ms × 1.5^attempt, at most 500 ms, times a random factor
/// in [0, 1).
fn backoff(attempt: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // `RandomState` is seeded afresh per instance: enough jitter to
    // spread writers apart, without a dependency.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let jitter = (h.finish() >> 11) as f64 / (1_u64 << 53) as f64;
    let ms = (5.0 * 1.5_f64.powi(attempt.min(30) as i32)).min(500.0) * jitter;
    Duration::from_micros((ms * 1000.0) as u64)
}

/// An expression that fails (ConversionFailure), so that a pipeline update
/// writes nothing: not a constant, so the server cannot fold it away.
fn refuse() -> Bson {
    bson::bson!({"$toLong": {"$concat": ["refused by the rank histogram: ", {"$toString": {"$type": "$_id"}}]}})
}

/// Whether an array board is well-formed: `scores` an array (or absent) of
/// `{score: number, count: integer ≥ 1}`, strictly best first (so no score
/// twice). One pass over the array, on the server.
fn valid_board(descending: bool) -> Bson {
    let before = if descending { "$gt" } else { "$lt" };
    // Written without `$let` and with neighbours compared through `$zip`
    // (the scores against themselves shifted by one): on some servers a
    // variable bound to the array, or `$arrayElemAt` by index in a `$map`,
    // costs a copy of the array per use, 10 to 20 times the whole check.
    let a = bson::bson!({"$ifNull": ["$scores", []]});
    let s = bson::bson!({"$map": {"input": a.clone(), "as": "e", "in": "$$e.score"}});
    bson::bson!({"$cond": [
        {"$isArray": a.clone()},
        {"$and": [
            {"$allElementsTrue": [{"$map": {"input": a, "as": "e", "in": {"$and": [
                {"$isNumber": "$$e.score"},
                {"$in": [{"$type": "$$e.count"}, ["int", "long"]]},
                {"$gte": ["$$e.count", 1]},
            ]}}}]},
            {"$allElementsTrue": [{"$map": {
                "input": {"$zip": {"inputs": [
                    s.clone(),
                    {"$slice": [s.clone(), 1, {"$max": [{"$size": s}, 1]}]},
                ]}},
                "as": "z",
                "in": {before: [{"$arrayElemAt": ["$$z", 0]}, {"$arrayElemAt": ["$$z", 1]}]},
            }}]},
        ]},
        false,
    ]})
}

/// Whether a document of the documents layout is well-formed: a numeric
/// score with an integer count ≥ 0, or the board's marker with count 0.
fn valid_document() -> Bson {
    bson::bson!({"$cond": [
        {"$eq": [{"$type": "$_id.s"}, "minKey"]},
        {"$and": [{"$in": [{"$type": "$count"}, ["int", "long"]]}, {"$eq": ["$count", 0]}]},
        {"$and": [
            {"$isNumber": "$_id.s"},
            {"$in": [{"$type": "$count"}, ["int", "long"]]},
            {"$gte": ["$count", 0]},
        ]},
    ]})
}

/// What is wrong with an array board, if anything: (field, problem).
fn array_problem(d: &Document, descending: bool) -> Option<(String, String)> {
    let scores = match d.get("scores") {
        None | Some(Bson::Null) => return None,
        Some(Bson::Array(a)) => a,
        Some(other) => {
            return Some((
                "scores".into(),
                format!("holds {other} ({:?}), not an array", other.element_type()),
            ))
        }
    };
    let mut seen: Vec<f64> = Vec::with_capacity(scores.len());
    for (i, e) in scores.iter().enumerate() {
        let Some(e) = e.as_document() else {
            return Some((
                format!("scores.{i}"),
                format!("holds {e}, not a {{score, count}} entry"),
            ));
        };
        let Some(score) = e.get("score").and_then(as_number) else {
            let found = e.get("score").map_or("nothing".to_owned(), Bson::to_string);
            return Some((
                format!("scores.{i}.score"),
                format!("holds {found}, not a number"),
            ));
        };
        match e.get("count") {
            Some(Bson::Int32(_) | Bson::Int64(_)) => {}
            other => {
                let found = other.map_or("nothing".to_owned(), Bson::to_string);
                return Some((
                    format!("scores.{i}.count"),
                    format!("holds {found}, not an integer count"),
                ));
            }
        }
        if let Some(n) = e.get("count").and_then(crate::util::int).filter(|n| *n < 1) {
            return Some((
                format!("scores.{i}.count"),
                format!("is {n} at score {score}: a count on the board is at least 1"),
            ));
        }
        if let Some(&prev) = seen.last() {
            let in_order = if descending {
                prev > score
            } else {
                prev < score
            };
            if !in_order {
                let problem = match seen.iter().position(|s| *s == score) {
                    Some(j) => format!("lists score {score} twice (entries {j} and {i})"),
                    None => format!("is out of order at entry {i} (score {score} after {prev})"),
                };
                return Some(("scores".into(), problem));
            }
        }
        seen.push(score);
    }
    None
}

/// What is wrong with a document of the documents layout, if anything.
fn document_problem(d: &Document) -> Option<(String, String)> {
    let s = d.get_document("_id").ok().and_then(|id| id.get("s"));
    let count = d.get("count");
    let found = || count.map_or("nothing".to_owned(), Bson::to_string);
    if matches!(s, Some(Bson::MinKey)) {
        return match count.and_then(crate::util::int) {
            Some(0) if matches!(count, Some(Bson::Int32(_) | Bson::Int64(_))) => None,
            _ => Some((
                "count".into(),
                format!("holds {} on the board's marker, which holds 0", found()),
            )),
        };
    }
    if s.and_then(as_number).is_none() {
        let s = s.map_or("nothing".to_owned(), Bson::to_string);
        return Some(("_id.s".into(), format!("holds {s}, not a number")));
    }
    match count {
        Some(Bson::Int32(n)) if *n >= 0 => None,
        Some(Bson::Int64(n)) if *n >= 0 => None,
        Some(Bson::Int32(_) | Bson::Int64(_)) => Some((
            "count".into(),
            format!("is {}: a count cannot be negative", found()),
        )),
        _ => Some((
            "count".into(),
            format!("holds {}, not an integer count", found()),
        )),
    }
}

fn as_number(b: &Bson) -> Option<f64> {
    match b {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(f) => Some(*f),
        _ => None,
    }
}

/// The pipeline update for the `"array"` layout: `-1` at `dec`, `+1` at
/// `inc` (inserted in board order when new), then emptied scores dropped.
fn array_update(delta: Delta<'_>, descending: bool) -> Vec<Document> {
    let mut arr = Bson::from(doc! {"$ifNull": ["$scores", []]});
    for (score, by) in [(delta.dec, -1_i64), (delta.inc, 1)] {
        let Some(s) = score else { continue };
        let (before, after) = if descending {
            ("$gt", "$lt")
        } else {
            ("$lt", "$gt")
        };
        arr = bson::bson!({"$let": {
            "vars": {"a": arr},
            "in": {"$cond": [
                {"$in": [s, {"$map": {"input": "$$a", "as": "e", "in": "$$e.score"}}]},
                {"$map": {"input": "$$a", "as": "e", "in": {"$cond": [
                    {"$eq": ["$$e.score", s]},
                    {"$mergeObjects": ["$$e", {"count": {"$add": ["$$e.count", by]}}]},
                    "$$e",
                ]}}},
                {"$concatArrays": [
                    {"$filter": {"input": "$$a", "as": "e", "cond": {before: ["$$e.score", s]}}},
                    [{"score": s, "count": by}],
                    {"$filter": {"input": "$$a", "as": "e", "cond": {after: ["$$e.score", s]}}},
                ]},
            ]},
        }});
    }
    vec![
        // Nothing is written on a damaged board.
        doc! {"$set": {"scores": {"$cond": [valid_board(descending), {"$ifNull": ["$scores", []]}, refuse()]}}},
        doc! {"$set": {"scores": {"$filter": {
            "input": arr, "as": "e", "cond": {"$gt": ["$$e.count", 0]},
        }}}},
    ]
}

/// How `precision` rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Quantum {
    Exact,
    /// A decimal step (`1 / k`, as 0.5 or 0.01): the score is
    /// `floor(x·k + ½) / k`, whose division by an integer gives the double
    /// nearest the decimal (87.35, not 87.35000000000001).
    Inverse(f64),
    /// Any other step `p`: `floor(x/p + ½)·p`.
    Step(f64),
}

fn quantum(precision: Option<f64>) -> Quantum {
    match precision {
        None => Quantum::Exact,
        Some(p) => {
            let k = (1.0 / p).round();
            if k >= 1.0 && ((1.0 / p) - k).abs() <= 1e-9 * k {
                Quantum::Inverse(k)
            } else {
                Quantum::Step(p)
            }
        }
    }
}

/// Rounds `x` to `precision` as `rebuild`'s pipeline does (`+ 0.0` turns
/// `-0.0` into `0.0`).
pub(crate) fn round(x: f64, precision: Option<f64>) -> f64 {
    let r = match quantum(precision) {
        Quantum::Exact => x,
        Quantum::Inverse(k) => (x * k + 0.5).floor() / k,
        Quantum::Step(p) => (x / p + 0.5).floor() * p,
    };
    r + 0.0
}

fn is_duplicate_mongo(e: &mongodb::error::Error) -> bool {
    server_codes(e).contains(&DUPLICATE_KEY)
}

/// IllegalOperation: "Transaction numbers are only allowed on a replica set
/// member or mongos".
fn refused_transaction(e: &Error) -> bool {
    match e {
        Error::Database(m) => server_codes(m).contains(&crate::error::code::ILLEGAL_OPERATION),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_decimal_steps() {
        assert_eq!(round(87.35, Some(0.01)), 87.35);
        assert_eq!(round(87.3449, Some(0.01)), 87.34);
        assert_eq!(round(87.3, Some(0.5)), 87.5);
        assert_eq!(round(87.2, Some(0.5)), 87.0);
        assert_eq!(round(7.4, Some(2.5)), 7.5);
        assert_eq!(round(-0.0, None), 0.0);
        assert!(round(-0.0, None).is_sign_positive());
        assert_eq!(round(0.1 + 0.2, Some(0.1)), 0.3);
    }

    #[test]
    fn rounding_past_the_largest_double_is_infinite_and_refused_upstream() {
        // `score_bson` refuses what this returns for such scores.
        assert!(!round(f64::MAX, Some(0.5)).is_finite());
        assert!(!round(f64::MIN, Some(0.5)).is_finite());
        assert_eq!(round(1e300, Some(0.5)), 1e300);
    }

    #[test]
    fn array_boards_are_checked_entry_by_entry() {
        let ok = doc! {"_id": "b", "scores": [{"score": 2.0, "count": 1_i64}, {"score": 1.0, "count": 3_i32}]};
        assert_eq!(array_problem(&ok, true), None);
        assert_eq!(array_problem(&doc! {"_id": "b"}, true), None);
        let dup = doc! {"_id": "b", "scores": [{"score": 2.0, "count": 1_i64}, {"score": 2.0, "count": 1_i64}]};
        let (field, problem) = array_problem(&dup, true).unwrap();
        assert_eq!(field, "scores");
        assert!(problem.contains("twice"), "{problem}");
        let neg = doc! {"_id": "b", "scores": [{"score": 2.0, "count": -1_i64}]};
        assert_eq!(array_problem(&neg, true).unwrap().0, "scores.0.count");
        let frac = doc! {"_id": "b", "scores": [{"score": 2.0, "count": 1.5}]};
        assert_eq!(array_problem(&frac, true).unwrap().0, "scores.0.count");
        let text = doc! {"_id": "b", "scores": [{"score": "x", "count": 1_i64}]};
        assert_eq!(array_problem(&text, true).unwrap().0, "scores.0.score");
        assert_eq!(
            array_problem(&doc! {"scores": 3}, true).unwrap().0,
            "scores"
        );
        let unsorted = doc! {"_id": "b", "scores": [{"score": 1.0, "count": 1_i64}, {"score": 2.0, "count": 1_i64}]};
        assert!(array_problem(&unsorted, true)
            .unwrap()
            .1
            .contains("out of order"));
        assert_eq!(array_problem(&unsorted, false), None);
        let apart = doc! {"_id": "b", "scores": [{"score": 3.0, "count": 1_i64}, {"score": 2.0, "count": 1_i64}, {"score": 3.0, "count": 1_i64}]};
        assert!(array_problem(&apart, true).unwrap().1.contains("twice"));
    }

    #[test]
    fn score_documents_are_checked() {
        let id = |s: Bson| doc! {"b": "b", "s": s};
        assert_eq!(
            document_problem(&doc! {"_id": id(2.0.into()), "count": 0_i64}),
            None
        );
        assert_eq!(
            document_problem(&doc! {"_id": id(Bson::MinKey), "count": 0_i64}),
            None
        );
        let bad = [
            doc! {"_id": id(2.0.into()), "count": -1_i64},
            doc! {"_id": id(2.0.into()), "count": 2.5},
            doc! {"_id": id(2.0.into()), "count": "2"},
            doc! {"_id": id(2.0.into())},
            doc! {"_id": id("two".into()), "count": 1_i64},
            doc! {"_id": id(Bson::MinKey), "count": 4_i64},
        ];
        for d in bad {
            assert!(document_problem(&d).is_some(), "{d}");
        }
    }

    #[test]
    fn backoff_is_jittered_and_capped() {
        for attempt in [0, 1, 5, 20, 1000] {
            let cap = (5.0 * 1.5_f64.powi(attempt.min(30) as i32)).min(500.0);
            let d = backoff(attempt);
            assert!(
                d <= Duration::from_micros((cap * 1000.0) as u64),
                "{attempt}: {d:?}"
            );
        }
        let spread: std::collections::HashSet<Duration> = (0..20).map(|_| backoff(10)).collect();
        assert!(spread.len() > 1, "jittered");
    }

    #[test]
    fn bulk_write_refusals_are_recognised() {
        let refusal = |code: i32, name: &str, msg: &str| -> mongodb::error::Error {
            let c: mongodb::error::CommandError =
                crate::compat::from_document(doc! {"code": code, "codeName": name, "errmsg": msg})
                    .unwrap();
            mongodb::error::ErrorKind::Command(c).into()
        };
        // As mongod 7.0, and the test server for a command it lacks, reply.
        assert!(refused_bulk_write(&refusal(
            59,
            "CommandNotFound",
            "no such command: 'bulkWrite'"
        )));
        assert!(refused_bulk_write(&refusal(
            0,
            "",
            "unrecognized command: bulkWrite"
        )));
        assert!(!refused_bulk_write(&refusal(
            16,
            "InvalidLength",
            "Write batch sizes must be between 1 and 100000"
        )));
        assert!(!refused_bulk_write(&mongodb::error::Error::custom(
            "no such command"
        )));
    }

    #[test]
    fn write_errors_of_update_replies_are_read() {
        assert!(first_write_error(&doc! {"n": 2, "ok": 1.0}).is_none());
        let reply = doc! {"n": 1, "writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}]};
        let (idx, e) = first_write_error(&reply).unwrap();
        assert_eq!((idx, server_codes(&e)), (1, vec![11000]));
        assert!(e.to_string().contains("dup"), "{e}");
    }

    #[test]
    fn lost_races_are_labelled_transient() {
        let e = crate::error::with_transient_label(mongodb::error::Error::custom("lost"));
        assert!(e.contains_label(TRANSIENT_TRANSACTION_ERROR));
    }

    #[test]
    fn percentile_counts_ties_half() {
        let r = Rank {
            rank: 3,
            dense: 3,
            above: 2,
            ties: 2,
            total: 10,
        };
        assert_eq!(r.percentile(), Some(70.0));
        let empty = Rank {
            rank: 1,
            dense: 1,
            above: 0,
            ties: 0,
            total: 0,
        };
        assert_eq!(empty.percentile(), None);
    }
}
