//! The bucket pattern vs one document per trade, and the generated
//! repository vs hand-written driver code: one customer's trade history,
//! 1,000 trades to a bucket, read a page at a time.
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
//! | `--page-reps N` | 31 | interleaved repetitions of the page comparison |
//! | `--page-ops N` | 100 | pages per repetition of the page comparison |
//! | `--cost-only` | off | load, then only the generated-vs-hand section (run so under callgrind, its samples are instructions) |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (CONTRIBUTING.md, "The test server"). The surrogate walks
//! whole collections on range queries, so read round trips and `explain`
//! figures first, and wall times only as ratios.
//!
//! Measured in one run:
//!
//! 1. Load ([`load`]): `Buckets::push_many` in chunks of `--batch`; the
//!    naive design (one document per trade, index `{customerId: 1, date: 1}`)
//!    by `insert_many` in batches of `--batch`.
//! 2. Pages ([`pages`]) 1, 100, 1000 and the last (100 a page), sizes 20 and
//!    50 at a deep page, and page 1 newest first: `Buckets::page` vs
//!    `find({customerId}).sort({date: ±1}).skip(..).limit(..)`. Round trips
//!    by command monitoring around one call; keys/docs examined by `explain`
//!    (`executionStats`) of the exact command (the bucket's aggregate from
//!    `page_pipeline`, newest first too); bytes as the sum of the BSON
//!    sizes of the reply's documents; wall time the median of `--reps`.
//! 3. Writes ([`writes`]): `push` (steady state) vs naive `insert_one`.
//! 4. Generated vs hand-written ([`generated`], the baselines in
//!    [`by_hand`]): `push` vs an `update_one` with the same filter and
//!    update, and `page` vs the same aggregation through a typed
//!    `Collection`. Client CPU from `/proc/self/task/*/schedstat`
//!    (utime+stime from `/proc/self/stat` as a cross-check), on a client
//!    without command monitoring, repetitions interleaved.

mod by_hand;
#[path = "../counter/cost.rs"]
mod cost;
mod generated;
mod load;
mod pages;
mod writes;

use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    self, external_server, server_version, thousands, BoxResult, Flags, Runtime, Session,
};
use mongo_patterns_testkit::{server_uri, Commands};

const CUSTOMER: i64 = 7_000_000;
const GEN_KEY: i64 = 7_000_001;
const HAND_KEY: i64 = 7_000_002;
const SIZE: i64 = 1000;
const BUCKETS: &str = "history";
const NAIVE: &str = "trades_naive";

/// A trade of one customer's history.
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

/// Trade `i` of `customer`: a minute after trade `i - 1`.
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
    page_reps: usize,
    page_ops: usize,
    cost_only: bool,
    command: String,
}

impl Args {
    fn parse() -> Args {
        let mut f = Flags::from_env(
            "bucket",
            "[--trades N] [--batch N] [--reps N] [--writes N] [--cpu-reps N] [--cpu-ops N] [--page-reps N] [--page-ops N] [--cost-only]",
        );
        let mut a = Args {
            trades: 100_000,
            batch: 10_000,
            reps: 3,
            writes: 2000,
            cpu_reps: 9,
            cpu_ops: 100,
            page_reps: 31,
            page_ops: 100,
            cost_only: false,
            command: f.command(),
        };
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--trades" => a.trades = f.value(&flag),
                "--batch" => a.batch = f.value(&flag),
                "--reps" => a.reps = f.value(&flag),
                "--writes" => a.writes = f.value(&flag),
                "--cpu-reps" => a.cpu_reps = f.value(&flag),
                "--cpu-ops" => a.cpu_ops = f.value(&flag),
                "--page-reps" => a.page_reps = f.value(&flag),
                "--page-ops" => a.page_ops = f.value(&flag),
                "--cost-only" => a.cost_only = true,
                _ => f.unknown(&flag),
            }
        }
        if a.trades < 100 || a.batch == 0 {
            f.fail("--trades must be at least 100 and --batch positive");
        }
        a.reps = a.reps.max(1);
        a.writes = a.writes.max(1);
        a.cpu_reps = a.cpu_reps.max(1);
        a.page_reps = a.page_reps.max(1);
        a.page_ops = a.page_ops.max(1);
        // Pushes for the CPU comparison must stay in one bucket per key.
        a.cpu_ops = a.cpu_ops.clamp(1, (SIZE as usize - 1) / a.cpu_reps);
        a
    }
}

fn main() {
    let args = Args::parse();
    bench::main(Runtime::CurrentThread, async move {
        let s = Session::open("bucket", server_uri()).await?;
        let report = bench(&args, &s.uri, &s.db, &s.commands).await;
        s.finish(report).await
    });
}

async fn bench(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<String> {
    let version = server_version(db).await;
    let mut out = format!(
        "# Bucket pattern benchmark: {} trades of one customer\n\nCommand: `{}` — server: {} (reports version {version}), client: tokio current-thread runtime.\n\n",
        thousands(args.trades),
        args.command,
        if external_server() { "MONGODB_URI" } else { "surrogate secantusd-rs" },
    );
    let repo = Trade::buckets(db);
    let naive: Collection<Trade> = db.collection(NAIVE);
    let loaded = load::load(args, db, &repo, &naive, commands).await?;
    if args.cost_only {
        return Ok(out + &generated::generated_vs_hand(args, uri, db, commands).await?);
    }
    out += &loaded;
    out += &pages::pages(args, db, &repo, &naive, commands).await?;
    out += &writes::writes(args, db, &repo, &naive, commands).await?;
    out += &generated::generated_vs_hand(args, uri, db, commands).await?;
    Ok(out)
}
