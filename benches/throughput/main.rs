//! Throughput under load: operations per second from 1, 16 and 64 tasks
//! sharing one client, each generated repository against the naive
//! hand-written design doing the same logical work, in one run.
//!
//! A program, not a test: markdown tables go to stdout, progress to stderr.
//!
//! ```text
//! cargo bench --bench throughput                      # quick: 2 s a cell
//! cargo bench --bench throughput -- --secs 10         # the headline run
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--secs N` | 2 | seconds each cell (workload, design, tasks) runs for |
//! | `--tasks a,b,..` | 1,16,64 | Tokio tasks issuing the operations |
//! | `--instances CxT,..` | 4x16,16x4 | the bucket pushes to one key, the score changes and the counters again from C clients of T tasks each, as C processes would run them (clients in one program stand in for processes: they share nothing in memory) |
//! | `--only LIST` | all | which workloads: `push1`, `push1000`, `rank`, `counter`, `keyset` |
//! | `--students N` | 1000 | students on the board of the score changes |
//! | `--visits N` | 10000 | visits the keyset pages walk through |
//! | `--threads N` | cores | worker threads of the client's runtime |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (CONTRIBUTING.md, "The test server"). It shares the
//! machine with this client, so read the round trips and server writes
//! first, and operations per second only as ratios.
//!
//! Each cell starts from freshly created collections, runs its tasks until
//! the time is up (a task starts no operation after it) and counts: the
//! commands sent (command monitoring), the server's writes
//! (`serverStatus` `opcounters` insert + update + delete, and
//! `metrics.document` inserted + updated + deleted, less what two
//! `serverStatus` calls count), and the operations done. The workloads
//! ([`bucket`], [`rank`], [`counter`], [`keyset`]):
//!
//! - pushes of trades to one customer, and to 1,000 customers in turn:
//!   `Buckets::push` (buckets of 100) against `insert_one` of a document
//!   per trade (index `{customerId: 1, date: 1}`); every push is checked
//!   to be counted exactly once at the end;
//! - score changes on one board: `Ranks::update_score` (student and
//!   histogram in one transaction) and `Ranks::change` (histogram only)
//!   against the stored-rank design (count the mover's new rank, set its
//!   score and rank, `$inc` the rank of everyone it passes);
//! - increments of one hot key: a sampled counter (every = 100) against an
//!   exact `$inc` per increment;
//! - pages of 100 walked from the start by each task: keyset `after(token)`
//!   against `skip(p·100).limit(100)`, both sorted by `_id`.
//!
//! With `MP_BENCH_KINDS` set, each cell also prints on stderr where its
//! round trips went: the commands every client sent, counted by kind (the
//! command, `[txn]` inside a transaction, and for updates, finds and
//! `findAndModify` the fields of their filter), the commands that failed
//! by error code (a transaction's `WriteConflict`), and its operations by
//! how long each took (under 10 ms, 100 ms, 1 s, longer; the longest).

mod bucket;
mod cell;
mod counter;
mod keyset;
mod rank;

use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{self, describe_server, BoxResult, Flags, Runtime, Session};
use mongo_patterns_testkit::{server_uri, with_pool};

pub(crate) use cell::{Ctx, Row};

struct Args {
    secs: f64,
    tasks: Vec<usize>,
    instances: Vec<(usize, usize)>,
    only: Vec<String>,
    students: u64,
    visits: u64,
    threads: usize,
    command: String,
}

const WORKLOADS: [&str; 5] = ["push1", "push1000", "rank", "counter", "keyset"];

impl Args {
    fn parse() -> Args {
        let mut f = Flags::from_env(
            "throughput",
            "[--secs N] [--tasks a,b,..] [--instances CxT,..] [--only push1,push1000,rank,counter,keyset] [--students N] [--visits N] [--threads N]",
        );
        let mut a = Args {
            secs: 2.0,
            tasks: vec![1, 16, 64],
            instances: vec![(4, 16), (16, 4)],
            only: WORKLOADS.iter().map(|s| s.to_string()).collect(),
            students: 1000,
            visits: 10_000,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            command: f.command(),
        };
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--secs" => a.secs = f.value(&flag),
                "--tasks" => a.tasks = f.list(&flag),
                "--instances" => {
                    let list = f.string(&flag);
                    let parsed: Option<Vec<(usize, usize)>> = list
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|cxt| {
                            let (c, t) = cxt.split_once('x')?;
                            Some((c.parse().ok()?, t.parse().ok()?))
                        })
                        .collect();
                    match parsed {
                        Some(v) if v.iter().all(|&(c, t)| c > 0 && t > 0) => a.instances = v,
                        _ => f.fail("--instances takes CxT pairs: 4x16,16x4"),
                    }
                }
                "--only" => {
                    a.only = f.string(&flag).split(',').map(str::to_owned).collect();
                    if let Some(w) = a.only.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
                        f.fail(&format!("unknown workload `{w}`"));
                    }
                }
                "--students" => a.students = f.value(&flag),
                "--visits" => a.visits = f.value(&flag),
                "--threads" => a.threads = f.value(&flag),
                _ => f.unknown(&flag),
            }
        }
        if a.secs <= 0.0 || a.tasks.is_empty() || a.tasks.contains(&0) {
            f.fail("--secs must be positive and --tasks positive numbers");
        }
        if a.students < 2 || a.visits < 200 {
            f.fail("--students must be at least 2 and --visits at least 200");
        }
        a.threads = a.threads.max(1);
        a
    }

    fn runs(&self, w: &str) -> bool {
        self.only.iter().any(|o| o == w)
    }
}

fn main() {
    let args = Args::parse();
    let runtime = Runtime::MultiThread {
        workers: Some(args.threads),
    };
    bench::main(runtime, async move {
        let pool = args.tasks.iter().copied().max().unwrap_or(1).max(10);
        let s = Session::open("throughput", with_pool(&server_uri(), u32::try_from(pool)?)).await?;
        let report = run(&args, &s.db, &s.commands).await;
        s.finish(report).await
    });
}

async fn run(
    args: &Args,
    db: &Database,
    commands: &mongo_patterns_testkit::Commands,
) -> BoxResult<String> {
    let server = describe_server(db).await;
    let ctx = Ctx::new(db.clone(), commands.clone(), args.secs).await?;
    let tasks = args.tasks.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    let mut out = format!(
        "# Throughput under load: {} tasks, {} s a cell\n\nCommand: `{}` — server: {server}, client: tokio multi-thread runtime, {} workers, connection pool of {}.\n\n",
        tasks.join(", "),
        args.secs,
        args.command,
        args.threads,
        args.tasks.iter().copied().max().unwrap_or(1).max(10),
    );
    out += "Each cell starts from fresh collections and runs its tasks for the time given (no operation starts after it). Round trips: commands sent per operation (command monitoring). Server writes: `serverStatus` `opcounters` insert + update + delete per operation; documents written: `metrics.document` inserted + updated + deleted per operation (less what two `serverStatus` calls count). Longest op, and ops ≥ 1 s: how long the slowest operation of the cell took, and how many took a second or more; the cell ends when the last operation started has, so a few held-up operations stretch its time, and a task held up for most of the cell does little of its work (with several instances, the rate can then be the rate of fewer instances). The test server shares 2 cores with this client: operations per second are ratios of one run, not figures for `mongod`.\n\n";
    if args.runs("push1") {
        out += &cell::table(
            "Bucket pushes to one key (buckets of 100)",
            &bucket::run(&ctx, &args.tasks, 1, &args.instances).await?,
        );
    }
    if args.runs("push1000") {
        out += &cell::table(
            "Bucket pushes to 1,000 keys in turn (buckets of 100)",
            &bucket::run(&ctx, &args.tasks, 1000, &[]).await?,
        );
    }
    if args.runs("rank") {
        out += &cell::table(
            &format!("Score changes on one board of {} students", args.students),
            &rank::run(&ctx, &args.tasks, args.students, &args.instances).await?,
        );
    }
    if args.runs("counter") {
        out += &cell::table(
            "Increments of one hot key",
            &counter::run(&ctx, &args.tasks, &args.instances).await?,
        );
    }
    if args.runs("keyset") {
        out += &cell::table(
            &format!(
                "Pages of 100, each task walking {} visits from the start",
                args.visits
            ),
            &keyset::run(&ctx, &args.tasks, args.visits).await?,
        );
    }
    Ok(out)
}
