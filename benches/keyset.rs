//! Keyset pagination vs `skip` + `limit`, and the generated repository vs
//! hand-written driver code (seed 004: a 10-million-visitor job paged by `_id`).
//!
//! A program, not a test: it prints markdown tables to stdout (progress goes
//! to stderr), so `cargo bench --bench keyset -- --docs 1000000 > out.md`
//! keeps only what can be pasted into the README.
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
//! | `--cpu-reps N` | 9 | scans per variant for the CPU comparison, interleaved |
//! | `--batch N` | 10000 | documents per `insert_many` while loading |
//! | `--multi-thread` | off | use tokio's multi-thread runtime (default: current-thread) |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (DESIGN.md, "The test server"). On the surrogate,
//! any range/sort/limit `find` walks the whole collection, so its wall times
//! say little about `mongod`: read the round trips and the `explain` figures
//! (`totalKeysExamined`, `totalDocsExamined`) first, and wall times only as
//! ratios.
//!
//! What is measured, all in one run:
//!
//! 1. Loading: `insert_many` in batches of `--batch`; no secondary index is
//!    created, because both designs sort by `_id`, which the `_id` index
//!    already serves (a fair skip+limit needs no other index).
//! 2. A page at each depth `d`, by `find({}).sort({_id: 1}).skip(d).limit(n)`
//!    and by keyset (`Visit::keyset(&db).page_size(n).after(&token).page()`).
//!    The token at depth `d` is made once, untimed, in setup: the `_id` of
//!    item `d - 1` is read with one `skip(d - 1).limit(1)` query, then a
//!    one-item keyset page filtered to `{_id: {$gte: that id}}` returns that
//!    item and, as its `next`, the token that marks it (tokens name the
//!    collection and sort keys, not the filter, so the token is valid for
//!    the unfiltered query). Both designs' pages are checked to hold the same
//!    ids. Round trips are counted with command monitoring around one fetch;
//!    server work comes from `explain` with `executionStats` of the exact
//!    command (`Keyset::command()` gives the keyset page's filter, sort and
//!    limit); wall time is the median of `--reps` fetches.
//! 3. A bounded scan of the first `--scan` items, by `Keyset::stream()` and
//!    by a hand-written driver loop over `Collection<Visit>` that sends the
//!    same `find` commands (checked command by command). Client CPU is the
//!    process's own on-CPU time, summed over its threads from
//!    `/proc/self/task/*/schedstat` (nanoseconds; `/proc/self/stat`
//!    utime+stime, in clock ticks, is printed as a cross-check). The server
//!    runs in another process, so none of its work is counted. The scans for
//!    CPU use a second client *without* command monitoring: with a handler
//!    installed the driver copies every reply into the event, which would
//!    cost both variants the same large amount and blur the ratio.

use std::hint::black_box;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    self, clock_ticks_per_second, cpu_ns, cpu_ticks, median, median_f64, ms, splitmix64, stat_u64,
    thousands,
};
use mongo_patterns_testkit::{client, server_uri, Commands};

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One visit, as in the seed: a visitor id and the visit's time.
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
    raw: Vec<String>,
}

impl Args {
    fn parse() -> Args {
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let mut a = Args {
            docs: 200_000,
            page_size: 100,
            depths: vec![0, 10_000, 100_000, 500_000],
            reps: 3,
            scan: 100_000,
            scan_page: 20_000,
            cpu_reps: 9,
            batch: 10_000,
            multi_thread: false,
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
                "--docs" => a.docs = num(&value("--docs")),
                "--page-size" => a.page_size = num(&value("--page-size")),
                "--depths" => {
                    a.depths = value("--depths")
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(num)
                        .collect()
                }
                "--reps" => a.reps = num(&value("--reps")),
                "--scan" => a.scan = num(&value("--scan")),
                "--scan-page" => a.scan_page = num(&value("--scan-page")),
                "--cpu-reps" => a.cpu_reps = num(&value("--cpu-reps")),
                "--batch" => a.batch = num(&value("--batch")),
                "--multi-thread" => a.multi_thread = true,
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown flag `{other}`")),
            }
        }
        if a.docs == 0 || a.page_size == 0 || a.scan_page == 0 || a.batch == 0 {
            usage("--docs, --page-size, --scan-page and --batch must be positive");
        }
        a.reps = a.reps.max(1);
        a.cpu_reps = a.cpu_reps.max(1);
        a.scan = a.scan.clamp(1, a.docs);
        a.depths.retain(|&d| d < a.docs);
        a.raw = raw.into_iter().filter(|s| s != "--bench").collect();
        a
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    bench::num(s, usage)
}

