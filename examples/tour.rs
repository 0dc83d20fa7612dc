//! The tour: each pattern doing its job once, saying what it did.
//!
//! `scripts/tour` runs it against MONGODB_URI, or against a test server that
//! it starts itself. Each part uses a database of its own and drops it.

use futures::TryStreamExt;
use mongo_patterns::bson::DateTime;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::keyset::created_since;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{client, server_uri, Commands};

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let uri = server_uri();
    let (client, commands) = client(&uri).await;
    println!("mongo-patterns tour against {}", redact(&uri));
    keyset(&client, &commands).await?;
    bucket(&client, &commands).await?;
    rank_histogram(&client, &commands).await?;
    approx_counter(&client, &commands).await?;
    shard_key(&client, &commands).await?;
    Ok(())
}

#[derive(Debug, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "visitedAt", order = "desc", page_size = 4)]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    visitor: String,
    visited_at: DateTime,
}

/// Keyset pagination: newest visits first, 4 a page, ties on the same
/// second broken by `_id`; a tampered token is refused.
async fn keyset(client: &Client, commands: &Commands) -> mongo_patterns::Result<()> {
    println!("\n== keyset pagination");
    let db = client.database("mp_tour_keyset");
    db.drop().await?;
    let visits: Vec<Visit> = (0..10)
        .map(|i| Visit {
            id: ObjectId::new(),
            visitor: format!("v{}", i % 3),
            // Pairs share a second: the sort key has duplicates.
            visited_at: DateTime::from_millis(1_767_225_600_000 + (i / 2) * 1000),
        })
        .collect();
    Visit::collection(&db).insert_many(&visits).await?;

    commands.take();
    let mut page = Visit::keyset(&db).page().await?;
    let mut n = 1;
    loop {
        let shown: Vec<String> = page
            .items
            .iter()
            .map(|v| {
                format!(
                    "{}@{}",
                    v.visitor,
                    v.visited_at.timestamp_millis() / 1000 % 100
                )
            })
            .collect();
        println!("page {n}: {}", shown.join(", "));
        let Some(next) = page.next.clone() else { break };
        println!("        next token: {next}");
        page = Visit::keyset(&db).after(&next).page().await?;
        n += 1;
    }
    println!(
        "{n} pages, {} finds, 0 skips, 0 counts",
        commands.take_count()
    );

    let forged = "AQAAAAA".parse::<PageToken>();
    println!(
        "a forged token: {}",
        forged
            .map(|_| "accepted".to_owned())
            .unwrap_or_else(|e| e.to_string())
    );
    let recent: Vec<Visit> = Visit::keyset(&db)
        .by_id()
        .filter(created_since(DateTime::from_millis(
            DateTime::now().timestamp_millis() - 60_000,
        ))?)
        .stream()
        .try_collect()
        .await?;
    println!(
        "made in the last minute, by `_id` range: {} visits",
        recent.len()
    );
    db.drop().await?;
    Ok(())
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 10, key = "customerId")]
struct Trade {
    customer_id: i64,
    ticker: String,
    qty: i32,
}

