//! An `explain` reply, whatever its shape, as the list of its plan's stages
//! and the work it reports.
//!
//! The shapes (MongoDB manual, "Explain Results"; the server's own
//! `jstests/libs/query/analyze_plan.js`):
//!
//! - mongod, classic engine (6.0; the surrogate):
//!   `queryPlanner.winningPlan: {stage, inputStage: {...}}`, and
//!   `executionStats: {nReturned, totalKeysExamined, totalDocsExamined, ...}`.
//! - mongod, slot-based engine (7.0, 8.0): the same tree one level down,
//!   `winningPlan: {queryPlan: {stage, ...}, slotBasedPlan: {...}}`.
//! - mongos, `find`: `queryPlanner.winningPlan: {stage: "SHARD_MERGE" |
//!   "SINGLE_SHARD", shards: [{shardName, winningPlan: {...}, ...}]}` (each
//!   shard's `winningPlan` in either engine's shape), and
//!   `executionStats.executionStages: {stage, totalKeysExamined, ...,
//!   shards: [{shardName, nReturned, totalKeysExamined, totalDocsExamined,
//!   executionStages}]}`.
//! - an aggregate: `stages: [{$cursor: {queryPlanner, executionStats}}, ...]`
//!   on mongod, or the `find` shape where the whole pipeline ran in the
//!   query layer; through mongos, `shards: {<name>: <either of those>}`.
//!
//! Stages are listed outermost first; on a sharded deployment the merge
//! stage comes first, then each shard's plan in turn. Keys and documents
//! examined are summed over the shards.

use mongo_patterns::bson::{Bson, Document};

/// What an `explain` reply says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Explain {
    /// Every stage of the winning plan(s), outermost first, each the
    /// stage's own document (its children still inside it).
    pub stages: Vec<Document>,
    /// The root of each winning plan tree: one from a mongod, one a shard
    /// (or `$cursor`) through mongos; the slot-based engine's `queryPlan`
    /// already unwrapped.
    pub plans: Vec<Document>,
    /// `totalKeysExamined`, summed over the shards; `None` without
    /// `executionStats`.
    pub keys_examined: Option<u64>,
    /// `totalDocsExamined`, summed over the shards.
    pub docs_examined: Option<u64>,
    /// `nReturned` of the whole command (on mongos, after the merge).
    pub n_returned: Option<u64>,
    /// The shards that answered (0 from a mongod).
    pub shards: usize,
}

/// The stage fields whose values are child stages (`analyze_plan.js`'s
/// list); `queryPlan` is the slot-based engine's wrapper.
const CHILDREN: [&str; 10] = [
    "queryPlan",
    "inputStage",
    "inputStages",
    "thenStage",
    "elseStage",
    "outerStage",
    "innerStage",
    "child",
    "leftChild",
    "rightChild",
];

impl Explain {
    /// Reads an `explain` reply (any verbosity).
    pub fn of(reply: &Document) -> Explain {
        let mut e = Explain::default();
        e.node(reply);
        e
    }

    /// The stages' names, with the index an index scan names:
    /// `["LIMIT", "FETCH", "IXSCAN mp_keyset_initTime"]`.
    pub fn stage_names(&self) -> Vec<String> {
        self.stages
            .iter()
            .filter_map(|s| {
                let stage = s.get_str("stage").ok()?;
                Some(match s.get_str("indexName") {
                    Ok(index) => format!("{stage} {index}"),
                    Err(_) => stage.to_owned(),
                })
            })
            .collect()
    }

    /// The indexes the plan's index scans read, in plan order (`IXSCAN`,
    /// and 8.0's `EXPRESS_IXSCAN`).
    pub fn index_scans(&self) -> Vec<&str> {
        self.stages
            .iter()
            .filter(|s| {
                s.get_str("stage")
                    .is_ok_and(|n| n == "IXSCAN" || n == "EXPRESS_IXSCAN")
            })
            .filter_map(|s| s.get_str("indexName").ok())
            .collect()
    }

