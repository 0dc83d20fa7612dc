//! `Model::ensure` and `Model::plan` against a real MongoDB-wire server:
//! a replica set, where sharding does not apply, or a sharded cluster
//! (`hello` answers `msg: "isdbgrid"`: CI's mongos job), where `ensure`
//! shards every collection with a declared shard key, first creating the
//! key's index where no index starts with it (a hashed `_id`:
//! `_id_hashed`). Each test expects what its deployment does.

use std::collections::{BTreeMap, BTreeSet};

use mongo_patterns::bson::Bson;
use mongo_patterns::ensure::{Conflict, EnsureAction, Note, PlanAction, VALIDATOR_REGISTRY};
use mongo_patterns::mongodb::options::WriteConcern;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, fresh_db, Explain};

/// Runs an action or a future, bounded to 30 s.
async fn within<F: std::future::IntoFuture>(f: F) -> F::Output {
    bounded(30, f.into_future()).await
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "initTime", order = "desc")]
struct Visit {
    #[serde(rename = "_id")]
    id: i64,
    init_time: i64,
    #[approx_counter(every = 10)]
    views: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 50, key = "customerId", order = "at")]
struct Trade {
    customer_id: i64,
    at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "players")]
#[rank_histogram(board = "game", score = "points", histogram = "player_ranks")]
struct Player {
    #[serde(rename = "_id")]
    id: String,
    game: String,
    points: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "racers")]
#[rank_histogram(board = "race", score = "ms", layout = "documents", order = "asc")]
struct Racer {
    #[serde(rename = "_id")]
    id: String,
    race: String,
    ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: ObjectId,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

/// No pattern: its collection is all it needs.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "plain_notes")]
struct PlainNote {
    text: String,
}

/// Whether `db`'s deployment is a sharded cluster (a `mongos`).
async fn sharded_cluster(db: &Database) -> bool {
    mongo_patterns_testkit::is_mongos(db.client()).await
}

/// The collections of [`all`] that `ensure` shards on a sharded cluster.
const SHARDED: [&str; 4] = ["visits", "history", "player_ranks", "logs"];

/// The indexes `ensure` creates on a sharded cluster for [`all`]'s shard
/// keys, besides the declared ones: a hashed `_id`'s (the counter's, the
/// array layout's histogram), which no declared index starts with. The
/// bucket's and the `#[shard_key]`'s keys start their declared indexes.
fn shard_key_indexes() -> BTreeMap<&'static str, Vec<(&'static str, Document)>> {
    BTreeMap::from([
        ("visits", vec![("_id_hashed", doc! {"_id": "hashed"})]),
        ("player_ranks", vec![("_id_hashed", doc! {"_id": "hashed"})]),
    ])
}

/// [`expected`], with [`shard_key_indexes`] on a sharded cluster.
fn expected_on(sharded: bool) -> BTreeMap<&'static str, Vec<(&'static str, Document)>> {
    let mut want = expected();
    if sharded {
        for (coll, ixs) in shard_key_indexes() {
            want.get_mut(coll)
                .expect("a declared collection")
                .extend(ixs);
        }
    }
    want
}

/// Every index the models above declare, by collection: (name, keys).
fn expected() -> BTreeMap<&'static str, Vec<(&'static str, Document)>> {
    BTreeMap::from([
        (
            "visits",
            vec![("mp_keyset_initTime", doc! {"initTime": -1, "_id": -1})],
        ),
        (
            "history",
            vec![(
                "mp_bucket_customerId_start",
                doc! {"customerId": 1, "start": 1},
            )],
        ),
        (
            "players",
            vec![("mp_rank_game_points", doc! {"game": 1, "points": -1})],
        ),
        ("player_ranks", vec![]),
        (
            "logs",
            vec![("mp_shard_month_type", doc! {"month": 1, "type": 1})],
        ),
        ("plain_notes", vec![]),
    ])
}

fn all(db: &Database) -> EnsureAction<'_> {
    Visit::ensure(db)
        .and(Trade::declared(db))
        .and(Player::declared(db))
        .and(Log::declared(db))
        .and(PlainNote::declared(db))
}

