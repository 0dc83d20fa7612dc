//! The routing checker (`testkit::routing`): it fails on a write `mongos`
//! would refuse or broadcast, passes a write on the full shard key, and
//! reports what each pattern's operations would do on a sharded cluster.
//! The counts asserted in `patterns_under_the_checker` are findings about
//! the patterns as they are, not targets.

use std::future::IntoFuture;

use futures::FutureExt;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::RankHistogram;
use mongo_patterns_testkit::fresh_db_with;
use mongo_patterns_testkit::routing::{Counts, Finding, Kind, Routing, ShardKey, Verdict};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 3, key = "customerId", items = "trades")]
struct Trade {
    customer_id: i64,
    seq: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores")]
#[rank_histogram]
struct ExamScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "views")]
struct Views {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    views: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "score")]
struct Visit {
    #[serde(rename = "_id")]
    id: i64,
    score: i32,
    visitor_id: String,
}

fn orders() -> Routing {
    Routing::new().key("orders", ShardKey::ranged("customerId"))
}

/// An upsert by `_id` alone on a collection sharded by `{customerId: 1}`:
/// `mongos` (before 7.0) refuses it, and so does the checker.
#[tokio::test]
async fn an_upsert_without_the_shard_key_fails_the_check() {
    let routing = orders();
    let (db, _) = fresh_db_with("routing_refused", Some(routing.clone())).await;
    let orders = db.collection::<Document>("orders");
    orders
        .update_one(doc! {"_id": 1}, doc! {"$set": {"total": 5}})
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(
        routing.violations(),
        vec![Finding {
            verdict: Verdict::Refused,
            coll: "orders".into(),
            command: "update".into(),
            op: "updateOne upsert".into(),
            shape: "{_id: ?}".into(),
            why: "an upsert needs equality on the full shard key {customerId: 1} (7.0+ takes an `_id` equality through a write without shard key)".into(),
        }]
    );
    let failed = std::panic::catch_unwind(|| routing.assert_clean()).unwrap_err();
    let message = failed.downcast_ref::<String>().unwrap();
    assert!(
        message.starts_with("routing: 1 write(s) mongos would refuse or broadcast:\n  refused update (updateOne upsert) on orders filter {_id: ?}"),
        "{message}"
    );
}

/// In `Mode::Panic` (what `MP_ROUTING=strict` installs) the call that sent
/// the command panics, so the test that made it fails there.
#[tokio::test]
async fn strict_mode_panics_in_the_call_that_sent_it() {
    let routing = orders().mode(mongo_patterns_testkit::routing::Mode::Panic);
    let (db, _) = fresh_db_with("routing_strict", Some(routing.clone())).await;
    let orders = db.collection::<Document>("orders");
    let sent = std::panic::AssertUnwindSafe(orders.delete_one(doc! {"_id": 1}).into_future())
        .catch_unwind()
        .await;
    let message = sent.map(|_| ()).unwrap_err();
    assert_eq!(
        message.downcast_ref::<String>().map(String::as_str),
        Some("routing: broadcast delete (deleteOne) on orders filter {_id: ?}: single-document write by `_id` without the shard key {customerId: 1}: sent to every shard")
    );
    assert_eq!(routing.counts().broadcast, 1);
}