    /// Whether a stage of this name is in the plan.
    pub fn has_stage(&self, name: &str) -> bool {
        self.stages
            .iter()
            .any(|s| s.get_str("stage").ok() == Some(name))
    }

    /// One node's explain: the reply itself, a shard's part of it, or an
    /// aggregate's `$cursor`.
    fn node(&mut self, node: &Document) {
        // mongos, an aggregate: {shards: {name: explain}}.
        if let Ok(shards) = node.get_document("shards") {
            for (_, shard) in shards {
                if let Bson::Document(shard) = shard {
                    self.shards += 1;
                    self.node(shard);
                }
            }
            return;
        }
        if let Ok(planner) = node.get_document("queryPlanner") {
            let winning = planner.get_document("winningPlan").ok();
            match winning.and_then(|w| w.get_array("shards").ok()) {
                // mongos, a find: the merge stage, then each shard's plan.
                Some(shards) => {
                    let mut merge = winning.cloned().unwrap_or_default();
                    merge.remove("shards");
                    self.stages.push(merge);
                    for shard in shards.iter().filter_map(Bson::as_document) {
                        self.shards += 1;
                        if let Ok(plan) = shard.get_document("winningPlan") {
                            self.plan(plan);
                        }
                    }
                }
                None => {
                    if let Some(plan) = winning {
                        self.plan(plan);
                    }
                }
            }
            if let Ok(stats) = node.get_document("executionStats") {
                self.stats(stats);
            }
            return;
        }
        // mongod, an aggregate: {stages: [{$cursor: {queryPlanner, ...}}, ...]}.
        if let Ok(stages) = node.get_array("stages") {
            for stage in stages.iter().filter_map(Bson::as_document) {
                if let Ok(cursor) = stage.get_document("$cursor") {
                    self.node(cursor);
                }
            }
        }
    }

    /// A winning plan, in either engine's shape.
    fn plan(&mut self, winning: &Document) {
        let root = winning.get_document("queryPlan").unwrap_or(winning);
        self.plans.push(root.clone());
        self.walk(root);
    }

    /// A plan tree, outermost first. The slot-based engine's `queryPlan`
    /// wrapper is looked through (its `slotBasedPlan` is not a stage tree).
    fn walk(&mut self, plan: &Document) {
        if plan.contains_key("stage") {
            self.stages.push(plan.clone());
        }
        for key in CHILDREN {
            match plan.get(key) {
                Some(Bson::Document(child)) => self.walk(child),
                Some(Bson::Array(children)) => {
                    for child in children.iter().filter_map(Bson::as_document) {
                        self.walk(child);
                    }
                }
                _ => {}
            }
        }
    }

    /// `executionStats`: per shard where mongos lists them, else its own
    /// totals.
    fn stats(&mut self, stats: &Document) {
        if self.n_returned.is_none() {
            self.n_returned = count(stats, "nReturned");
        } else if let Some(n) = count(stats, "nReturned") {
            // Several `$cursor`s or shards' aggregates: their sum.
            self.n_returned = Some(self.n_returned.unwrap_or(0) + n);
        }
        let per_shard = stats
            .get_document("executionStages")
            .and_then(|s| s.get_array("shards"))
            .ok()
            .map(|a| a.iter().filter_map(Bson::as_document).collect::<Vec<_>>())
            .filter(|a| !a.is_empty());
        let parts = per_shard.unwrap_or_else(|| vec![stats]);
        for part in parts {
            add(&mut self.keys_examined, count(part, "totalKeysExamined"));
            add(&mut self.docs_examined, count(part, "totalDocsExamined"));
        }
    }
}

fn add(total: &mut Option<u64>, n: Option<u64>) {
    if let Some(n) = n {
        *total = Some(total.unwrap_or(0) + n);
    }
}

