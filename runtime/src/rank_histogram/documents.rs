//! The `"documents"` layout: one document per (board, score),
//! `{_id: {b: board, s: score}, count}`, and a marker
//! `{_id: {b: board, s: MinKey}, count: 0}` that keeps an emptied board
//! known. Outside a transaction a write is one of the driver's retryable
//! writes: one ordered `Client::bulk_write` (MongoDB 8.0+), or its
//! statements one by one through `update_one` and `delete_one` on a server
//! that refuses it. Inside a transaction, `update` and `delete` commands
//! (or `bulkWrite`, after the player's write).

use mongodb::bson;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use futures::future::BoxFuture;
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::UpdateModifications;
use mongodb::ClientSession;

use super::score::as_number;
use super::send::{bulk_write, commands, learnt_no_bulk_write, one_by_one, refused_bulk_write};
use super::write::{refuse, Delta, Statement, Txn};
use super::{RankHistogram, RankSpec, Ranks, Store, ARRAY_LIMIT};
use crate::action::{Effective, Options};
use crate::error::code::{DUPLICATE_KEY, REFUSED, WRITE_CONFLICT};
use crate::error::{server_codes, Error, Result};

pub(super) struct DocumentStore;

/// Every document of `board`: the `_id` range `{b: board, s: MinKey}` to
/// `{b: board, s: MaxKey}` (the `_id` index serves it), plus equality on
/// `_id.b`, the declared shard key, so that `mongos` sends the read or the
/// removal to the board's one shard instead of every shard.
fn board_range(board: &Bson) -> Document {
    let mut filter = crate::util::id_range("b", board);
    filter.insert("_id.b", board.clone());
    filter
}

impl<T: RankHistogram> Store<T> for DocumentStore {
    fn rank_pipeline(&self, spec: &RankSpec, board: &Bson, score: &Bson) -> Vec<Document> {
        let better = if spec.descending { "$gt" } else { "$lt" };
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
                // One damaged document, if any (`$max` skips nulls).
                "bad": {"$max": {"$cond": [valid_document(), Bson::Null, "$$ROOT"]}},
            }},
        ]
    }

    fn rank_damage<'a>(
        &'a self,
        r: &'a Ranks<T>,
        _board: &'a Bson,
        reply: &'a Document,
    ) -> BoxFuture<'a, Option<Error>> {
        let damage = reply.get_document("bad").ok().map(|bad| {
            let id = bad.get("_id").cloned().unwrap_or(Bson::Null);
            let (field, problem) = document_problem(bad)
                .unwrap_or_else(|| ("count".into(), "fails the count check".into()));
            Error::damaged(r.hist.name(), id, field, problem)
        });
        Box::pin(std::future::ready(damage))
    }

    fn write<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        delta: Delta<'a>,
        o: &'a Options,
        session: Option<&'a mut ClientSession>,
        txn: Txn,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(write(r, board, delta, o, session, txn))
    }

    fn rows<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        limit: Option<u32>,
        o: Effective<'a>,
        session: Option<&'a mut ClientSession>,
    ) -> BoxFuture<'a, Result<Vec<(Bson, Document)>>> {
        Box::pin(rows(r, board, limit, o, session))
    }

    fn replace<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        scores: Vec<(Bson, u64)>,
        o: Options,
        mut session: Option<&'a mut ClientSession>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let delete = r
                .hist
                .delete_many(board_range(board))
                .with_options(o.driver());
            crate::action::run!(delete, session.as_deref_mut())?;
            let mut docs: Vec<Document> = scores
                .iter()
                .map(|(s, n)| doc! {"_id": {"b": board, "s": s}, "count": *n as i64})
                .collect();
            // The marker that keeps an emptied board known.
            docs.push(doc! {"_id": {"b": board, "s": Bson::MinKey}, "count": 0_i64});
            let insert = r.hist.insert_many(docs).with_options(o.driver());
            crate::action::run!(insert, session)?;
            Ok(())
        })
    }
}

