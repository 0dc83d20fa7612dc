//! Approximate counters vs an exact `$inc` per view (seed 003: an insurance
//! product's `web_page_views`, millions of increments an hour; issue 5).
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
//! | `--cpu-reps N` | 9 | interleaved repetitions per variant for client CPU (0: skip) |
//! | `--cpu-ops N` | 50000 | increments per repetition for client CPU |
//! | `--path-reps N` | 3 | repetitions of each no-write-path case (0: skip) |
//! | `--path-ops N` | 1000000 | increments per no-write-path case |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (DESIGN.md, "The test server"). It shares the
//! machine with this client, so its wall times are ratios, never absolute
//! claims about `mongod`.
//!
//! Measured in one run, on `--keys` product documents pre-created with every
//! counter at 0 (`upsert` stays off, the default):
//!
//! 1. One sequence of key draws per task (a seeded SplitMix64 stream per
//!    task, sampled through the Zipf CDF), drawn before any timing. Every run
//!    replays the same per-task sequences (the exact run a per-task prefix of
//!    them when `--exact-increments` is smaller), so the truth per key is
//!    known exactly.
//! 2. Each mode (`sampled`, `buffered`, `geometric`, one field each, one
//!    handle per run shared by `--tasks` tasks) and the exact baseline (a
//!    hand-written `update_one({_id}, {$inc: {exact_views: 1}})` per view from
//!    the same tasks). Server writes from `serverStatus` before/after
//!    (`opcounters`, `metrics.document.updated`; what two `serverStatus`
//!    calls count is subtracted), cross-checked with the commands sent
//!    (command monitoring) and the handle's `stats().writes`. Wall time of the
//!    tasks, and of the final `shutdown()` (the flush of a buffered handle);
//!    increments per second count both. Client CPU of this process over all
//!    its threads (`/proc/self/task/*/schedstat`).
//! 3. The error at the end: every product read back (one `find`), the total
//!    and each key against the truth, with the documented relative standard
//!    error (`Counter::relative_error(n)` of each key's count).
//! 4. Client CPU: `incr` on a sampled handle vs a hand-written "draw, and
//!    one time in N `update_one($inc: N)`" loop drawing the same numbers
//!    (`Counter::seeded` and the same SplitMix64 stream by hand), so that
//!    both send exactly the same writes; on a client without command
//!    monitoring, one task, repetitions interleaved.
//! 5. The path that does not write, per mode: handles set up so that they
//!    (almost) never write (N = 10⁶; geometric N = 2 after one `incr_by` of
//!    10⁹ per key, so that m = 5·10⁸), from one task and from `--tasks`
//!    tasks, on the Zipf keys and on the hottest key alone: wall time and
//!    client CPU per increment, to show what the handle's locks cost when
//!    tasks meet on them.

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::approx_counter::{CounterSpec, Mode, MAX_EVERY};
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{self, cpu_ns, sort_median_f64, splitmix64, thousands};
use mongo_patterns_testkit::{client, server_uri, Commands};

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const COLLECTION: &str = "products";
const EXACT_FIELD: &str = "exact_views";
/// Documents of the CPU comparison, outside the measured products.
const CPU_GEN_ID: &str = "cpu_generated";
const CPU_HAND_ID: &str = "cpu_hand_written";

/// Seed 003's product: one counter field per mode, and the exact count.
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

// ------------------------------------------------------------------ flags

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
    raw: Vec<String>,
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
        let raw: Vec<String> = std::env::args().skip(1).collect();
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
            cpu_reps: 9,
            cpu_ops: 50_000,
            path_reps: 3,
            path_ops: 1_000_000,
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
                // `cargo bench` passes `--bench` to harness-less benches.
                "--bench" => {}
                "--increments" => a.increments = num(&value("--increments")),
                "--exact-increments" => a.exact_increments = num(&value("--exact-increments")),
                "--keys" => a.keys = num(&value("--keys")),
                "--zipf" => a.zipf = num(&value("--zipf")),
                "--tasks" => a.tasks = num(&value("--tasks")),
                "--every" => a.every = num(&value("--every")),
                "--seed" => a.seed = num(&value("--seed")),
                "--threads" => a.threads = num(&value("--threads")),
                "--cpu-reps" => a.cpu_reps = num(&value("--cpu-reps")),
                "--cpu-ops" => a.cpu_ops = num(&value("--cpu-ops")),
                "--path-reps" => a.path_reps = num(&value("--path-reps")),
                "--path-ops" => a.path_ops = num(&value("--path-ops")),
                "--modes" => {
                    a.modes = value("--modes")
                        .split(',')
                        .map(|m| match m.trim() {
                            "sampled" => Run::Sampled,
                            "buffered" => Run::Buffered,
                            "geometric" => Run::Geometric,
                            "exact" => Run::Exact,
                            other => usage(&format!("unknown mode `{other}`")),
                        })
                        .collect();
                }
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown flag `{other}`")),
            }
        }
        if a.exact_increments == 0 {
            a.exact_increments = a.increments;
        }
        if a.keys == 0 || a.keys > u32::MAX as usize || a.tasks == 0 || a.increments == 0 {
            usage("--keys, --tasks and --increments must be positive");
        }
        if !(2..=MAX_EVERY).contains(&a.every) {
            usage(&format!("--every must be from 2 to {MAX_EVERY}"));
        }
        if !(a.zipf.is_finite() && a.zipf >= 0.0) {
            usage("--zipf must be a non-negative number");
        }
        if a.modes.is_empty() {
            usage("--modes names no run");
        }
        a.cpu_ops = a.cpu_ops.max(1);
        a.path_ops = a.path_ops.max(1);
        a.raw = raw.into_iter().filter(|s| s != "--bench").collect();
        a
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    bench::num(s, usage)
}