/// A count, whichever numeric type the server sent it as.
pub fn count(doc: &Document, key: &str) -> Option<u64> {
    match doc.get(key)? {
        Bson::Int32(v) => u64::try_from(*v).ok(),
        Bson::Int64(v) => u64::try_from(*v).ok(),
        Bson::Double(v) if *v >= 0.0 => Some(*v as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongo_patterns::bson::doc;

    /// A keyset page's plan: LIMIT <- FETCH <- IXSCAN.
    fn tree(index: &str) -> Document {
        doc! {
            "stage": "LIMIT",
            "limitAmount": 51,
            "inputStage": {
                "stage": "FETCH",
                "inputStage": {
                    "stage": "IXSCAN",
                    "keyPattern": {"initTime": 1, "_id": 1},
                    "indexName": index,
                    "direction": "forward",
                    "indexBounds": {"initTime": ["[MinKey, MaxKey]"], "_id": ["[MinKey, MaxKey]"]},
                },
            },
        }
    }

    /// mongod 6.0, classic engine: the tree at `winningPlan`.
    #[test]
    fn classic_mongod() {
        let reply = doc! {
            "explainVersion": "1",
            "queryPlanner": {
                "namespace": "db.visits",
                "indexFilterSet": false,
                "winningPlan": tree("mp_keyset_initTime"),
                "rejectedPlans": [{"stage": "SORT", "inputStage": {"stage": "COLLSCAN"}}],
            },
            "executionStats": {
                "executionSuccess": true,
                "nReturned": 51,
                "executionTimeMillis": 0,
                "totalKeysExamined": 51,
                "totalDocsExamined": 51_i64,
                "executionStages": tree("mp_keyset_initTime"),
            },
            "serverInfo": {"host": "h", "port": 27017, "version": "6.0.19"},
            "ok": 1.0,
        };
        let e = Explain::of(&reply);
        assert_eq!(
            e.stage_names(),
            ["LIMIT", "FETCH", "IXSCAN mp_keyset_initTime"]
        );
        assert_eq!(e.index_scans(), ["mp_keyset_initTime"]);
        assert!(!e.has_stage("COLLSCAN"), "rejected plans are not the plan");
        assert_eq!(
            (e.keys_examined, e.docs_examined, e.n_returned, e.shards),
            (Some(51), Some(51), Some(51), 0)
        );
    }

    /// mongod 7.0 / 8.0, slot-based engine: the tree under
    /// `winningPlan.queryPlan`, beside `slotBasedPlan`.
    #[test]
    fn slot_based_mongod() {
        let reply = doc! {
            "explainVersion": "2",
            "queryPlanner": {
                "namespace": "db.visits",
                "winningPlan": {
                    "queryPlan": tree("mp_keyset_initTime"),
                    "slotBasedPlan": {"slots": "$$RESULT=s11 env: { }", "stages": "[2] limit 51 ..."},
                },
                "rejectedPlans": [],
            },
            "executionStats": {
                "executionSuccess": true,
                "nReturned": 51,
                "totalKeysExamined": 52,
                "totalDocsExamined": 51,
                "executionStages": {"stage": "limit", "planNodeId": 3},
            },
            "ok": 1.0,
        };
        let e = Explain::of(&reply);
        assert_eq!(
            e.stage_names(),
            ["LIMIT", "FETCH", "IXSCAN mp_keyset_initTime"]
        );
        assert_eq!((e.keys_examined, e.docs_examined), (Some(52), Some(51)));
        assert_eq!(e.plans, [tree("mp_keyset_initTime")]);
    }

    /// mongos with two shards, a `find`: the merge stage, then each
    /// shard's plan (one classic, one slot-based); keys and documents
    /// summed over the shards, `nReturned` after the merge.
    #[test]
    fn mongos_two_shards() {
        let shard = |name: &str, plan: Document| {
            doc! {
                "shardName": name,
                "connectionString": format!("{name}/{name}:27018"),
                "serverInfo": {"host": name, "port": 27018, "version": "8.0.4"},
                "namespace": "db.visits",
                "winningPlan": plan,
                "rejectedPlans": [],
            }
        };
        let stats = |name: &str, n: i32, keys: i32, docs: i32| {
            doc! {
                "shardName": name,
                "executionSuccess": true,
                "nReturned": n,
                "executionTimeMillis": 1,
                "totalKeysExamined": keys,
                "totalDocsExamined": docs,
                "executionStages": {"stage": "limit"},
            }
        };
        let reply = doc! {
            "queryPlanner": {
                "mongosPlannerVersion": 1,
                "winningPlan": {
                    "stage": "SHARD_MERGE_SORT",
                    "shards": [
                        shard("sh1", {
                            let mut t = tree("mp_keyset_initTime");
                            t.get_document_mut("inputStage").unwrap().insert(
                                "inputStage",
                                doc! {"stage": "SHARDING_FILTER", "inputStage": {"stage": "IXSCAN", "indexName": "mp_keyset_initTime"}},
                            );
                            t
                        }),
                        shard("sh2", doc! {"queryPlan": tree("mp_keyset_initTime"), "slotBasedPlan": {}}),
                    ],
                },
            },
            "executionStats": {
                "nReturned": 51,
                "executionTimeMillis": 2,
                "totalKeysExamined": 80,
                "totalDocsExamined": 70,
                "executionStages": {
                    "stage": "SHARD_MERGE_SORT",
                    "nReturned": 51,
                    "totalKeysExamined": 80,
                    "totalDocsExamined": 70,
                    "shards": [stats("sh1", 40, 50, 40), stats("sh2", 30, 30, 30)],
                },
            },
            "ok": 1.0,
        };
        let e = Explain::of(&reply);
        assert_eq!(
            e.stage_names(),
            [
                "SHARD_MERGE_SORT",
                "LIMIT",
                "FETCH",
                "SHARDING_FILTER",
                "IXSCAN mp_keyset_initTime",
                "LIMIT",
                "FETCH",
                "IXSCAN mp_keyset_initTime",
            ]
        );
        assert_eq!((e.shards, e.plans.len()), (2, 2));
        assert_eq!(e.plans[1], tree("mp_keyset_initTime"));
        assert_eq!(
            (e.keys_examined, e.docs_examined, e.n_returned),
            (Some(80), Some(70), Some(51))
        );
    }

    /// An aggregate: the `$cursor` stage's plan and stats on mongod; per
    /// shard, under `shards: {name: ...}`, through mongos.
    #[test]
    fn aggregates() {
        let cursor = |keys: i32| {
            doc! {"$cursor": {
                "queryPlanner": {"winningPlan": {"stage": "PROJECTION_COVERED", "inputStage": {"stage": "IXSCAN", "indexName": "i"}}},
                "executionStats": {"nReturned": 3, "totalKeysExamined": keys, "totalDocsExamined": 0},
            }}
        };
        let mongod = doc! {"stages": [cursor(4), {"$group": {"_id": null}}], "ok": 1.0};
        let e = Explain::of(&mongod);
        assert_eq!(e.stage_names(), ["PROJECTION_COVERED", "IXSCAN i"]);
        assert_eq!((e.keys_examined, e.docs_examined), (Some(4), Some(0)));

        let mongos = doc! {
            "mergeType": "mongos",
            "splitPipeline": {"shardsPart": [], "mergerPart": []},
            "shards": {
                "sh1": {"host": "sh1:27018", "stages": [cursor(4)]},
                "sh2": {"host": "sh2:27018", "stages": [cursor(6)]},
            },
            "ok": 1.0,
        };
        let e = Explain::of(&mongos);
        assert_eq!(e.shards, 2);
        assert_eq!(e.index_scans(), ["i", "i"]);
        assert_eq!((e.keys_examined, e.n_returned), (Some(10), Some(6)));
    }

    /// Without `executionStats` (verbosity `queryPlanner`), no counts.
    #[test]
    fn planner_only() {
        let e = Explain::of(&doc! {"queryPlanner": {"winningPlan": tree("i")}});
        assert_eq!(e.index_scans(), ["i"]);
        assert_eq!(
            (e.keys_examined, e.docs_examined, e.n_returned),
            (None, None, None)
        );
    }
}
