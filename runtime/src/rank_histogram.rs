//! The rank histogram (seed 001): real-time ranks from `{score, count}`
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
//!   documents by `_id` and `rank` sums one `_id` range, so a board can hold
//!   any number of distinct scores.
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
//!   and [`Ranks::delete`] change both in one transaction where the
//!   deployment has them, and [`Ranks::rebuild`] recomputes a board.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicBool, Ordering};

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::error::{TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::IndexOptions;
use mongodb::{ClientSession, Collection, Database, IndexModel};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{server_codes, Error, Result};
use crate::model::Model;

/// Distinct scores per board up to which the `"array"` layout is the better
/// choice: each write rewrites the board's array (about 40 bytes a score).
pub const ARRAY_ADVISED: usize = 10_000;
/// Distinct scores the `"array"` layout refuses to pass: about 4 MB, a
/// quarter of MongoDB's 16 MiB document limit.
pub const ARRAY_LIMIT: usize = 100_000;
/// Times a write retries after losing a race (a concurrent upsert, a
/// transaction's write conflict) before it returns
/// [`Error::Contended`].
const MAX_ATTEMPTS: usize = 100;
/// Duplicate key.
const DUPLICATE_KEY: i32 = 11000;

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

macro_rules! impls {
    ($tr:ident: $($t:ty),*) => { $(impl $tr for $t {})* };
}
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
    /// Whether the deployment refused a transaction (a standalone): then
    /// writes go one after the other. Learnt from the first refusal, so a
    /// replica set or a sharded cluster pays no extra round trip to ask.
    no_transactions: std::sync::Arc<AtomicBool>,
}

impl<T: RankHistogram> Clone for Ranks<T> {
    fn clone(&self) -> Self {
        Ranks {
            db: self.db.clone(),
            source: self.source.clone(),
            hist: self.hist.clone(),
            spec: self.spec,
            no_transactions: self.no_transactions.clone(),
        }
    }
}

