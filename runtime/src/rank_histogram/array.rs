//! The `"array"` layout: one document per board,
//! `{_id: board, scores: [{score, count}]}`, kept sorted best first. Every
//! write is one pipeline update of that document, checked on the server.

use mongodb::bson;
use std::sync::OnceLock;

use futures::future::BoxFuture;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::TRANSIENT_TRANSACTION_ERROR;
use mongodb::options::UpdateModifications;
use mongodb::ClientSession;

use super::read::first_of;
use super::score::as_number;
use super::write::{refuse, Delta, Statement, Txn};
use super::{RankHistogram, RankSpec, Ranks, Store, ARRAY_LIMIT};
use crate::action::{Effective, Options};
use crate::error::code::{DUPLICATE_KEY, REFUSED};
use crate::error::{server_codes, Error, Result};

pub(super) struct ArrayStore;

impl<T: RankHistogram> Store<T> for ArrayStore {
    fn rank_pipeline(&self, spec: &RankSpec, board: &Bson, score: &Bson) -> Vec<Document> {
        let better = if spec.descending { "$gt" } else { "$lt" };
        let sum_where = |cond: Document| {
            doc! {"$sum": {"$map": {
                "input": {"$filter": {"input": "$scores", "as": "e", "cond": cond}},
                "as": "e", "in": "$$e.count",
            }}}
        };
        vec![
            doc! {"$match": {"_id": board}},
            // A damaged board is reported, not summed.
            doc! {"$set": {"valid": valid_board(spec.descending)}},
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

    fn rank_damage<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        reply: &'a Document,
    ) -> BoxFuture<'a, Option<Error>> {
        Box::pin(async move {
            if reply.get_bool("valid").ok() == Some(true) {
                return None;
            }
            Some(damage_or(r, board, "the board check").await)
        })
    }

    fn write<'a>(
        &'a self,
        r: &'a Ranks<T>,
        board: &'a Bson,
        delta: Delta<'a>,
        o: &'a Options,
        session: Option<&'a mut ClientSession>,
        _txn: Txn,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(write(r, board, delta, o, session))
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
        session: Option<&'a mut ClientSession>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let arr: Vec<Bson> = scores
                .iter()
                .map(|(s, n)| Bson::Document(doc! {"score": s, "count": *n as i64}))
                .collect();
            let replace = r
                .hist
                .replace_one(doc! {"_id": board}, doc! {"_id": board, "scores": arr})
                .with_options(o.driver())
                .upsert(true);
            crate::action::run!(replace, session)?;
            Ok(())
        })
    }
}