/// Writes on the full shard key, and a read on it, pass; a read without it
/// is counted as scatter-gather, and a write of every shape is judged.
#[tokio::test]
async fn conforming_writes_pass() {
    let routing = orders().key(
        "events",
        ShardKey::ranged("tenant").then("day", Kind::Ranged),
    );
    let (db, _) = fresh_db_with("routing_clean", Some(routing.clone())).await;
    let orders = db.collection::<Document>("orders");
    orders
        .insert_one(doc! {"_id": 1, "customerId": 7, "total": 1})
        .await
        .unwrap();
    orders
        .update_one(
            doc! {"customerId": 7, "_id": 1},
            doc! {"$inc": {"total": 1}},
        )
        .upsert(true)
        .await
        .unwrap();
    orders
        .find_one_and_update(doc! {"customerId": {"$eq": 7}}, doc! {"$inc": {"total": 1}})
        .await
        .unwrap();
    orders
        .update_many(
            doc! {"customerId": {"$in": [7, 8]}},
            doc! {"$set": {"seen": true}},
        )
        .await
        .unwrap();
    orders.delete_one(doc! {"customerId": 7}).await.unwrap();
    orders.find_one(doc! {"customerId": 7}).await.unwrap();
    let events = db.collection::<Document>("events");
    events
        .insert_one(doc! {"tenant": "a", "day": 3})
        .await
        .unwrap();
    events
        .count_documents(doc! {"tenant": "a", "day": {"$gte": 1}})
        .await
        .unwrap();
    routing.assert_clean();
    assert_eq!(
        routing.counts(),
        Counts {
            targeted_writes: 5,
            multi_writes: 1,
            targeted_reads: 1,
            multi_reads: 1,
            ..Counts::default()
        }
    );

    // What mongos would not do with the same collection.
    let (before, _) = routing.take();
    assert_eq!(before.refused + before.broadcast, 0);
    orders.find_one(doc! {"total": 1}).await.unwrap();
    orders
        .update_many(doc! {"total": 1}, doc! {"$set": {"x": 1}})
        .await
        .unwrap();
    orders
        .update_one(doc! {"total": 1}, doc! {"$set": {"x": 1}})
        .await
        .unwrap();
    orders
        .find_one_and_update(doc! {"_id": 1}, doc! {"$set": {"x": 1}})
        .await
        .unwrap();
    orders
        .update_one(
            doc! {"customerId": {"$in": [7, 8]}},
            doc! {"$set": {"customerId": 9}},
        )
        .await
        .unwrap();
    orders.insert_one(doc! {"_id": 2}).await.unwrap();
    let verdicts: Vec<(Verdict, String)> = routing
        .findings()
        .into_iter()
        .map(|f| (f.verdict, f.op))
        .collect();
    assert_eq!(
        verdicts,
        vec![
            (Verdict::Scatter, "read".into()),
            (Verdict::Broadcast, "updateMany".into()),
            (Verdict::Refused, "updateOne".into()),
            (Verdict::Refused, "findAndModify".into()),
            (Verdict::Refused, "updateOne".into()),
            (Verdict::Refused, "insert".into()),
        ]
    );
}

fn line(op: &str, c: Counts, findings: &[Finding]) -> (usize, usize, usize) {
    println!(
        "{op}: {} refused, {} broadcast, {} scatter reads ({} targeted writes, {} targeted reads, {} multi)",
        c.refused,
        c.broadcast,
        c.scatter,
        c.targeted_writes,
        c.targeted_reads,
        c.multi_reads + c.multi_writes
    );
    for f in findings {
        println!("    {f}");
    }
    (c.refused, c.broadcast, c.scatter)
}

/// A bucket push and page, a rank `update_score` and `rank`, a counter
/// `incr` and `flush`, and a keyset page, each under the checker in report
/// mode with the keys the issue proposes: buckets by their key field
/// (hashed, as `Buckets::declared` says), rank
/// histograms by board (`_id`), counters by hashed `_id`, the players by
/// `_id`, and the keyset's visits by `visitorId`.
#[tokio::test]
async fn patterns_under_the_checker() {
    let routing = Routing::new()
        .key(Trade::COLLECTION, ShardKey::hashed(Trade::BUCKET.key))
        .key(ExamScore::RANK.histogram, ShardKey::ranged("_id"))
        .key(ExamScore::COLLECTION, ShardKey::ranged("_id"))
        .key(Views::COLLECTION, ShardKey::hashed("_id"))
        .key(Visit::COLLECTION, ShardKey::ranged("visitorId"))
        .mode(mongo_patterns_testkit::routing::Mode::Report);
    let (db, _) = fresh_db_with("routing_patterns", Some(routing.clone())).await;

    // Bucket: pushes that fill a bucket and open the next, then pages.
    let trades = Trade::buckets(&db);
    for seq in 0..4 {
        trades
            .push(&Trade {
                customer_id: 7,
                seq,
            })
            .await
            .unwrap();
    }
    let (c, f) = routing.take();
    let push = line("bucket push ×4", c, &f);
    trades
        .page(&7_i64, PageRequest::page(1).page_size(2))
        .await
        .unwrap();
    trades
        .page(&7_i64, PageRequest::page(1).page_size(2).newest_first())
        .await
        .unwrap();
    let (c, f) = routing.take();
    let page = line("bucket page ×2", c, &f);

    // Rank histogram (array layout): players and the histogram.
    let ranks = Ranks::<ExamScore>::new(&db);
    for (i, s) in [80, 90, 70].into_iter().enumerate() {
        ranks
            .insert(&ExamScore {
                student: format!("s{i}"),
                exam_id: "e1".into(),
                score: s,
            })
            .await
            .unwrap();
    }
    routing.take();
    ranks.update_score(doc! {"_id": "s0"}, 95).await.unwrap();
    let (c, f) = routing.take();
    let update_score = line("rank update_score", c, &f);
    ranks.rank("e1", 90).await.unwrap();
    let (c, f) = routing.take();
    let rank = line("rank rank", c, &f);

    // Approximate counter (buffered): increments, then a flush.
    let views = Views::views_counter(&db);
    for i in 0..25 {
        views.incr(&(i % 3)).await.unwrap();
    }
    views.flush().await.unwrap();
    let (c, f) = routing.take();
    let counter = line("counter incr ×25 + flush", c, &f);

    // Keyset: a first page and the next.
    let visits = db.collection::<Visit>(Visit::COLLECTION);
    let docs: Vec<Visit> = (0..5)
        .map(|i| Visit {
            id: i,
            score: i as i32,
            visitor_id: format!("v{}", i % 2),
        })
        .collect();
    visits.insert_many(docs).await.unwrap();
    routing.take();
    let q = Visit::keyset(&db).page_size(2);
    let first = q.clone().page().await.unwrap();
    let token = first.next.clone().unwrap();
    q.clone().after(&token).page().await.unwrap();
    Visit::keyset(&db)
        .filter(doc! {"visitorId": "v1"})
        .page_size(2)
        .page()
        .await
        .unwrap();
    let (c, f) = routing.take();
    let keyset = line("keyset page ×3 (2 unfiltered, 1 by visitorId)", c, &f);

    // The findings as they are: every bucket command names the key field
    // (before, a push's one-command `findAndModify` found its bucket by
    // `_id` alone, which `mongos` before 7.1 refuses, 3 refused and 1
    // scatter read in these pushes, 1 scatter read in these pages); a
    // keyset page without the shard key in its filter goes to every shard.
    assert_eq!(push, (0, 0, 0), "bucket push");
    assert_eq!(page, (0, 0, 0), "bucket page");
    assert_eq!(update_score, (0, 0, 0), "rank update_score");
    assert_eq!(rank, (0, 0, 0), "rank rank");
    assert_eq!(counter, (0, 0, 0), "counter");
    assert_eq!(keyset, (0, 0, 2), "keyset");
}

