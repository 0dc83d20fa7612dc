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

/// The rank aggregation written by hand, array layout.
pub(crate) fn array_rank_by_hand(score: f64) -> Vec<Document> {
    vec![
        doc! {"$match": {"_id": EXAM}},
        doc! {"$project": {
            "_id": 0,
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
        doc! {"$match": {"_id": {
            "$gte": {"b": EXAM, "s": Bson::MinKey},
            "$lte": {"b": EXAM, "s": Bson::MaxKey},
        }}},
        doc! {"$group": {
            "_id": Bson::Null,
            "above": {"$sum": {"$cond": [{"$gt": ["$_id.s", score]}, "$count", 0]}},
            "distinctAbove": {"$sum": {"$cond": [
                {"$and": [{"$gt": ["$_id.s", score]}, {"$gt": ["$count", 0]}]}, 1, 0,
            ]}},
            "ties": {"$sum": {"$cond": [{"$eq": ["$_id.s", score]}, "$count", 0]}},
            "total": {"$sum": "$count"},
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
    let get = |k: &str| lossy_u64(d.get(k)).ok_or_else(|| format!("no `{k}` in {d}"));
    Ok(HandRank {
        rank: get("above")? + 1,
        dense: get("distinctAbove")? + 1,
        ties: get("ties")?,
        total: get("total")?,
    })
}

/// The histogram change written by hand, array layout: one pipeline update
/// of the exam's document, `-1` at `old` and `+1` at `new` (inserted in
/// order when new), emptied scores dropped.
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
    let pipeline = vec![doc! {"$set": {"scores": {"$filter": {
        "input": arr, "as": "e", "cond": {"$gt": ["$$e.count", 0]},
    }}}}];
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

/// The histogram change written by hand, documents layout: one `update`
/// command of two statements.
pub(crate) async fn docs_change_by_hand(db: &Database, old: f64, new: f64) -> BoxResult<()> {
    let reply = db
        .run_command(doc! {
            "update": "students_docs_ranks",
            "updates": [
                {"q": {"_id": {"b": EXAM, "s": old}, "count": {"$gt": 0}}, "u": {"$inc": {"count": -1_i64}}},
                {"q": {"_id": {"b": EXAM, "s": new}}, "u": {"$inc": {"count": 1_i64}}, "upsert": true},
            ],
            "ordered": true,
        })
        .await?;
    if reply.get_array("writeErrors").is_ok_and(|e| !e.is_empty()) {
        return Err(format!("write error: {reply}").into());
    }
    if lossy_u64(reply.get("n")) != Some(2) {
        return Err("nobody holds the old score".into());
    }
    Ok(())
}