/// The documents layout's write of `delta`. Outside a transaction
/// ([`retryable`]) it is one of the driver's retryable writes; inside one
/// ([`in_transaction`]) the transaction covers it.
async fn write<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    session: Option<&mut ClientSession>,
    txn: Txn,
) -> Result<()> {
    match (txn, session) {
        (Txn::No, session) => retryable(r, board, delta, o, session).await,
        (txn, Some(s)) => in_transaction(r, board, delta, o, s, txn == Txn::Callers).await,
        (_, None) => Err(Error::invalid("session", "a transaction needs a session")),
    }
}

/// How a batch went out: applied, or refused by a server without
/// `bulkWrite` (nothing written).
enum Sent {
    Done,
    NoBulkWrite,
}

/// `delta` outside a transaction, as the driver's retryable writes: one
/// ordered `Client::bulk_write` (MongoDB 8.0+), or, on a server that
/// refuses it (learnt from its first refusal, which wrote nothing), the
/// same statements one by one through `update_one` and `delete_one`. The
/// driver sends a retryable write once more after a failover's error, and
/// the server answers that attempt from its record of the first one,
/// statement by statement: a write interrupted, or whose reply was lost,
/// is stored once. The driver's retry is the only resend; an error that
/// reaches the caller is what is left after it.
///
/// Without a session, the one-by-one path runs as a task of its own
/// ([`crate::task::uncut`]): a call dropped between two statements leaves
/// the rest to run, so that a cut call never stops between the `-1` and
/// the `+1`.
async fn retryable<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    mut session: Option<&mut ClientSession>,
) -> Result<()> {
    if uses_bulk_write(r) {
        match batch(r, board, delta, o, session.as_deref_mut(), true).await? {
            Sent::Done => return Ok(()),
            Sent::NoBulkWrite => learnt_no_bulk_write(r),
        }
    }
    // Boxed when taken (servers before 8.0): inline, it would make every
    // write's future larger.
    let sent = match session {
        Some(s) => Box::pin(batch(r, board, delta, o, Some(s), false)).await?,
        None => {
            let (r, board, o) = (r.clone(), board.clone(), o.clone());
            let (dec, inc) = (delta.dec.cloned(), delta.inc.cloned());
            let one_by_one = async move {
                let delta = Delta {
                    dec: dec.as_ref(),
                    inc: inc.as_ref(),
                };
                batch(&r, &board, delta, &o, None, false).await
            };
            Box::pin(crate::task::uncut(one_by_one, "rank write")).await?
        }
    };
    match sent {
        Sent::Done => Ok(()),
        // Only `bulkWrite` is refused so, and this path sends none.
        Sent::NoBulkWrite => Err(Error::invalid(
            "bulk_write",
            "refused where it was not sent",
        )),
    }
}

/// `delta`'s statements outside a transaction, as one ordered `bulkWrite`
/// (`bulk`) or one by one. A statement that lost an upsert race to a
/// concurrent writer (that upsert is now an update), or met one writing
/// the same document, was not applied, nor were those after it: they go
/// again, from it, after a jittered backoff. A refused `-1` says why.
async fn batch<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    mut session: Option<&mut ClientSession>,
    bulk: bool,
) -> Result<Sent> {
    let ns = r.hist.namespace();
    let mut from = 0;
    let mut retry = crate::retry::Retry::new("rank write");
    loop {
        // Built for each attempt and moved into it: an attempt after a
        // race is rare, a copy kept for one would cost every write.
        let ops = statements(board, delta, None).into_iter().skip(from);
        let failed = if bulk {
            let models = ops.map(|op| op.model(&ns)).collect();
            match bulk_write(r, models, o, session.as_deref_mut(), false).await {
                // Nothing was written: the server does not know the command.
                Err(e) if from == 0 && refused_bulk_write(&e) => return Ok(Sent::NoBulkWrite),
                other => other?,
            }
        } else {
            let ops = ops.collect();
            Box::pin(one_by_one(r, ops, o, session.as_deref_mut())).await?
        };
        let Some((idx, e)) = failed else {
            return Ok(Sent::Done);
        };
        match server_codes(&e).first().copied().unwrap_or_default() {
            DUPLICATE_KEY | WRITE_CONFLICT => {
                from += idx;
                retry.pause().await?;
            }
            REFUSED => return Err(Box::pin(why_not_written(r, board, delta)).await),
            _ => return Err(Error::from(e)),
        }
    }
}

