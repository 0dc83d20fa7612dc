//! The rank histogram vs counting students and vs a stored rank, and the
//! generated repository vs hand-written driver code: an exam whose ranks
//! must follow score changes in real time.
//!
//! A program, not a test: markdown tables go to stdout, progress to stderr.
//!
//! ```text
//! cargo bench --bench rank                             # quick: 100k students
//! cargo bench --bench rank -- --students 1000000       # the headline run
//! ```
//!
//! Flags (all optional):
//!
//! | flag | default | meaning |
//! | --- | --- | --- |
//! | `--students N` | 100000 | students of one exam, loaded into each design |
//! | `--batch N` | 10000 | students per `insert_many` while loading |
//! | `--reps N` | 5 | timed reads per variant and score (median reported) |
//! | `--window-reps N` | 1 | timed `$setWindowFields` reads per score |
//! | `--no-window` | off | skip `$setWindowFields` (it sorts the whole exam) |
//! | `--change-reps N` | 1 | top-student drop/restore pairs per design |
//! | `--small-reps N` | 3 | 70 → 70.5 → 70 pairs per design |
//! | `--ops N` | 50 | repetitions per operation for round trips and latency |
//! | `--cpu-reps N` | 21 | interleaved repetitions per variant for client CPU |
//! | `--cpu-ops N` | 100 | operations per repetition for client CPU (even) |
//! | `--cost-only` | off | load, then only the generated-vs-hand section (run so under callgrind, its samples are instructions) |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (CONTRIBUTING.md, "The test server"). The surrogate walks
//! whole collections on range, sort and count queries, whatever the index, so
//! its wall times say little about `mongod`: read round trips, `explain`
//! figures and documents written first, and wall times only as ratios.
//!
//! Measured in one run, on one exam (`examId: "exam_001"`), scores in half
//! points from 0 to 100 (201 distinct; one student alone at 100):
//!
//! 1. Load ([`load`]): the same students into three collections by `insert_many`:
//!    `students` (histogram layout `"array"`), `students_docs` (layout
//!    `"documents"`), both with the index `ensure_indexes` makes,
//!    `{examId: 1, score: -1}`, and then `Ranks::rebuild`; and
//!    `students_naive` (each student stores its `rank`, computed on the
//!    client while loading; same index).
//! 2. Rank of a score (top, middle, bottom; [`reads`]): `Ranks::rank` on each layout vs
//!    `countDocuments({examId, score: {$gt: s}})` vs `$setWindowFields`
//!    (`$rank` by exam, score descending, then `$match` the student). Round
//!    trips by command monitoring; keys/docs examined by `explain`
//!    (`executionStats`) of the exact command each sent.
//! 3. Score changes ([`changes`]): the top student drops to 0 (and is restored), and a
//!    typical 70 → 70.5 (and back): `Ranks::update_score` (player document +
//!    histogram, in a transaction) and `Ranks::change` (histogram only) vs
//!    the stored-rank design, which must rewrite the rank of every student
//!    the change passes. Documents written from the results and from
//!    `serverStatus` (`metrics.document`, `opcounters`); stored ranks are
//!    checked against the histogram after each change.
//! 4. Round trips per operation for every call of `Ranks`, both layouts
//!    ([`round_trips`]).
//! 5. Generated vs hand-written ([`generated`], the baselines in
//!    [`by_hand`]): `rank` and `change` vs the same commands
//!    through a `Collection<Document>` (checked command by command); client
//!    CPU from `/proc/self/task/*/schedstat`, on a client without command

mod by_hand;
mod changes;
#[path = "../counter/cost.rs"]
mod cost;
mod generated;
mod load;
mod reads;
mod round_trips;

use mongo_patterns::bson::Bson;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    self, describe_server, splitmix64, thousands, BoxResult, Flags, Runtime, Session,
};
use mongo_patterns_testkit::{server_uri, Commands};

const EXAM: &str = "exam_001";
const NAIVE: &str = "students_naive";
/// Ids of students the round-trip section inserts and deletes again.
const SCRATCH_ID: i64 = 50_000_000;

/// A student's score in the exam, histogram as one array document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "students")]
#[rank_histogram(board = "examId", score = "score", precision = 0.5)]
struct Student {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: f64,
}

/// The same, histogram as one document per (exam, score).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "students_docs")]
#[rank_histogram(
    board = "examId",
    score = "score",
    precision = 0.5,
    layout = "documents"
)]
struct StudentDocs {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: f64,
}

/// The naive design: the rank is a stored field.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RankedStudent {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: f64,
    rank: i64,
}

/// What both models share, so that loading and timing are written once.
trait Exam: RankHistogram<Board = String, Score = f64> + mongo_patterns::Documents + Clone {
    fn new(id: i64, score: f64) -> Self;
}

impl Exam for Student {
    fn new(id: i64, score: f64) -> Self {
        Student {
            id,
            exam_id: EXAM.to_owned(),
            score,
        }
    }
}

impl Exam for StudentDocs {
    fn new(id: i64, score: f64) -> Self {
        StudentDocs {
            id,
            exam_id: EXAM.to_owned(),
            score,
        }
    }
}

