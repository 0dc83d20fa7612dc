//! The `"documents"` layout: one document per (board, score),
//! `{_id: {b: board, s: score}, count}`, and a marker
//! `{_id: {b: board, s: MinKey}, count: 0}` that keeps an emptied board
//! known. A write is one ordered `bulkWrite` (MongoDB 8.0+), or an `update`
//! and a `delete` command on a server that refuses it.

use mongodb::bson;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use futures::future::BoxFuture;
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document, RawArrayBuf, RawBson, RawDocumentBuf};
use mongodb::ClientSession;

use super::score::as_number;
use super::write::{refuse, Delta, Statement, Txn};
use super::{RankHistogram, RankSpec, Ranks, Store, ARRAY_LIMIT};
use crate::action::{Effective, Options};
use crate::compat::{self, append};
use crate::error::code::{DUPLICATE_KEY, REFUSED, WRITE_CONFLICT};
use crate::error::{server_codes, Error, Result};
use crate::failover::{outcome, Outcome};

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

/// The documents layout's write, in order: check the target of `+1`
/// when a `-1` comes first, `-1` (refused, writing nothing, when nobody
/// holds the score), the board's marker, the removal of a score that
/// reached 0, then `+1`. One `bulkWrite` command (one round trip) on
/// MongoDB 8.0+; on an older server, which refuses `bulkWrite`, an
/// `update` command with the update statements, then a `delete` command
/// for the emptied score (two round trips when a `-1` is sent, one
/// otherwise).
async fn write<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    session: Option<&mut ClientSession>,
    txn: Txn,
) -> Result<()> {
    let in_transaction = txn != Txn::No;
    // The fallback's order: the updates, then the delete. A `+1` that
    // lands before the delete leaves its count above 0, so the delete
    // (of a count of 0 only) removes the same scores.
    // Chosen once per call, so that a clone learning of a refusal
    // meanwhile does not change the order under a resumed call.
    // Not as a caller's transaction's possibly first command: the driver
    // adds `readConcern` to that one, which `bulkWrite` refuses.
    let mut bulk = uses_bulk_write(r) && txn != Txn::Callers;
    // The statements are built for each attempt, and moved into its
    // command: a resumed attempt is rare, a copy kept for one would cost
    // every write. From `sorted` on (`None`: none) they go in the
    // fallback's order.
    let mut sorted = if bulk { None } else { Some(0) };
    let ops = |sorted: Option<usize>| -> Result<Vec<Statement>> {
        let mut ops = statements(board, delta)?;
        if let Some(k) = sorted {
            ops[k..].sort_by_key(|op| matches!(op, Statement::Delete { .. }));
        }
        Ok(ops)
    };
    let mut session = session;
    let mut from = 0;
    let mut retry = crate::retry::Retry::new("rank write");
    let mut resent = false;
    loop {
        let failed = if bulk {
            let mut these = ops(sorted)?;
            these.drain(..from);
            match bulk_write_once(r, these, o, session.as_deref_mut(), in_transaction).await {
                Err(e) if refused_bulk_write(&e) => {
                    // Nothing was written: the server does not know the
                    // command. Inside a transaction the whole
                    // transaction is rerun, as the server may have
                    // aborted it.
                    crate::action::learnt(
                        &r.no_bulk_write,
                        "no_bulk_write",
                        r.hist.name(),
                        "the deployment refused bulkWrite (a server before 8.0): writes go as update and delete commands",
                    );
                    if in_transaction {
                        return Err(Error::Raced(e));
                    }
                    bulk = false;
                    sorted = Some(from);
                    continue;
                }
                other => other.map_err(|e| unknown_outcome(Error::from(e), in_transaction))?,
            }
        } else {
            let these = ops(sorted)?;
            // Boxed when taken (servers before 8.0), as the other rare
            // paths below: inline, they would make every write's future
            // too large for a small allocation.
            Box::pin(commands_once(
                r,
                &these[from..],
                o,
                session.as_deref_mut(),
                in_transaction,
            ))
            .await
            .map_err(|e| unknown_outcome(e, in_transaction))?
        };
        let Some((idx, e)) = failed else {
            return Ok(());
        };
        if !in_transaction && !resent && outcome(&e) == Outcome::NotStored {
            // An election refused or interrupted the statement at `idx`
            // (or the command before it ran): what came before is stored,
            // the rest goes once more, to the new primary.
            resent = true;
            from += idx;
            continue;
        }
        match server_codes(&e).first().copied().unwrap_or_default() {
            // Inside a transaction the server aborted it: it is rerun.
            DUPLICATE_KEY | WRITE_CONFLICT if in_transaction => return Err(Error::Raced(e)),
            // A concurrent writer created the document first (that
            // upsert is now an update), or wrote it at the same time:
            // what came before is written, so go on from there.
            DUPLICATE_KEY | WRITE_CONFLICT => {
                from += idx;
                retry.pause().await?;
            }
            REFUSED => return Err(Box::pin(why_not_written(r, board, delta)).await),
            _ => return Err(Error::from(e)),
        }
    }
}