/// `delta` inside a transaction: `callers` when it is the caller's
/// (perhaps as its first command), otherwise after the player's write in
/// the same transaction. A failed statement aborts the transaction on the
/// server: a lost race comes back as [`Error::Raced`], for whoever owns
/// the transaction to run it again.
///
/// Inside the caller's transaction a `-1` reads first (see
/// [`read_first`]), and the statements go as `update` and `delete`
/// commands, never as `bulkWrite`, which refuses the `readConcern` the
/// driver adds to a transaction's first command. After the player's
/// write, `bulkWrite` where the server takes it.
async fn in_transaction<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    session: &mut ClientSession,
    callers: bool,
) -> Result<()> {
    let known = match (callers, delta.dec) {
        // Boxed: a path only a caller's transaction takes.
        (true, Some(_)) => Some(Box::pin(read_first(r, board, delta, o, &mut *session)).await?),
        _ => None,
    };
    let ops = statements(board, delta, known);
    let failed = if uses_bulk_write(r) && !callers {
        let ns = r.hist.namespace();
        let models = ops.into_iter().map(|op| op.model(&ns)).collect();
        match bulk_write(r, models, o, Some(session), true).await {
            Err(e) if refused_bulk_write(&e) => {
                // Nothing was written, but the server may have aborted the
                // transaction: it is run again, with the commands.
                learnt_no_bulk_write(r);
                return Err(Error::Raced(e));
            }
            other => other?.map(|(_, e)| e),
        }
    } else {
        Box::pin(commands(r, ops, o, session)).await?
    };
    let Some(e) = failed else {
        return Ok(());
    };
    match server_codes(&e).first().copied().unwrap_or_default() {
        DUPLICATE_KEY | WRITE_CONFLICT => Err(Error::Raced(e)),
        REFUSED => Err(Box::pin(why_not_written(r, board, delta)).await),
        _ => Err(Error::from(e)),
    }
}

/// Inside the caller's transaction, before a `-1`: the documents of the
/// `-1` and of the `+1`, as the transaction sees them (one `find`, on the
/// primary). A score nobody holds, a board never written or a damaged
/// count is found by this read, which leaves the caller's transaction
/// going, rather than by a refused statement, which would abort it. The
/// count at the `-1`, at least 1: within the transaction's snapshot the
/// statements then cannot fail for want of it (a concurrent writer of the
/// same document makes them conflict, a race).
async fn read_first<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    session: &mut ClientSession,
) -> Result<i64> {
    let mut ids = Vec::with_capacity(2);
    for s in [delta.dec, delta.inc].into_iter().flatten() {
        ids.push(Bson::Document(doc! {"b": board.clone(), "s": s.clone()}));
    }
    let filter = doc! {"_id": {"$in": ids}, "_id.b": board.clone()};
    let find = r
        .hist
        .find(filter)
        .with_options(o.deciding::<mongodb::options::FindOptions>());
    let docs: Vec<Document> = all_of!(find, Some(&mut *session));
    let mut count = None;
    for d in &docs {
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        if let Some((field, problem)) = document_problem(d) {
            return Err(Error::damaged(r.hist.name(), id, field, problem));
        }
        let s = d.get_document("_id").ok().and_then(|id| id.get("s"));
        if s.and_then(as_number) == delta.dec.and_then(as_number) {
            count = d.get("count").and_then(crate::util::int);
        }
    }
    match count {
        Some(n) if n > 0 => Ok(n),
        _ => {
            let any = r.hist.find_one(board_range(board)).session(session).await;
            Err(r.not_written(board, delta, any))
        }
    }
}