/// Student `i`'s score in half points (0 to 200). Student 0 alone has full
/// marks and student 1 has 0; of the others a quarter are spread evenly over
/// 0 to 99.5 (so every score is held) and the rest form a bell around 69.
fn half_points(i: u64) -> u32 {
    match i {
        0 => 200,
        1 => 0,
        _ => {
            let h = splitmix64(i);
            if h.is_multiple_of(4) {
                ((h >> 8) % 200) as u32
            } else {
                80 + ((h >> 8) % 40 + (h >> 24) % 40 + (h >> 40) % 40) as u32
            }
        }
    }
}

fn score_of(i: u64) -> f64 {
    f64::from(half_points(i)) / 2.0
}

struct Args {
    students: u64,
    batch: usize,
    reps: usize,
    window_reps: usize,
    window: bool,
    change_reps: usize,
    small_reps: usize,
    ops: usize,
    cpu_reps: usize,
    cpu_ops: usize,
    cost_only: bool,
    command: String,
}

impl Args {
    fn parse() -> Args {
        let mut f = Flags::from_env(
            "rank",
            "[--students N] [--batch N] [--reps N] \
             [--window-reps N] [--no-window] [--change-reps N] [--small-reps N] [--ops N] \
             [--cpu-reps N] [--cpu-ops N] [--cost-only]",
        );
        let mut a = Args {
            students: 100_000,
            batch: 10_000,
            reps: 5,
            window_reps: 1,
            window: true,
            change_reps: 1,
            small_reps: 3,
            ops: 50,
            cpu_reps: 21,
            cpu_ops: 100,
            cost_only: false,
            command: f.command(),
        };
        while let Some(flag) = f.next_flag() {
            match flag.as_str() {
                "--students" => a.students = f.value(&flag),
                "--batch" => a.batch = f.value(&flag),
                "--reps" => a.reps = f.value(&flag),
                "--window-reps" => a.window_reps = f.value(&flag),
                "--no-window" => a.window = false,
                "--change-reps" => a.change_reps = f.value(&flag),
                "--small-reps" => a.small_reps = f.value(&flag),
                "--ops" => a.ops = f.value(&flag),
                "--cpu-reps" => a.cpu_reps = f.value(&flag),
                "--cpu-ops" => a.cpu_ops = f.value(&flag),
                "--cost-only" => a.cost_only = true,
                _ => f.unknown(&flag),
            }
        }
        if a.students < 1000 || a.batch == 0 {
            f.fail("--students must be at least 1000 and --batch positive");
        }
        a.reps = a.reps.max(1);
        a.window_reps = a.window_reps.max(1);
        a.change_reps = a.change_reps.max(1);
        a.small_reps = a.small_reps.max(1);
        a.ops = a.ops.max(1);
        a.cpu_reps = a.cpu_reps.max(1);
        // Changes go there and back, so that each repetition ends where it
        // started.
        a.cpu_ops = a.cpu_ops.max(2).div_ceil(2) * 2;
        a
    }
}

fn main() {
    let args = Args::parse();
    bench::main(Runtime::CurrentThread, async move {
        let s = Session::open("rank", server_uri()).await?;
        let report = bench(&args, &s.uri, &s.db, &s.commands).await;
        s.finish(report).await
    });
}

/// The students picked for the reads and the changes.
struct Picks {
    /// Student 1, at 0.
    bottom: i64,
    /// The first student at 70.
    middle: i64,
}

async fn bench(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<String> {
    let server = describe_server(db).await;
    let mut out = format!(
        "# Rank histogram benchmark: {} students of one exam\n\nCommand: `{}` — server: {server}, client: {} cores, tokio current-thread runtime.\n\n",
        thousands(args.students),
        args.command,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    out += "The surrogate server walks whole collections on range and sort queries whatever the index (counts follow the index bounds; CONTRIBUTING.md, \"The test server\"): read round trips, keys/docs examined and documents written first; wall times are its, not mongod's, so compare them as ratios only.\n\n";

    let middle = (2..args.students)
        .find(|&i| half_points(i) == 140)
        .ok_or("no student at 70")? as i64;
    let picks = Picks { bottom: 1, middle };

    // ---- 1. load ----
    let (loaded, rebuilt) = load::load(args, db, commands).await?;
    if args.cost_only {
        return Ok(out + &generated::generated_vs_hand(args, uri, db, commands).await?);
    }
    out += &loaded;

    // ---- 4 first: it also warms both repositories (the `hello` that
    // decides on transactions is sent once per repository). ----
    let round_trips = round_trips::round_trips(args, db, commands, rebuilt).await?;

    // ---- 2. rank reads ----
    out += &reads::reads(args, db, commands, &picks).await?;

    // ---- 3. score changes ----
    out += &changes::changes(args, db, commands, &picks).await?;

    out += &round_trips;

    // ---- 5. generated vs hand-written ----
    out += &generated::generated_vs_hand(args, uri, db, commands).await?;
    Ok(out)
}

/// Round trips, as names: `findAndModify + update + commitTransaction`.
fn names(v: &[(String, Document)]) -> String {
    if v.is_empty() {
        return "—".into();
    }
    v.iter()
        .map(|(n, _)| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(" + ")
}

fn lossy_u64(b: Option<&Bson>) -> Option<u64> {
    match b? {
        Bson::Int32(i) => u64::try_from(*i).ok(),
        Bson::Int64(i) => u64::try_from(*i).ok(),
        Bson::Double(f) if f.fract() == 0.0 && *f >= 0.0 => Some(*f as u64),
        _ => None,
    }
}
