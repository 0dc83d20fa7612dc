//! Five shard keys for application logs, compared on the simulator of the
//! `mongo-patterns-sim` crate. No server: a deterministic model of chunks,
//! splits, jumbo chunks, the classic balancer and mongos's targeting (its
//! rules are in that crate's docs).
//!
//! A program, not a test: the parameters and a markdown table go to stdout,
//! timings to stderr.
//!
//! ```text
//! cargo bench --bench shard_sim                          # 1,000,000 logs
//! cargo bench --bench shard_sim -- --logs 200000 --chunk-docs 8192
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--logs N` | 1000000 | logs inserted, in `ts` order over 24 months |
//! | `--shards N` | 4 | shards in the cluster |
//! | `--chunk-docs N` | 32768 | documents above which a chunk splits |
//! | `--seed N` | 2 | the workload's PRNG seed |
//! | `--balance-every N` | chunk-docs / 8 | inserts between balancer rounds |
//! | `--top-chunk` | off | MongoDB's top-chunk optimization (≤ 5.x) |

use std::time::Instant;

use mongo_patterns_sim::{add_months, compare, markdown_table, Params, Workload};
use mongo_patterns_testkit::bench;

struct Args {
    workload: Workload,
    params: Params,
    balance_every: Option<usize>,
}

impl Args {
    fn parse() -> Args {
        let mut a = Args {
            workload: Workload::default(),
            params: Params::default(),
            balance_every: None,
        };
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let mut it = raw.iter();
        while let Some(flag) = it.next() {
            let mut value = |name: &str| -> String {
                it.next()
                    .unwrap_or_else(|| usage(&format!("{name} needs a value")))
                    .clone()
            };
            match flag.as_str() {
                "--bench" => {}
                "--logs" => a.workload.logs = num(&value("--logs")),
                "--shards" => a.params.shards = num(&value("--shards")),
                "--chunk-docs" => a.params.chunk_docs = num(&value("--chunk-docs")),
                "--seed" => a.workload.seed = num(&value("--seed")),
                "--balance-every" => a.balance_every = Some(num(&value("--balance-every"))),
                "--top-chunk" => a.params.top_chunk_optimization = true,
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown flag `{other}`")),
            }
        }
        if a.workload.logs == 0 || a.params.shards == 0 || a.params.chunk_docs == 0 {
            usage("--logs, --shards and --chunk-docs must be positive");
        }
        if a.workload.logs > u32::MAX as usize {
            usage("--logs must fit in 32 bits");
        }
        let top = a.params.top_chunk_optimization;
        a.params = Params {
            top_chunk_optimization: top,
            ..Params::new(a.params.shards, a.params.chunk_docs)
        };
        if let Some(every) = a.balance_every {
            a.params.balance_every = every;
        }
        a
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    bench::num(s, usage)
}

fn usage(err: &str) -> ! {
    bench::usage(
        "cargo bench --bench shard_sim -- [--logs N] [--shards N] [--chunk-docs N] \
         [--seed N] [--balance-every N] [--top-chunk]",
        err,
    )
}

/// `2023-01` for the month starting at `secs`.
fn year_month(secs: i64) -> String {
    let dt = mongo_patterns::bson::DateTime::from_millis(secs * 1000);
    dt.try_to_rfc3339_string()
        .map(|s| s[..7].to_owned())
        .unwrap_or_else(|_| secs.to_string())
}

fn main() {
    let args = Args::parse();
    let (w, p) = (&args.workload, &args.params);
    let started = Instant::now();
    let rows = compare(w, p);
    eprintln!("simulated 5 keys in {:.2?}", started.elapsed());

    let last = add_months(w.start, w.months - 1);
    println!("## Shard keys for application logs, simulated\n");
    println!(
        "- workload: {} logs in `ts` order over {} months ({} to {}), types app/web/admin \
         {}/{}/{} %, random UUID ids, seed {}",
        w.logs,
        w.months,
        year_month(w.start),
        year_month(last),
        w.mix[0],
        w.mix[1],
        w.mix[2],
        w.seed
    );
    println!(
        "- cluster: {} shards; a chunk splits above {} documents; balancer every {} inserts \
         (classic chunk-count thresholds 2/4/8); hashed key pre-split into {} chunks per shard; \
         top-chunk optimization {}",
        p.shards,
        p.chunk_docs,
        p.balance_every,
        p.hashed_chunks_per_shard,
        if p.top_chunk_optimization {
            "on"
        } else {
            "off"
        }
    );
    println!(
        "- queries: \"type X in {}\" for each type; windows of {} inserts; pages of {} documents\n",
        year_month(last),
        w.logs.div_ceil(p.windows),
        p.page_docs
    );
    print!("{}", markdown_table(&rows));

    // Each pattern's own write stream, under its declared key and the bad
    // ones (`sim::patterns`).
    let s = mongo_patterns_sim::Streams::default();
    let started = Instant::now();
    let rows = mongo_patterns_sim::simulate_patterns(s);
    eprintln!(
        "simulated the patterns' streams in {:.2?}",
        started.elapsed()
    );
    println!("\n## The patterns' write streams, simulated\n");
    println!(
        "- cluster: {} shards; a chunk splits at its median key value above {} documents \
         (40 for the array layout's one document per board, 200 for buckets), and cannot \
         when all its documents share one key value (jumbo); the balancer moves chunks \
         after every split (classic thresholds 2/4/8)",
        s.shards, s.chunk_docs
    );
    println!(
        "- streams ({} operations each, seed {}): boards, counters and customers appear \
         over time with monotonic ids, and half the operations go to the newest quarter; \
         rank array: {} boards; rank documents: {} boards × 1,000 scores, one rank read \
         in 10; counters: {} ids; bucket: {} customers, 100 items a bucket, one page \
         read in 10 (the bucket's key is chosen by the bucket work: none is marked \
         declared here)",
        s.ops,
        s.seed,
        s.keys,
        s.keys / 10,
        s.keys * 50,
        s.keys
    );
    println!(
        "- \"more than one shard\": a write whose filter cannot carry the key's value \
         (`{{count: 1}}` changes with every write; a bucket push does not know its \
         bucket's `start`), or a read whose key range spans chunks on several shards\n"
    );
    print!("{}", mongo_patterns_sim::patterns_table(&rows));
}