/// The bucket pattern: 10 trades to a document, pages of 4 cut across
/// buckets, newest first; 8 tasks pushing to one customer at once.
async fn bucket(client: &Client, commands: &Commands) -> mongo_patterns::Result<()> {
    println!("\n== bucket");
    let db = client.database("mp_tour_bucket");
    db.drop().await?;
    let trades = Trade::buckets(&db);
    trades.ensure().await?;
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let trades = trades.clone();
            tokio::spawn(async move {
                for i in 0..5 {
                    let t = Trade {
                        customer_id: 7,
                        ticker: format!("T{task}"),
                        qty: i,
                    };
                    trades.push(&t).await?;
                }
                Ok::<_, mongo_patterns::Error>(())
            })
        })
        .collect();
    commands.take();
    for t in tasks {
        t.await.expect("task")?;
    }
    let pushes = commands.take_count();
    let buckets = db
        .collection::<Document>("history")
        .count_documents(doc! {})
        .await?;
    println!("8 tasks pushed 40 trades in {pushes} round trips (racing for each new bucket), into {buckets} buckets of at most 10");
    commands.take();
    for page in 1..=3 {
        let p = trades
            .page(&7, PageRequest::page(page).page_size(4).newest_first())
            .await?;
        let shown: Vec<String> = p
            .items
            .iter()
            .map(|t| format!("{}#{}", t.ticker, t.qty))
            .collect();
        println!(
            "newest first, page {page} of 4: {} ({} round trips)",
            shown.join(", "),
            commands.take_count()
        );
    }
    let removed = trades.delete(&7, doc! {"ticker": "T3"}).await?;
    println!(
        "removed T3's {removed} trades; {} trades left",
        trades.count(&7).await?
    );
    db.drop().await?;
    Ok(())
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores")]
#[rank_histogram(precision = 0.5)]
struct ExamScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// The rank histogram: the seed's ten scores, 85 ranks 3rd; the top
/// student drops to 0 in one write; 16 tasks change scores at once.
async fn rank_histogram(client: &Client, commands: &Commands) -> mongo_patterns::Result<()> {
    println!("\n== rank histogram");
    let db = client.database("mp_tour_rank");
    db.drop().await?;
    let ranks = ExamScore::ranks(&db);
    let seed = [50.0, 50.0, 50.0, 60.0, 60.0, 60.0, 60.0, 80.0, 90.0, 100.0];
    for (i, score) in seed.into_iter().enumerate() {
        let student = ExamScore {
            student: format!("s{i}"),
            exam_id: "exam_001".into(),
            score,
        };
        ranks.insert(&student).await?;
    }
    let shown: Vec<String> = ranks
        .histogram("exam_001")
        .await?
        .iter()
        .map(|s| format!("{}×{}", s.score, s.count))
        .collect();
    println!("histogram of exam_001: {}", shown.join(", "));
    commands.take();
    let r = ranks.rank("exam_001", 85.0).await?;
    println!(
        "85 ranks {} of {} (dense {}, percentile {:.0}) in {} round trip",
        r.rank,
        r.total,
        r.dense,
        r.percentile().unwrap_or_default(),
        commands.take_count()
    );
    commands.take();
    ranks.update_score(doc! {"_id": "s9"}, 0.0).await?;
    println!(
        "s9 drops from 100 to 0: student and histogram in one transaction, {} commands, 2 documents written; 90 now ranks {}",
        commands.take_count(),
        ranks.rank("exam_001", 90.0).await?.rank
    );
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let ranks = ranks.clone();
            tokio::spawn(async move {
                ranks.record("exam_002", 70.0).await?;
                for step in 1..=10 {
                    let (old, new) = (70.0 + (step - 1) as f64, 70.0 + step as f64);
                    ranks
                        .change("exam_002", old, new + (task % 2) as f64 * 0.5)
                        .await?;
                    ranks
                        .change("exam_002", new + (task % 2) as f64 * 0.5, new)
                        .await?;
                }
                Ok::<_, mongo_patterns::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task")?;
    }
    let h = ranks.histogram("exam_002").await?;
    println!(
        "16 tasks × 20 changes on exam_002: {} students, all at {:?}",
        h.iter().map(|s| s.count).sum::<u64>(),
        h.iter().map(|s| s.score).collect::<Vec<_>>()
    );
    let err = ranks.unrecord("exam_001", 33.0).await.unwrap_err();
    println!("removing a score nobody holds: {err}");
    db.drop().await?;
    Ok(())
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "products")]
#[approx_counter(field = "buffered_views", every = 100, mode = "buffered")]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    product_name: String,
    #[approx_counter(every = 100)]
    web_page_views: i64,
    buffered_views: i64,
}