/// The statements of the documents layout's write of `delta`, in order:
/// check the target of `+1` when a `-1` comes first, `-1` (refused,
/// writing nothing, when nobody holds the score), the board's marker (for
/// a `-1` alone, the one write that can empty a board), the removal of a
/// score that reached 0, then `+1`. `known`: the count at the
/// `-1` as a read in the same transaction found it (see [`read_first`]),
/// which makes the check unneeded, and the removal too unless the count
/// is 1.
pub(super) fn statements(board: &Bson, delta: Delta<'_>, known: Option<i64>) -> Vec<Statement> {
    let u = updates();
    let id = |s: &Bson| doc! {"_id": {"b": board.clone(), "s": s.clone()}};
    let set = |s: &Bson, update: &Vec<Document>, upsert: bool| Statement::Update {
        filter: id(s),
        update: UpdateModifications::Pipeline(update.clone()),
        upsert,
    };
    let mut ops = Vec::with_capacity(5);
    if let Some(d) = delta.dec {
        if let (Some(i), None) = (delta.inc, known) {
            // Nothing is written when the `+1` would land on a damaged
            // count.
            ops.push(set(i, &u.same, false));
        }
        // An upsert, so that a missing score is refused rather than
        // matching nothing while the `+1` goes ahead.
        ops.push(set(d, &u.minus, true));
        if delta.inc.is_none() {
            // Only a `-1` alone can empty the board.
            ops.push(Statement::Update {
                filter: id(&Bson::MinKey),
                update: UpdateModifications::Document(u.marker.clone()),
                upsert: true,
            });
        }
        if known.is_none_or(|n| n == 1) {
            let mut filter = id(d);
            filter.insert("count", 0_i32);
            ops.push(Statement::Delete { filter });
        }
    }
    if let Some(i) = delta.inc {
        ops.push(set(i, &u.plus, true));
    }
    ops
}

/// The documents layout's write of a group's calls (see `group`): each
/// score's net change (`nets`, none 0) as one update of its document,
/// `-n` refused (writing nothing) when fewer than `n` players hold the
/// score or its count is damaged, `+n` creating the score if missing;
/// then, when some count fell, the board's marker and the removal of the
/// scores that reached 0. In one transaction, so a refusal aborts it all:
/// the group's calls then run alone, and say which.
pub(super) fn group_statements(board: &Bson, nets: &[(Bson, i64)]) -> Vec<Statement> {
    let u = updates();
    let id = |s: &Bson| doc! {"_id": {"b": board.clone(), "s": s.clone()}};
    let valid = doc! {"$and": [
        {"$in": [{"$type": "$count"}, ["int", "long"]]},
        {"$gte": ["$count", 0]},
    ]};
    let mut ops = Vec::with_capacity(nets.len() * 2 + 1);
    let mut fell = Vec::new();
    for (s, by) in nets {
        let to = if *by < 0 {
            fell.push(s);
            bson::bson!({"$cond": [
                {"$and": [&valid, {"$gte": ["$count", -by]}]},
                {"$add": ["$count", by]},
                refuse(),
            ]})
        } else {
            bson::bson!({"$cond": [
                {"$eq": [{"$type": "$count"}, "missing"]},
                by,
                {"$cond": [&valid, {"$add": ["$count", by]}, refuse()]},
            ]})
        };
        ops.push(Statement::Update {
            filter: id(s),
            update: UpdateModifications::Pipeline(vec![doc! {"$set": {"count": to}}]),
            upsert: true,
        });
    }
    if !fell.is_empty() {
        ops.push(Statement::Update {
            filter: id(&Bson::MinKey),
            update: UpdateModifications::Document(u.marker.clone()),
            upsert: true,
        });
    }
    for s in fell {
        let mut filter = id(s);
        filter.insert("count", 0_i32);
        ops.push(Statement::Delete { filter });
    }
    ops
}

