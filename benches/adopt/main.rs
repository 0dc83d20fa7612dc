//! Adopting a flat collection into buckets: `Buckets::adopt_from` (on
//! the server, `$setWindowFields` and `$merge` per batch of keys) against
//! the client-side way (a cursor over the flat collection sorted by key
//! and time, `push_many` per key), on the same trades.
//!
//! A program, not a test: markdown tables go to stdout, progress to stderr.
//!
//! ```text
//! cargo bench --bench adopt                         # quick: 100k trades
//! cargo bench --bench adopt -- --items 1000000      # the headline run
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--items N` | 100000 | trades in the flat collection |
//! | `--per-key N` | 1000 | trades of each customer (keys = items / per-key) |
//! | `--batch N` | 50000 | items per `$merge` (`batch_items`) |
//! | `--no-baseline` | off | skip the client-side `push_many` run |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (CONTRIBUTING.md, "The test server"): its wall
//! times are for ratios.
//!
//! Measured in one run: the flat collection loaded by `insert_many`
//! (customers interleaved, each customer's times out of order, index
//! `{customerId: 1, date: 1}` created first); `adopt_from` timed, its progress reports
//! counted; `adopt_from` again (every bucket rewritten, the same); the
//! baseline; then a check that both bucket collections hold the same
//! items for every customer (the write ids aside); then `rebucket_all`
//! after `size` was lowered from 200 to 50 (every customer moved, one
//! transaction each), checked: every item kept, no bucket over the limit.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::TryStreamExt;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns::progress::Progress;
use mongo_patterns_testkit::bench::{
    self, external_server, server_version, thousands, BoxResult, Flags, Runtime, Session,
};
use mongo_patterns_testkit::server_uri;

const FLAT: &str = "trades_flat";
const BASELINE: &str = "history_pushed";

/// A trade, as the application stored it flat and as buckets hold it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 200, key = "customerId", order = "date")]
struct Trade {
    customer_id: i64,
    #[serde(rename = "type")]
    kind: String,
    ticker: String,
    qty: i32,
    date: DateTime,
}

/// The same buckets after `size` was lowered to 50: with `order` a bucket
/// holds at most 100, so every bucket of 200 is over it and
/// `rebucket_all` moves every customer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 50, key = "customerId", order = "date")]
struct Smaller {
    customer_id: i64,
    #[serde(rename = "type")]
    kind: String,
    ticker: String,
    qty: i32,
    date: DateTime,
}

/// Trade `i` of `customer`: its minute goes back and forth (a permutation
/// of the customer's minutes), as trades reported late make it.
fn trade(customer: i64, i: u64, per_key: u64) -> Trade {
    const TICKERS: [&str; 5] = ["MDB", "AAPL", "MSFT", "TSLA", "AMZN"];
    let minute = (i * 7919) % per_key;
    Trade {
        customer_id: customer,
        kind: if i.is_multiple_of(3) { "sell" } else { "buy" }.to_owned(),
        ticker: TICKERS[i as usize % TICKERS.len()].to_owned(),
        qty: 1 + ((i * 37) % 500) as i32,
        date: DateTime::from_millis(1_767_225_600_000 + minute as i64 * 60_000),
    }
}

struct Args {
    items: u64,
    per_key: u64,
    batch: u64,
    baseline: bool,
    command: String,
}

impl Args {
    fn parse() -> Args {
        let mut f = Flags::from_env(
            "adopt",
            "[--items N] [--per-key N] [--batch N] [--no-baseline]",
        );
        let mut a = Args {
            items: 100_000,
            per_key: 1000,
            batch: 50_000,
            baseline: true,
            command: f.command(),
        };
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--items" => a.items = f.value(&flag),
                "--per-key" => a.per_key = f.value(&flag),
                "--batch" => a.batch = f.value(&flag),
                "--no-baseline" => a.baseline = false,
                _ => f.unknown(&flag),
            }
        }
        if a.per_key == 0 || a.items < a.per_key || a.batch == 0 {
            f.fail("--items must be at least --per-key, both and --batch positive");
        }
        a
    }
}

fn main() {
    let args = Args::parse();
    bench::main(Runtime::CurrentThread, async move {
        let s = Session::open("adopt", server_uri()).await?;
        let report = bench(&args, &s.db).await;
        s.finish(report).await
    });
}

fn rate(n: u64, secs: f64) -> String {
    thousands((n as f64 / secs) as u64)
}

async fn bench(args: &Args, db: &Database) -> BoxResult<String> {
    let version = server_version(db).await;
    let keys = args.items / args.per_key;
    let items = keys * args.per_key;
    let mut out = format!(
        "# Adopting a flat collection: {} trades, {} customers of {} trades, buckets of 200\n\nCommand: `{}` — server: {} (reports version {version}), client: tokio current-thread runtime.\n\n",
        thousands(items),
        thousands(keys),
        thousands(args.per_key),
        args.command,
        if external_server() { "MONGODB_URI" } else { "surrogate secantusd-rs" },
    );

    // The flat collection, customers interleaved as a live application
    // writes them.
    let flat: Collection<Trade> = db.collection(FLAT);
    let t = Instant::now();
    // Before the load: the test server builds an index on a full
    // collection slowly.
    flat.create_index(
        mongo_patterns::mongodb::IndexModel::builder()
            .keys(doc! {"customerId": 1, "date": 1})
            .build(),
    )
    .await?;
    let mut chunk = Vec::with_capacity(10_000);
    for i in 0..args.per_key {
        for k in 0..keys {
            chunk.push(trade(k as i64, i, args.per_key));
            if chunk.len() == 10_000 {
                flat.insert_many(std::mem::take(&mut chunk)).await?;
                eprintln!("loaded {} of {}", (i * keys + k + 1), items);
            }
        }
    }
    if !chunk.is_empty() {
        flat.insert_many(chunk).await?;
    }
    let load = t.elapsed().as_secs_f64();

    let repo = Trade::buckets(db);
    repo.ensure().await?;
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let log = seen.clone();
    let t = Instant::now();
    let copied = repo
        .adopt_from(FLAT)
        .batch_items(args.batch)
        .on_progress(move |p| {
            eprintln!("adopted {} of {} ({:.0}/s)", p.done, p.of, p.rate());
            log.lock().unwrap().push(p);
        })
        .await?;
    let first = t.elapsed().as_secs_f64();
    let (reports, batch_rates) = {
        let seen = seen.lock().unwrap();
        // Each batch's own rate, from the reports before and after it.
        let mut last = (0u64, 0f64);
        let rates: Vec<f64> = seen
            .iter()
            .map(|p| {
                let (d, e) = (p.done, p.elapsed.as_secs_f64());
                let r = (d - last.0) as f64 / (e - last.1).max(1e-9);
                last = (d, e);
                r
            })
            .collect();
        (seen.len(), rates)
    };
    let t = Instant::now();
    let again = repo.adopt_from(FLAT).batch_items(args.batch).await?;
    let second = t.elapsed().as_secs_f64();
    if copied != items || again != items {
        return Err(format!("adopted {copied} and {again} of {items}").into());
    }
    let buckets = repo.collection().count_documents(doc! {}).await?;

    let mut rows = vec![
        format!(
            "| flat collection: `insert_many` of 10,000 (+ index `{{customerId: 1, date: 1}}`) | {} | {load:.1} | {} |",
            thousands(items),
            rate(items, load)
        ),
        format!(
            "| `adopt_from`, batches of {} items ({reports} progress reports, {} buckets) | {} | {first:.1} | {} |",
            thousands(args.batch),
            thousands(buckets),
            thousands(items),
            rate(items, first)
        ),
        format!(
            "| `adopt_from` again (every bucket rewritten, the same) | {} | {second:.1} | {} |",
            thousands(items),
            rate(items, second)
        ),
    ];

    let mut notes = Vec::new();
    if let (Some(first), Some(last)) = (batch_rates.get(1), batch_rates.last()) {
        notes.push(format!(
            "Per batch of the first `adopt_from` (from its progress reports): the second batch {} trades/s, the last {} trades/s. The rate falls as the bucket collection fills where each write by a compound `_id` costs more the more documents the collection holds (the test server: 250 `replace_one` upserts by `{{k, s}}` take about 4 s into 2,750 buckets; `$merge` on `_id` is such a write).",
            thousands(*first as u64),
            thousands(*last as u64),
        ));
    }
    if args.baseline {
        let pushed = Trade::buckets(db).with_collection(BASELINE);
        let t = Instant::now();
        let mut cursor = flat
            .find(doc! {})
            .sort(doc! {"customerId": 1, "date": 1, "_id": 1})
            .await?;
        let mut group: Vec<Trade> = Vec::new();
        let mut done = 0u64;
        while let Some(tr) = cursor.try_next().await? {
            if group
                .first()
                .is_some_and(|g| g.customer_id != tr.customer_id)
            {
                pushed.push_many(&group).await?;
                done += group.len() as u64;
                group.clear();
                if done.is_multiple_of(100_000) {
                    eprintln!("pushed {done} of {items}");
                }
            }
            group.push(tr);
        }
        pushed.push_many(&group).await?;
        let base = t.elapsed().as_secs_f64();
        rows.push(format!(
            "| client side: a cursor sorted by `{{customerId, date, _id}}`, `push_many` per customer | {} | {base:.1} | {} |",
            thousands(items),
            rate(items, base)
        ));
        // Both hold the same buckets, the write ids aside.
        let strip = |mut d: Document| {
            d.remove("mp_ops");
            d
        };
        let a: Vec<Document> = repo
            .collection()
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await?
            .try_collect()
            .await?;
        let b: Vec<Document> = pushed
            .collection()
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await?
            .try_collect()
            .await?;
        let same = a.len() == b.len() && a.into_iter().map(strip).eq(b.into_iter().map(strip));
        if !same {
            return Err("adopt_from and push_many wrote different buckets".into());
        }
        notes.push(format!(
            "Both wrote the same {} buckets (compared document by document, `mp_ops` aside). Time client side ÷ `adopt_from`: {:.2}×.",
            thousands(buckets),
            base / first
        ));
    }

    // The migration after `size` was lowered over the adopted buckets.
    let smaller = Smaller::buckets(db);
    let t = Instant::now();
    let moved = smaller
        .rebucket_all()
        .on_progress(|p| eprintln!("rebucketed {} of {} customers", p.done, p.of))
        .await?
        .items;
    let migrated = t.elapsed().as_secs_f64();
    let over = smaller
        .collection()
        .count_documents(doc! {"count": {"$gt": 50}})
        .await?;
    let now = smaller.collection().count_documents(doc! {}).await?;
    let first_key = smaller.count(&0_i64).await?;
    if moved != items || over != 0 || first_key != args.per_key {
        return Err(format!(
            "rebucket_all moved {moved} of {items}; {over} buckets over 50; customer 0 holds {first_key}"
        )
        .into());
    }
    rows.push(format!(
        "| `rebucket_all` after `size` lowered to 50 (one transaction per customer; {} buckets after) | {} | {migrated:.1} | {} |",
        thousands(now),
        thousands(items),
        rate(items, migrated)
    ));

    out += "| step | trades | seconds | trades/s |\n| --- | ---: | ---: | ---: |\n";
    for r in rows {
        out += &r;
        out += "\n";
    }
    for n in notes {
        out += "\n";
        out += &n;
        out += "\n";
    }
    out += "\n";
    Ok(out)
}