/// Approximate counters: 16 tasks view one product 50,000 times; sampled
/// and buffered counting, each about one write in 100.
async fn approx_counter(client: &Client, commands: &Commands) -> mongo_patterns::Result<()> {
    println!("\n== approximate counter");
    let db = client.database("mp_tour_counter");
    db.drop().await?;
    Product::collection(&db)
        .insert_one(Product {
            id: "vlog7923479273".into(),
            product_name: "儿童健康险（D）".into(),
            web_page_views: 0,
            buffered_views: 0,
        })
        .await?;
    let sampled = Product::web_page_views_counter(&db);
    let buffered = Product::buffered_views_counter(&db);
    for (name, counter) in [("sampled", &sampled), ("buffered", &buffered)] {
        commands.take();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let counter = counter.clone();
                tokio::spawn(async move {
                    for _ in 0..3_125 {
                        counter.incr("vlog7923479273").await?;
                    }
                    Ok::<_, mongo_patterns::Error>(())
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task")?;
        }
        counter.shutdown().await?;
        let s = counter.stats();
        println!(
            "{name}: {} views in {} writes ({} commands); the product now shows {}",
            s.increments,
            s.writes,
            commands.take_count(),
            counter.estimate("vlog7923479273").await?
        );
    }
    println!(
        "sampled's relative standard error at 50,000 views: {:.1}%; buffered is exact once flushed",
        100.0 * sampled.relative_error(50_000)
    );
    db.drop().await?;
    Ok(())
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
    msg: String,
}

/// The shard key: `{month: 1, type: 1}`, `month` derived from `ts`; a
/// targeted query; the analyser on the seed's candidates; and what
/// `ensure_sharded` says on a deployment that does not shard.
async fn shard_key(client: &Client, commands: &Commands) -> mongo_patterns::Result<()> {
    use mongo_patterns::shard_key::TimeRange;
    println!("\n== shard key");
    let db = client.database("mp_tour_shard");
    db.drop().await?;
    let logs = Log::sharded(&db);
    let start = 1_609_459_200_i64; // 2021-01-01, then one log an hour
    let batch: Vec<Log> = (0..17_520_i64)
        .map(|i| Log {
            id: ObjectId::new(),
            // 80% app, 15% web, 5% admin, as in the seed's workload.
            kind: match i % 20 {
                19 => "admin",
                4 | 8 | 13 => "web",
                _ => "app",
            }
            .into(),
            ts: start + i * 3_600,
            msg: format!("event {i}"),
        })
        .collect();
    logs.insert_many(&batch).await?;
    println!(
        "shard key {}: 17,520 logs over 2 years, `month` filled on every write",
        logs.shard_spec()
    );
    let last_month = TimeRange::between(
        DateTime::from_millis((start + 17_520 * 3_600 - 30 * 86_400) * 1_000),
        DateTime::from_millis((start + 17_520 * 3_600) * 1_000),
    );
    commands.take();
    let web: Vec<Log> =
        futures::TryStreamExt::try_collect(logs.find("web", last_month, doc! {}).await?).await?;
    let sent = commands.take();
    println!(
        "type web, the last 30 days: {} logs; the filter names the key's prefix: {}",
        web.len(),
        sent.first()
            .and_then(|(_, c)| c.get_document("filter").ok())
            .cloned()
            .unwrap_or_default()
    );
    for key in [&["type"][..], &["ts"], &["month", "type"]] {
        let a = logs.analyze(key, 2_000).await?;
        println!("analyse {{{}}}: {}", key.join(", "), a.verdict.join("; "));
    }
    match logs.ensure_sharded().await {
        Ok(()) => println!("sharded"),
        Err(e) => println!("ensure_sharded: {e}"),
    }
    db.drop().await?;
    Ok(())
}

fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &uri[..s], &uri[at..]),
        _ => uri.to_owned(),
    }
}