/// The documents layout of the same exam, for its own declared key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores_docs")]
#[rank_histogram(board = "examId", score = "score", layout = "documents")]
struct ExamScoreDocs {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: i64,
}

/// Counters in the two other modes.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "likes")]
struct Likes {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 2, upsert = true)]
    sampled: i64,
    #[approx_counter(every = 2, mode = "geometric", upsert = true)]
    geometric: i64,
}

/// A checker in strict mode (what `MP_ROUTING=strict` installs) with the
/// keys `Model::declared` lists, and nothing else: a collection without a
/// declared key (the players') is not judged.
fn strict(declared: Vec<mongo_patterns::ensure::Declared>) -> Routing {
    Routing::new()
        .declared(declared)
        .mode(mongo_patterns_testkit::routing::Mode::Panic)
}

/// Every rank call on a histogram sharded by its declared key, in one
/// layout: no refused or broadcast write, and every histogram read on one
/// shard.
async fn rank_calls_target_one_shard<T>(name: &str, make: fn(String, i64) -> T)
where
    T: RankHistogram<Board = String, Score = i64> + Clone,
{
    let db0 = fresh_db_with(name, None).await.0;
    let routing = strict(T::declared(&db0));
    let key = routing.key_of(T::RANK.histogram).expect("declared");
    let (db, _) = fresh_db_with(name, Some(routing.clone())).await;
    let ranks = Ranks::<T>::new(&db);
    for (i, s) in [80, 90, 70, 90].into_iter().enumerate() {
        ranks.insert(&make(format!("s{i}"), s)).await.unwrap();
    }
    ranks.record("e1", 60).await.unwrap();
    ranks.change("e1", 60, 65).await.unwrap();
    ranks.unrecord("e1", 65).await.unwrap();
    ranks.update_score(doc! {"_id": "s0"}, 95).await.unwrap();
    ranks.delete(doc! {"_id": "s1"}).await.unwrap();
    ranks.rank("e1", 90).await.unwrap();
    ranks.top("e1", 2).await.unwrap();
    ranks.histogram("e1").await.unwrap();
    ranks.rebuild("e1").await.unwrap();
    routing.assert_clean();
    let on_histogram: Vec<Finding> = routing
        .findings()
        .into_iter()
        .filter(|f| f.coll == T::RANK.histogram)
        .collect();
    assert!(on_histogram.is_empty(), "{key}: {on_histogram:#?}");
    let c = routing.counts();
    assert!(c.targeted_writes >= 10 && c.targeted_reads >= 3, "{c}");
    println!("{name} under {key}: {c}");
}

impl ExamScoreDocs {
    fn make(student: String, score: i64) -> Self {
        ExamScoreDocs {
            student,
            exam_id: "e1".into(),
            score,
        }
    }
}

