//! Keyset pagination vs `skip` + `limit`, and the generated repository vs
//! hand-written driver code: a batch job that reads a large collection of
//! visits page by page, in `_id` order.
//!
//! A program, not a test: it prints markdown tables to stdout (progress goes
//! to stderr), so `cargo bench --bench keyset -- --docs 1000000 > out.md`
//! keeps only the tables (`scripts/bench` writes them to
//! `benches/keyset-results.md`).
//!
//! ```text
//! cargo bench --bench keyset                        # quick: 200k visits
//! cargo bench --bench keyset -- --docs 1000000      # the headline run
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--docs N` | 200000 | visits loaded into a fresh database |
//! | `--page-size N` | 100 | items per page in the depth comparison |
//! | `--depths a,b,..` | 0,10000,100000,500000 | page depths (items skipped); depths `>= N` are dropped |
//! | `--reps N` | 3 | timed fetches per design and depth (the median is reported) |
//! | `--scan N` | 100000 | items read by the bounded scan (clamped to `--docs`) |
//! | `--scan-page N` | 20000 | page size of the bounded scan |
//! | `--cpu-reps N` | 15 | scans per variant for the CPU comparison, interleaved |
//! | `--batch N` | 10000 | documents per `insert_many` while loading |
//! | `--multi-thread` | off | use tokio's multi-thread runtime (default: current-thread) |
//! | `--cost-only` | off | load, then only the scan's client cost (run so under callgrind, its samples are instructions) |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (CONTRIBUTING.md, "The test server"). On the surrogate,
//! any range/sort/limit `find` walks the whole collection, so its wall times
//! say little about `mongod`: read the round trips and the `explain` figures
//! (`totalKeysExamined`, `totalDocsExamined`) first, and wall times only as
//! ratios.
//!
//! What is measured, all in one run:
//!
//! 1. Loading ([`load`]): `insert_many` in batches of `--batch`; no
//!    secondary index is created, because both designs sort by `_id`, which
//!    the `_id` index already serves (a fair skip+limit needs no other
//!    index).
//! 2. A page at each depth `d` ([`depths`]), by
//!    `find({}).sort({_id: 1}).skip(d).limit(n)` and by keyset
//!    (`Visit::keyset(&db).page_size(n).after(&token).page()`). The token at
//!    depth `d` is made once, untimed, in setup: the `_id` of item `d - 1` is
//!    read with one `skip(d - 1).limit(1)` query, then a one-item keyset page
//!    filtered to `{_id: {$gte: that id}}` returns that item and, as its
//!    `next`, the token that marks it (tokens name the collection and sort
//!    keys, not the filter, so the token is valid for the unfiltered query).
//!    Both designs' pages are checked to hold the same ids. Round trips are
//!    counted with command monitoring around one fetch; server work comes
//!    from `explain` with `executionStats` of the exact command
//!    (`Keyset::command()` gives the keyset page's filter, sort and limit);
//!    wall time is the median of `--reps` fetches.
//! 3. A bounded scan of the first `--scan` items ([`scan`]), by
//!    `Keyset::stream()` and by a hand-written driver loop over
//!    `Collection<Visit>` that sends the same `find` commands (checked
//!    command by command). Client CPU is the process's own on-CPU time,
//!    summed over its threads from `/proc/self/task/*/schedstat`
//!    (nanoseconds; `/proc/self/stat` utime+stime, in clock ticks, is printed
//!    as a cross-check). The server runs in another process, so none of its
//!    work is counted. The scans for CPU use a second client *without*
//!    command monitoring: with a handler installed the driver copies every
//!    reply into the event, which would cost both variants the same large
//!    amount and blur the ratio.

#[path = "../counter/cost.rs"]
mod cost;
mod depths;
mod load;
mod scan;

use std::fmt::Write as _;
use std::time::Duration;

use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{self, describe_server, BoxResult, Flags, Runtime, Session};
use mongo_patterns_testkit::{server_uri, Commands};

/// One visit: a visitor id and the visit's time.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    uuid: String,
    init_time: DateTime,
}

#[derive(Debug, Clone)]
struct Args {
    docs: u64,
    page_size: u32,
    depths: Vec<u64>,
    reps: usize,
    scan: u64,
    scan_page: u32,
    cpu_reps: usize,
    batch: usize,
    multi_thread: bool,
    cost_only: bool,
    command: String,
}

impl Args {
    fn parse() -> Args {
        let mut f = Flags::from_env(
            "keyset",
            "[--docs N] [--page-size N] [--depths a,b,..] \
             [--reps N] [--scan N] [--scan-page N] [--cpu-reps N] [--batch N] [--multi-thread] [--cost-only]",
        );
        let mut a = Args {
            docs: 200_000,
            page_size: 100,
            depths: vec![0, 10_000, 100_000, 500_000],
            reps: 3,
            scan: 100_000,
            scan_page: 20_000,
            cpu_reps: 15,
            batch: 10_000,
            multi_thread: false,
            cost_only: false,
            command: f.command(),
        };
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--docs" => a.docs = f.value(&flag),
                "--page-size" => a.page_size = f.value(&flag),
                "--depths" => a.depths = f.list(&flag),
                "--reps" => a.reps = f.value(&flag),
                "--scan" => a.scan = f.value(&flag),
                "--scan-page" => a.scan_page = f.value(&flag),
                "--cpu-reps" => a.cpu_reps = f.value(&flag),
                "--batch" => a.batch = f.value(&flag),
                "--multi-thread" => a.multi_thread = true,
                "--cost-only" => a.cost_only = true,
                _ => f.unknown(&flag),
            }
        }
        if a.docs == 0 || a.page_size == 0 || a.scan_page == 0 || a.batch == 0 {
            f.fail("--docs, --page-size, --scan-page and --batch must be positive");
        }
        a.reps = a.reps.max(1);
        a.cpu_reps = a.cpu_reps.max(1);
        a.scan = a.scan.clamp(1, a.docs);
        a.depths.retain(|&d| d < a.docs);
        a
    }
}

fn main() {
    let args = Args::parse();
    let runtime = if args.multi_thread {
        Runtime::MultiThread { workers: None }
    } else {
        Runtime::CurrentThread
    };
    bench::main(runtime, async move {
        let s = Session::open("keyset", server_uri()).await?;
        let report = bench(&args, &s.uri, &s.db, &s.commands).await;
        s.finish(report).await
    });
}

async fn bench(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<String> {
    let server = describe_server(db).await;

    // 1. Load.
    let load = load::load(args, db).await?;
    commands.take();
    if args.cost_only {
        let scan = scan::scan(args, uri, db, commands).await?;
        return Ok(format!(
            "Command: `{}` — {} visits, server: {server}, tokio current-thread runtime.\n\n{}",
            args.command,
            args.docs,
            scan::cost_table(args, &scan)
        ));
    }

    // 2. Pages at depth.
    let depth_rows = depths::depths(args, db, commands).await?;

    // 3. Generated vs hand-written scan.
    let scan = scan::scan(args, uri, db, commands).await?;

    let mut out = String::new();
    writeln!(
        out,
        "Command: `{}` — {} visits, server: {server}, client: {} cores, tokio {} runtime.\n",
        args.command,
        args.docs,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if args.multi_thread {
            "multi-thread"
        } else {
            "current-thread"
        }
    )?;
    writeln!(
        out,
        "Loading: {} visits with `insert_many` in batches of {} took {:.1} s ({:.0} docs/s). \
         Indexes: `_id_` only (both designs sort by `_id`).\n",
        args.docs,
        args.batch,
        load.as_secs_f64(),
        args.docs as f64 / load.as_secs_f64()
    )?;
    depths::report(&mut out, args, &depth_rows)?;
    scan::report(&mut out, args, &scan)?;
    Ok(out)
}

/// Lets a `killCursors` sent in the background on a cursor's drop be counted.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}