fn usage(err: &str) -> ! {
    bench::usage(
        "cargo bench --bench keyset -- [--docs N] [--page-size N] [--depths a,b,..] \
         [--reps N] [--scan N] [--scan-page N] [--cpu-reps N] [--batch N] [--multi-thread]",
        err,
    )
}

fn main() {
    let args = Args::parse();
    let mut rt = if args.multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let rt = rt.enable_all().build().expect("tokio runtime");
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> BoxResult<()> {
    let started = Instant::now();
    let uri = server_uri();
    let (client, commands) = client(&uri).await;
    let db_name = format!("mp_bench_keyset_{}", std::process::id());
    let db = client.database(&db_name);
    db.drop().await?;
    let result = bench(&args, &uri, &db, &commands).await;
    // Drop the database whatever happened.
    let dropped = db.drop().await;
    let report = result?;
    dropped?;
    print!("{report}");
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn bench(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<String> {
    let server = match db
        .client()
        .database("admin")
        .run_command(doc! {"buildInfo": 1})
        .await
    {
        Ok(info) => info.get_str("version").unwrap_or("?").to_owned(),
        Err(_) => "?".into(),
    };
    let server = if std::env::var("MONGODB_URI").is_ok_and(|u| !u.is_empty()) {
        format!("MONGODB_URI server, version {server}")
    } else {
        format!("surrogate secantusd-rs (reports version {server})")
    };

    // 1. Load.
    let load = load(args, db).await?;
    commands.take();

    // 2. Pages at depth.
    let depth_rows = depths(args, db, commands).await?;

    // 3. Generated vs hand-written scan.
    let scan = scan(args, uri, db, commands).await?;

    let mut out = String::new();
    use std::fmt::Write as _;
    let cmd = if args.raw.is_empty() {
        "cargo bench --bench keyset".to_owned()
    } else {
        format!("cargo bench --bench keyset -- {}", args.raw.join(" "))
    };
    writeln!(
        out,
        "Command: `{cmd}` — {} visits, server: {server}, client: {} cores, tokio {} runtime.\n",
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

    writeln!(
        out,
        "### A page of {} at depth d: `skip(d).limit({})` vs keyset `after(token)`\n",
        args.page_size, args.page_size
    )?;
    writeln!(out, "Round trips are commands seen by command monitoring for one page; keys/docs examined are the server's `explain` (`executionStats`) of the exact command; time is the median of {} fetches on the test server (compare as ratios only).\n", args.reps)?;
    writeln!(out, "| depth d | round trips skip / keyset | keys examined skip / keyset | docs examined skip / keyset | ms per page skip / keyset | time skip ÷ keyset | keys examined skip ÷ keyset | docs examined skip ÷ keyset |")?;
    writeln!(
        out,
        "| ---: | :---: | :---: | :---: | :---: | ---: | ---: | ---: |"
    )?;
    for r in &depth_rows {
        writeln!(
            out,
            "| {} | {} / {} | {} / {} | {} / {} | {:.1} / {:.1} | {:.2}× | {:.1}× | {:.2}× |",
            thousands(r.depth),
            r.skip.round_trips,
            r.keyset.round_trips,
            thousands(r.skip.explain.keys),
            thousands(r.keyset.explain.keys),
            thousands(r.skip.explain.docs),
            thousands(r.keyset.explain.docs),
            ms(r.skip.time),
            ms(r.keyset.time),
            r.skip.time.as_secs_f64() / r.keyset.time.as_secs_f64(),
            r.skip.explain.keys as f64 / r.keyset.explain.keys.max(1) as f64,
            r.skip.explain.docs as f64 / r.keyset.explain.docs.max(1) as f64,
        )?;
    }
    writeln!(out)?;
    writeln!(out, "Winning plans and the keyset boundary: the runtime sends `{{$or: [{{_id: {{$gt: last}}}}]}}` (one `$or` branch per sort key; by `_id` there is one); the plain form is what one writes by hand.\n")?;
    writeln!(out, "| depth d | skip plan | keyset plan | keyset keys / docs | plain `{{_id: {{$gt: last}}}}` plan | plain keys / docs |")?;
    writeln!(out, "| ---: | --- | --- | :---: | --- | :---: |")?;
    for r in &depth_rows {
        writeln!(
            out,
            "| {} | {} | {} | {} / {} | {} | {} |",
            thousands(r.depth),
            r.skip.explain.plan,
            r.keyset.explain.plan,
            thousands(r.keyset.explain.keys),
            thousands(r.keyset.explain.docs),
            r.plain.as_ref().map_or("—".into(), |e| e.plan.clone()),
            r.plain.as_ref().map_or("—".into(), |e| format!(
                "{} / {}",
                thousands(e.keys),
                thousands(e.docs)
            )),
        )?;
    }
    writeln!(out)?;

    writeln!(
        out,
        "### Generated vs hand-written: the first {} visits, pages of {}\n",
        thousands(args.scan),
        thousands(u64::from(args.scan_page))
    )?;
    writeln!(out, "Both send the same `find` commands (filter, sort, limit {} = page + 1, batchSize {}; checked command by command). Client CPU is this process's on-CPU time (all threads, `/proc/self/task/*/schedstat`), median of {} interleaved scans each, on a client without command monitoring; the server's CPU is not included.\n",
        args.scan_page + 1, args.scan_page + 1, args.cpu_reps)?;
    writeln!(out, "| variant | round trips | client CPU ms per scan (median) | min – max | µs CPU per item | CPU ÷ hand-written | wall s per scan (median) |")?;
    writeln!(out, "| --- | ---: | ---: | :---: | ---: | ---: | ---: |")?;
    let hand_cpu = scan.variants.last().map_or(1.0, |v| v.cpu_median);
    for v in &scan.variants {
        writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} – {:.1} | {:.2} | {:.3} | {:.2} |",
            v.name,
            v.round_trips,
            v.cpu_median / 1e6,
            v.cpu_min / 1e6,
            v.cpu_max / 1e6,
            v.cpu_median / 1e3 / scan.items as f64,
            v.cpu_median / hand_cpu,
            v.wall_median.as_secs_f64(),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "Generated ÷ hand-written CPU: ratio of medians {:.3}, of minimums {:.3}; per repetition (the two scans back to back) median {:.3}, range {:.3} – {:.3}.\n",
        scan.variants[0].cpu_median / scan.variants[1].cpu_median,
        scan.variants[0].cpu_min / scan.variants[1].cpu_min,
        scan.paired_median,
        scan.paired_min,
        scan.paired_max
    )?;
    writeln!(out, "Cross-check from `/proc/self/stat` (utime+stime, 10 ms ticks), total over all measured scans: {}.\n",
        scan.variants
            .iter()
            .map(|v| format!("{} {} ms", v.name, v.ticks_total_ms))
            .collect::<Vec<_>>()
            .join(", "))?;
    Ok(out)
}

// ---------------------------------------------------------------- loading

async fn load(args: &Args, db: &Database) -> BoxResult<Duration> {
    let visits = Visit::collection(db);
    let visitors = (args.docs / 4).max(1);
    let base = 1_704_067_200_000_i64; // 2024-01-01T00:00:00Z
    eprintln!("loading {} visits...", args.docs);
    let t = Instant::now();
    let mut batch = Vec::with_capacity(args.batch);
    let mut next_report = 100_000;
    for i in 0..args.docs {
        let who = splitmix64(i) % visitors;
        let h = splitmix64(who ^ 0x5eed);
        let g = splitmix64(h);
        batch.push(Visit {
            id: ObjectId::new(),
            uuid: format!(
                "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                h >> 32,
                (h >> 16) & 0xffff,
                h & 0xfff,
                0x8000 | (g >> 48) & 0x3fff,
                g & 0xffff_ffff_ffff
            ),
            init_time: DateTime::from_millis(base + i as i64 * 300),
        });
        if batch.len() == args.batch || i + 1 == args.docs {
            visits.insert_many(&batch).await?;
            batch.clear();
            if i + 1 >= next_report {
                eprintln!(
                    "  {} loaded, {:.1} s",
                    thousands(i + 1),
                    t.elapsed().as_secs_f64()
                );
                next_report += 100_000;
            }
        }
    }
    let took = t.elapsed();
    let n = visits.estimated_document_count().await?;
    if n != args.docs {
        return Err(format!("loaded {n} visits, expected {}", args.docs).into());
    }
    Ok(took)
}

// ---------------------------------------------------------- pages at depth

#[derive(Debug, Clone, Default)]
struct Explained {
    keys: u64,
    docs: u64,
    plan: String,
}

struct Measured {
    round_trips: usize,
    explain: Explained,
    time: Duration,
}

struct DepthRow {
    depth: u64,
    skip: Measured,
    keyset: Measured,
    /// The keyset page's boundary written plainly, `{_id: {$gt: last}}`.
    plain: Option<Explained>,
}

async fn skip_page(visits: &Collection<Visit>, depth: u64, n: u32) -> BoxResult<Vec<Visit>> {
    Ok(visits
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .skip(depth)
        .limit(i64::from(n))
        .await?
        .try_collect()
        .await?)
}

async fn depths(args: &Args, db: &Database, commands: &Commands) -> BoxResult<Vec<DepthRow>> {
    let visits = Visit::collection(db);
    let n = args.page_size;
    let mut rows = Vec::new();
    for &depth in &args.depths {
        eprintln!("depth {}:", thousands(depth));
        // Setup, untimed: the token that marks item `depth - 1`.
        let query = Visit::keyset(db).page_size(n);
        let (query, last_id) = if depth == 0 {
            (query, None)
        } else {
            let before = skip_page(&visits, depth - 1, 1).await?;
            let id = before.first().ok_or("no item before the depth")?.id;
            let marker = Visit::keyset(db)
                .filter(doc! {"_id": {"$gte": id}})
                .page_size(1)
                .page()
                .await?;
            if marker.items.first().map(|v| v.id) != Some(id) {
                return Err("the marker page does not start at the item".into());
            }
            let token = marker.next.ok_or("no token after the item")?;
            (query.after(&token), Some(id))
        };

        // Round trips (and a warm-up, and a check that both agree).
        commands.take();
        let by_skip = skip_page(&visits, depth, n).await?;
        settle().await;
        let skip_rt = commands.take_count();
        let by_keyset = query.page().await?;
        settle().await;
        let keyset_rt = commands.take_count();
        let ids = |v: &[Visit]| v.iter().map(|v| v.id).collect::<Vec<_>>();
        if ids(&by_skip) != ids(&by_keyset.items) {
            return Err(format!("depth {depth}: skip and keyset pages differ").into());
        }

        // Server work, from `explain` of the exact commands.
        let skip_explain = explain(
            db,
            doc! {"find": "visits", "filter": {}, "sort": {"_id": 1}, "skip": depth as i64, "limit": i64::from(n)},
        )
        .await?;
        let (filter, sort, limit) = query.command()?;
        let keyset_explain = explain(
            db,
            doc! {"find": "visits", "filter": filter, "sort": sort.clone(), "limit": limit},
        )
        .await?;
        let plain = match last_id {
            Some(id) => Some(
                explain(
                    db,
                    doc! {"find": "visits", "filter": {"_id": {"$gt": id}}, "sort": sort, "limit": limit},
                )
                .await?,
            ),
            None => None,
        };
        commands.take();

        // Wall time, interleaved.
        let mut skip_times = Vec::new();
        let mut keyset_times = Vec::new();
        for _ in 0..args.reps {
            let t = Instant::now();
            black_box(skip_page(&visits, depth, n).await?);
            skip_times.push(t.elapsed());
            let t = Instant::now();
            black_box(query.page().await?);
            keyset_times.push(t.elapsed());
        }
        commands.take();
        let row = DepthRow {
            depth,
            skip: Measured {
                round_trips: skip_rt,
                explain: skip_explain,
                time: median(&mut skip_times),
            },
            keyset: Measured {
                round_trips: keyset_rt,
                explain: keyset_explain,
                time: median(&mut keyset_times),
            },
            plain,
        };
        eprintln!(
            "  skip: {} rt, {} keys, {} docs, {:.1} ms; keyset: {} rt, {} keys, {} docs, {:.1} ms",
            row.skip.round_trips,
            row.skip.explain.keys,
            row.skip.explain.docs,
            ms(row.skip.time),
            row.keyset.round_trips,
            row.keyset.explain.keys,
            row.keyset.explain.docs,
            ms(row.keyset.time)
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Lets a `killCursors` sent in the background on a cursor's drop be counted.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

async fn explain(db: &Database, find: Document) -> BoxResult<Explained> {
    let reply = db
        .run_command(doc! {"explain": find, "verbosity": "executionStats"})
        .await?;
    let stats = reply.get_document("executionStats")?;
    let count = |k: &str| stat_u64(stats, k).unwrap_or(0);
    let plan = reply
        .get_document("queryPlanner")
        .and_then(|q| q.get_document("winningPlan"))
        .map(describe_plan)
        .unwrap_or_else(|_| "?".into());
    Ok(Explained {
        keys: count("totalKeysExamined"),
        docs: count("totalDocsExamined"),
        plan,
    })
}

/// `LIMIT ← FETCH ← IXSCAN _id (bounds)`, outermost first.
fn describe_plan(stage: &Document) -> String {
    let mut parts = Vec::new();
    let mut cur = Some(stage);
    while let Some(s) = cur {
        let mut name = s.get_str("stage").unwrap_or("?").to_owned();
        if let Ok(bounds) = s.get_document("indexBounds") {
            let b: Vec<String> = bounds
                .iter()
                .map(|(k, v)| match v {
                    Bson::Array(a) => format!(
                        "{k} {}",
                        a.iter()
                            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                            .collect::<Vec<_>>()
                            .join(" ∪ ")
                    ),
                    other => format!("{k} {other}"),
                })
                .collect();
            name = format!("{name} `{}`", shorten_oids(&b.join(", ")));
        }
        parts.push(name);
        cur = s.get_document("inputStage").ok().or_else(|| {
            // Several children (an `OR`): follow the first, mark the rest.
            s.get_array("inputStages")
                .ok()
                .and_then(|a| a.first())
                .and_then(Bson::as_document)
        });
        if let Ok(a) = s.get_array("inputStages") {
            if a.len() > 1 {
                parts.push(format!("({} inputs)", a.len()));
            }
        }
    }
    parts.join(" ← ")
}

/// Bounds print whole ObjectIds; keep the table narrow.
fn shorten_oids(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("ObjectId('") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "ObjectId('".len()..];
        match after.find("')") {
            Some(j) => {
                out.push_str("oid");
                rest = &after[j + 2..];
            }
            None => {
                rest = &rest[i..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

// ------------------------------------------ generated vs hand-written scan

struct Variant {
    name: &'static str,
    round_trips: usize,
    cpu: Vec<f64>,
    ticks: u64,
    walls: Vec<Duration>,
    cpu_median: f64,
    cpu_min: f64,
    cpu_max: f64,
    ticks_total_ms: u64,
    wall_median: Duration,
}

struct Scan {
    items: u64,
    variants: Vec<Variant>,
    /// generated ÷ hand-written of the two scans of each repetition.
    paired_median: f64,
    paired_min: f64,
    paired_max: f64,
}

/// What a scan saw, to check that both variants read the same items.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    items: u64,
    last: Option<ObjectId>,
    digest: u64,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            items: 0,
            last: None,
            digest: 0,
        }
    }

    /// The job's work per visit: look at the visitor and the time.
    fn visit(&mut self, v: &Visit) {
        let v = black_box(v);
        self.items += 1;
        self.last = Some(v.id);
        self.digest = self
            .digest
            .rotate_left(5)
            .wrapping_add(v.uuid.len() as u64 ^ v.init_time.timestamp_millis() as u64);
    }
}

/// The generated repository: `Keyset::stream()`, bounded to `limit` items.
async fn scan_generated(db: &Database, page: u32, limit: u64) -> BoxResult<Seen> {
    let mut seen = Seen::new();
    let mut items = std::pin::pin!(Visit::keyset(db)
        .page_size(page)
        .stream()
        .take(limit as usize));
    while let Some(v) = items.next().await {
        seen.visit(&v?);
    }
    Ok(seen)
}

/// The same job written by hand against the driver, as in seed 004: sort by
/// `_id`, take one more than a page to learn whether another follows, and
/// start each page after the last `_id` seen. The boundary keeps the
/// runtime's one-branch `$or` so that both send identical commands (the
/// plain `{_id: {$gt: last}}` is compared with `explain` in the table above).
async fn scan_by_hand(db: &Database, page: u32, limit: u64) -> BoxResult<Seen> {
    let visits = db.collection::<Visit>("visits");
    let mut seen = Seen::new();
    let mut last: Option<ObjectId> = None;
    loop {
        let filter = match last {
            None => doc! {},
            Some(id) => doc! {"$or": [{"_id": {"$gt": id}}]},
        };
        let mut cursor = visits
            .find(filter)
            .sort(doc! {"_id": 1})
            .limit(i64::from(page) + 1)
            .batch_size(page + 1)
            .await?;
        let mut in_page = 0;
        let mut more = false;
        while let Some(v) = cursor.try_next().await? {
            if in_page == page {
                more = true; // the look-ahead item; it opens the next page
                continue;
            }
            in_page += 1;
            last = Some(v.id);
            seen.visit(&v);
            if seen.items == limit {
                return Ok(seen);
            }
        }
        if !more {
            return Ok(seen);
        }
    }
}

async fn scan(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<Scan> {
    let (page, limit) = (args.scan_page, args.scan);
    eprintln!(
        "scan of {} items in pages of {}:",
        thousands(limit),
        thousands(u64::from(page))
    );

    // Round trips and commands, on the monitored client (also a warm-up).
    commands.take();
    let generated = scan_generated(db, page, limit).await?;
    settle().await;
    let generated_cmds = commands.take();
    let by_hand = scan_by_hand(db, page, limit).await?;
    settle().await;
    let hand_cmds = commands.take();
    if generated != by_hand {
        return Err(format!("the scans differ: {generated:?} vs {by_hand:?}").into());
    }
    if generated.items != limit {
        return Err(format!("the scan read {} items, not {limit}", generated.items).into());
    }
    let strip = |cmds: &[(String, Document)]| -> Vec<(String, Document)> {
        cmds.iter()
            .map(|(name, c)| {
                let mut c = c.clone();
                for k in [
                    "lsid",
                    "$clusterTime",
                    "$db",
                    "txnNumber",
                    "$readPreference",
                ] {
                    c.remove(k);
                }
                (name.clone(), c)
            })
            .collect()
    };
    let (g, h) = (strip(&generated_cmds), strip(&hand_cmds));
    if g != h {
        return Err(
            format!("the scans sent different commands:\ngenerated {g:?}\nby hand {h:?}").into(),
        );
    }
    eprintln!(
        "  both sent {} identical commands ({})",
        g.len(),
        g.first().map_or("", |(n, _)| n.as_str())
    );

    // CPU, on a client without command monitoring.
    let plain = Client::with_uri_str(uri).await?;
    let db = plain.database(db.name());
    // Warm the new client's connection (one small page each).
    black_box(scan_generated(&db, page.min(100), 1).await?);
    black_box(scan_by_hand(&db, page.min(100), 1).await?);
    let mut variants = vec![
        Variant::new("generated: `Keyset::stream()`", generated_cmds.len()),
        Variant::new("hand-written driver loop", hand_cmds.len()),
    ];
    for rep in 0..args.cpu_reps {
        // Alternate which goes first.
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (cpu0, ticks0, t) = (cpu_ns(), cpu_ticks(), Instant::now());
            let seen = if i == 0 {
                scan_generated(&db, page, limit).await?
            } else {
                scan_by_hand(&db, page, limit).await?
            };
            let (wall, cpu, ticks) = (t.elapsed(), cpu_ns() - cpu0, cpu_ticks() - ticks0);
            if seen != generated {
                return Err("a timed scan read different items".into());
            }
            let v = &mut variants[i];
            v.cpu.push(cpu as f64);
            v.ticks += ticks;
            v.walls.push(wall);
            eprintln!(
                "  rep {rep}: {:<32} cpu {:>8.1} ms, wall {:.2} s",
                v.name,
                cpu as f64 / 1e6,
                wall.as_secs_f64()
            );
        }
    }
    let paired: Vec<f64> = {
        let mut r: Vec<f64> = variants[0]
            .cpu
            .iter()
            .zip(&variants[1].cpu)
            .map(|(g, h)| g / h)
            .collect();
        r.sort_by(f64::total_cmp);
        r
    };
    let tick_ms = 1000 / clock_ticks_per_second();
    for v in &mut variants {
        v.cpu.sort_by(f64::total_cmp);
        v.cpu_median = median_f64(&v.cpu);
        v.cpu_min = v.cpu[0];
        v.cpu_max = v.cpu[v.cpu.len() - 1];
        v.ticks_total_ms = v.ticks * tick_ms;
        v.wall_median = median(&mut v.walls);
    }
    plain.shutdown().await;
    Ok(Scan {
        items: limit,
        paired_median: median_f64(&paired),
        paired_min: paired[0],
        paired_max: paired[paired.len() - 1],
        variants,
    })
}

impl Variant {
    fn new(name: &'static str, round_trips: usize) -> Variant {
        Variant {
            name,
            round_trips,
            cpu: Vec::new(),
            ticks: 0,
            walls: Vec::new(),
            cpu_median: 0.0,
            cpu_min: 0.0,
            cpu_max: 0.0,
            ticks_total_ms: 0,
            wall_median: Duration::ZERO,
        }
    }
}
