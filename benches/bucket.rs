//! The bucket pattern vs one document per trade, and the generated
//! repository vs hand-written driver code (seed 000: one customer's trades,
//! 1,000 to a bucket, read a page at a time).
//!
//! A program, not a test: markdown tables go to stdout, progress to stderr.
//!
//! ```text
//! cargo bench --bench bucket                          # quick: 100k trades
//! cargo bench --bench bucket -- --trades 1000000      # the headline run
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--trades N` | 100000 | trades of one customer, loaded into both designs |
//! | `--batch N` | 10000 | trades per `push_many` / `insert_many` while loading |
//! | `--reps N` | 3 | timed fetches per design and page (median reported) |
//! | `--writes N` | 2000 | single writes per design (`push` vs `insert_one`) |
//! | `--cpu-reps N` | 9 | interleaved repetitions per variant for client CPU |
//! | `--cpu-ops N` | 100 | operations per repetition for client CPU |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (DESIGN.md, "The test server"). The surrogate walks
//! whole collections on range queries, so read round trips and `explain`
//! figures first, and wall times only as ratios.
//!
//! Measured in one run:
//!
//! 1. Load: `Buckets::push_many` in chunks of `--batch`; the naive design
//!    (one document per trade, index `{customerId: 1, date: 1}`) by
//!    `insert_many` in batches of `--batch`.
//! 2. Pages 1, 100, 1000 and the last (100 a page), sizes 20 and 50 at a
//!    deep page, and page 1 newest first: `Buckets::page` vs
//!    `find({customerId}).sort({date: ±1}).skip(..).limit(..)`. Round trips
//!    by command monitoring around one call; keys/docs examined by `explain`
//!    (`executionStats`) of the exact command (the bucket's aggregate from
//!    `page_pipeline`; newest first, the aggregate it sends after its head
//!    read); bytes as the sum of the BSON sizes of the reply's documents;
//!    wall time the median of `--reps`.
//! 3. Writes: `push` (steady state) vs naive `insert_one`.
//! 4. Generated vs hand-written: `push` vs an `update_one` by `_id` with the
//!    same filter and update, and `page` vs the same aggregation through a
//!    typed `Collection`. Client CPU from `/proc/self/task/*/schedstat`
//!    (utime+stime from `/proc/self/stat` as a cross-check), on a client
//!    without command monitoring, repetitions interleaved.

use std::hint::black_box;
use std::time::Instant;

use futures::TryStreamExt;
use mongo_patterns::bson::{self, Bson, RawBson, RawBsonRef, RawDocumentBuf};
use mongo_patterns::bucket::{PageRequest, MAX_BUCKET_BYTES};
use mongo_patterns::mongodb::{Client, Collection, IndexModel};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    self, cpu_ns, cpu_ticks, median, median_f64, ms, opt, stat_u64, thousands,
};
use mongo_patterns_testkit::{client, server_uri, Commands};

/// Turns a page reply (sliced buckets) into trades.
type Decoder = fn(&[RawDocumentBuf], i64) -> BoxResult<Vec<Trade>>;

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CUSTOMER: i64 = 7_000_000;
const GEN_KEY: i64 = 7_000_001;
const HAND_KEY: i64 = 7_000_002;
const SIZE: i64 = 1000;
const BUCKETS: &str = "history";
const NAIVE: &str = "trades_naive";

/// A trade, as in the seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 1000, key = "customerId", order = "date")]
struct Trade {
    customer_id: i64,
    #[serde(rename = "type")]
    kind: String,
    ticker: String,
    qty: i32,
    date: DateTime,
}

/// A trade as a bucket stores it, without the key: what hand-written code
/// pushes and reads back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Item {
    #[serde(rename = "type")]
    kind: String,
    ticker: String,
    qty: i32,
    date: DateTime,
}

/// A bucket as the page aggregation projects it.
#[derive(Debug, Deserialize)]
struct Sliced {
    #[serde(default)]
    items: Vec<Item>,
}

fn trade(customer: i64, i: u64) -> Trade {
    const TICKERS: [&str; 5] = ["MDB", "AAPL", "MSFT", "TSLA", "AMZN"];
    Trade {
        customer_id: customer,
        kind: if i.is_multiple_of(3) { "sell" } else { "buy" }.to_owned(),
        ticker: TICKERS[i as usize % TICKERS.len()].to_owned(),
        qty: 1 + ((i * 37) % 500) as i32,
        date: DateTime::from_millis(1_767_225_600_000 + i as i64 * 60_000),
    }
}

struct Args {
    trades: u64,
    batch: usize,
    reps: usize,
    writes: usize,
    cpu_reps: usize,
    cpu_ops: usize,
    raw: Vec<String>,
}

impl Args {
    fn parse() -> Args {
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let mut a = Args {
            trades: 100_000,
            batch: 10_000,
            reps: 3,
            writes: 2000,
            cpu_reps: 9,
            cpu_ops: 100,
            raw: Vec::new(),
        };
        let mut it = raw.iter();
        while let Some(flag) = it.next() {
            let mut value = |name: &str| -> String {
                it.next()
                    .unwrap_or_else(|| usage(&format!("{name} needs a value")))
                    .clone()
            };
            match flag.as_str() {
                "--bench" => {}
                "--trades" => a.trades = num(&value("--trades")),
                "--batch" => a.batch = num(&value("--batch")),
                "--reps" => a.reps = num(&value("--reps")),
                "--writes" => a.writes = num(&value("--writes")),
                "--cpu-reps" => a.cpu_reps = num(&value("--cpu-reps")),
                "--cpu-ops" => a.cpu_ops = num(&value("--cpu-ops")),
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown flag `{other}`")),
            }
        }
        if a.trades < 100 || a.batch == 0 {
            usage("--trades must be at least 100 and --batch positive");
        }
        a.reps = a.reps.max(1);
        a.writes = a.writes.max(1);
        a.cpu_reps = a.cpu_reps.max(1);
        // Pushes for the CPU comparison must stay in one bucket per key.
        a.cpu_ops = a.cpu_ops.clamp(1, (SIZE as usize - 1) / a.cpu_reps);
        a.raw = raw.into_iter().filter(|s| s != "--bench").collect();
        a
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    bench::num(s, usage)
}

fn usage(err: &str) -> ! {
    bench::usage(
        "cargo bench --bench bucket -- [--trades N] [--batch N] [--reps N] \
         [--writes N] [--cpu-reps N] [--cpu-ops N]",
        err,
    )
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> BoxResult<()> {
    let started = Instant::now();
    let uri = server_uri();
    let (client, commands) = client(&uri).await;
    let db_name = format!("mp_bench_bucket_{}", std::process::id());
    let db = client.database(&db_name);
    db.drop().await?;
    let result = bench(&args, &uri, &db, &commands).await;
    let dropped = db.drop().await;
    let report = result?;
    dropped?;
    print!("{report}");
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn bench(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<String> {
    let mut out = String::new();
    let version = db
        .run_command(doc! {"buildInfo": 1})
        .await
        .ok()
        .and_then(|d| d.get_str("version").ok().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    out += &format!(
        "# Bucket pattern benchmark: {} trades of one customer\n\nCommand: `cargo bench --bench bucket -- {}` — server: {} (reports version {version}), client: tokio current-thread runtime.\n\n",
        thousands(args.trades),
        args.raw.join(" "),
        if std::env::var("MONGODB_URI").is_ok_and(|u| !u.is_empty()) { "MONGODB_URI" } else { "surrogate secantusd-rs" },
    );

    // ---- 1. load ----
    let repo = Trade::buckets(db);
    repo.ensure_indexes().await?;
    let naive: Collection<Trade> = db.collection(NAIVE);
    naive
        .create_index(
            IndexModel::builder()
                .keys(doc! {"customerId": 1, "date": 1})
                .build(),
        )
        .await?;
    let n = args.trades;
    commands.take();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + args.batch as u64).min(n);
        let chunk: Vec<Trade> = (i..end).map(|j| trade(CUSTOMER, j)).collect();
        repo.push_many(&CUSTOMER, &chunk).await?;
        i = end;
    }
    let bucket_load = t.elapsed();
    let bucket_rt = commands.take_count();
    eprintln!("bucket load {:.1} s", bucket_load.as_secs_f64());
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + args.batch as u64).min(n);
        let chunk: Vec<Trade> = (i..end).map(|j| trade(CUSTOMER, j)).collect();
        naive.insert_many(&chunk).await?;
        i = end;
    }
    let naive_load = t.elapsed();
    let naive_rt = commands.take_count();
    eprintln!("naive load {:.1} s", naive_load.as_secs_f64());
    let buckets_n = db
        .collection::<Document>(BUCKETS)
        .count_documents(doc! {})
        .await?;
    let naive_n = naive.count_documents(doc! {}).await?;
    assert_eq!(repo.total(&CUSTOMER).await?, n);
    out += "### Load\n\n| design | documents | round trips | seconds | trades/s | time naive ÷ bucket |\n| --- | ---: | ---: | ---: | ---: | ---: |\n";
    out += &format!(
        "| bucket: `push_many` in chunks of {} | {} | {} | {:.1} | {:.0} | — |\n",
        thousands(args.batch as u64),
        thousands(buckets_n),
        bucket_rt,
        bucket_load.as_secs_f64(),
        n as f64 / bucket_load.as_secs_f64()
    );
    out += &format!(
        "| naive: `insert_many` in batches of {} (+ index `{{customerId: 1, date: 1}}`) | {} | {} | {:.1} | {:.0} | {:.2}× |\n\n",
        thousands(args.batch as u64),
        thousands(naive_n),
        naive_rt,
        naive_load.as_secs_f64(),
        n as f64 / naive_load.as_secs_f64(),
        naive_load.as_secs_f64() / bucket_load.as_secs_f64()
    );

    // ---- 2. pages ----
    out += &pages(args, db, &repo, &naive, commands).await?;

    // ---- 3. writes ----
    out += &writes(args, db, &repo, &naive, commands).await?;

    // ---- 4. generated vs hand-written ----
    out += &generated_vs_hand(args, uri, db, commands).await?;
    Ok(out)
}

struct Explained {
    keys: Option<u64>,
    docs: Option<u64>,
}

async fn explain(db: &Database, cmd: Document) -> BoxResult<Explained> {
    let reply = db
        .run_command(doc! {"explain": cmd, "verbosity": "executionStats"})
        .await?;
    let stats = reply.get_document("executionStats").ok().or_else(|| {
        reply
            .get_array("stages")
            .ok()?
            .first()?
            .as_document()?
            .get_document("$cursor")
            .ok()?
            .get_document("executionStats")
            .ok()
    });
    Ok(match stats {
        Some(s) => Explained {
            keys: stat_u64(s, "totalKeysExamined"),
            docs: stat_u64(s, "totalDocsExamined"),
        },
        None => Explained {
            keys: None,
            docs: None,
        },
    })
}

/// Runs `cmd` (a find or aggregate that fits its first batch) and sums the
/// BSON sizes of the documents it returns.
async fn reply_bytes(db: &Database, cmd: Document) -> BoxResult<(u64, usize)> {
    let reply = db.run_command(cmd).await?;
    let cursor = reply.get_document("cursor")?;
    let batch = cursor.get_array("firstBatch")?;
    let mut bytes = 0u64;
    for d in batch {
        if let Bson::Document(d) = d {
            bytes += mongo_patterns_testkit::bsonc::to_vec(d)?.len() as u64;
        }
    }
    Ok((bytes, batch.len()))
}

/// The aggregation the repository sends for items `[from, from + n)`
/// (written out as by hand; checked against `page_pipeline`).
fn range_pipeline(key: i64, from: i64, n: i64) -> Vec<Document> {
    vec![
        doc! {"$match": {
            "customerId": key,
            "start": {"$gt": from - SIZE, "$lt": from + n},
            "count": {"$gt": 0},
        }},
        doc! {"$sort": {"start": 1, "_id": 1}},
        doc! {"$project": {
            "_id": 0,
            "start": 1,
            "items": {"$slice": [
                "$items",
                {"$max": [0, {"$subtract": [from, "$start"]}]},
                {"$subtract": [from + n, {"$max": [from, "$start"]}]},
            ]},
        }},
    ]
}

struct PageCase {
    label: String,
    page: u32,
    per: u32,
    newest: bool,
}

async fn pages(
    args: &Args,
    db: &Database,
    repo: &Buckets<Trade>,
    naive: &Collection<Trade>,
    commands: &Commands,
) -> BoxResult<String> {
    let n = args.trades;
    let last = n.div_ceil(100) as u32;
    let mut cases = Vec::new();
    for p in [1u32, 100, 1000] {
        if p < last {
            cases.push(PageCase {
                label: format!("{p}"),
                page: p,
                per: 100,
                newest: false,
            });
        }
    }
    cases.push(PageCase {
        label: format!("{last} (last)"),
        page: last,
        per: 100,
        newest: false,
    });
    // Sizes 20 and 50 at the deep page whose first item is that of page
    // 1000 of 100 (or of the last page when there are fewer).
    let deep_item = (u64::from(1000.min(last)) - 1) * 100;
    for per in [20u32, 50] {
        let p = (deep_item / u64::from(per)) as u32 + 1;
        cases.push(PageCase {
            label: format!("{p} (item {})", thousands(deep_item)),
            page: p,
            per,
            newest: false,
        });
    }
    cases.push(PageCase {
        label: "1 newest first".into(),
        page: 1,
        per: 100,
        newest: true,
    });

    let mut out = String::new();
    out += "### Page reads: bucket `page()` vs naive `find({customerId}).sort({date: 1}).skip((p-1)*s).limit(s)`\n\n";
    out += "Round trips: commands seen by command monitoring around one call. Keys/docs examined: `explain` (`executionStats`) of the exact command (bucket: the aggregate from `page_pipeline`, which asks for s + 1 items to know whether another page follows; newest first, the aggregate sent after the head read, whose `find_one` by the `_id` range is not included). Bytes: sum of BSON sizes of the reply documents. Time: median of ";
    out += &format!(
        "{} fetches on the test server (ratios only).\n\n",
        args.reps
    );
    out += "| page (size) | round trips bucket / naive | keys examined bucket / naive | docs examined bucket / naive | bytes returned bucket / naive | ms per page bucket / naive | time naive ÷ bucket |\n| --- | :---: | :---: | :---: | :---: | :---: | ---: |\n";
    let coll = BUCKETS;
    for c in &cases {
        eprintln!("page {} of {}", c.label, c.per);
        let mut req = PageRequest::new(c.page, c.per);
        if c.newest {
            req = req.newest_first();
        }
        let per = i64::from(c.per);
        let skip = (i64::from(c.page) - 1) * per;
        let pipeline = if c.newest {
            let total = n as i64;
            let end = total - skip;
            let from = (end - per).max(0);
            range_pipeline(CUSTOMER, from, end - from)
        } else {
            let p = repo.page_pipeline(&CUSTOMER, req)?;
            assert_eq!(p, range_pipeline(CUSTOMER, skip, per + 1), "pipeline shape");
            p
        };
        let sort = if c.newest {
            doc! {"date": -1}
        } else {
            doc! {"date": 1}
        };
        let find = |skip: i64| {
            let mut f =
                doc! {"find": NAIVE, "filter": {"customerId": CUSTOMER}, "sort": sort.clone()};
            if skip > 0 {
                f.insert("skip", skip);
            }
            f.insert("limit", per);
            f
        };
        let agg = doc! {"aggregate": coll, "pipeline": pipeline.clone(), "cursor": {}};

        // Correctness and round trips.
        commands.take();
        let bp = repo.page(&CUSTOMER, req).await?;
        let b_rt = commands.take_count();
        let np: Vec<Trade> = naive
            .find(doc! {"customerId": CUSTOMER})
            .sort(sort.clone())
            .skip(skip as u64)
            .limit(per)
            .await?
            .try_collect()
            .await?;
        let n_rt = commands.take_count();
        assert_eq!(bp.items, np, "both designs return the same page");

        let be = explain(db, agg.clone()).await?;
        let ne = explain(db, find(skip)).await?;
        let (bb, _) = reply_bytes(db, agg.clone()).await?;
        let (nb, _) = reply_bytes(db, find(skip)).await?;

        let mut bt = Vec::new();
        let mut nt = Vec::new();
        for _ in 0..args.reps {
            let t = Instant::now();
            black_box(repo.page(&CUSTOMER, req).await?);
            bt.push(t.elapsed());
            let t = Instant::now();
            let v: Vec<Trade> = naive
                .find(doc! {"customerId": CUSTOMER})
                .sort(sort.clone())
                .skip(skip as u64)
                .limit(per)
                .await?
                .try_collect()
                .await?;
            black_box(v);
            nt.push(t.elapsed());
        }
        commands.take();
        let (bm, nm) = (median(&mut bt), median(&mut nt));
        out += &format!(
            "| {} ({}) | {} / {} | {} / {} | {} / {} | {} / {} | {:.1} / {:.1} | {:.2}× |\n",
            c.label,
            c.per,
            b_rt,
            n_rt,
            opt(be.keys),
            opt(ne.keys),
            opt(be.docs),
            opt(ne.docs),
            thousands(bb),
            thousands(nb),
            ms(bm),
            ms(nm),
            nm.as_secs_f64() / bm.as_secs_f64()
        );
    }
    out += "\n";
    Ok(out)
}

async fn writes(
    args: &Args,
    _db: &Database,
    repo: &Buckets<Trade>,
    naive: &Collection<Trade>,
    commands: &Commands,
) -> BoxResult<String> {
    eprintln!("writes");
    let n = args.trades;
    let mut bt = Vec::with_capacity(args.writes);
    let mut nt = Vec::with_capacity(args.writes);
    let mut b_rt = 0;
    let mut n_rt = 0;
    let mut b_max = 0;
    commands.take();
    for k in 0..args.writes as u64 {
        let t1 = trade(CUSTOMER, n + k);
        let t = Instant::now();
        repo.push(&t1).await?;
        bt.push(t.elapsed());
        let c = commands.take_count();
        b_rt += c;
        b_max = b_max.max(c);
        let t = Instant::now();
        naive.insert_one(&t1).await?;
        nt.push(t.elapsed());
        n_rt += commands.take_count();
    }
    assert_eq!(repo.total(&CUSTOMER).await?, n + args.writes as u64);
    commands.take();
    // Where a push's time goes: the same `update_one` by `_id` by hand, then
    // without `$sort`, then changing no array at all, each on a key of its
    // own (one bucket, filled from 1 to at most 1000 items).
    let raw: Collection<Document> = _db.collection(BUCKETS);
    let ops = args.writes.min(SIZE as usize - 1) as u64;
    let mut parts = Vec::new();
    for (v, label) in [
        "hand-written push (same `update_one`)",
        "same, `$push` without `$sort`",
        "same filter, `$inc` only (array untouched)",
    ]
    .iter()
    .enumerate()
    {
        let key = 7_100_000 + v as i64;
        repo.push_many(&key, &[trade(key, 0)]).await?;
        commands.take();
        let mut ts = Vec::new();
        for k in 1..=ops {
            let t = Instant::now();
            write_variant(&raw, &trade(key, k), v).await?;
            ts.push(t.elapsed());
        }
        let rt = commands.take_count();
        parts.push((label.to_string(), rt as f64 / ops as f64, median(&mut ts)));
    }
    let (bm, nm) = (median(&mut bt), median(&mut nt));
    let w = args.writes as f64;
    let mut out = format!(
        "### Single writes: {} interleaved ops each\n\n`push` appends to the open bucket (one `updateOne` by `_id`); every 1000th push opens the next bucket (failed update + point read + upsert).\n\n",
        thousands(args.writes as u64)
    );
    out += "| design | round trips per op (mean) | max | ms per op (median) | time ÷ bucket |\n| --- | ---: | ---: | ---: | ---: |\n";
    out += &format!(
        "| bucket `push` | {:.3} | {} | {:.3} | 1.00× |\n",
        b_rt as f64 / w,
        b_max,
        ms(bm)
    );
    out += &format!(
        "| naive `insert_one` | {:.3} | 1 | {:.3} | {:.2}× |\n\n",
        n_rt as f64 / w,
        ms(nm),
        nm.as_secs_f64() / bm.as_secs_f64()
    );
    out += &format!(
        "Where a push's time goes ({} ops each on a fresh key, one bucket):\n\n| variant | round trips per op | ms per op (median) | time ÷ bucket `push` |\n| --- | ---: | ---: | ---: |\n",
        thousands(ops)
    );
    for (label, rt, m) in parts {
        out += &format!(
            "| {label} | {rt:.3} | {:.3} | {:.2}× |\n",
            ms(m),
            m.as_secs_f64() / bm.as_secs_f64()
        );
    }
    out += "\n";
    Ok(out)
}

/// Variants of the push command: 0 = as the repository sends it, 1 = without
/// `$sort`, 2 = `$inc` only.
async fn write_variant(coll: &Collection<Document>, t: &Trade, v: usize) -> BoxResult<()> {
    if v == 0 {
        return push_by_hand(coll, t, 0).await;
    }
    let item = mongo_patterns_testkit::bsonc::to_document(&Item {
        kind: t.kind.clone(),
        ticker: t.ticker.clone(),
        qty: t.qty,
        date: t.date,
    })?;
    let len = mongo_patterns_testkit::bsonc::to_vec(&item)?.len() as i64 + 8;
    let filter = doc! {
        "_id": {"k": t.customer_id, "s": 0_i64},
        "customerId": t.customer_id,
        "sealed": Bson::Null,
        "count": {"$lte": SIZE - 1},
        "bytes": {"$lte": MAX_BUCKET_BYTES - len},
    };
    let update = if v == 1 {
        doc! {
            "$push": {"items": {"$each": [item]}},
            "$inc": {"count": 1_i64, "bytes": len},
        }
    } else {
        doc! {"$inc": {"count": 1_i64, "bytes": len}}
    };
    let r = coll.update_one(filter, update).upsert(false).await?;
    if r.matched_count != 1 {
        return Err("write variant matched no open bucket".into());
    }
    Ok(())
}

/// The hand-written push: the filter and update `Buckets::push` builds for
/// a known open bucket.
async fn push_by_hand(coll: &Collection<Document>, t: &Trade, seq: i64) -> BoxResult<()> {
    let item = mongo_patterns_testkit::bsonc::to_document(&Item {
        kind: t.kind.clone(),
        ticker: t.ticker.clone(),
        qty: t.qty,
        date: t.date,
    })?;
    let len = mongo_patterns_testkit::bsonc::to_vec(&item)?.len() as i64 + 8;
    let filter = doc! {
        "_id": {"k": t.customer_id, "s": seq},
        "customerId": t.customer_id,
        "sealed": Bson::Null,
        "count": {"$lte": SIZE - 1},
        "bytes": {"$lte": MAX_BUCKET_BYTES - len},
    };
    let update = doc! {
        "$push": {"items": {"$each": [item], "$sort": {"date": 1}}},
        "$inc": {"count": 1_i64, "bytes": len},
    };
    let r = coll.update_one(filter, update).upsert(false).await?;
    if r.matched_count != 1 {
        return Err("hand-written push matched no open bucket".into());
    }
    Ok(())
}

/// The hand-written page: the same aggregation, typed.
async fn page_by_hand(
    coll: &Collection<Sliced>,
    key: i64,
    page: u32,
    per: u32,
) -> BoxResult<Vec<Trade>> {
    let per = i64::from(per);
    let from = (i64::from(page) - 1) * per;
    let want = per + 1;
    let mut cursor = coll
        .aggregate(range_pipeline(key, from, want))
        .with_type::<Sliced>()
        .await?;
    let mut out = Vec::with_capacity(want as usize);
    while let Some(b) = cursor.try_next().await? {
        for it in b.items {
            if out.len() as i64 >= want {
                break;
            }
            out.push(Trade {
                customer_id: key,
                kind: it.kind,
                ticker: it.ticker,
                qty: it.qty,
                date: it.date,
            });
        }
    }
    out.truncate(per as usize);
    Ok(out)
}

/// The hand-written page with the runtime's decoding (`items_of`): raw
/// buckets, each item copied, the key appended, `from_slice`, at most
/// `per + 1` items.
async fn page_by_hand_raw(
    coll: &Collection<RawDocumentBuf>,
    key: i64,
    page: u32,
    per: u32,
) -> BoxResult<Vec<Trade>> {
    let per = i64::from(per);
    let from = (i64::from(page) - 1) * per;
    let want = per + 1;
    let mut cursor = coll
        .aggregate(range_pipeline(key, from, want))
        .with_type::<RawDocumentBuf>()
        .await?;
    let key_raw = RawBson::try_from(Bson::Int64(key))?;
    let mut out = Vec::with_capacity(want as usize);
    while let Some(b) = cursor.try_next().await? {
        for el in items_array(&b)? {
            if out.len() as i64 >= want {
                break;
            }
            let RawBsonRef::Document(d) = el? else {
                return Err("an item is not a document".into());
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())?;
            mongo_patterns_testkit::bsonc::append(&mut item, "customerId", key_raw.clone());
            out.push(mongo_patterns_testkit::bsonc::from_slice(item.as_bytes())?);
        }
    }
    out.truncate(per as usize);
    Ok(out)
}

/// Strips the values out of a command, keeping its field names and types,
/// so that two commands for different keys and items can be compared.
fn shape(b: &Bson) -> String {
    match b {
        Bson::Document(d) => {
            let inner: Vec<String> = d
                .iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "lsid" | "$db" | "txnNumber" | "$clusterTime")
                })
                .map(|(k, v)| format!("{k}: {}", shape(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        Bson::Array(a) => format!("[{}]", a.iter().map(shape).collect::<Vec<_>>().join(", ")),
        other => format!("{:?}", other.element_type()),
    }
}

async fn generated_vs_hand(
    args: &Args,
    uri: &str,
    db: &Database,
    commands: &Commands,
) -> BoxResult<String> {
    eprintln!("generated vs hand-written");
    // Round trips and command shapes, on the monitored client.
    let repo = Trade::buckets(db);
    let raw: Collection<Document> = db.collection(BUCKETS);
    let typed: Collection<Sliced> = db.collection(BUCKETS);
    repo.push_many(&GEN_KEY, &[trade(GEN_KEY, 0)]).await?;
    repo.push_many(&HAND_KEY, &[trade(HAND_KEY, 0)]).await?;
    commands.take();
    repo.push(&trade(GEN_KEY, 1)).await?;
    let gen_cmds = commands.take();
    push_by_hand(&raw, &trade(HAND_KEY, 1), 0).await?;
    let hand_cmds = commands.take();
    let gen_shape: Vec<String> = gen_cmds
        .iter()
        .map(|(n, c)| format!("{n} {}", shape(&Bson::Document(c.clone()))))
        .collect();
    let hand_shape: Vec<String> = hand_cmds
        .iter()
        .map(|(n, c)| format!("{n} {}", shape(&Bson::Document(c.clone()))))
        .collect();
    let push_same = gen_shape == hand_shape;
    if !push_same {
        eprintln!("push commands differ:\n gen  {gen_shape:?}\n hand {hand_shape:?}");
    }
    let last = args.trades.div_ceil(100) as u32;
    let page = 500.min(last);
    let gp = repo.page(&CUSTOMER, PageRequest::new(page, 100)).await?;
    let gen_page_cmds = commands.take();
    let hp = page_by_hand(&typed, CUSTOMER, page, 100).await?;
    let hand_page_cmds = commands.take();
    assert_eq!(gp.items, hp, "hand-written page equals the generated one");
    let strip = |v: &[(String, Document)]| -> Vec<(String, Document)> {
        v.iter()
            .map(|(n, c)| {
                let mut c = c.clone();
                for k in ["lsid", "$db", "$clusterTime"] {
                    c.remove(k);
                }
                (n.clone(), c)
            })
            .collect()
    };
    let page_same = strip(&gen_page_cmds) == strip(&hand_page_cmds);
    if !page_same {
        eprintln!("page commands differ:\n gen  {gen_page_cmds:?}\n hand {hand_page_cmds:?}");
    }

    // CPU, on a client without monitoring.
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let prepo = Trade::buckets(&pdb);
    let praw: Collection<Document> = pdb.collection(BUCKETS);
    let ptyped: Collection<Sliced> = pdb.collection(BUCKETS);
    // Teach the fresh repository GEN_KEY's open bucket (seq 0): one push.
    prepo.push(&trade(GEN_KEY, 2)).await?;
    push_by_hand(&praw, &trade(HAND_KEY, 2), 0).await?;
    let ops = args.cpu_ops as u64;
    let mut next = 3u64;
    let mut cpu = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]]; // [push|page][gen|hand]
    let mut ticks = [[0u64; 2]; 2];
    for rep in 0..args.cpu_reps {
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for &v in &order {
            let (c0, t0) = (cpu_ns(), cpu_ticks());
            for k in 0..ops {
                if v == 0 {
                    prepo.push(&trade(GEN_KEY, next + k)).await?;
                } else {
                    push_by_hand(&praw, &trade(HAND_KEY, next + k), 0).await?;
                }
            }
            cpu[0][v].push(cpu_ns() - c0);
            ticks[0][v] += cpu_ticks() - t0;
        }
        next += ops;
        for &v in &order {
            let (c0, t0) = (cpu_ns(), cpu_ticks());
            for k in 0..ops {
                let p = 1 + (page - 1 + k as u32) % last.max(1);
                if v == 0 {
                    black_box(prepo.page(&CUSTOMER, PageRequest::new(p, 100)).await?);
                } else {
                    black_box(page_by_hand(&ptyped, CUSTOMER, p, 100).await?);
                }
            }
            cpu[1][v].push(cpu_ns() - c0);
            ticks[1][v] += cpu_ticks() - t0;
        }
    }
    let gen_total = repo.total(&GEN_KEY).await?;
    let hand_total = repo.total(&HAND_KEY).await?;
    assert_eq!(gen_total, hand_total, "both keys got the same pushes");
    assert!(
        gen_total <= SIZE as u64,
        "no bucket rollover in the CPU runs"
    );

    let mut out = format!(
        "### Generated vs hand-written: client CPU, {} interleaved repetitions of {} ops\n\n",
        args.cpu_reps, ops
    );
    out += &format!(
        "Push: `Buckets::push` vs `update_one` by `_id: {{k, s}}` with the same filter and update (command shapes equal: {}). Page: `Buckets::page(page {page}.., 100)` vs the same aggregation through `Collection<Sliced>` deserialising `items` (commands equal: {}). Client CPU is this process's on-CPU time over its threads (`/proc/self/task/*/schedstat`), on a client without command monitoring; the server's CPU is not included.\n\n",
        if push_same { "yes" } else { "NO" },
        if page_same { "yes" } else { "NO" }
    );
    out += "| operation | round trips generated / hand | µs CPU per op generated (median rep) | µs CPU per op hand (median rep) | CPU generated ÷ hand (ratio of medians) | per-rep ratio median (min – max) | utime+stime ticks generated / hand |\n| --- | :---: | ---: | ---: | ---: | :---: | :---: |\n";
    let rts = [
        (gen_cmds.len(), hand_cmds.len()),
        (gen_page_cmds.len(), hand_page_cmds.len()),
    ];
    for (i, name) in ["push", "page (100)"].iter().enumerate() {
        let per_rep: Vec<f64> = cpu[i][0]
            .iter()
            .zip(&cpu[i][1])
            .map(|(g, h)| *g as f64 / *h as f64)
            .collect();
        let mut pr = per_rep.clone();
        pr.sort_by(f64::total_cmp);
        let mut g: Vec<f64> = cpu[i][0].iter().map(|&x| x as f64).collect();
        let mut h: Vec<f64> = cpu[i][1].iter().map(|&x| x as f64).collect();
        g.sort_by(f64::total_cmp);
        h.sort_by(f64::total_cmp);
        let (gm, hm) = (median_f64(&g), median_f64(&h));
        out += &format!(
            "| {name} | {} / {} | {:.1} | {:.1} | {:.3} | {:.3} ({:.3} – {:.3}) | {} / {} |\n",
            rts[i].0,
            rts[i].1,
            gm / ops as f64 / 1e3,
            hm / ops as f64 / 1e3,
            gm / hm,
            median_f64(&pr),
            pr[0],
            pr[pr.len() - 1],
            ticks[i][0],
            ticks[i][1]
        );
    }
    out += "\n";

    // The same page call by hand, but decoding as the runtime does: if this
    // costs what `Buckets::page` costs, the gap is the decoding.
    let rawc: Collection<RawDocumentBuf> = pdb.collection(BUCKETS);
    let mut three: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for rep in 0..args.cpu_reps {
        for i in 0..3 {
            let v = (i + rep) % 3;
            let c0 = cpu_ns();
            for k in 0..ops {
                let p = 1 + (page - 1 + k as u32) % last.max(1);
                match v {
                    0 => {
                        black_box(prepo.page(&CUSTOMER, PageRequest::new(p, 100)).await?);
                    }
                    1 => {
                        black_box(page_by_hand(&ptyped, CUSTOMER, p, 100).await?);
                    }
                    _ => {
                        black_box(page_by_hand_raw(&rawc, CUSTOMER, p, 100).await?);
                    }
                }
            }
            three[v].push((cpu_ns() - c0) as f64 / ops as f64 / 1e3);
        }
    }
    for v in &mut three {
        v.sort_by(f64::total_cmp);
    }
    let typed_m = median_f64(&three[1]);
    out += &format!(
        "Page calls, three ways, {} interleaved repetitions of {} pages (same command each):\n\n| variant | µs CPU per page (median rep) | ÷ hand-written typed |\n| --- | ---: | ---: |\n",
        args.cpu_reps, ops
    );
    for (v, label) in [
        "generated `Buckets::page`",
        "hand-written, typed `Collection<Sliced>`",
        "hand-written, `Collection<RawDocumentBuf>` + the runtime's per-item decoding",
    ]
    .iter()
    .enumerate()
    {
        let m = median_f64(&three[v]);
        out += &format!("| {label} | {m:.1} | {:.3} |\n", m / typed_m);
    }
    out += "\n";

    // Client-side decoding alone, no server: the reply of one page (the
    // sliced buckets, as raw documents) turned into `Vec<Trade>` three ways.
    let from = (i64::from(page) - 1) * 100;
    let replies: Vec<RawDocumentBuf> = praw
        .aggregate(range_pipeline(CUSTOMER, from, 101))
        .with_type::<RawDocumentBuf>()
        .await?
        .try_collect()
        .await?;
    let decoders: [(&str, Decoder); 3] = [
        ("as the runtime does (`items_of`: copy each item into a `RawDocumentBuf`, append the key, `from_slice`)", decode_like_runtime),
        ("typed: `from_slice::<Sliced>` of each bucket, key set in Rust (the hand-written page)", decode_typed),
        ("proposed: one reused buffer, item bytes + pre-encoded key element, `from_slice`", decode_spliced),
    ];
    let expect = decode_typed(&replies, CUSTOMER)?;
    let loops = 2000;
    let mut dec: Vec<Vec<f64>> = vec![Vec::new(); decoders.len()];
    for _ in 0..args.cpu_reps {
        for (d, (_, f)) in decoders.iter().enumerate() {
            assert_eq!(f(&replies, CUSTOMER)?, expect, "decoders agree");
            let c0 = cpu_ns();
            for _ in 0..loops {
                black_box(f(black_box(&replies), CUSTOMER)?);
            }
            dec[d].push((cpu_ns() - c0) as f64 / loops as f64 / 1e3);
        }
    }
    for v in &mut dec {
        v.sort_by(f64::total_cmp);
    }
    let base = median_f64(&dec[1]);
    out += &format!(
        "Decoding one page's reply ({} buckets, {} items) on the client only, {} decodes per repetition, median of {}:\n\n| decoder | µs CPU per page | ÷ typed |\n| --- | ---: | ---: |\n",
        replies.len(),
        expect.len(),
        loops,
        args.cpu_reps
    );
    for (d, (label, _)) in decoders.iter().enumerate() {
        let m = median_f64(&dec[d]);
        out += &format!("| {label} | {m:.1} | {:.2}× |\n", m / base);
    }
    out += "\n";
    Ok(out)
}

fn items_array(bucket: &RawDocumentBuf) -> BoxResult<&bson::RawArray> {
    match bucket.get("items")? {
        Some(RawBsonRef::Array(a)) => Ok(a),
        _ => Err("a bucket without items".into()),
    }
}

/// What `Buckets::items_of` does per item.
fn decode_like_runtime(buckets: &[RawDocumentBuf], key: i64) -> BoxResult<Vec<Trade>> {
    let key_raw = RawBson::try_from(Bson::Int64(key))?;
    let mut out = Vec::new();
    for b in buckets {
        for el in items_array(b)? {
            let RawBsonRef::Document(d) = el? else {
                return Err("an item is not a document".into());
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())?;
            mongo_patterns_testkit::bsonc::append(&mut item, "customerId", key_raw.clone());
            out.push(mongo_patterns_testkit::bsonc::from_slice(item.as_bytes())?);
        }
    }
    Ok(out)
}

fn decode_typed(buckets: &[RawDocumentBuf], key: i64) -> BoxResult<Vec<Trade>> {
    let mut out = Vec::new();
    for b in buckets {
        let s: Sliced = mongo_patterns_testkit::bsonc::from_slice(b.as_bytes())?;
        out.extend(s.items.into_iter().map(|it| Trade {
            customer_id: key,
            kind: it.kind,
            ticker: it.ticker,
            qty: it.qty,
            date: it.date,
        }));
    }
    Ok(out)
}

/// The fix: encode the key element once, and splice it onto each item's
/// bytes in one reused buffer (no per-item allocation, no re-validation).
fn decode_spliced(buckets: &[RawDocumentBuf], key: i64) -> BoxResult<Vec<Trade>> {
    let mut key_doc = RawDocumentBuf::new();
    mongo_patterns_testkit::bsonc::append(&mut key_doc, "customerId", key);
    let kb = key_doc.as_bytes();
    let key_elem = &kb[4..kb.len() - 1];
    let mut buf = Vec::with_capacity(256);
    let mut out = Vec::new();
    for b in buckets {
        for el in items_array(b)? {
            let RawBsonRef::Document(d) = el? else {
                return Err("an item is not a document".into());
            };
            let db = d.as_bytes();
            buf.clear();
            buf.extend_from_slice(&[0; 4]);
            buf.extend_from_slice(&db[4..db.len() - 1]);
            buf.extend_from_slice(key_elem);
            buf.push(0);
            let len = (buf.len() as i32).to_le_bytes();
            buf[..4].copy_from_slice(&len);
            out.push(mongo_patterns_testkit::bsonc::from_slice(&buf)?);
        }
    }
    Ok(out)
}