fn plan_all(db: &Database) -> PlanAction<'_> {
    Visit::plan(db)
        .and(Trade::declared(db))
        .and(Player::declared(db))
        .and(Log::declared(db))
        .and(PlainNote::declared(db))
}

/// The indexes of `coll` as the raw driver lists them: name → keys.
async fn indexes(db: &Database, coll: &str) -> BTreeMap<String, Document> {
    let mut out = BTreeMap::new();
    let mut cursor = db
        .collection::<Document>(coll)
        .list_indexes()
        .await
        .unwrap();
    while cursor.advance().await.unwrap() {
        let ix = cursor.deserialize_current().unwrap();
        out.insert(ix.options.unwrap().name.unwrap(), ix.keys);
    }
    out
}

/// Numbers as the server may echo them (`1`, `1.0`): compare by sign;
/// a kind of index (`"hashed"`) as it is.
fn norm(keys: &Document) -> Vec<(String, String)> {
    keys.iter()
        .map(|(k, v)| {
            let n = match v {
                Bson::Int32(n) => *n as f64,
                Bson::Int64(n) => *n as f64,
                Bson::Double(n) => *n,
                Bson::String(kind) => return (k.clone(), kind.clone()),
                other => panic!("unexpected key value {other}"),
            };
            (k.clone(), if n < 0.0 { "-1" } else { "1" }.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn ensure_creates_everything_then_nothing() {
    let (db, _) = fresh_db("ensure_all").await;
    let sharded = sharded_cluster(&db).await;
    let done = within(all(&db)).await.unwrap();
    println!("{done}");

    let want = expected_on(sharded);
    let created: BTreeSet<String> = done.collections_created.iter().cloned().collect();
    let want_colls: BTreeSet<String> = want.keys().map(|s| s.to_string()).collect();
    assert_eq!(created, want_colls, "every collection reported created");
    let listed: BTreeSet<String> = db
        .list_collection_names()
        .await
        .unwrap()
        .into_iter()
        .collect();
    // And the registry of the validators' parts, which `ensure` writes
    // before it sets a validator.
    let mut with_registry = want_colls.clone();
    with_registry.insert(VALIDATOR_REGISTRY.to_owned());
    assert_eq!(listed, with_registry, "and every one exists");

    let mut reported: Vec<(String, String)> = done
        .indexes_created
        .iter()
        .map(|i| (i.collection.clone(), i.name.clone()))
        .collect();
    reported.sort();
    let mut want_ix: Vec<(String, String)> = want
        .iter()
        .flat_map(|(c, ixs)| ixs.iter().map(|(n, _)| (c.to_string(), n.to_string())))
        .collect();
    want_ix.sort();
    assert_eq!(reported, want_ix, "every index reported created");
    for (coll, ixs) in &want {
        let found = indexes(&db, coll).await;
        assert_eq!(found.len(), ixs.len() + 1, "{coll}: {found:?}");
        assert!(found.contains_key("_id_"));
        for (name, keys) in ixs {
            let got = found.get(*name).unwrap_or_else(|| panic!("{coll}.{name}"));
            assert_eq!(norm(got), norm(keys), "{coll}.{name}");
        }
    }
    assert!(done.conflicts.is_empty(), "{:?}", done.conflicts);
    // Every collection with a declared shard key: the counter's (hashed
    // `_id`), the bucket collection's (by key), the histogram's (by board)
    // and the `#[shard_key]` model's. Sharded on a sharded cluster, a note
    // elsewhere.
    if sharded {
        let got: BTreeSet<&str> = done.sharded.iter().map(String::as_str).collect();
        assert_eq!(got, BTreeSet::from(SHARDED), "{done}");
        assert!(done.notes.is_empty(), "{done}");
    } else {
        assert!(done.sharded.is_empty());
        assert_eq!(
            done.notes,
            SHARDED
                .map(|c| Note::ShardingNotApplicable {
                    collection: c.into()
                })
                .to_vec()
        );
    }

    // Second run: nothing to create, the same deployment.
    let again = within(all(&db)).await.unwrap();
    assert!(again.created_nothing(), "{again}");
    assert!(again.conflicts.is_empty());
    let plan = within(plan_all(&db)).await.unwrap();
    assert!(plan.is_up_to_date(), "{plan}");
    for (coll, ixs) in &want {
        assert_eq!(indexes(&db, coll).await.len(), ixs.len() + 1);
    }
}

#[tokio::test]
async fn model_without_patterns_gets_its_collection() {
    let (db, _) = fresh_db("ensure_plain").await;
    let plan = within(PlainNote::plan(&db)).await.unwrap();
    assert_eq!(plan.create_collections, vec!["plain_notes".to_owned()]);
    assert!(plan.create_indexes.is_empty());
    let done = within(PlainNote::ensure(&db)).await.unwrap();
    assert_eq!(done.collections_created, vec!["plain_notes".to_owned()]);
    assert!(done.indexes_created.is_empty());
    assert_eq!(
        indexes(&db, "plain_notes")
            .await
            .into_keys()
            .collect::<Vec<_>>(),
        ["_id_"]
    );
    assert!(within(PlainNote::ensure(&db))
        .await
        .unwrap()
        .created_nothing());
}

#[tokio::test]
async fn conflicting_index_is_reported_and_left_alone() {
    let (db, _) = fresh_db("ensure_conflict").await;
    let sharded = sharded_cluster(&db).await;
    // Another client's index under the declared name, on other keys.
    let visits = db.collection::<Document>("visits");
    let theirs = mongo_patterns::mongodb::IndexModel::builder()
        .keys(doc! {"initTime": 1})
        .options(
            mongo_patterns::mongodb::options::IndexOptions::builder()
                .name("mp_keyset_initTime".to_owned())
                .build(),
        )
        .build();
    visits.create_index(theirs).await.unwrap();

    let plan = within(Visit::plan(&db)).await.unwrap();
    println!("{plan}");
    assert!(plan.create_collections.is_empty());
    // On a sharded cluster, the hashed `_id`'s index before sharding.
    let planned: Vec<&str> = plan
        .create_indexes
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    let shard_index: &[&str] = if sharded { &["_id_hashed"] } else { &[] };
    assert_eq!(planned, shard_index, "{plan}");
    assert_eq!(plan.conflicts.len(), 1, "{plan}");
    match &plan.conflicts[0] {
        Conflict::Index { declared, found } => {
            assert_eq!(declared.name, "mp_keyset_initTime");
            assert_eq!(
                norm(&declared.keys),
                norm(&doc! {"initTime": -1, "_id": -1})
            );
            assert_eq!(
                norm(found.get_document("key").unwrap()),
                norm(&doc! {"initTime": 1})
            );
        }
        other => panic!("{other:?}"),
    }

    // The rest is still created; the conflicting index stays as it was.
    let done = within(Visit::ensure(&db).and(Player::declared(&db)))
        .await
        .unwrap();
    println!("{done}");
    assert_eq!(done.conflicts, plan.conflicts);
    assert_eq!(
        done.collections_created,
        vec!["players".to_owned(), "player_ranks".to_owned()]
    );
    let mut created: Vec<(&str, &str)> = done
        .indexes_created
        .iter()
        .map(|i| (i.collection.as_str(), i.name.as_str()))
        .collect();
    created.sort_unstable();
    let mut want = vec![("players", "mp_rank_game_points")];
    if sharded {
        want.extend([("player_ranks", "_id_hashed"), ("visits", "_id_hashed")]);
        want.sort_unstable();
    }
    assert_eq!(created, want, "{done}");
    let found = indexes(&db, "visits").await;
    assert_eq!(found.len(), 2 + usize::from(sharded), "{found:?}");
    assert_eq!(
        norm(&found["mp_keyset_initTime"]),
        norm(&doc! {"initTime": 1})
    );
}

#[tokio::test]
async fn same_keys_under_another_name_satisfy() {
    let (db, _) = fresh_db("ensure_other_name").await;
    let sharded = sharded_cluster(&db).await;
    let history = db.collection::<Document>("history");
    let theirs = mongo_patterns::mongodb::IndexModel::builder()
        .keys(doc! {"customerId": 1.0, "start": 1.0})
        .options(
            mongo_patterns::mongodb::options::IndexOptions::builder()
                .name("by_customer".to_owned())
                .build(),
        )
        .build();
    history.create_index(theirs).await.unwrap();
    let plan = within(Trade::plan(&db)).await.unwrap();
    let other_name = |n: &Note| {
        matches!(n, Note::IndexUnderOtherName { declared, found }
            if declared.name == "mp_bucket_customerId_start" && found == "by_customer")
    };
    if sharded {
        // The index serves the shard key too (it starts with it): only
        // the sharding is left to do.
        assert!(
            plan.create_collections.is_empty() && plan.create_indexes.is_empty(),
            "{plan}"
        );
        assert!(
            matches!(&plan.shard[..], [s] if s.collection == "history"),
            "{plan}"
        );
        assert!(matches!(&plan.notes[..], [n] if other_name(n)), "{plan}");
    } else {
        // Nothing to create; the bucket's validator to set.
        assert!(
            plan.create_collections.is_empty()
                && plan.create_indexes.is_empty()
                && plan.conflicts.is_empty(),
            "{plan}"
        );
        assert!(
            matches!(&plan.validators[..], [v] if v.collection == "history"),
            "{plan}"
        );
        assert!(matches!(
            &plan.notes[..],
            [n, Note::ShardingNotApplicable { collection }]
                if other_name(n) && collection == "history"
        ));
    }
    let done = within(Trade::ensure(&db)).await.unwrap();
    if sharded {
        assert!(
            done.collections_created.is_empty() && done.indexes_created.is_empty(),
            "{done}"
        );
        assert_eq!(done.sharded, ["history"], "{done}");
    } else {
        assert!(
            done.collections_created.is_empty() && done.indexes_created.is_empty(),
            "{done}"
        );
        assert_eq!(done.validators_set, ["history"], "{done}");
    }
    assert_eq!(
        indexes(&db, "history")
            .await
            .into_keys()
            .collect::<Vec<_>>(),
        ["_id_", "by_customer"]
    );

    // A partial index on the same keys does not serve every page: it is
    // not taken for the declared one.
    let (db, _) = fresh_db("ensure_partial").await;
    let partial = mongo_patterns::mongodb::IndexModel::builder()
        .keys(doc! {"customerId": 1, "start": 1})
        .options(
            mongo_patterns::mongodb::options::IndexOptions::builder()
                .name("mp_bucket_customerId_start".to_owned())
                .partial_filter_expression(doc! {"customerId": {"$gt": 5}})
                .build(),
        )
        .build();
    db.collection::<Document>("history")
        .create_index(partial)
        .await
        .unwrap();
    let plan = within(Trade::plan(&db)).await.unwrap();
    assert!(
        matches!(&plan.conflicts[..], [Conflict::Index { found, .. }] if found.contains_key("partialFilterExpression")),
        "{plan}"
    );
}

#[tokio::test]
async fn plan_sends_only_reads() {
    let (db, commands) = fresh_db("ensure_plan_reads").await;
    // On a sharded cluster `plan` reads `config.collections` too (a
    // `find`), and plans the hashed `_id`'s indexes.
    let sharded = sharded_cluster(&db).await;
    // And an `aggregate` per stored-data check of a collection that
    // exists (`Conflict::Stored`).
    let mut reads = BTreeSet::from([
        "listCollections",
        "listIndexes",
        "hello",
        "buildInfo",
        "aggregate",
    ]);
    if sharded {
        reads.insert("find");
    }
    commands.take();
    let plan = within(plan_all(&db)).await.unwrap();
    let sent = commands.take();
    let names: BTreeSet<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.is_subset(&reads), "{names:?}");
    assert!(names.contains("listCollections"));
    assert_eq!(plan.create_collections.len(), expected().len(), "{plan}");
    let shard_key_indexes = if sharded { 2 } else { 0 };
    assert_eq!(plan.create_indexes.len(), 4 + shard_key_indexes, "{plan}");
    assert!(db.list_collection_names().await.unwrap().is_empty());

    // With half of it in place, still reads only.
    within(Visit::ensure(&db)).await.unwrap();
    within(Player::ensure(&db)).await.unwrap();
    commands.take();
    let plan = within(plan_all(&db)).await.unwrap();
    let names: BTreeSet<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, reads.iter().map(|n| n.to_string()).collect());
    assert_eq!(
        plan.create_collections,
        vec![
            "history".to_owned(),
            "logs".to_owned(),
            "plain_notes".to_owned()
        ]
    );
    assert_eq!(plan.create_indexes.len(), 2, "{plan}");
}

#[tokio::test]
async fn ensure_sends_write_concern_and_comment() {
    let (db, commands) = fresh_db("ensure_options").await;
    let sharded = sharded_cluster(&db).await;
    commands.take();
    let done = within(
        all(&db)
            .write_concern(WriteConcern::majority())
            .comment("deploy-42"),
    )
    .await
    .unwrap();
    assert!(!done.created_nothing());
    let sent = commands.take();
    let mut writes = 0;
    for (name, cmd) in &sent {
        assert_eq!(
            cmd.get_str("comment").ok(),
            Some("deploy-42"),
            "{name}: {cmd}"
        );
        if name == "create" || name == "createIndexes" {
            writes += 1;
            assert_eq!(
                cmd.get_document("writeConcern")
                    .and_then(|w| w.get_str("w"))
                    .ok(),
                Some("majority"),
                "{cmd}"
            );
        }
    }
    // One `createIndexes` per index, and one `create` per collection: each
    // has a validator (its fields' types, its pattern's invariants) and is
    // created with it. On a sharded cluster the two hashed `_id`s'
    // indexes as well.
    let writes_want = if sharded { 6 + 6 } else { 4 + 6 };
    assert_eq!(writes, writes_want, "{sent:?}");

    // Without one set, the database's write concern is sent.
    let (db, commands) = fresh_db("ensure_db_wc").await;
    let db = db.client().database_with_options(
        db.name(),
        mongo_patterns::mongodb::options::DatabaseOptions::builder()
            .write_concern(WriteConcern::nodes(1))
            .build(),
    );
    commands.take();
    within(Trade::ensure(&db)).await.unwrap();
    for (name, cmd) in commands.take() {
        if name == "create" || name == "createIndexes" {
            assert_eq!(
                cmd.get_document("writeConcern")
                    .ok()
                    .and_then(|w| w.get("w").cloned()),
                Some(Bson::Int32(1)),
                "{cmd}"
            );
        }
    }
}

#[tokio::test]
async fn keyset_page_at_depth_uses_the_created_index() {
    let (db, _) = fresh_db("ensure_explain").await;
    let visits = Visit::collection(&db);
    let docs: Vec<Visit> = (0..2_000)
        .map(|i| Visit {
            id: i,
            init_time: (i * 7919) % 2_000,
            views: 0,
        })
        .collect();
    visits.insert_many(docs).await.unwrap();

    async fn deep_query(db: &Database) -> (Document, Document, i64) {
        let mut q = Visit::keyset(db).page_size(50);
        for _ in 0..5 {
            let page = q.page().await.unwrap();
            q = Visit::keyset(db)
                .page_size(50)
                .after(page.next.as_ref().unwrap());
        }
        q.command().unwrap()
    }
    async fn explain(
        db: &Database,
        (filter, sort, limit): (Document, Document, i64),
        verbosity: &str,
    ) -> Explain {
        let reply = db
            .run_command(doc! {
                "explain": {"find": "visits", "filter": filter, "sort": sort, "limit": limit},
                "verbosity": verbosity,
            })
            .await
            .unwrap();
        let e = Explain::of(&reply);
        assert!(!e.stages.is_empty(), "no plan in {reply}");
        e
    }

    let before = within(async { explain(&db, deep_query(&db).await, "queryPlanner").await }).await;
    println!("before ensure: {:?}", before.stage_names());
    assert!(
        !before.index_scans().contains(&"mp_keyset_initTime"),
        "{:?}",
        before.stages
    );

    let before_stats =
        within(async { explain(&db, deep_query(&db).await, "executionStats").await }).await;
    within(Visit::ensure(&db)).await.unwrap();
    let (filter, sort, limit) = within(deep_query(&db)).await;
    assert!(!filter.is_empty(), "a page at depth starts after a token");
    let after = within(explain(&db, (filter, sort, limit), "queryPlanner")).await;
    println!("after ensure: {:?}", after.stage_names());
    // An index scan (of one per `$or` branch, on each shard) reads the
    // created index.
    assert!(
        after.index_scans().contains(&"mp_keyset_initTime"),
        "{:?}",
        after.stages
    );
    // What the work was (printed for the record: this server answers the
    // keyset's `$or` with a SORT over both index scans, not a merge).
    let after_stats =
        within(async { explain(&db, deep_query(&db).await, "executionStats").await }).await;
    let work = |e: &Explain| (e.n_returned, e.keys_examined, e.docs_examined);
    println!(
        "executionStats (returned, keys, docs) before ensure: {:?}, after: {:?}",
        work(&before_stats),
        work(&after_stats)
    );
    assert_eq!(after_stats.n_returned, Some(51));
}

/// Two deploys at once both succeed and leave the deployment as declared.
/// Who created what is best effort then: this server's `createIndexes`
/// replies let both calls claim an index built concurrently, and neither
/// claim a collection the other's index created.
#[tokio::test]
async fn concurrent_ensures_both_succeed() {
    let (db, _) = fresh_db("ensure_race").await;
    let sharded = sharded_cluster(&db).await;
    let (a, b) = tokio::join!(within(all(&db)), within(all(&db)));
    let (a, b) = (a.unwrap(), b.unwrap());
    println!("first:\n{a}second:\n{b}");
    assert!(a.conflicts.is_empty() && b.conflicts.is_empty());
    let want: BTreeSet<String> = expected().keys().map(|s| s.to_string()).collect();
    let claimed: BTreeSet<String> = a
        .collections_created
        .iter()
        .chain(&b.collections_created)
        .cloned()
        .collect();
    assert!(claimed.is_subset(&want), "{claimed:?}");
    let listed: BTreeSet<String> = db
        .list_collection_names()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c != VALIDATOR_REGISTRY)
        .collect();
    assert_eq!(listed, want);
    for (coll, ixs) in expected_on(sharded) {
        let found = indexes(&db, coll).await;
        assert_eq!(found.len(), ixs.len() + 1, "{coll}: {found:?}");
        for (name, keys) in ixs {
            assert_eq!(norm(&found[name]), norm(&keys));
        }
    }
    // Once both are done, a third finds nothing to do.
    assert!(within(all(&db)).await.unwrap().created_nothing());
}

#[tokio::test]
async fn ensure_runs_in_a_callers_session() {
    let (db, commands) = fresh_db("ensure_session").await;
    let mut s = db.client().start_session().await.unwrap();
    let lsid = s.id().clone();
    commands.take();
    let done = within(Trade::ensure(&db).session(&mut s)).await.unwrap();
    assert_eq!(done.indexes_created.len(), 1);
    let sent = commands.take();
    assert!(!sent.is_empty());
    for (name, cmd) in &sent {
        assert_eq!(cmd.get_document("lsid").ok(), Some(&lsid), "{name}");
    }
    let plan = within(Trade::plan(&db).session(&mut s)).await.unwrap();
    assert!(plan.is_up_to_date(), "{plan}");

    // Inside a transaction the server refuses the listing: an error, and
    // nothing created.
    let (db, _) = fresh_db("ensure_txn").await;
    db.create_collection("seed").await.unwrap();
    let mut s = db.client().start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    let err = within(PlainNote::ensure(&db).session(&mut s)).await;
    println!("in a transaction: {err:?}");
    // OperationNotSupportedInTransaction.
    assert_eq!(
        err.as_ref().err().and_then(|e| e.code()),
        Some(263),
        "{err:?}"
    );
    let _ = s.abort_transaction().await;
    assert_eq!(db.list_collection_names().await.unwrap(), ["seed"]);
}

/// The shard keys a model declares (`Model::declared`), by collection,
/// as `shardCollection` would be sent them on a sharded cluster;
/// declarations without one left out.
fn shard_keys(declared: Vec<mongo_patterns::ensure::Declared>) -> Vec<(String, Document)> {
    declared
        .into_iter()
        .filter_map(|d| {
            let (key, unique) = d.shard_key?;
            assert!(!unique, "no declared key is unique");
            Some((d.collection, key))
        })
        .collect()
}

#[tokio::test]
async fn declared_shard_keys_and_plan_on_a_replica_set() {
    let (db, _) = fresh_db("ensure_shard_keys").await;
    // Rank, array layout: the histogram by board (`_id`), hashed; the
    // players' collection is the application's, with no key of ours.
    assert_eq!(
        shard_keys(Player::declared(&db)),
        vec![("player_ranks".to_owned(), doc! {"_id": "hashed"})]
    );
    // Rank, documents layout: by `_id.b`, one board on one shard.
    assert_eq!(
        shard_keys(Racer::declared(&db)),
        vec![("racers_ranks".to_owned(), doc! {"_id.b": "hashed"})]
    );
    // Approximate counter: hashed `_id` (the keyset's declaration of the
    // same collection comes first and has none; the merge keeps the one).
    assert_eq!(
        shard_keys(Visit::declared(&db)),
        vec![("visits".to_owned(), doc! {"_id": "hashed"})]
    );
    assert_eq!(
        shard_keys(Log::declared(&db)),
        vec![("logs".to_owned(), doc! {"month": 1, "type": 1})]
    );

    // On a replica set `plan` says sharding does not apply to any of
    // them, before and after `ensure`, and `ensure` sends no
    // `shardCollection`. On a sharded cluster `plan` lists them to shard,
    // and `ensure` shards them.
    let sharded = sharded_cluster(&db).await;
    let keyed = ["visits", "player_ranks", "racers_ranks"];
    let all = || {
        Visit::plan(&db)
            .and(Player::declared(&db))
            .and(Racer::declared(&db))
    };
    let want: Vec<Note> = keyed
        .map(|c| Note::ShardingNotApplicable {
            collection: c.into(),
        })
        .to_vec();
    let plan = within(all()).await.unwrap();
    let notes: Vec<Note> = plan
        .notes
        .iter()
        .filter(|n| matches!(n, Note::ShardingNotApplicable { .. }))
        .cloned()
        .collect();
    let to_shard: Vec<(&str, &Document)> = plan
        .shard
        .iter()
        .map(|s| (s.collection.as_str(), &s.key))
        .collect();
    if sharded {
        assert!(notes.is_empty(), "{plan}");
        assert_eq!(
            to_shard,
            [
                ("visits", &doc! {"_id": "hashed"}),
                ("player_ranks", &doc! {"_id": "hashed"}),
                ("racers_ranks", &doc! {"_id.b": "hashed"}),
            ],
            "{plan}"
        );
    } else {
        assert_eq!(notes, want, "{plan}");
        assert!(to_shard.is_empty(), "{plan}");
    }
    assert!(plan.conflicts.is_empty(), "{plan}");
    let done = within(
        Visit::ensure(&db)
            .and(Player::declared(&db))
            .and(Racer::declared(&db)),
    )
    .await
    .unwrap();
    if sharded {
        assert_eq!(done.sharded, keyed, "{done}");
    } else {
        assert!(done.sharded.is_empty(), "{done}");
    }
    let plan = within(all()).await.unwrap();
    assert!(plan.is_up_to_date(), "{plan}");
    let noted = plan.notes.iter().any(
        |n| matches!(n, Note::ShardingNotApplicable { collection } if collection == "racers_ranks"),
    );
    assert_eq!(noted, !sharded, "{plan}");
}