#[tokio::test]
async fn rank_array_layout_under_its_declared_key() {
    rank_calls_target_one_shard::<ExamScore>("routing_rank_array", |student, score| ExamScore {
        student,
        exam_id: "e1".into(),
        score,
    })
    .await;
}

#[tokio::test]
async fn rank_documents_layout_under_its_declared_key() {
    rank_calls_target_one_shard::<ExamScoreDocs>("routing_rank_docs", ExamScoreDocs::make).await;
}

/// Every counter mode on a collection sharded by its declared hashed
/// `_id`: every write and read on one shard.
#[tokio::test]
async fn counters_under_their_declared_key() {
    let db0 = fresh_db_with("routing_counters", None).await.0;
    let routing = strict(
        Views::declared(&db0)
            .into_iter()
            .chain(Likes::declared(&db0))
            .collect(),
    );
    assert_eq!(
        routing.key_of(Views::COLLECTION),
        Some(ShardKey::hashed("_id"))
    );
    let (db, _) = fresh_db_with("routing_counters", Some(routing.clone())).await;
    let views = Views::views_counter(&db);
    let (sampled, geometric) = (Likes::sampled_counter(&db), Likes::geometric_counter(&db));
    for i in 0..40_i64 {
        views.incr(&(i % 7)).await.unwrap();
        sampled.incr(&(i % 5)).await.unwrap();
        geometric.incr(&(i % 5)).await.unwrap();
    }
    views.incr_by(&3, 100).await.unwrap();
    views.flush().await.unwrap();
    views.estimate(&3).await.unwrap();
    sampled.estimate(&1).await.unwrap();
    routing.assert_clean();
    assert!(routing.findings().is_empty(), "{}", routing.report());
    let c = routing.counts();
    assert!(c.targeted_writes > 10 && c.targeted_reads >= 2, "{c}");
    println!("counters under {{_id: \"hashed\"}}: {c}");
}

/// A bucket model that `#[shard_key]` shards on ranges of its bucket key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "ranged_history")]
#[bucket(size = 3, key = "customerId", order = "seq")]
#[shard_key(search = "customerId")]
struct RangedTrade {
    customer_id: String,
    seq: u32,
}

/// Every bucket call on a collection sharded on `{customerId: 1}` (what
/// `#[shard_key(search = "customerId")]` declares for a bucket model):
/// each names the key, so no write is refused or broadcast and every read
/// of the buckets goes to one shard, late items and removals included.
#[tokio::test]
async fn buckets_under_a_ranged_key_from_shard_key() {
    let db0 = fresh_db_with("routing_ranged_buckets", None).await.0;
    let routing = strict(RangedTrade::declared(&db0));
    assert_eq!(
        routing.key_of(RangedTrade::COLLECTION),
        Some(ShardKey::ranged("customerId"))
    );
    let (db, _) = fresh_db_with("routing_ranged_buckets", Some(routing.clone())).await;
    let trades = RangedTrade::buckets(&db);
    let t = |c: &str, seq| RangedTrade {
        customer_id: c.into(),
        seq,
    };
    for seq in [1, 2, 3, 5, 6] {
        trades.push(&t("c-7", seq)).await.unwrap();
    }
    trades.push(&t("c-7", 4)).await.unwrap(); // late: into a sealed bucket
    trades
        .push_many(&[t("c-8", 1), t("c-9", 1), t("c-8", 2)])
        .await
        .unwrap();
    let page = trades
        .page("c-7", PageRequest::page(1).page_size(4))
        .await
        .unwrap();
    assert_eq!(
        page.items.iter().map(|x| x.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    trades
        .page("c-7", PageRequest::page(1).page_size(2).newest_first())
        .await
        .unwrap();
    assert_eq!(trades.count("c-8").await.unwrap(), 2);
    let all: Vec<RangedTrade> = trades.stream("c-7").try_collect().await.unwrap();
    assert_eq!(all.len(), 6);
    assert!(trades
        .replace("c-7", doc! {"seq": 6}, &t("c-7", 6))
        .await
        .unwrap());
    assert_eq!(
        trades
            .delete("c-7", doc! {"seq": {"$lt": 3}})
            .await
            .unwrap(),
        2
    );
    trades.reindex("c-7").await.unwrap();
    routing.assert_clean();
    let on_buckets: Vec<Finding> = routing
        .findings()
        .into_iter()
        .filter(|f| f.coll == RangedTrade::COLLECTION)
        .collect();
    assert!(on_buckets.is_empty(), "{on_buckets:#?}");
    let c = routing.counts();
    println!("buckets under {{customerId: 1}}: {c}");
}
