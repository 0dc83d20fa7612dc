//! Approximate counters vs an exact `$inc` per view: the page views of an
//! insurance site's products, millions of increments an hour.
//!
//! A program, not a test: markdown tables go to stdout, progress to stderr.
//!
//! ```text
//! cargo bench --bench counter -- --increments 100000       # quick
//! cargo bench --bench counter -- --increments 1000000      # the headline run
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--increments N` | 1000000 | page views counted by each approximate mode |
//! | `--exact-increments N` | 0 | views counted by the exact `$inc` baseline; 0: as `--increments` (a smaller number, with the same key distribution, if a million single `$inc`s would take too long) |
//! | `--keys N` | 1000 | products (documents), drawn with a Zipf skew |
//! | `--zipf S` | 1.0 | the skew: product k (1-based) is drawn with probability ∝ 1/k^S |
//! | `--tasks N` | 16 | Tokio tasks issuing the increments |
//! | `--every N` | 100 | N of every mode (the models declare 100; another N builds the handle from the declared spec with `every` replaced) |
//! | `--modes LIST` | sampled,buffered,geometric,exact | which runs, comma-separated |
//! | `--seed N` | 3 | seed of the key draws (and of the CPU comparison's streams) |
//! | `--threads N` | cores | worker threads of the client's runtime (0: current-thread runtime) |
//! | `--cpu-reps N` | 21 | interleaved repetitions per variant for client cost (0: skip) |
//! | `--cpu-ops N` | 50000 | increments per repetition for client cost on the writing path (×20 on the path that does not write) |
//! | `--path-reps N` | 3 | repetitions of each no-write-path case (0: skip) |
//! | `--path-ops N` | 1000000 | increments per no-write-path case |
//! | `--cost-only` | off | only the client-cost comparison (run so under callgrind, its samples are instructions) |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (CONTRIBUTING.md, "The test server"). It shares the
//! machine with this client, so its wall times are ratios, never absolute
//! claims about `mongod`.
//!
//! Measured in one run, on `--keys` product documents pre-created with every
//! counter at 0 (`upsert` stays off, the default):
//!
//! 1. One sequence of key draws per task ([`workload`]) (a seeded SplitMix64 stream per
//!    task, sampled through the Zipf CDF), drawn before any timing. Every run
//!    replays the same per-task sequences (the exact run a per-task prefix of
//!    them when `--exact-increments` is smaller), so the truth per key is
//!    known exactly.
//! 2. Each mode ([`runs`]; `sampled`, `buffered`, `geometric`, one field each, one
//!    handle per run shared by `--tasks` tasks) and the exact baseline (a
//!    hand-written `update_one({_id}, {$inc: {exact_views: 1}})` per view from
//!    the same tasks). Server writes from `serverStatus` before/after
//!    (`opcounters`, `metrics.document.updated`; what two `serverStatus`
//!    calls count is subtracted), cross-checked with the commands sent
//!    (command monitoring) and the handle's `stats().writes`. Wall time of the
//!    tasks, and of the final `shutdown()` (the flush of a buffered handle);
//!    increments per second count both. Client CPU of this process over all
//!    its threads (`/proc/self/task/*/schedstat`).
//! 3. The error at the end ([`tables`] writes it and the tables above): every product read back (one `find`), the total
//!    and each key against the truth, with the documented relative standard
//!    error (`Counter::relative_error(n)` of each key's count).
//! 4. Client cost ([`cpu`], the baseline in [`by_hand`]): `incr` on a sampled handle vs a
//!    hand-written "draw, and one time in N `update_one($inc: N)`" loop, on
//!    a client without command monitoring, one task, repetitions
//!    interleaved: writing one time in N (client CPU), drawing the same
//!    numbers (`Counter::seeded` and the same SplitMix64 stream by hand) so
//!    that both send exactly the same writes; and the path that does not
//!    write (N = 10⁶, wall time), seeded on a stretch of the stream without
//!    a hit, and unseeded against the same per-thread generator by hand.
//!    [`cost`] prints the ratios of medians and their spread.
//! 5. The path that does not write, per mode ([`no_write`]): handles set up so that they
//!    (almost) never write (N = 10⁶; geometric N = 2 after one `incr_by` of
//!    10⁹ per key, so that m = 5·10⁸), from one task and from `--tasks`
//!    tasks, on the Zipf keys and on the hottest key alone: wall time and
//!    client CPU per increment, to show what the handle's locks cost when
//!    tasks meet on them.

mod by_hand;
mod cost;
mod cpu;
mod no_write;
mod runs;
mod tables;
mod workload;

use std::sync::Arc;
use std::time::Duration;

use mongo_patterns::approx_counter::MAX_EVERY;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    self, describe_server, external_server, thousands, BoxResult, Flags, Runtime, ServerCounters,
    Session,
};
use mongo_patterns_testkit::{server_uri, with_pool, Commands};

const COLLECTION: &str = "products";
const EXACT_FIELD: &str = "exact_views";
/// Documents of the CPU comparison, outside the measured products.
const CPU_GEN_ID: &str = "cpu_generated";
const CPU_HAND_ID: &str = "cpu_hand_written";

/// A product: one counter field per mode, and the exact count.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "products")]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    product_name: String,
    /// Sampled, the default mode.
    #[approx_counter(every = 100)]
    web_page_views: i64,
    #[approx_counter(every = 100, mode = "buffered")]
    buffered_views: i64,
    #[approx_counter(every = 100, mode = "geometric")]
    geometric_views: i64,
    /// Counted by hand, one `$inc: 1` per view.
    exact_views: i64,
}

struct Args {
    increments: u64,
    exact_increments: u64,
    keys: usize,
    zipf: f64,
    tasks: usize,
    every: u32,
    modes: Vec<Run>,
    seed: u64,
    threads: usize,
    cpu_reps: usize,
    cpu_ops: u64,
    path_reps: usize,
    path_ops: u64,
    cost_only: bool,
    command: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Sampled,
    Buffered,
    Geometric,
    Exact,
}

impl Run {
    fn name(self) -> &'static str {
        match self {
            Run::Sampled => "sampled",
            Run::Buffered => "buffered",
            Run::Geometric => "geometric",
            Run::Exact => "exact `$inc`",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Run::Sampled => "web_page_views",
            Run::Buffered => "buffered_views",
            Run::Geometric => "geometric_views",
            Run::Exact => EXACT_FIELD,
        }
    }
}

impl Args {
    fn parse() -> Args {
        let mut f = Flags::from_env(
            "counter",
            "[--increments N] [--exact-increments N] \
             [--keys N] [--zipf S] [--tasks N] [--every N] [--modes sampled,buffered,geometric,exact] \
             [--seed N] [--threads N] [--cpu-reps N] [--cpu-ops N] [--path-reps N] [--path-ops N] [--cost-only]",
        );
        let mut a = Args {
            increments: 1_000_000,
            exact_increments: 0,
            keys: 1000,
            zipf: 1.0,
            tasks: 16,
            every: 100,
            modes: vec![Run::Sampled, Run::Buffered, Run::Geometric, Run::Exact],
            seed: 3,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            cpu_reps: 21,
            cpu_ops: 50_000,
            path_reps: 3,
            path_ops: 1_000_000,
            cost_only: false,
            command: f.command(),
        };
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--increments" => a.increments = f.value(&flag),
                "--exact-increments" => a.exact_increments = f.value(&flag),
                "--keys" => a.keys = f.value(&flag),
                "--zipf" => a.zipf = f.value(&flag),
                "--tasks" => a.tasks = f.value(&flag),
                "--every" => a.every = f.value(&flag),
                "--seed" => a.seed = f.value(&flag),
                "--threads" => a.threads = f.value(&flag),
                "--cpu-reps" => a.cpu_reps = f.value(&flag),
                "--cpu-ops" => a.cpu_ops = f.value(&flag),
                "--path-reps" => a.path_reps = f.value(&flag),
                "--path-ops" => a.path_ops = f.value(&flag),
                "--cost-only" => a.cost_only = true,
                "--modes" => {
                    a.modes = f
                        .string(&flag)
                        .split(',')
                        .map(|m| match m.trim() {
                            "sampled" => Run::Sampled,
                            "buffered" => Run::Buffered,
                            "geometric" => Run::Geometric,
                            "exact" => Run::Exact,
                            other => f.fail(&format!("unknown mode `{other}`")),
                        })
                        .collect();
                }
                _ => f.unknown(&flag),
            }
        }
        if a.exact_increments == 0 {
            a.exact_increments = a.increments;
        }
        if a.keys == 0 || a.keys > u32::MAX as usize || a.tasks == 0 || a.increments == 0 {
            f.fail("--keys, --tasks and --increments must be positive");
        }
        if !(2..=MAX_EVERY).contains(&a.every) {
            f.fail(&format!("--every must be from 2 to {MAX_EVERY}"));
        }
        if !(a.zipf.is_finite() && a.zipf >= 0.0) {
            f.fail("--zipf must be a non-negative number");
        }
        if a.modes.is_empty() {
            f.fail("--modes names no run");
        }
        a.cpu_ops = a.cpu_ops.max(1);
        a.path_ops = a.path_ops.max(1);
        a
    }
}

fn main() {
    let args = Args::parse();
    let runtime = match args.threads {
        0 => Runtime::CurrentThread,
        n => Runtime::MultiThread { workers: Some(n) },
    };
    bench::main(runtime, async move {
        // 16 tasks, plus a buffered flush's 16 concurrent writes.
        let pool = args.tasks + 16;
        let s = Session::open("counter", with_pool(&server_uri(), u32::try_from(pool)?)).await?;
        let report = bench(&args, &s.uri, pool, &s.db, &s.commands).await;
        s.finish(report).await
    });
}

async fn bench(
    args: &Args,
    uri: &str,
    pool: usize,
    db: &Database,
    commands: &Commands,
) -> BoxResult<String> {
    let mut server = describe_server(db).await;
    if !external_server() {
        server += " on the same machine";
    }
    let runtime = if args.threads == 0 {
        "tokio current-thread runtime".to_owned()
    } else {
        format!("tokio multi-thread runtime, {} workers", args.threads)
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = format!(
        "# Approximate counter benchmark: {} increments over {} products\n\nCommand: `{}` — server: {server}, client: {cores} cores, {runtime}, connection pool of {pool}.\n\n",
        thousands(args.increments),
        thousands(args.keys as u64),
        args.command,
    );
    if args.cost_only {
        return Ok(out + &cpu::cpu_comparison(args, uri, db).await?);
    }

    eprintln!(
        "drawing {} keys",
        thousands(args.increments.max(args.exact_increments))
    );
    let w = workload::Workload::new(args);
    let coldest = args.keys - 1;
    out += &format!(
        "Workload: {} page views of {} products (`_id` \"p00001\" … ), product k drawn with probability ∝ 1/k^{} (Zipf): the hottest gets {:.2}% of the views, product {} {:.3}%, the coldest (product {}) {:.4}%. {} Tokio tasks share one handle per mode, each replaying its own pre-drawn sequence of products (seed {}), so every mode counts exactly the same views; the exact baseline replays a per-task prefix of the same sequences. Every mode has every = {}. The products are inserted first with every counter at 0; `upsert` stays off.\n\n",
        thousands(args.increments),
        thousands(args.keys as u64),
        args.zipf,
        100.0 * w.p[0],
        10.min(args.keys),
        100.0 * w.p[10.min(args.keys) - 1],
        args.keys,
        100.0 * w.p[coldest],
        args.tasks,
        args.seed,
        args.every,
    );

    // Products, every counter at 0.
    let products: Vec<Product> = w
        .ids
        .iter()
        .map(|id| Product {
            id: id.clone(),
            product_name: "儿童健康险（D）".to_owned(),
            web_page_views: 0,
            buffered_views: 0,
            geometric_views: 0,
            exact_views: 0,
        })
        .collect();
    let coll = Product::collection(db);
    for chunk in products.chunks(10_000) {
        coll.insert_many(chunk).await?;
    }

    let tally = runs::Tally {
        commands: commands.clone(),
        counts: Arc::default(),
    };
    let drainer = {
        let tally = tally.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tally.drain();
            }
        })
    };
    // What two `serverStatus` calls in a row count, to subtract.
    let baseline = ServerCounters::baseline(db).await?;
    // Warm the connection pool: as many connections as tasks.
    let warm: Vec<_> = (0..args.tasks)
        .map(|_| {
            let db = db.clone();
            tokio::spawn(async move { db.run_command(doc! {"ping": 1}).await })
        })
        .collect();
    for h in warm {
        h.await??;
    }

    let mut runs = Vec::new();
    for &run in &args.modes {
        let n = if run == Run::Exact {
            args.exact_increments
        } else {
            args.increments
        };
        runs.push(runs::measure(args, db, &tally, baseline, &w, run, n).await?);
    }
    drainer.abort();

    out += &tables::writes_table(args, &runs);
    out += &tables::throughput_table(args, &runs);
    out += &tables::verdict_table(&runs);
    out += &tables::error_tables(args, &w, &runs);
    if args.cpu_reps > 0 {
        out += &cpu::cpu_comparison(args, uri, db).await?;
    }
    if args.path_reps > 0 {
        out += &no_write::no_write_path(args, uri, db, &w).await?;
    }
    Ok(out)
}