fn usage(err: &str) -> ! {
    bench::usage(
        "cargo bench --bench counter -- [--increments N] [--exact-increments N] \
         [--keys N] [--zipf S] [--tasks N] [--every N] [--modes sampled,buffered,geometric,exact] \
         [--seed N] [--threads N] [--cpu-reps N] [--cpu-ops N] [--path-reps N] [--path-ops N]",
        err,
    )
}

fn main() {
    let args = Args::parse();
    let rt = if args.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// `uri` with `maxPoolSize=n` unless it sets one: the driver's default of 10
/// connections would cap 16 tasks at 10 writes in flight.
fn with_pool(uri: &str, n: usize) -> String {
    if uri.to_ascii_lowercase().contains("maxpoolsize") {
        return uri.to_owned();
    }
    if uri.contains('?') {
        return format!("{uri}&maxPoolSize={n}");
    }
    let after_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    if after_scheme.contains('/') {
        format!("{uri}?maxPoolSize={n}")
    } else {
        format!("{uri}/?maxPoolSize={n}")
    }
}

async fn run(args: Args) -> BoxResult<()> {
    let started = Instant::now();
    // 16 tasks, plus a buffered flush's 16 concurrent writes.
    let pool = args.tasks + 16;
    let uri = with_pool(&server_uri(), pool);
    let (client, commands) = client(&uri).await;
    let db_name = format!("mp_bench_counter_{}", std::process::id());
    let db = client.database(&db_name);
    db.drop().await?;
    let result = bench(&args, &uri, pool, &db, &commands).await;
    // Drop the database whatever happened.
    let dropped = db.drop().await;
    let report = result?;
    dropped?;
    print!("{report}");
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

// --------------------------------------------------------------- workload

/// Draw `i` of the stream `seed`, as `Counter::seeded` draws it.
fn seeded_draw(seed: u64, i: u64) -> u64 {
    splitmix64(seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// The key draws, the products' ids and the Zipf probabilities.
struct Workload {
    ids: Arc<Vec<String>>,
    /// Per task, the indices (0-based: index 0 is the hottest product) of
    /// the products it counts, in order.
    draws: Vec<Arc<Vec<u32>>>,
    /// Probability of each key.
    p: Vec<f64>,
}

/// How many of `n` increments task `t` of `tasks` issues.
fn share(n: u64, tasks: usize, t: usize) -> usize {
    let tasks = tasks as u64;
    (n / tasks + u64::from((t as u64) < n % tasks)) as usize
}

impl Workload {
    fn new(args: &Args) -> Workload {
        let weights: Vec<f64> = (1..=args.keys)
            .map(|k| (k as f64).powf(-args.zipf))
            .collect();
        let sum: f64 = weights.iter().sum();
        let p: Vec<f64> = weights.iter().map(|w| w / sum).collect();
        let mut acc = 0.0;
        let cdf: Vec<f64> = p
            .iter()
            .map(|x| {
                acc += x;
                acc
            })
            .collect();
        let n = args.increments.max(args.exact_increments);
        let draws = (0..args.tasks)
            .map(|t| {
                let seed = splitmix64(args.seed ^ (t as u64).wrapping_mul(0xA076_1D64_78BD_642F));
                let v: Vec<u32> = (0..share(n, args.tasks, t) as u64)
                    .map(|i| {
                        let u = (seeded_draw(seed, i) >> 11) as f64 / (1u64 << 53) as f64;
                        cdf.partition_point(|&c| c <= u).min(args.keys - 1) as u32
                    })
                    .collect();
                Arc::new(v)
            })
            .collect();
        let ids = (0..args.keys).map(|k| format!("p{:05}", k + 1)).collect();
        Workload {
            ids: Arc::new(ids),
            draws,
            p,
        }
    }

    /// Each key's count when each task issues its share of `n`.
    fn truth(&self, n: u64) -> Vec<u64> {
        let mut counts = vec![0u64; self.ids.len()];
        let tasks = self.draws.len();
        for (t, d) in self.draws.iter().enumerate() {
            for &k in d.iter().take(share(n, tasks, t)) {
                counts[k as usize] += 1;
            }
        }
        counts
    }
}

// ------------------------------------------------------ server and client

/// Server-side counters from `serverStatus`.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    updated: i64,
    op_update: i64,
    op_command: i64,
    op_query: i64,
}

impl Counters {
    async fn read(db: &Database) -> BoxResult<Counters> {
        let s = db
            .client()
            .database("admin")
            .run_command(doc! {"serverStatus": 1})
            .await?;
        let get = |d: Option<&Document>, k: &str| -> i64 {
            d.and_then(|d| d.get(k))
                .and_then(|v| match v {
                    Bson::Int32(i) => Some(i64::from(*i)),
                    Bson::Int64(i) => Some(*i),
                    Bson::Double(f) => Some(*f as i64),
                    _ => None,
                })
                .unwrap_or(-1)
        };
        let docs = s
            .get_document("metrics")
            .ok()
            .and_then(|m| m.get_document("document").ok());
        let ops = s.get_document("opcounters").ok();
        Ok(Counters {
            updated: get(docs, "updated"),
            op_update: get(ops, "update"),
            op_command: get(ops, "command"),
            op_query: get(ops, "query"),
        })
    }

    fn minus(self, o: Counters) -> Counters {
        Counters {
            updated: self.updated - o.updated,
            op_update: self.op_update - o.op_update,
            op_command: self.op_command - o.op_command,
            op_query: self.op_query - o.op_query,
        }
    }
}

/// Commands sent, by name, drained from the monitored client's log as they
/// come (a million logged commands would not fit in memory).
#[derive(Clone)]
struct Tally {
    commands: Commands,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Tally {
    fn drain(&self) {
        // Taken under the map's lock, so that `reset` cannot interleave.
        let mut m = self.counts.lock().expect("tally");
        for (name, _) in self.commands.take() {
            *m.entry(name).or_default() += 1;
        }
    }

    fn reset(&self) {
        let mut m = self.counts.lock().expect("tally");
        self.commands.take();
        m.clear();
    }

    fn snapshot(&self) -> BTreeMap<String, u64> {
        self.drain();
        self.counts.lock().expect("tally").clone()
    }
}

// ------------------------------------------------------------------ runs

/// What the tasks count with.
#[derive(Clone)]
enum Sink {
    Counter(Counter<Product>),
    Exact(Collection<Document>),
}

impl Sink {
    async fn incr(&self, id: &str) -> BoxResult<()> {
        match self {
            Sink::Counter(c) => c.incr(id).await?,
            Sink::Exact(coll) => {
                let r = coll
                    .update_one(doc! {"_id": id}, doc! {"$inc": {EXACT_FIELD: 1}})
                    .await?;
                if r.matched_count != 1 {
                    return Err(format!("no product {id}").into());
                }
            }
        }
        Ok(())
    }
}

/// The handle of `run`'s field, with `every` as the flag says.
fn handle(db: &Database, run: Run, every: u32) -> Counter<Product> {
    let declared = match run {
        Run::Sampled => Product::web_page_views_counter(db),
        Run::Buffered => Product::buffered_views_counter(db),
        Run::Geometric => Product::geometric_views_counter(db),
        Run::Exact => unreachable!("the exact run has no handle"),
    };
    if declared.spec().every == every {
        declared
    } else {
        let spec = CounterSpec {
            every,
            ..declared.spec()
        };
        drop(declared);
        Counter::new(db, spec)
    }
}

/// One run's measurements.
struct Measured {
    run: Run,
    increments: u64,
    tasks_time: Duration,
    shutdown_time: Duration,
    cpu_ns: u64,
    delta: Counters,
    sent: BTreeMap<String, u64>,
    stats: Option<CounterStats>,
    spec: Option<CounterSpec>,
    truth: Vec<u64>,
    stored: Vec<i64>,
    /// The documented relative standard error of each key's count.
    bound: Vec<f64>,
    /// Writes the mode's rules predict for these counts (see `expected`).
    expected_writes: f64,
}

impl Measured {
    fn total_time(&self) -> Duration {
        self.tasks_time + self.shutdown_time
    }

    fn rate(&self) -> f64 {
        self.increments as f64 / self.total_time().as_secs_f64()
    }

    /// Writes the server applied: `update` commands count in
    /// `opcounters.update`, `findAndModify` (geometric) in
    /// `opcounters.command` on mongod, which also counts the driver's
    /// background commands (a handful).
    fn server_writes(&self) -> i64 {
        if self.sent.contains_key("findAndModify") {
            self.delta.op_update + self.delta.op_command
        } else {
            self.delta.op_update
        }
    }

    fn per_write(&self) -> f64 {
        self.increments as f64 / self.server_writes().max(1) as f64
    }
}

async fn measure(
    args: &Args,
    db: &Database,
    tally: &Tally,
    baseline: Counters,
    w: &Workload,
    run: Run,
    n: u64,
) -> BoxResult<Measured> {
    let coll: Collection<Document> = db.collection(COLLECTION);
    let counter = (run != Run::Exact).then(|| handle(db, run, args.every));
    let sink = match &counter {
        Some(c) => Sink::Counter(c.clone()),
        None => Sink::Exact(coll.clone()),
    };
    let done = Arc::new(AtomicU64::new(0));
    let progress = {
        let done = done.clone();
        let label = run.name();
        tokio::spawn(async move {
            let t = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(15)).await;
                let d = done.load(Ordering::Relaxed);
                eprintln!(
                    "  {label}: {} of {} increments, {:.0} s, {:.0}/s",
                    thousands(d),
                    thousands(n),
                    t.elapsed().as_secs_f64(),
                    d as f64 / t.elapsed().as_secs_f64()
                );
            }
        })
    };
    eprintln!("{}: {} increments", run.name(), thousands(n));

    let before = Counters::read(db).await?;
    tally.reset();
    let cpu0 = cpu_ns();
    let t0 = Instant::now();
    let handles: Vec<_> = (0..args.tasks)
        .map(|t| {
            let draws = w.draws[t].clone();
            let ids = w.ids.clone();
            let sink = sink.clone();
            let done = done.clone();
            let count = share(n, args.tasks, t);
            tokio::spawn(async move {
                for chunk in draws[..count].chunks(1024) {
                    for &k in chunk {
                        sink.incr(&ids[k as usize]).await?;
                    }
                    done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for h in handles {
        h.await??;
    }
    let tasks_time = t0.elapsed();
    let t1 = Instant::now();
    if let Some(c) = &counter {
        c.shutdown().await?;
    }
    let shutdown_time = t1.elapsed();
    let cpu = cpu_ns() - cpu0;
    let sent = tally.snapshot();
    let after = Counters::read(db).await?;
    progress.abort();
    drop(sink);

    // Every product read back in one `find`.
    let field = run.field();
    let docs: Vec<Document> = coll
        .find(doc! {})
        .projection(doc! {field: 1})
        .await?
        .try_collect()
        .await?;
    let index: HashMap<&str, usize> = w
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut stored = vec![0i64; w.ids.len()];
    for d in &docs {
        let Ok(id) = d.get_str("_id") else { continue };
        if let Some(&i) = index.get(id) {
            stored[i] = match d.get(field) {
                Some(Bson::Int32(v)) => i64::from(*v),
                Some(Bson::Int64(v)) => *v,
                Some(Bson::Double(v)) => v.round() as i64,
                _ => 0,
            };
        }
    }
    let truth = w.truth(n);
    let (stats, spec, bound) = match &counter {
        Some(c) => {
            // `estimate` of the hottest key agrees with the stored value
            // (nothing is pending after `shutdown`).
            let est = c.estimate(w.ids[0].as_str()).await?;
            if est != stored[0] {
                return Err(format!("estimate {est} ≠ stored {}", stored[0]).into());
            }
            let bound = truth.iter().map(|&t| c.relative_error(t)).collect();
            (Some(c.stats()), Some(c.spec()), bound)
        }
        None => (None, None, vec![0.0; truth.len()]),
    };
    let expected_writes = expected(run, args.every, &truth);
    let delta = after.minus(before).minus(baseline);
    eprintln!(
        "  {:.1} s + {:.2} s shutdown, Δ opcounters update {} command {}",
        tasks_time.as_secs_f64(),
        shutdown_time.as_secs_f64(),
        delta.op_update,
        delta.op_command
    );
    Ok(Measured {
        run,
        increments: n,
        tasks_time,
        shutdown_time,
        cpu_ns: cpu,
        delta,
        sent,
        stats,
        spec,
        truth,
        stored,
        bound,
        expected_writes,
    })
}

/// Writes each mode's rules predict for the final counts: sampled n/N;
/// buffered ⌊n_k/N⌋ per key plus one final flush of the remainder (a lower
/// bound: timed flushes add more); geometric Σ over c < n_k of 1/m(c),
/// m(c) = max(N, ⌊c/N⌋) (the value read back taken as current); exact n.
fn expected(run: Run, every: u32, truth: &[u64]) -> f64 {
    let n = u64::from(every);
    match run {
        Run::Sampled => truth.iter().sum::<u64>() as f64 / n as f64,
        Run::Buffered => truth
            .iter()
            .map(|&t| (t / n + u64::from(!t.is_multiple_of(n))) as f64)
            .sum(),
        Run::Geometric => truth
            .iter()
            .map(|&t| (0..t).map(|c| 1.0 / (c / n).max(n) as f64).sum::<f64>())
            .sum(),
        Run::Exact => truth.iter().sum::<u64>() as f64,
    }
}

// ------------------------------------------------------------------ bench

async fn bench(
    args: &Args,
    uri: &str,
    pool: usize,
    db: &Database,
    commands: &Commands,
) -> BoxResult<String> {
    let version = db
        .client()
        .database("admin")
        .run_command(doc! {"buildInfo": 1})
        .await
        .ok()
        .and_then(|d| d.get_str("version").ok().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    let server = if std::env::var("MONGODB_URI").is_ok_and(|u| !u.is_empty()) {
        format!("MONGODB_URI server, version {version}")
    } else {
        format!("surrogate secantusd-rs (reports version {version}) on the same machine")
    };
    let cmd = if args.raw.is_empty() {
        "cargo bench --bench counter".to_owned()
    } else {
        format!("cargo bench --bench counter -- {}", args.raw.join(" "))
    };
    let runtime = if args.threads == 0 {
        "tokio current-thread runtime".to_owned()
    } else {
        format!("tokio multi-thread runtime, {} workers", args.threads)
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = format!(
        "# Approximate counter benchmark: {} increments over {} products\n\nCommand: `{cmd}` — server: {server}, client: {cores} cores, {runtime}, connection pool of {pool}.\n\n",
        thousands(args.increments),
        thousands(args.keys as u64),
    );

    eprintln!(
        "drawing {} keys",
        thousands(args.increments.max(args.exact_increments))
    );
    let w = Workload::new(args);
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

    let tally = Tally {
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
    let a = Counters::read(db).await?;
    let b = Counters::read(db).await?;
    let baseline = b.minus(a);
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
        runs.push(measure(args, db, &tally, baseline, &w, run, n).await?);
    }
    drainer.abort();

    out += &writes_table(args, &runs);
    out += &throughput_table(args, &runs);
    out += &verdict_table(&runs);
    out += &error_tables(args, &w, &runs);
    if args.cpu_reps > 0 {
        out += &cpu_comparison(args, uri, db).await?;
    }
    if args.path_reps > 0 {
        out += &no_write_path(args, uri, db, &w).await?;
    }
    Ok(out)
}

fn exact_of(runs: &[Measured]) -> Option<&Measured> {
    runs.iter().find(|r| r.run == Run::Exact)
}

fn label(args: &Args, r: &Measured) -> String {
    if r.run == Run::Exact && r.increments != args.increments {
        format!(
            "{} — {} increments only (`--exact-increments`)",
            r.run.name(),
            thousands(r.increments)
        )
    } else {
        r.run.name().to_owned()
    }
}

fn sent_names(r: &Measured) -> String {
    if r.sent.is_empty() {
        return "—".into();
    }
    r.sent
        .iter()
        .map(|(n, c)| format!("{} `{n}`", thousands(*c)))
        .collect::<Vec<_>>()
        .join(" + ")
}

fn writes_table(args: &Args, runs: &[Measured]) -> String {
    let exact = exact_of(runs);
    let mut out = String::from("### Writes\n\n");
    out += "Server writes: `serverStatus` after minus before, less what two `serverStatus` calls count: Δ`opcounters.update`, plus Δ`opcounters.command` for the run that sends `findAndModify` (geometric: mongod counts it under `command`, as does the surrogate; `command` also counts a few background commands of the driver, which is why it moves by a handful in the other runs) — Δ`metrics.document.updated` beside it. Commands sent: command monitoring. Handle: `stats().writes`. Expected: what the mode's rules give for these exact per-key counts (sampled n/N; buffered ⌊n_k/N⌋ + 1 final flush per key with a remainder, before timed flushes; geometric Σ_k Σ_{c<n_k} 1/max(N, ⌊c/N⌋)). Writes ÷ exact: the exact run's writes per increment × this run's increments ÷ this run's server writes.\n\n";
    out += "| counting | increments | server writes | Δ `opcounters.update` / `.command` | Δ `metrics.document.updated` | commands sent | handle `stats().writes` | expected writes | increments per write | writes ÷ exact |\n| --- | ---: | ---: | :---: | ---: | --- | ---: | ---: | ---: | ---: |\n";
    for r in runs {
        let vs = exact.map_or("—".to_owned(), |e| {
            let per = e.server_writes() as f64 / e.increments as f64;
            format!(
                "{:.1}×",
                per * r.increments as f64 / r.server_writes().max(1) as f64
            )
        });
        out += &format!(
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {:.1} | {} |\n",
            label(args, r),
            thousands(r.increments),
            thousands(r.server_writes().max(0) as u64),
            r.delta.op_update,
            r.delta.op_command,
            r.delta.updated,
            sent_names(r),
            r.stats.map_or("—".to_owned(), |s| thousands(s.writes)),
            thousands(r.expected_writes.round() as u64),
            r.per_write(),
            vs
        );
    }
    out += "\n";
    let every = u64::from(args.every);
    for r in runs {
        match r.run {
            Run::Buffered => {
                out += &format!(
                    "Buffered: {} server writes against the rules' floor of {} — the difference is about the number of timed flushes (`max_delay_ms` = {} ms, checked every {} ms, over a {:.1} s run): each writes a key's pending count before it reaches N.\n\n",
                    thousands(r.server_writes().max(0) as u64),
                    thousands(r.expected_writes.round() as u64),
                    r.spec.map_or(0, |s| s.max_delay_ms),
                    r.spec.map_or(0, |s| s.max_delay_ms / 2),
                    r.total_time().as_secs_f64()
                );
            }
            Run::Geometric => {
                let knee = every * every;
                let below = r.truth.iter().filter(|&&t| t <= knee).count();
                let one = expected(Run::Geometric, args.every, &[r.increments]);
                out += &format!(
                    "Geometric: m = max(N, ⌊E/N⌋) is N, as sampled, until a key's value passes N² = {}; {} of the {} keys stay below it and are sampled one in N. For one key counted {} times the same rules give {} writes (n/N up to N², then about N·ln(n/N²)).\n\n",
                    thousands(knee),
                    below,
                    thousands(r.truth.len() as u64),
                    thousands(r.increments),
                    thousands(one.round() as u64),
                );
            }
            _ => {}
        }
    }
    out
}

fn throughput_table(args: &Args, runs: &[Measured]) -> String {
    let exact = exact_of(runs);
    let mut out = String::from("### Throughput\n\n");
    out += &format!(
        "Wall time: from spawning the {} tasks until all have finished (\"tasks\"), then the handle's `shutdown()` (for buffered, the final flush of what is pending; for the others it only marks the handle closed); increments per second count both. Client CPU: this process over all its threads (the server is another process). Throughput × exact: increments per second ÷ the exact run's.\n\n",
        args.tasks
    );
    out += "| counting | increments | tasks s | `shutdown()` s | increments/s (tasks + shutdown) | increments/s (tasks only) | throughput × exact | client CPU µs per increment |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for r in runs {
        let vs = exact.map_or("—".to_owned(), |e| format!("{:.1}×", r.rate() / e.rate()));
        out += &format!(
            "| {} | {} | {:.2} | {:.3} | {} | {} | {} | {:.2} |\n",
            label(args, r),
            thousands(r.increments),
            r.tasks_time.as_secs_f64(),
            r.shutdown_time.as_secs_f64(),
            thousands(r.rate().round() as u64),
            thousands((r.increments as f64 / r.tasks_time.as_secs_f64()).round() as u64),
            vs,
            r.cpu_ns as f64 / r.increments as f64 / 1e3
        );
    }
    out += "\n";
    out
}

fn verdict_table(runs: &[Measured]) -> String {
    let Some(exact) = exact_of(runs) else {
        return "No exact run (`--modes` left it out): the 50× / 10× targets cannot be judged.\n\n"
            .into();
    };
    let per = exact.server_writes() as f64 / exact.increments as f64;
    let mut out = String::from("### Issue 5's targets: at least 50× fewer writes and 10× the throughput of exact counting\n\n");
    if exact.increments != runs.iter().map(|r| r.increments).max().unwrap_or(0) {
        out += &format!(
            "The exact run counted {} increments, not the modes' {}: its writes per increment ({:.3}) and its increments per second are what the ratios use.\n\n",
            thousands(exact.increments),
            thousands(runs.iter().map(|r| r.increments).max().unwrap_or(0)),
            per
        );
    }
    out += "| mode | writes ÷ exact | ≥ 50×? | throughput × exact | ≥ 10×? | both? |\n| --- | ---: | :---: | ---: | :---: | :---: |\n";
    for r in runs.iter().filter(|r| r.run != Run::Exact) {
        let fewer = per * r.increments as f64 / r.server_writes().max(1) as f64;
        let faster = r.rate() / exact.rate();
        let yes = |b: bool| if b { "yes" } else { "**no**" };
        out += &format!(
            "| {} | {:.1}× | {} | {:.1}× | {} | {} |\n",
            r.run.name(),
            fewer,
            yes(fewer >= 50.0),
            faster,
            yes(faster >= 10.0),
            yes(fewer >= 50.0 && faster >= 10.0)
        );
    }
    out += "\n";
    out
}

fn pct(x: f64) -> String {
    format!("{:+.3}%", 100.0 * x)
}

fn error_tables(args: &Args, w: &Workload, runs: &[Measured]) -> String {
    let mut out = String::from("### Error at the end\n\n");
    out += "Every product read back with one `find` after the run (and `shutdown()`). Truth: the increments issued, per key. σ: the documented relative standard error, `relative_error(n_k)` of the key's true count n_k (sampled √((N−1)/n_k), geometric the same up to N² and then levelling off towards 1/√(2N), buffered 0 once flushed); σ of the total: √(Σ_k (σ_k·n_k)²) ÷ n, the keys' errors being independent. z: the error in units of σ (one run: one draw per key).\n\n";
    out += "| counting | truth (total) | stored (total) | error of the total | documented σ of the total | z of the total | keys within 2σ / 3σ | RMS z over keys with σ > 0 | largest key error | keys exact |\n| --- | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: |\n";
    for r in runs {
        let truth: u64 = r.truth.iter().sum();
        let stored: i64 = r.stored.iter().sum();
        let err = (stored - truth as i64) as f64 / truth.max(1) as f64;
        let var: f64 = r
            .truth
            .iter()
            .zip(&r.bound)
            .map(|(&t, &b)| (b * t as f64).powi(2))
            .sum();
        let sigma = var.sqrt() / truth.max(1) as f64;
        let z = if sigma > 0.0 { err / sigma } else { f64::NAN };
        let mut within = [0usize; 2];
        let mut zsq = 0.0;
        let mut zn = 0usize;
        let mut largest = 0.0f64;
        let mut exact_keys = 0;
        for ((&t, &s), &b) in r.truth.iter().zip(&r.stored).zip(&r.bound) {
            let d = (s - t as i64) as f64;
            if d == 0.0 {
                exact_keys += 1;
            }
            if t > 0 {
                largest = largest.max((d / t as f64).abs());
            }
            let sd = b * t as f64;
            if sd > 0.0 {
                let zk = d / sd;
                zsq += zk * zk;
                zn += 1;
                within[0] += usize::from(zk.abs() <= 2.0);
                within[1] += usize::from(zk.abs() <= 3.0);
            } else {
                within[0] += usize::from(d == 0.0);
                within[1] += usize::from(d == 0.0);
            }
        }
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} of {} | {} | {:.2}% | {} of {} |\n",
            label(args, r),
            thousands(truth),
            thousands(stored.max(0) as u64),
            pct(err),
            if sigma > 0.0 {
                format!("{:.3}%", 100.0 * sigma)
            } else {
                "0".into()
            },
            if z.is_finite() {
                format!("{z:+.2}")
            } else {
                "—".into()
            },
            within[0],
            within[1],
            r.truth.len(),
            if zn > 0 {
                format!("{:.2}", (zsq / zn as f64).sqrt())
            } else {
                "—".into()
            },
            100.0 * largest,
            exact_keys,
            r.truth.len()
        );
    }
    out += "\n";

    // Per key: the hottest, a few warm ones, the coldest.
    let mut picks: Vec<usize> = [0usize, 9, 99, args.keys / 2, args.keys - 1]
        .into_iter()
        .filter(|&k| k < args.keys)
        .collect();
    picks.dedup();
    out += "Per key (product k = k-th hottest; truth from each run's own increments, so the exact run's are smaller when it counted fewer):\n\n";
    out += "| counting | product | truth | stored | error | documented σ | z |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for r in runs {
        for &k in &picks {
            let t = r.truth[k];
            let s = r.stored[k];
            let d = (s - t as i64) as f64;
            let rel = d / t.max(1) as f64;
            let sd = r.bound[k];
            out += &format!(
                "| {} | {} ({}) | {} | {} | {} | {} | {} |\n",
                r.run.name(),
                k + 1,
                match k {
                    0 => "hottest".to_owned(),
                    k if k == args.keys - 1 => "coldest".to_owned(),
                    _ => format!("{:.3}% of views", 100.0 * w.p[k]),
                },
                thousands(t),
                thousands(s.max(0) as u64),
                pct(rel),
                if sd > 0.0 {
                    format!("{:.2}%", 100.0 * sd)
                } else {
                    "0".into()
                },
                if sd > 0.0 && t > 0 {
                    format!("{:+.2}", rel / sd)
                } else {
                    "—".into()
                }
            );
        }
    }
    out += "\n";
    let specs: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            let s = r.spec?;
            Some(format!(
                "{} {{every: {}, mode: {:?}, max_delay_ms: {}, max_keys: {}, upsert: {}}}",
                r.run.name(),
                s.every,
                s.mode,
                s.max_delay_ms,
                s.max_keys,
                s.upsert
            ))
        })
        .collect();
    if !specs.is_empty() {
        out += &format!("Specs of the handles: {}.\n\n", specs.join("; "));
    }
    out
}

// ----------------------------------------------------------- client CPU

/// The hand-written sampled counter: one draw per view from the same stream
/// `Counter::seeded` uses, and one time in N `$inc: N` by `_id`.
async fn hand_sampled(
    coll: &Collection<Document>,
    field: &str,
    id: &str,
    every: u64,
    seed: u64,
    draws: &mut u64,
) -> BoxResult<bool> {
    let r = seeded_draw(seed, *draws);
    *draws += 1;
    if ((u128::from(r) * u128::from(every)) >> 64) == 0 {
        coll.update_one(doc! {"_id": id}, doc! {"$inc": {field: every as i64}})
            .await?;
        return Ok(true);
    }
    Ok(false)
}

async fn cpu_comparison(args: &Args, uri: &str, db: &Database) -> BoxResult<String> {
    eprintln!("client CPU: sampled `incr` vs hand-written");
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let coll: Collection<Document> = pdb.collection(COLLECTION);
    for id in [CPU_GEN_ID, CPU_HAND_ID] {
        coll.insert_one(doc! {"_id": id, "web_page_views": 0_i64})
            .await?;
    }
    let declared = Product::web_page_views_counter(&pdb).spec();
    let field = declared.field;
    let ops = args.cpu_ops;
    let mut out = format!(
        "### Client CPU: sampled `incr` vs hand-written, {} interleaved repetitions\n\n",
        args.cpu_reps,
    );
    out += "Generated: `Counter::incr(id)` on a sampled handle made with `.seeded(seed)`. Hand-written: draw from the same SplitMix64 stream, and when `r·N < 2⁶⁴` (one time in N) `update_one({_id}, {$inc: {field: N}})` — so both send exactly the same writes (checked). One task, one key each, a client without command monitoring, a new seed per repetition shared by both variants, order alternating. CPU: this process over all its threads (`/proc/self/task/*/schedstat`), the driver's included. Row N = 1,000,000: the path that does not write, alone (about one write in a million), timed by the wall clock because a loop that never waits does not move the scheduler's clock between ticks.\n\n";
    out += "| every | increments per repetition | measured as | writes per repetition (generated = hand, median) | µs per increment generated (median rep) | µs per increment hand (median rep) | generated ÷ hand (ratio of medians) | per-rep ratio median (min – max) |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | :---: |\n";
    // N as declared, and N = 10⁶: the path without writes alone.
    for every in [args.every, MAX_EVERY] {
        let spec = CounterSpec {
            every,
            mode: Mode::Sampled,
            ..declared
        };
        // Without writes the loop never leaves the thread, and the
        // scheduler's CPU clock only moves at ticks: wall time of 20× the
        // increments instead.
        let (ops, by_wall) = if every == args.every {
            (ops, false)
        } else {
            (ops * 20, true)
        };
        let took = |c0: u64, t0: Instant| -> f64 {
            let ns = if by_wall {
                t0.elapsed().as_nanos() as f64
            } else {
                (cpu_ns() - c0) as f64
            };
            ns / ops as f64 / 1e3
        };
        let mut gen = Vec::new();
        let mut hand = Vec::new();
        let mut writes = Vec::new();
        for rep in 0..args.cpu_reps {
            let seed = splitmix64(args.seed.wrapping_add(1000 + rep as u64));
            let mut per = [0.0f64; 2];
            let mut w = [0u64; 2];
            let order = if rep.is_multiple_of(2) {
                [0, 1]
            } else {
                [1, 0]
            };
            for v in order {
                if v == 0 {
                    let c = Counter::<Product>::new(&pdb, spec).seeded(seed);
                    let (c0, t0) = (cpu_ns(), Instant::now());
                    for _ in 0..ops {
                        c.incr(black_box(CPU_GEN_ID)).await?;
                    }
                    per[0] = took(c0, t0);
                    w[0] = c.stats().writes;
                } else {
                    let mut draws = 0u64;
                    let mut n = 0;
                    let (c0, t0) = (cpu_ns(), Instant::now());
                    for _ in 0..ops {
                        n += u64::from(
                            hand_sampled(
                                &coll,
                                field,
                                black_box(CPU_HAND_ID),
                                u64::from(every),
                                seed,
                                &mut draws,
                            )
                            .await?,
                        );
                    }
                    per[1] = took(c0, t0);
                    w[1] = n;
                }
            }
            if w[0] != w[1] {
                return Err(format!("writes differ: generated {} vs hand {}", w[0], w[1]).into());
            }
            gen.push(per[0]);
            hand.push(per[1]);
            writes.push(w[0] as f64);
        }
        let mut ratios: Vec<f64> = gen.iter().zip(&hand).map(|(g, h)| g / h).collect();
        let (gm, hm) = (sort_median_f64(&mut gen), sort_median_f64(&mut hand));
        let rm = sort_median_f64(&mut ratios);
        out += &format!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} ({:.3} – {:.3}) |\n",
            thousands(u64::from(every)),
            thousands(ops),
            if by_wall {
                "wall time (no I/O, one thread)"
            } else {
                "CPU, all threads"
            },
            thousands(sort_median_f64(&mut writes) as u64),
            gm,
            hm,
            gm / hm,
            rm,
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
    out += "\n";
    Ok(out)
}

/// Which keys a no-write-path case counts.
#[derive(Clone, Copy, PartialEq)]
enum Keys {
    Zipf,
    Hottest,
}

async fn no_write_path(args: &Args, uri: &str, db: &Database, w: &Workload) -> BoxResult<String> {
    eprintln!("the path that does not write");
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let n = args.path_ops;
    let mut out = format!(
        "### The path that does not write: per-increment cost and contention, {} increments per case, median of {}\n\n",
        thousands(n),
        args.path_reps
    );
    out += &format!(
        "Handles that (almost) never write: sampled and buffered with N = 1,000,000 (buffered also `max_delay_ms` = 1 h, so no timed flush; its pending counts are written by an untimed `shutdown()` after each case), geometric with N = 2 after one untimed `incr_by(id, 10⁹)` per key (m = 5·10⁸ from then on). One task counts the Zipf keys in the order drawn; {t} tasks each count their own Zipf sequence, or all the hottest key. The server is idle here, so the client has both cores; {t} tasks run on the runtime's {w} worker threads. Wall: ns per increment over the whole case; CPU: this process's CPU over all threads (`/proc/self/task/*/schedstat`) per increment. With more than one worker, CPU per increment above the one-task figure is time lost to the handle's shared state (locks, contended atomics).\n\n",
        t = args.tasks,
        w = args.threads.max(1)
    );
    out += "| mode | load | writes during the timed loop | wall ns per increment | CPU ns per increment | CPU ÷ one task, Zipf |\n| --- | --- | ---: | ---: | ---: | ---: |\n";
    for mode in [Mode::Sampled, Mode::Buffered, Mode::Geometric] {
        let (declared, name) = match mode {
            Mode::Sampled => (Product::web_page_views_counter(&pdb).spec(), "sampled"),
            Mode::Buffered => (Product::buffered_views_counter(&pdb).spec(), "buffered"),
            Mode::Geometric => (Product::geometric_views_counter(&pdb).spec(), "geometric"),
        };
        let spec = CounterSpec {
            every: if mode == Mode::Geometric {
                2
            } else {
                MAX_EVERY
            },
            max_delay_ms: 3_600_000,
            ..declared
        };
        let mut base = f64::NAN;
        for (load, tasks, keys) in [
            ("1 task, Zipf keys".to_owned(), 1, Keys::Zipf),
            (
                format!("{} tasks, Zipf keys", args.tasks),
                args.tasks,
                Keys::Zipf,
            ),
            (
                format!("{} tasks, hottest key only", args.tasks),
                args.tasks,
                Keys::Hottest,
            ),
        ] {
            eprintln!("  {name}: {load}");
            let mut wall = Vec::new();
            let mut cpu = Vec::new();
            let mut writes = 0;
            for _ in 0..args.path_reps {
                let c = Counter::<Product>::new(&pdb, spec);
                if mode == Mode::Geometric {
                    let ids: Vec<&String> = match keys {
                        Keys::Zipf => w.ids.iter().collect(),
                        Keys::Hottest => vec![&w.ids[0]],
                    };
                    for id in ids {
                        c.incr_by(id.as_str(), 1_000_000_000).await?;
                    }
                }
                let w0 = c.stats().writes;
                // One task: every task's sequence, one after the other.
                let seqs: Vec<Vec<u32>> = if tasks == 1 {
                    vec![w
                        .draws
                        .iter()
                        .flat_map(|d| d.iter().copied())
                        .chain(std::iter::repeat(0))
                        .take(n as usize)
                        .collect()]
                } else {
                    (0..tasks)
                        .map(|t| {
                            let k = share(n, tasks, t);
                            match keys {
                                Keys::Hottest => vec![0; k],
                                Keys::Zipf => w.draws[t]
                                    .iter()
                                    .copied()
                                    .chain(std::iter::repeat(0))
                                    .take(k)
                                    .collect(),
                            }
                        })
                        .collect()
                };
                let (c0, t0) = (cpu_ns(), Instant::now());
                let handles: Vec<_> = seqs
                    .into_iter()
                    .map(|seq| {
                        let c = c.clone();
                        let ids = w.ids.clone();
                        tokio::spawn(async move {
                            for k in seq {
                                c.incr(ids[k as usize].as_str()).await?;
                            }
                            Ok::<_, mongo_patterns::Error>(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.await??;
                }
                wall.push(t0.elapsed().as_nanos() as f64 / n as f64);
                cpu.push((cpu_ns() - c0) as f64 / n as f64);
                writes += c.stats().writes - w0;
                c.shutdown().await?;
            }
            let (wm, cm) = (sort_median_f64(&mut wall), sort_median_f64(&mut cpu));
            if base.is_nan() {
                base = cm;
            }
            out += &format!(
                "| {name} | {load} | {} | {wm:.0} | {cm:.0} | {:.2} |\n",
                writes / args.path_reps as u64,
                cm / base
            );
        }
    }
    out += "\n";
    Ok(out)
}
