//! The hand-written baselines: the commands of `rank` and `change` as a
//! user of the driver would write them.
//!
//! They repeat what the runtime sends on purpose, and share none of its
//! code: a baseline built on the runtime's helpers could not show what
//! those helpers cost. When the runtime's commands change, the checks in
//! [`crate::generated`] say so, and these are updated by hand.

use futures::TryStreamExt;
use mongo_patterns::bson::{self, Bson};
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::BoxResult;

use crate::{lossy_u64, EXAM};

/// Whether the exam's array board is well-formed, best score first:
/// `scores` an array (or absent) of `{score: number, count: integer ≥ 1}`,
/// each score above the next. A damaged board is reported, not summed,
/// and never written to.
fn valid_board() -> Bson {
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
                "in": {"$gt": [{"$arrayElemAt": ["$$z", 0]}, {"$arrayElemAt": ["$$z", 1]}]},
            }}]},
        ]},
        false,
    ]})
}

/// Whether a document of the documents layout is well-formed: a numeric
/// score with an integer count ≥ 0, or the exam's marker with count 0.
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

/// An expression that fails the command: what a write sends instead of a
/// value it must not write.
fn refuse() -> Bson {
    bson::bson!({"$toLong": {"$concat": ["refused by the rank histogram: ", {"$toString": {"$type": "$_id"}}]}})
}

/// The rank aggregation written by hand, array layout.
pub(crate) fn array_rank_by_hand(score: f64) -> Vec<Document> {
    vec![
        doc! {"$match": {"_id": EXAM}},
        doc! {"$set": {"valid": valid_board()}},
        doc! {"$set": {"scores": {"$cond": ["$valid", {"$ifNull": ["$scores", []]}, []]}}},
        doc! {"$project": {
            "_id": 0,
            "valid": 1,
            "above": {"$sum": {"$map": {
                "input": {"$filter": {"input": "$scores", "as": "e", "cond": {"$gt": ["$$e.score", score]}}},
                "as": "e", "in": "$$e.count",
            }}},
            "distinctAbove": {"$size": {"$filter": {
                "input": "$scores", "as": "e",
                "cond": {"$and": [{"$gt": ["$$e.score", score]}, {"$gt": ["$$e.count", 0]}]},
            }}},
            "ties": {"$sum": {"$map": {
                "input": {"$filter": {"input": "$scores", "as": "e", "cond": {"$eq": ["$$e.score", score]}}},
                "as": "e", "in": "$$e.count",
            }}},
            "total": {"$sum": {"$map": {"input": "$scores", "as": "e", "in": "$$e.count"}}},
        }},
    ]
}

/// The rank aggregation written by hand, documents layout.
pub(crate) fn docs_rank_by_hand(score: f64) -> Vec<Document> {
    vec![
        // `_id.b` as well: a hashed `{_id.b}` shard key targets one shard.
        doc! {"$match": {
            "_id": {
                "$gte": {"b": EXAM, "s": Bson::MinKey},
                "$lte": {"b": EXAM, "s": Bson::MaxKey},
            },
            "_id.b": EXAM,
        }},
        doc! {"$group": {
            "_id": Bson::Null,
            "above": {"$sum": {"$cond": [{"$gt": ["$_id.s", score]}, "$count", 0]}},
            "distinctAbove": {"$sum": {"$cond": [
                {"$and": [{"$gt": ["$_id.s", score]}, {"$gt": ["$count", 0]}]}, 1, 0,
            ]}},
            "ties": {"$sum": {"$cond": [{"$eq": ["$_id.s", score]}, "$count", 0]}},
            "total": {"$sum": "$count"},
            "bad": {"$max": {"$cond": [valid_document(), Bson::Null, "$$ROOT"]}},
        }},
    ]
}

/// What a hand-written caller reads from the reply.
#[derive(Debug, PartialEq)]
pub(crate) struct HandRank {
    pub(crate) rank: u64,
    pub(crate) dense: u64,
    pub(crate) ties: u64,
    pub(crate) total: u64,
}

pub(crate) async fn rank_by_hand(
    coll: &Collection<Document>,
    pipeline: Vec<Document>,
) -> BoxResult<HandRank> {
    let mut cursor = coll.aggregate(pipeline).await?;
    let d = cursor.try_next().await?.ok_or("unknown exam")?;
    if d.get_bool("valid").ok() == Some(false) || d.get_document("bad").is_ok() {
        return Err(format!("a damaged board: {d}").into());
    }
    let get = |k: &str| lossy_u64(d.get(k)).ok_or_else(|| format!("no `{k}` in {d}"));
    Ok(HandRank {
        rank: get("above")? + 1,
        dense: get("distinctAbove")? + 1,
        ties: get("ties")?,
        total: get("total")?,
    })
}