/// The statements of the documents layout's write of `delta`, in order:
/// check the target of `+1` when a `-1` comes first, `-1` (refused,
/// writing nothing, when nobody holds the score), the board's marker, the
/// removal of a score that reached 0, then `+1`.
pub(super) fn statements(board: &Bson, delta: Delta<'_>) -> Result<Vec<Statement>> {
    let u = updates()?;
    let board = compat::raw(board)?;
    let id = |s: RawBson| {
        let mut id = RawDocumentBuf::new();
        append(&mut id, "b", board.clone());
        append(&mut id, "s", s);
        let mut filter = RawDocumentBuf::new();
        append(&mut filter, "_id", RawBson::Document(id));
        filter
    };
    let set = |s: RawBson, update: &RawBson, upsert: bool| Statement::Update {
        filter: id(s),
        update: update.clone(),
        upsert,
    };
    let inc = delta.inc.map(compat::raw).transpose()?;
    let mut ops = Vec::with_capacity(5);
    if let Some(d) = delta.dec {
        let d = compat::raw(d)?;
        if let Some(i) = &inc {
            // Nothing is written when the `+1` would land on a damaged
            // count.
            ops.push(set(i.clone(), &u.same, false));
        }
        // An upsert, so that a missing score is refused rather than
        // matching nothing while the `+1` goes ahead.
        ops.push(set(d.clone(), &u.minus, true));
        ops.push(set(RawBson::MinKey, &u.marker, true));
        let mut filter = id(d);
        append(&mut filter, "count", RawBson::Int32(0));
        ops.push(Statement::Delete { filter });
    }
    if let Some(i) = inc {
        ops.push(set(i, &u.plus, true));
    }
    Ok(ops)
}

/// The documents layout's updates, the same for every write: built once.
struct Updates {
    /// The `+1`'s target checked and left as it is.
    same: RawBson,
    /// `-1`, refused when nobody holds the score.
    minus: RawBson,
    /// The board's marker, created if missing.
    marker: RawBson,
    /// `+1`, the score created if missing.
    plus: RawBson,
}

fn updates() -> Result<&'static Updates> {
    static UPDATES: OnceLock<Option<Updates>> = OnceLock::new();
    UPDATES
        .get_or_init(|| {
            let valid = doc! {"$and": [
                {"$in": [{"$type": "$count"}, ["int", "long"]]},
                {"$gte": ["$count", 0]},
            ]};
            let set = |to: Bson| compat::raw(&bson::bson!([{"$set": {"count": to}}])).ok();
            Some(Updates {
                same: set(bson::bson!({"$cond": [&valid, "$count", refuse()]}))?,
                minus: set(bson::bson!({"$cond": [
                    {"$and": [&valid, {"$gt": ["$count", 0]}]},
                    {"$add": ["$count", -1_i64]},
                    refuse(),
                ]}))?,
                marker: compat::raw(&bson::bson!({"$setOnInsert": {"count": 0_i64}})).ok()?,
                plus: set(bson::bson!({"$cond": [
                    {"$eq": [{"$type": "$count"}, "missing"]},
                    1_i64,
                    {"$cond": [&valid, {"$add": ["$count", 1_i64]}, refuse()]},
                ]}))?,
            })
        })
        .as_ref()
        .ok_or_else(|| Error::invalid("update", "the histogram's updates do not encode"))
}

/// Whether the documents layout sends `bulkWrite`: allowed, and not
/// refused by this deployment yet.
fn uses_bulk_write<T: RankHistogram>(r: &Ranks<T>) -> bool {
    r.bulk_write && !r.no_bulk_write.load(Ordering::Relaxed)
}

/// `ops` as one ordered `bulkWrite` command; the first failed one, as
/// (index in `ops`, the server's error). A `writeConcernError` is the
/// error of the whole command.
async fn bulk_write_once<T: RankHistogram>(
    r: &Ranks<T>,
    ops: Vec<Statement>,
    o: &Options,
    session: Option<&mut ClientSession>,
    in_transaction: bool,
) -> std::result::Result<Option<(usize, mongodb::error::Error)>, mongodb::error::Error> {
    let mut arr = RawArrayBuf::new();
    for op in ops {
        arr.push(RawBson::Document(op.into_bulk_op(0)));
    }
    let mut command = RawDocumentBuf::new();
    append(&mut command, r.bulk_command, RawBson::Int32(1));
    append(&mut command, "ops", RawBson::Array(arr));
    append(
        &mut command,
        "nsInfo",
        ns_info(r.db.name(), &[r.hist.name()]),
    );
    append(&mut command, "ordered", RawBson::Boolean(true));
    append(&mut command, "errorsOnly", RawBson::Boolean(true));
    command_options(r, &mut command, o, in_transaction)?;
    let admin = r.db.client().database("admin");
    let reply = match crate::action::run!(admin.run_raw_command(command), session) {
        Ok(reply) => reply,
        // Nothing of it ran: as a refusal of its first statement.
        Err(e) if outcome(&e) == Outcome::NotStored => return Ok(Some((0, e))),
        Err(e) => return Err(e),
    };
    if let Some(failed) = first_bulk_error(&reply) {
        return Ok(Some(failed));
    }
    crate::action::command_write_errors(&reply)?;
    Ok(None)
}