/// A write to the players' collection that the histogram follows.
enum SourceOp<'a, T: RankHistogram> {
    Insert(&'a T),
    Update(Document, T::Score),
    Delete(Document),
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
        }
    }

    /// The collection that holds the histograms.
    pub fn histogram_collection(&self) -> &Collection<Document> {
        &self.hist
    }

    /// Creates `{board: 1, score: ±1}` on the players' collection, which
    /// [`rebuild`](Self::rebuild) reads by. The histogram needs no index
    /// beyond `_id`. Existing indexes are left alone.
    pub async fn ensure_indexes(&self) -> Result<()> {
        let (board, score) = (self.spec.board, self.spec.score);
        let dir = if self.spec.descending { -1 } else { 1 };
        let index = IndexModel::builder()
            .keys(doc! {board: 1, score: dir})
            .options(
                IndexOptions::builder()
                    .name(format!("mp_rank_{board}_{score}"))
                    .build(),
            )
            .build();
        self.source.create_index(index).await?;
        Ok(())
    }

    /// Counts one more player at `score` on `board`; creates the board and
    /// the score when they are new. One round trip.
    pub async fn record<Q>(&self, board: &Q, score: T::Score) -> Result<()>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let (b, s) = (self.board_bson(board)?, self.score_bson(score)?);
        self.write(
            &b,
            Delta {
                dec: None,
                inc: Some(&s),
            },
            None,
        )
        .await
    }

    /// Moves one player from `old` to `new`: both counts change together or
    /// neither does. One round trip, also when `new` is new to the board.
    /// Fails with [`Error::ScoreNotFound`] when
    /// nobody holds `old`.
    pub async fn change<Q>(&self, board: &Q, old: T::Score, new: T::Score) -> Result<()>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let b = self.board_bson(board)?;
        let (o, n) = (self.score_bson(old)?, self.score_bson(new)?);
        let delta = Delta {
            dec: Some(&o),
            inc: Some(&n),
        };
        self.write(&b, delta, None).await
    }

    /// Counts one player fewer at `score`. Fails with
    /// [`Error::ScoreNotFound`] when nobody holds
    /// it: a count never goes below 0.
    pub async fn remove<Q>(&self, board: &Q, score: T::Score) -> Result<()>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let (b, s) = (self.board_bson(board)?, self.score_bson(score)?);
        self.write(
            &b,
            Delta {
                dec: Some(&s),
                inc: None,
            },
            None,
        )
        .await
    }

    /// Where `score` stands on `board`: ranks, ties, total. The sums run on
    /// the server, in one round trip, over the board's distinct scores.
    /// A score nobody holds still ranks (`ties` is 0). Fails with
    /// [`Error::UnknownBoard`] for a board never
    /// written.
    pub async fn rank<Q>(&self, board: &Q, score: T::Score) -> Result<Rank>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let (b, s) = (self.board_bson(board)?, self.score_bson(score)?);
        let pipeline = self.rank_pipeline(&b, &s);
        let mut cursor = self.hist.aggregate(pipeline).await?;
        let Some(d) = cursor.try_next().await? else {
            return Err(self.unknown_board(&b));
        };
        let get = |f: &str| count(&d, f, self.spec.histogram);
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
                    doc! {"$project": {
                        "_id": 0,
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
                    doc! {"$match": board_range(board)},
                    doc! {"$group": {
                        "_id": Bson::Null,
                        "above": when(doc! {better: ["$_id.s", score]}, "$count".into()),
                        "distinctAbove": when(
                            doc! {"$and": [{better: ["$_id.s", score]}, {"$gt": ["$count", 0]}]},
                            1.into(),
                        ),
                        "ties": when(doc! {"$eq": ["$_id.s", score]}, "$count".into()),
                        "total": {"$sum": "$count"},
                    }},
                ]
            }
        }
    }

    /// The scores of the first `places` places, best first, ties included
    /// (`top(board, 3)` on 100, 90, 90, 80 gives 100, 90 ×2: places 1 to 3).
    /// One round trip, reading at most `places` scores.
    pub async fn top<Q>(&self, board: &Q, places: u32) -> Result<Vec<ScoreCount<T::Score>>>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let b = self.board_bson(board)?;
        if places == 0 {
            return Ok(Vec::new());
        }
        let mut all = self.read(&b, Some(places)).await?;
        all.retain(|s| s.rank <= u64::from(places));
        Ok(all)
    }

    /// Every score of `board` with its count and rank, best first. One round
    /// trip (up to 100,000 scores; a larger `"documents"` board continues
    /// with `getMore`s).
    pub async fn histogram<Q>(&self, board: &Q) -> Result<Vec<ScoreCount<T::Score>>>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let b = self.board_bson(board)?;
        self.read(&b, None).await
    }

    /// Inserts a player's document and counts its score, in one transaction
    /// where the deployment has them (three round trips: insert, histogram,
    /// commit); otherwise one after the other.
    pub async fn insert(&self, doc: &T) -> Result<()> {
        self.atomically(&SourceOp::Insert(doc)).await.map(drop)
    }

    /// Sets the score of the first player document `filter` matches and
    /// moves it on the histogram, in one transaction where the deployment
    /// has them. Returns whether a document matched.
    pub async fn update_score(&self, filter: Document, new: T::Score) -> Result<bool> {
        self.atomically(&SourceOp::Update(filter, new)).await
    }

    /// Deletes the first player document `filter` matches and uncounts its
    /// score, in one transaction where the deployment has them. Returns
    /// whether a document matched.
    pub async fn delete(&self, filter: Document) -> Result<bool> {
        self.atomically(&SourceOp::Delete(filter)).await
    }

    /// Recomputes `board`'s histogram from the players' documents, for
    /// repair, and returns how many players it counted. Scores are grouped
    /// on the server (rounded as `precision` says); documents whose score is
    /// missing, not a number, NaN or infinite are not counted. Run it while
    /// no writes to this board are in flight: one that lands between the
    /// read and the write is lost from the histogram.
    pub async fn rebuild<Q>(&self, board: &Q) -> Result<u64>
    where
        T::Board: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let b = self.board_bson(board)?;
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
            doc! {"$sort": {"_id": dir}},
        ];
        let groups: Vec<Document> = self
            .source
            .clone_with_type::<Document>()
            .aggregate(pipeline)
            .await?
            .try_collect()
            .await?;
        let mut total = 0;
        let mut scores = Vec::with_capacity(groups.len());
        for g in &groups {
            let s = g.get("_id").cloned().unwrap_or(Bson::Null);
            let n = count(g, "count", T::COLLECTION)?;
            total += n;
            scores.push((self.normalize(s), n));
        }
        match self.spec.layout {
            Layout::Array => {
                let arr: Vec<Bson> = scores
                    .iter()
                    .map(|(s, n)| Bson::Document(doc! {"score": s, "count": *n as i64}))
                    .collect();
                self.hist
                    .replace_one(doc! {"_id": &b}, doc! {"_id": &b, "scores": arr})
                    .upsert(true)
                    .await?;
            }
            Layout::Documents => {
                self.hist.delete_many(board_range(&b)).await?;
                let docs: Vec<Document> = scores
                    .iter()
                    .map(|(s, n)| doc! {"_id": {"b": &b, "s": s}, "count": *n as i64})
                    .collect();
                if docs.is_empty() {
                    // An empty board is still a known board.
                    self.hist
                        .insert_one(doc! {"_id": {"b": &b, "s": Bson::MinKey}, "count": 0_i64})
                        .await?;
                } else {
                    self.hist.insert_many(docs).await?;
                }
            }
        }
        Ok(total)
    }

    /// Runs `op` in a transaction where the deployment has them, retrying
    /// it when the server says the transaction may succeed on a retry (a
    /// write conflict with another writer of the same board).
    async fn atomically(&self, op: &SourceOp<'_, T>) -> Result<bool> {
        if self.no_transactions.load(Ordering::Relaxed) {
            return self.source_op(op, None).await;
        }
        let mut session = self.db.client().start_session().await?;
        for _ in 0..MAX_ATTEMPTS {
            session.start_transaction().await?;
            match self.source_op(op, Some(&mut session)).await {
                // A standalone refuses transactions on the first write, before
                // writing anything.
                Err(e) if refused_transaction(&e) => {
                    let _ = session.abort_transaction().await;
                    self.no_transactions.store(true, Ordering::Relaxed);
                    return self.source_op(op, None).await;
                }
                Ok(r) => loop {
                    match session.commit_transaction().await {
                        Ok(()) => return Ok(r),
                        // The driver retried the commit once already.
                        Err(e) if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) => continue,
                        Err(e) if e.contains_label(TRANSIENT_TRANSACTION_ERROR) => break,
                        Err(e) => return Err(e.into()),
                    }
                },
                Err(e) => {
                    let _ = session.abort_transaction().await;
                    if !is_transient(&e) {
                        return Err(e);
                    }
                }
            }
        }
        Err(Error::Contended {
            operation: "rank transaction",
            attempts: MAX_ATTEMPTS,
        })
    }

    /// One write to the players' collection and the matching histogram
    /// write; `false` when the filter matched nothing.
    async fn source_op(
        &self,
        op: &SourceOp<'_, T>,
        mut session: Option<&mut ClientSession>,
    ) -> Result<bool> {
        let (old, new) = match op {
            SourceOp::Insert(doc) => {
                let b = self.board_bson(doc.board())?;
                let s = self.score_bson(doc.score())?;
                let insert = self.source.insert_one(*doc);
                match session.as_deref_mut() {
                    Some(sess) => insert.session(sess).await?,
                    None => insert.await?,
                };
                let delta = Delta {
                    dec: None,
                    inc: Some(&s),
                };
                self.write(&b, delta, session).await?;
                return Ok(true);
            }
            SourceOp::Update(filter, new) => {
                let n = self.score_bson(*new)?;
                let set = doc! {"$set": {self.spec.score: bson::to_bson(new)?}};
                let update = self.source.find_one_and_update(filter.clone(), set);
                let old = match session.as_deref_mut() {
                    Some(sess) => update.session(sess).await?,
                    None => update.await?,
                };
                (old, Some(n))
            }
            SourceOp::Delete(filter) => {
                let delete = self.source.find_one_and_delete(filter.clone());
                let old = match session.as_deref_mut() {
                    Some(sess) => delete.session(sess).await?,
                    None => delete.await?,
                };
                (old, None)
            }
        };
        let Some(old) = old else { return Ok(false) };
        let b = self.board_bson(old.board())?;
        let o = self.score_bson(old.score())?;
        let delta = Delta {
            dec: Some(&o),
            inc: new.as_ref(),
        };
        self.write(&b, delta, session).await?;
        Ok(true)
    }

    /// Applies `delta` to `board`'s histogram.
    async fn write(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        mut session: Option<&mut ClientSession>,
    ) -> Result<()> {
        for _ in 0..MAX_ATTEMPTS {
            let result = match self.spec.layout {
                Layout::Array => self.write_array(board, delta, session.as_deref_mut()).await,
                Layout::Documents => {
                    self.write_documents(board, delta, session.as_deref_mut())
                        .await
                }
            };
            match result {
                // A concurrent upsert created the same document first; inside
                // a transaction the transaction is retried instead.
                Err(e) if session.is_none() && is_duplicate(&e) => continue,
                other => return other,
            }
        }
        Err(Error::Contended {
            operation: "rank write",
            attempts: MAX_ATTEMPTS,
        })
    }

    async fn write_array(
        &self,
        board: &Bson,
        delta: Delta<'_>,
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
            .upsert(delta.dec.is_none());
        let result = match session {
            Some(s) => update.session(s).await,
            None => update.await,
        };
        match result {
            Ok(r) if r.matched_count > 0 || r.upserted_id.is_some() => Ok(()),
            Ok(_) => Err(self.why_not_written(board, delta).await),
            // The upsert of a board that exists: it is full, or a concurrent
            // writer created it (retried by `write`).
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
            Err(e) => Err(e.into()),
        }
    }

    async fn write_documents(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        session: Option<&mut ClientSession>,
    ) -> Result<()> {
        let id = |s: &Bson| doc! {"b": board, "s": s};
        let mut updates = Vec::new();
        if let Some(d) = delta.dec {
            updates.push(doc! {
                "q": {"_id": id(d), "count": {"$gt": 0}},
                "u": {"$inc": {"count": -1_i64}},
            });
        }
        if let Some(i) = delta.inc {
            updates.push(doc! {
                "q": {"_id": id(i)},
                "u": {"$inc": {"count": 1_i64}},
                "upsert": true,
            });
        }
        // One command, so a change is one round trip.
        let command = doc! {"update": self.spec.histogram, "updates": updates, "ordered": true};
        // In a transaction, a failed decrement aborts everything: no undo.
        let in_transaction = session.is_some();
        let run = self.db.run_command(command);
        let reply = match session {
            Some(s) => run.session(s).await?,
            None => run.await?,
        };
        if let Some(e) = reply
            .get_array("writeErrors")
            .ok()
            .and_then(|errors| errors.first())
            .and_then(Bson::as_document)
        {
            let code = e.get_i32("code").unwrap_or_default();
            let msg = e.get_str("errmsg").unwrap_or("write error");
            let e = mongodb::error::Error::custom(format!("{msg} (code {code})"));
            return Err(if code == DUPLICATE_KEY {
                Error::Raced(e)
            } else {
                Error::Database(e)
            });
        }
        let n = reply
            .get("n")
            .and_then(Bson::as_i64_lossy)
            .unwrap_or_default();
        if delta.dec.is_some() && n < delta.inc.map_or(1, |_| 2) {
            // The decrement found nothing; undo the increment that followed,
            // and drop the document if it made it (else an unknown board
            // would now be known).
            if let Some(i) = delta.inc.filter(|_| !in_transaction) {
                self.hist
                    .update_one(
                        doc! {"_id": id(i), "count": {"$gt": 0}},
                        doc! {"$inc": {"count": -1_i64}},
                    )
                    .await?;
                if reply.get_array("upserted").is_ok_and(|u| !u.is_empty()) {
                    self.hist
                        .delete_one(doc! {"_id": id(i), "count": 0})
                        .await?;
                }
            }
            return Err(self.why_not_written(board, delta).await);
        }
        Ok(())
    }

    /// After a write that matched nothing: an unknown board, or a score
    /// nobody holds.
    async fn why_not_written(&self, board: &Bson, delta: Delta<'_>) -> Error {
        let exists = match self.spec.layout {
            Layout::Array => self.hist.find_one(doc! {"_id": board}).await,
            Layout::Documents => self.hist.find_one(board_range(board)).await,
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
    async fn read(&self, board: &Bson, limit: Option<u32>) -> Result<Vec<ScoreCount<T::Score>>> {
        let dir = if self.spec.descending { -1 } else { 1 };
        let rows: Vec<Document> = match self.spec.layout {
            Layout::Array => {
                let mut pipeline = vec![
                    doc! {"$match": {"_id": board}},
                    doc! {"$unwind": "$scores"},
                    doc! {"$replaceWith": "$scores"},
                    doc! {"$match": {"count": {"$gt": 0}}},
                    doc! {"$sort": {"score": dir}},
                ];
                if let Some(n) = limit {
                    pipeline.push(doc! {"$limit": i64::from(n)});
                }
                // One reply for the whole board (at most `ARRAY_LIMIT` scores).
                let rows: Vec<Document> = self
                    .hist
                    .aggregate(pipeline)
                    .batch_size(limit.unwrap_or(ARRAY_LIMIT as u32))
                    .await?
                    .try_collect()
                    .await?;
                if rows.is_empty() && self.hist.find_one(doc! {"_id": board}).await?.is_none() {
                    return Err(self.unknown_board(board));
                }
                rows
            }
            Layout::Documents => {
                let mut filter = board_range(board);
                filter.insert("count", doc! {"$gt": 0});
                let find = self
                    .hist
                    .find(filter)
                    .sort(doc! {"_id": dir})
                    .batch_size(limit.unwrap_or(ARRAY_LIMIT as u32));
                let find = match limit {
                    Some(n) => find.limit(i64::from(n)),
                    None => find,
                };
                let rows: Vec<Document> = find
                    .await?
                    .try_collect::<Vec<Document>>()
                    .await?
                    .into_iter()
                    .map(|d| {
                        let s = d
                            .get_document("_id")
                            .ok()
                            .and_then(|id| id.get("s").cloned())
                            .unwrap_or(Bson::Null);
                        doc! {"score": s, "count": d.get("count").cloned().unwrap_or(Bson::Null)}
                    })
                    .collect();
                if rows.is_empty() && self.hist.find_one(board_range(board)).await?.is_none() {
                    return Err(self.unknown_board(board));
                }
                rows
            }
        };
        let mut out = Vec::with_capacity(rows.len());
        let mut above = 0;
        for row in rows {
            let n = count(&row, "count", self.spec.histogram)?;
            let s = row.get("score").cloned().unwrap_or(Bson::Null);
            let score =
                bson::from_bson::<T::Score>(s.clone()).map_err(|e| Error::UnexpectedDocument {
                    collection: self.spec.histogram.to_owned(),
                    id: board.clone(),
                    source: e,
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

    fn unknown_board(&self, board: &Bson) -> Error {
        Error::UnknownBoard {
            collection: self.spec.histogram.to_owned(),
            board: board.to_string(),
        }
    }

    fn board_bson<Q: Serialize + ?Sized>(&self, board: &Q) -> Result<Bson> {
        Ok(bson::to_bson(board)?)
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
            Number::Float(f) => Ok(Bson::Double(round(f, self.spec.precision))),
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
    vec![doc! {"$set": {"scores": {"$filter": {
        "input": arr, "as": "e", "cond": {"$gt": ["$$e.count", 0]},
    }}}}]
}

/// The `_id` range of one board's documents in the `"documents"` layout.
fn board_range(board: &Bson) -> Document {
    doc! {"_id": {
        "$gte": {"b": board, "s": Bson::MinKey},
        "$lte": {"b": board, "s": Bson::MaxKey},
    }}
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

/// A non-negative count field of a reply.
fn count(d: &Document, field: &str, collection: &str) -> Result<u64> {
    d.get(field)
        .and_then(Bson::as_i64_lossy)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| Error::UnexpectedDocument {
            collection: collection.to_owned(),
            id: d.get("_id").cloned().unwrap_or(Bson::Null),
            source: serde::de::Error::custom(format!("`{field}` is not a count")),
        })
}

trait AsI64Lossy {
    fn as_i64_lossy(&self) -> Option<i64>;
}

impl AsI64Lossy for Bson {
    fn as_i64_lossy(&self) -> Option<i64> {
        match self {
            Bson::Int32(i) => Some(i64::from(*i)),
            Bson::Int64(i) => Some(*i),
            Bson::Double(f) if f.fract() == 0.0 => Some(*f as i64),
            _ => None,
        }
    }
}

fn is_duplicate_mongo(e: &mongodb::error::Error) -> bool {
    server_codes(e).contains(&DUPLICATE_KEY)
}

/// A histogram upsert that lost to a concurrent one: retrying it succeeds.
/// (A duplicate from the players' collection is the caller's, and is not
/// `Raced`.)
fn is_duplicate(e: &Error) -> bool {
    matches!(e, Error::Raced(_))
}

/// IllegalOperation: "Transaction numbers are only allowed on a replica set
/// member or mongos".
fn refused_transaction(e: &Error) -> bool {
    match e {
        Error::Database(m) => server_codes(m).contains(&20),
        _ => false,
    }
}

/// Worth running the transaction again: the server says so, or a histogram
/// upsert inside it lost a race.
fn is_transient(e: &Error) -> bool {
    match e {
        Error::Raced(_) => true,
        Error::Database(m) | Error::Unavailable(m) => m.contains_label(TRANSIENT_TRANSACTION_ERROR),
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