/// The histogram change written by hand, array layout: one pipeline update
/// of the exam's document that refuses a damaged board, then `-1` at `old`
/// and `+1` at `new` (inserted in order when new), emptied scores dropped.
pub(crate) async fn array_change_by_hand(
    coll: &Collection<Document>,
    old: f64,
    new: f64,
) -> BoxResult<()> {
    let step = |arr: Bson, s: f64, by: i64| -> Bson {
        bson::bson!({"$let": {
            "vars": {"a": arr},
            "in": {"$cond": [
                {"$in": [s, {"$map": {"input": "$$a", "as": "e", "in": "$$e.score"}}]},
                {"$map": {"input": "$$a", "as": "e", "in": {"$cond": [
                    {"$eq": ["$$e.score", s]},
                    {"$mergeObjects": ["$$e", {"count": {"$add": ["$$e.count", by]}}]},
                    "$$e",
                ]}}},
                {"$concatArrays": [
                    {"$filter": {"input": "$$a", "as": "e", "cond": {"$gt": ["$$e.score", s]}}},
                    [{"score": s, "count": by}],
                    {"$filter": {"input": "$$a", "as": "e", "cond": {"$lt": ["$$e.score", s]}}},
                ]},
            ]},
        }})
    };
    let arr = Bson::from(doc! {"$ifNull": ["$scores", []]});
    let arr = step(step(arr, old, -1), new, 1);
    let pipeline = vec![
        doc! {"$set": {"scores": {"$cond": [valid_board(), {"$ifNull": ["$scores", []]}, refuse()]}}},
        doc! {"$set": {"scores": {"$filter": {
            "input": arr, "as": "e", "cond": {"$gt": ["$$e.count", 0]},
        }}}},
    ];
    let filter = doc! {
        "_id": EXAM,
        "scores": {"$elemMatch": {"score": old, "count": {"$gt": 0}}},
        "$or": [{"scores.score": new}, {"scores.99999": {"$exists": false}}],
    };
    let r = coll.update_one(filter, pipeline).upsert(false).await?;
    if r.matched_count != 1 {
        return Err("nobody holds the old score".into());
    }
    Ok(())
}

/// The histogram change written by hand, documents layout: one ordered
/// `bulkWrite` of five statements. The new score's count is checked (and
/// left as it is), the old one's decremented (refused when nobody holds
/// it), the exam's marker kept, the old score's document deleted if it
/// reached 0, and the new one's incremented or created.
pub(crate) async fn docs_change_by_hand(db: &Database, old: f64, new: f64) -> BoxResult<()> {
    let valid = doc! {"$and": [
        {"$in": [{"$type": "$count"}, ["int", "long"]]},
        {"$gte": ["$count", 0]},
    ]};
    let id = |s: Bson| doc! {"b": EXAM, "s": s};
    let set = |s: f64, count: Bson, upsert: bool| {
        doc! {
            "update": 0, "filter": {"_id": id(s.into())}, "multi": false, "upsert": upsert,
            "updateMods": [{"$set": {"count": count}}],
        }
    };
    let same = bson::bson!({"$cond": [&valid, "$count", refuse()]});
    let minus = bson::bson!({"$cond": [
        {"$and": [&valid, {"$gt": ["$count", 0]}]},
        {"$add": ["$count", -1_i64]},
        refuse(),
    ]});
    let plus = bson::bson!({"$cond": [
        {"$eq": [{"$type": "$count"}, "missing"]},
        1_i64,
        {"$cond": [&valid, {"$add": ["$count", 1_i64]}, refuse()]},
    ]});
    let ops = vec![
        set(new, same, false),
        set(old, minus, true),
        doc! {"delete": 0, "filter": {"_id": id(old.into()), "count": 0}, "multi": false},
        set(new, plus, true),
    ];
    let ns = format!("{}.students_docs_ranks", db.name());
    let reply = db
        .client()
        .database("admin")
        .run_command(doc! {
            "bulkWrite": 1, "ops": ops, "nsInfo": [{"ns": ns}],
            "ordered": true, "errorsOnly": true,
        })
        .await?;
    if lossy_u64(reply.get("nErrors")) != Some(0) {
        return Err(format!("the change was refused: {reply}").into());
    }
    Ok(())
}