/// A `bulkWrite`'s `nsInfo`: one entry per collection of `db`.
pub(super) fn ns_info(db: &str, collections: &[&str]) -> RawBson {
    let mut arr = RawArrayBuf::new();
    for c in collections {
        let mut ns = RawDocumentBuf::new();
        append(&mut ns, "ns", RawBson::String(format!("{db}.{c}")));
        arr.push(RawBson::Document(ns));
    }
    RawBson::Array(arr)
}

/// `o` on a `run_command` write, which inherits nothing: the effective
/// write concern (the operation's, else the histogram collection's,
/// which has the database's and the client's), except inside a
/// transaction, whose own applies.
pub(super) fn command_options<T: RankHistogram>(
    r: &Ranks<T>,
    command: &mut RawDocumentBuf,
    o: &Options,
    in_txn: bool,
) -> Result<()> {
    let inherited = if in_txn { None } else { r.hist.write_concern() };
    let mut fields = Document::new();
    o.command_fields(&mut fields, inherited, true)?;
    for (k, v) in &fields {
        append(command, k, compat::raw(v)?);
    }
    Ok(())
}

/// `ops` as the commands every server takes: one ordered `update`
/// command with the update statements, then one `delete` command (the
/// fallback sorts the delete last). The first failed statement, as
/// (index in `ops`, code, message).
async fn commands_once<T: RankHistogram>(
    r: &Ranks<T>,
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
    let command = |name: &str, list: &str, stmts: RawArrayBuf| {
        let mut command = RawDocumentBuf::new();
        append(
            &mut command,
            name,
            RawBson::String(r.hist.name().to_owned()),
        );
        append(&mut command, list, RawBson::Array(stmts));
        append(&mut command, "ordered", RawBson::Boolean(true));
        command
    };
    if !updates.is_empty() {
        let mut stmts = RawArrayBuf::new();
        for op in updates {
            if let Statement::Update {
                filter,
                update,
                upsert,
            } = op
            {
                let mut stmt = RawDocumentBuf::new();
                append(&mut stmt, "q", RawBson::Document(filter.clone()));
                append(&mut stmt, "u", update.clone());
                append(&mut stmt, "upsert", RawBson::Boolean(*upsert));
                append(&mut stmt, "multi", RawBson::Boolean(false));
                stmts.push(RawBson::Document(stmt));
            }
        }
        commands.push((0, command("update", "updates", stmts)));
    }
    if !deletes.is_empty() {
        let mut stmts = RawArrayBuf::new();
        for op in deletes {
            if let Statement::Delete { filter } = op {
                let mut stmt = RawDocumentBuf::new();
                append(&mut stmt, "q", RawBson::Document(filter.clone()));
                append(&mut stmt, "limit", RawBson::Int32(1));
                stmts.push(RawBson::Document(stmt));
            }
        }
        commands.push((split, command("delete", "deletes", stmts)));
    }
    for (offset, mut command) in commands {
        command_options(r, &mut command, o, in_transaction)?;
        let run = r.db.run_raw_command(command);
        let reply = match crate::action::run!(run, session.as_deref_mut()) {
            Ok(reply) => reply,
            // Nothing of this command ran: as a refusal of its first
            // statement (the one before, if any, is stored).
            Err(e) if outcome(&e) == Outcome::NotStored => return Ok(Some((offset, e))),
            Err(e) => return Err(e.into()),
        };
        if let Some((idx, e)) = crate::action::first_write_error(&reply) {
            return Ok(Some((offset + idx, e)));
        }
        crate::action::command_write_errors(&reply)?;
    }
    Ok(None)
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

/// The first failed operation of a `bulkWrite` reply: (index, the server's
/// error).
pub(super) fn first_bulk_error(reply: &Document) -> Option<(usize, mongodb::error::Error)> {
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
        Some(r) => crate::action::write_error_at(r, "idx"),
        None => (
            0,
            mongodb::error::Error::custom("bulkWrite reported an error it did not list"),
        ),
    })
}

/// Whether the server cannot run `bulkWrite` (nothing was written):
/// 6.0 does not know it (59), 7.0 refuses 8.0's fields (40415),
/// DocumentDB and the documentdb engine do not support it (303, 115).
pub(super) fn refused_bulk_write(e: &mongodb::error::Error) -> bool {
    crate::error::code::lacks_command(e, "bulkWrite")
}

/// [`crate::action::unknown_outcome`] for this layout's writes.
fn unknown_outcome(e: Error, in_transaction: bool) -> Error {
    crate::failover::unknown("rank write", in_transaction, e)
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