async fn write<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    delta: Delta<'_>,
    o: &Options,
    session: Option<&mut ClientSession>,
) -> Result<()> {
    let filter = filter_of(board, delta);
    let pipeline = array_update(delta, r.spec.descending);
    let update = r
        .hist
        .update_one(filter, pipeline)
        .with_options(o.driver())
        .upsert(delta.dec.is_none());
    let result = crate::action::run!(update, session);
    match result {
        Ok(w) if w.matched_count > 0 || w.upserted_id.is_some() => Ok(()),
        // Boxed when taken: inline, it would make every write's future too
        // large for a small allocation.
        Ok(_) => Err(Box::pin(why_not_written(r, board, delta)).await),
        // The upsert of a board that exists: it is full, or a concurrent
        // writer created it (retried).
        Err(e) if server_codes(&e).contains(&DUPLICATE_KEY) => {
            if let Some(i) = delta.inc {
                if full(r, board, i).await? {
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
            Err(damage_or(r, board, "the board check").await)
        }
        Err(e) => Err(e.into()),
    }
}

/// The array layout's write of `delta` as one statement: the board's
/// update, an upsert when no `-1` comes first.
pub(super) fn statement(board: &Bson, delta: Delta<'_>, descending: bool) -> Statement {
    Statement::Update {
        filter: filter_of(board, delta),
        update: UpdateModifications::Pipeline(array_update(delta, descending)),
        upsert: delta.dec.is_none(),
    }
}

/// The array layout's write of a group's calls (see `group`) as one
/// statement: each score's net change (`nets`, none 0), in one rewrite of
/// the board, an upsert. One pass over the board whatever the number of
/// calls (each entry's count plus its net change, found by a `$switch`),
/// the scores new to the board added, the emptied ones dropped, then
/// `$sortArray` (MongoDB 5.2+; a group only runs where `bulkWrite`, 8.0,
/// does): no `$let` per score, which costs a copy of the array per use on
/// some servers. Refused (nothing written) when a score to lower is
/// missing or would fall below 0, when the board would pass
/// [`ARRAY_LIMIT`], or when the board is damaged: the group's calls then
/// run alone, and say which.
pub(super) fn group_statement(board: &Bson, nets: &[(Bson, i64)], descending: bool) -> Statement {
    let held = bson::bson!({"$map": {"input": "$scores", "as": "e", "in": "$$e.score"}});
    let branches: Vec<Bson> = nets
        .iter()
        .map(|(s, by)| bson::bson!({"case": {"$eq": ["$$e.score", s]}, "then": by}))
        .collect();
    let plus = bson::bson!({"$switch": {"branches": branches, "default": 0_i64}});
    let mut parts = vec![bson::bson!({"$map": {"input": "$scores", "as": "e", "in": {
        "$mergeObjects": ["$$e", {"count": {"$add": ["$$e.count", plus]}}],
    }}})];
    let mut present = Vec::new();
    for (s, by) in nets {
        if *by > 0 {
            parts.push(bson::bson!({"$cond": [
                {"$in": [s, held.clone()]},
                [],
                [{"score": s, "count": by}],
            ]}));
        } else {
            present.push(bson::bson!({"$in": [s, held.clone()]}));
        }
    }
    let limit = i64::try_from(ARRAY_LIMIT).unwrap_or(i64::MAX);
    let dir = if descending { -1_i32 } else { 1 };
    let update = vec![
        // Nothing is written on a damaged board.
        doc! {"$set": {"scores": {"$cond": [valid_board(descending), {"$ifNull": ["$scores", []]}, refuse()]}}},
        doc! {"$set": {"scores": {"$cond": [
            {"$and": present},
            {"$concatArrays": parts},
            refuse(),
        ]}}},
        doc! {"$set": {"scores": {"$cond": [
            {"$and": [
                {"$allElementsTrue": [{"$map": {"input": "$scores", "as": "e", "in": {"$gte": ["$$e.count", 0]}}}]},
                {"$lte": [{"$size": "$scores"}, limit]},
            ]},
            {"$sortArray": {
                "input": {"$filter": {"input": "$scores", "as": "e", "cond": {"$gt": ["$$e.count", 0]}}},
                "sortBy": {"score": dir},
            }},
            refuse(),
        ]}}},
    ];
    Statement::Update {
        filter: doc! {"_id": board},
        update: UpdateModifications::Pipeline(update),
        upsert: true,
    }
}

/// What the board's update matches: the board, holding a count above 0 at
/// `dec`, and `inc` or room for one more score.
fn filter_of(board: &Bson, delta: Delta<'_>) -> Document {
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
    filter
}

async fn rows<T: RankHistogram>(
    r: &Ranks<T>,
    board: &Bson,
    limit: Option<u32>,
    o: Effective<'_>,
    session: Option<&mut ClientSession>,
) -> Result<Vec<(Bson, Document)>> {
    // A valid board is sorted best first, every count at least 1.
    let all = bson::bson!({"$ifNull": ["$scores", []]});
    let scores = match limit {
        Some(n) => bson::bson!({"$slice": [all, i64::from(n)]}),
        None => all,
    };
    // One document back, whatever `limit`: the first batch holds the
    // answer.
    let pipeline = vec![
        doc! {"$match": {"_id": board}},
        doc! {"$set": {"valid": valid_board(r.spec.descending)}},
        doc! {"$project": {"valid": 1, "scores": {"$cond": ["$valid", scores, []]}}},
    ];
    let Some(d) = first_of(&r.hist, pipeline, o, session).await? else {
        return Err(r.unknown_board(board));
    };
    if d.get_bool("valid").ok() != Some(true) {
        return Err(damage_or(r, board, "the board check").await);
    }
    let entries = d
        .get_array("scores")
        .map_err(|_| Error::damaged(r.hist.name(), board.clone(), "scores", "is not an array"))?;
    Ok(entries
        .iter()
        .filter_map(Bson::as_document)
        .map(|e| (board.clone(), e.clone()))
        .collect())
}

/// After a write that matched nothing: a damaged board, an unknown board,
/// or a score nobody holds.
async fn why_not_written<T: RankHistogram>(r: &Ranks<T>, board: &Bson, delta: Delta<'_>) -> Error {
    match board_damage(r, board).await {
        Err(e) => return e,
        Ok(Some(e)) => return e,
        Ok(None) => {}
    }
    let found = r.hist.find_one(doc! {"_id": board}).await;
    r.not_written(board, delta, found)
}

/// The damage the server saw on `board`, named by a look at it; `check`
/// says which server-side check failed if the look finds nothing.
async fn damage_or<T: RankHistogram>(r: &Ranks<T>, board: &Bson, check: &str) -> Error {
    match board_damage(r, board).await {
        Err(e) | Ok(Some(e)) => e,
        Ok(None) => Error::damaged(
            r.hist.name(),
            board.clone(),
            "scores",
            format!("fails {check}"),
        ),
    }
}

/// [`Error::Damaged`] for `board`, if it is broken.
async fn board_damage<T: RankHistogram>(r: &Ranks<T>, board: &Bson) -> Result<Option<Error>> {
    Ok(match r.hist.find_one(doc! {"_id": board}).await? {
        None => None,
        Some(d) => array_problem(&d, r.spec.descending)
            .map(|(field, problem)| Error::damaged(r.hist.name(), board.clone(), field, problem)),
    })
}

/// Whether `board` holds [`ARRAY_LIMIT`] scores, none of them `score`.
async fn full<T: RankHistogram>(r: &Ranks<T>, board: &Bson, score: &Bson) -> Result<bool> {
    let last = format!("scores.{}", ARRAY_LIMIT - 1);
    let full = r
        .hist
        .find_one(doc! {"_id": board, last: {"$exists": true}, "scores.score": {"$ne": score}})
        .projection(doc! {"_id": 1})
        .await?;
    Ok(full.is_some())
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

/// Whether an array board is well-formed: `scores` an array (or absent) of
/// `{score: number, count: integer ≥ 1}`, strictly best first (so no score
/// twice). One pass over the array, on the server. Built once per
/// direction: a copy costs less than building it.
fn valid_board(descending: bool) -> Bson {
    static CHECKS: [OnceLock<Bson>; 2] = [OnceLock::new(), OnceLock::new()];
    CHECKS[usize::from(descending)]
        .get_or_init(|| board_check(descending))
        .clone()
}

fn board_check(descending: bool) -> Bson {
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

/// What is wrong with an array board, if anything: (field, problem).
pub(super) fn array_problem(d: &Document, descending: bool) -> Option<(String, String)> {
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