/// The documents layout's updates, the same for every write: built once.
struct Updates {
    /// The `+1`'s target checked and left as it is.
    same: Vec<Document>,
    /// `-1`, refused when nobody holds the score.
    minus: Vec<Document>,
    /// The board's marker, created if missing.
    marker: Document,
    /// `+1`, the score created if missing.
    plus: Vec<Document>,
}

fn updates() -> &'static Updates {
    static UPDATES: OnceLock<Updates> = OnceLock::new();
    UPDATES.get_or_init(|| {
        let valid = doc! {"$and": [
            {"$in": [{"$type": "$count"}, ["int", "long"]]},
            {"$gte": ["$count", 0]},
        ]};
        let set = |to: Bson| vec![doc! {"$set": {"count": to}}];
        Updates {
            same: set(bson::bson!({"$cond": [&valid, "$count", refuse()]})),
            minus: set(bson::bson!({"$cond": [
                {"$and": [&valid, {"$gt": ["$count", 0]}]},
                {"$add": ["$count", -1_i64]},
                refuse(),
            ]})),
            marker: doc! {"$setOnInsert": {"count": 0_i64}},
            plus: set(bson::bson!({"$cond": [
                {"$eq": [{"$type": "$count"}, "missing"]},
                1_i64,
                {"$cond": [&valid, {"$add": ["$count", 1_i64]}, refuse()]},
            ]})),
        }
    })
}

/// Whether the documents layout sends `bulkWrite`: allowed, and not
/// refused by this deployment yet.
fn uses_bulk_write<T: RankHistogram>(r: &Ranks<T>) -> bool {
    r.bulk_write && !r.no_bulk_write.load(Ordering::Relaxed)
}

async fn rows<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    limit: Option<u32>,
    o: Effective<'_>,
    mut session: Option<&mut ClientSession>,
) -> Result<Vec<(Bson, Document)>> {
    let dir = if r.spec.descending { -1 } else { 1 };
    let mut filter = board_range(board);
    // Count 0: the board's marker (and emptied scores a former
    // version kept); anything else is checked below.
    filter.insert("count", doc! {"$ne": 0});
    let find = r
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
            return Err(Error::damaged(r.hist.name(), id, field, problem));
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
        let any = r.hist.find_one(board_range(board)).with_options(o.driver());
        if crate::action::run!(any, session)?.is_none() {
            return Err(r.unknown_board(board));
        }
    }
    Ok(rows)
}

/// After a write that was refused: a damaged board, an unknown board, or a
/// score nobody holds.
async fn why_not_written<T: RankHistogram>(r: &Ranks<T>, board: &Bson, delta: Delta<'_>) -> Error {
    match board_damage(r, board).await {
        Err(e) => return e,
        Ok(Some(e)) => return e,
        Ok(None) => {}
    }
    let found = r.hist.find_one(board_range(board)).await;
    r.not_written(board, delta, found)
}

/// [`Error::Damaged`] for the first broken document of `board`, if any.
async fn board_damage<T: RankHistogram>(r: &Ranks<T>, board: &Bson) -> Result<Option<Error>> {
    let mut filter = board_range(board);
    filter.insert(
        "$or",
        vec![
            doc! {"count": {"$not": {"$type": ["int", "long"]}}},
            doc! {"count": {"$lt": 0}},
            doc! {"_id.s": {"$not": {"$type": "number"}}},
        ],
    );
    let suspects: Vec<Document> = r.hist.find(filter).limit(16).await?.try_collect().await?;
    Ok(suspects.iter().find_map(|d| {
        let (field, problem) = document_problem(d)?;
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        Some(Error::damaged(r.hist.name(), id, field, problem))
    }))
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

/// What is wrong with a document of the documents layout, if anything.
pub(super) fn document_problem(d: &Document) -> Option<(String, String)> {
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
