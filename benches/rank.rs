//! The rank histogram vs counting students and vs a stored rank, and the
//! generated repository vs hand-written driver code (seed 001: an exam whose
//! ranks must follow score changes in real time).
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
//! | `--cpu-reps N` | 15 | interleaved repetitions per variant for client CPU |
//! | `--cpu-ops N` | 100 | operations per repetition for client CPU (even) |
//!
//! The server is `MONGODB_URI` if set, otherwise the surrogate `secantusd-rs`
//! that the testkit starts (DESIGN.md, "The test server"). The surrogate walks
//! whole collections on range, sort and count queries, whatever the index, so
//! its wall times say little about `mongod`: read round trips, `explain`
//! figures and documents written first, and wall times only as ratios.
//!
//! Measured in one run, on one exam (`examId: "exam_001"`), scores in half
//! points from 0 to 100 (201 distinct; one student alone at 100):
//!
//! 1. Load: the same students into three collections by `insert_many`:
//!    `students` (histogram layout `"array"`), `students_docs` (layout
//!    `"documents"`), both with the index `ensure_indexes` makes,
//!    `{examId: 1, score: -1}`, and then `Ranks::rebuild`; and
//!    `students_naive` (each student stores its `rank`, computed on the
//!    client while loading; same index).
//! 2. Rank of a score (top, middle, bottom): `Ranks::rank` on each layout vs
//!    `countDocuments({examId, score: {$gt: s}})` vs `$setWindowFields`
//!    (`$rank` by exam, score descending, then `$match` the student). Round
//!    trips by command monitoring; keys/docs examined by `explain`
//!    (`executionStats`) of the exact command each sent.
//! 3. Score changes: the top student drops to 0 (and is restored), and a
//!    typical 70 → 70.5 (and back): `Ranks::update_score` (player document +
//!    histogram, in a transaction) and `Ranks::change` (histogram only) vs
//!    the stored-rank design, which must rewrite the rank of every student
//!    the change passes. Documents written from the results and from
//!    `serverStatus` (`metrics.document`, `opcounters`); stored ranks are
//!    checked against the histogram after each change.
//! 4. Round trips per operation for every call of `Ranks`, both layouts.
//! 5. Generated vs hand-written: `rank` and `change` vs the same commands
//!    through a `Collection<Document>` (checked command by command); client
//!    CPU from `/proc/self/task/*/schedstat`, on a client without command
//!    monitoring, repetitions interleaved.

use std::hint::black_box;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::{self, Bson};
use mongo_patterns::mongodb::{Client, Collection, IndexModel};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    self, cpu_ns, cpu_ticks, median, median_f64, ms, opt, splitmix64, stat_u64, thousands,
};
use mongo_patterns_testkit::{client, server_uri, Commands};

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const EXAM: &str = "exam_001";
const NAIVE: &str = "students_naive";
/// Ids of students the round-trip section inserts and deletes again.
const SCRATCH_ID: i64 = 50_000_000;

/// A student's score in the seed's exam, histogram as one array document.
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
trait Exam: RankHistogram<Board = String, Score = f64> + Clone {
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
    raw: Vec<String>,
}

impl Args {
    fn parse() -> Args {
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let mut a = Args {
            students: 100_000,
            batch: 10_000,
            reps: 5,
            window_reps: 1,
            window: true,
            change_reps: 1,
            small_reps: 3,
            ops: 50,
            cpu_reps: 15,
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
                // `cargo bench` passes `--bench` to harness-less benches.
                "--bench" => {}
                "--students" => a.students = num(&value("--students")),
                "--batch" => a.batch = num(&value("--batch")),
                "--reps" => a.reps = num(&value("--reps")),
                "--window-reps" => a.window_reps = num(&value("--window-reps")),
                "--no-window" => a.window = false,
                "--change-reps" => a.change_reps = num(&value("--change-reps")),
                "--small-reps" => a.small_reps = num(&value("--small-reps")),
                "--ops" => a.ops = num(&value("--ops")),
                "--cpu-reps" => a.cpu_reps = num(&value("--cpu-reps")),
                "--cpu-ops" => a.cpu_ops = num(&value("--cpu-ops")),
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown flag `{other}`")),
            }
        }
        if a.students < 1000 || a.batch == 0 {
            usage("--students must be at least 1000 and --batch positive");
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
        a.raw = raw.into_iter().filter(|s| s != "--bench").collect();
        a
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    bench::num(s, usage)
}

fn usage(err: &str) -> ! {
    bench::usage(
        "cargo bench --bench rank -- [--students N] [--batch N] [--reps N] \
         [--window-reps N] [--no-window] [--change-reps N] [--small-reps N] [--ops N] \
         [--cpu-reps N] [--cpu-ops N]",
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
    let db_name = format!("mp_bench_rank_{}", std::process::id());
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

/// The students picked for the reads and the changes.
struct Picks {
    /// Student 1, at 0.
    bottom: i64,
    /// The first student at 70.
    middle: i64,
}

async fn bench(args: &Args, uri: &str, db: &Database, commands: &Commands) -> BoxResult<String> {
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
        format!("surrogate secantusd-rs (reports version {version})")
    };
    let cmd = if args.raw.is_empty() {
        "cargo bench --bench rank".to_owned()
    } else {
        format!("cargo bench --bench rank -- {}", args.raw.join(" "))
    };
    let mut out = format!(
        "# Rank histogram benchmark: {} students of one exam\n\nCommand: `{cmd}` — server: {server}, client: {} cores, tokio current-thread runtime.\n\n",
        thousands(args.students),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    out += "The surrogate server walks whole collections on range and sort queries whatever the index (counts follow the index bounds) (DESIGN.md, \"The test server\"): read round trips, keys/docs examined and documents written first; wall times are its, not mongod's, so compare them as ratios only.\n\n";

    let middle = (2..args.students)
        .find(|&i| half_points(i) == 140)
        .ok_or("no student at 70")? as i64;
    let picks = Picks { bottom: 1, middle };

    // ---- 1. load ----
    let (loaded, rebuilt) = load(args, db, commands).await?;
    out += &loaded;

    // ---- 4 first: it also warms both repositories (the `hello` that
    // decides on transactions is sent once per repository). ----
    let round_trips = round_trips(args, db, commands, rebuilt).await?;

    // ---- 2. rank reads ----
    out += &reads(args, db, commands, &picks).await?;

    // ---- 3. score changes ----
    out += &changes(args, db, commands, &picks).await?;

    out += &round_trips;

    // ---- 5. generated vs hand-written ----
    out += &generated_vs_hand(args, uri, db, commands).await?;
    Ok(out)
}

// ---------------------------------------------------------------- loading

async fn load_students<T: Exam>(args: &Args, db: &Database) -> BoxResult<Duration> {
    let ranks = T::ranks(db);
    ranks.ensure_indexes().await?;
    let coll = T::collection(db);
    let t = Instant::now();
    let mut i = 0;
    let mut next_report = 200_000;
    while i < args.students {
        let end = (i + args.batch as u64).min(args.students);
        let chunk: Vec<T> = (i..end).map(|j| T::new(j as i64, score_of(j))).collect();
        coll.insert_many(&chunk).await?;
        i = end;
        if i >= next_report {
            eprintln!(
                "  {}: {} loaded, {:.1} s",
                T::COLLECTION,
                thousands(i),
                t.elapsed().as_secs_f64()
            );
            next_report += 200_000;
        }
    }
    Ok(t.elapsed())
}

/// The load table, and how long each layout's `rebuild` took.
async fn load(
    args: &Args,
    db: &Database,
    commands: &Commands,
) -> BoxResult<(String, [Duration; 2])> {
    let n = args.students;
    let mut counts = [0u64; 201];
    for i in 0..n {
        counts[half_points(i) as usize] += 1;
    }
    let distinct = counts.iter().filter(|&&c| c > 0).count();
    // above[h]: students strictly above h half points.
    let mut above = [0u64; 201];
    let mut acc = 0;
    for h in (0..201).rev() {
        above[h] = acc;
        acc += counts[h];
    }

    eprintln!("loading {} students into each design", thousands(n));
    commands.take();
    let array_load = load_students::<Student>(args, db).await?;
    let array_load_rt = commands.take_count();
    let t = Instant::now();
    let counted = Student::ranks(db).rebuild(EXAM).await?;
    let array_rebuild = t.elapsed();
    let array_rebuild_rt = commands.take();
    assert_eq!(counted, n, "rebuild counted every student");
    eprintln!(
        "  array: load {:.1} s, rebuild {:.1} s",
        array_load.as_secs_f64(),
        array_rebuild.as_secs_f64()
    );

    let docs_load = load_students::<StudentDocs>(args, db).await?;
    let docs_load_rt = commands.take_count();
    let t = Instant::now();
    let counted = StudentDocs::ranks(db).rebuild(EXAM).await?;
    let docs_rebuild = t.elapsed();
    let docs_rebuild_rt = commands.take();
    assert_eq!(counted, n, "rebuild counted every student");
    eprintln!(
        "  documents: load {:.1} s, rebuild {:.1} s",
        docs_load.as_secs_f64(),
        docs_rebuild.as_secs_f64()
    );

    let naive: Collection<RankedStudent> = db.collection(NAIVE);
    naive
        .create_index(
            IndexModel::builder()
                .keys(doc! {"examId": 1, "score": -1})
                .build(),
        )
        .await?;
    commands.take();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + args.batch as u64).min(n);
        let chunk: Vec<RankedStudent> = (i..end)
            .map(|j| RankedStudent {
                id: j as i64,
                exam_id: EXAM.to_owned(),
                score: score_of(j),
                rank: above[half_points(j) as usize] as i64 + 1,
            })
            .collect();
        naive.insert_many(&chunk).await?;
        i = end;
    }
    let naive_load = t.elapsed();
    let naive_load_rt = commands.take_count();
    eprintln!("  naive: load {:.1} s", naive_load.as_secs_f64());

    // The histograms agree with the counts loaded.
    let h = Student::ranks(db).histogram(EXAM).await?;
    let hd = StudentDocs::ranks(db).histogram(EXAM).await?;
    assert_eq!(h, hd, "both layouts hold the same histogram");
    assert_eq!(h.len(), distinct);
    for s in &h {
        assert_eq!(s.count, counts[(s.score * 2.0) as usize]);
        assert_eq!(s.rank, above[(s.score * 2.0) as usize] + 1);
    }
    let array_doc = Student::ranks(db)
        .histogram_collection()
        .find_one(doc! {"_id": EXAM})
        .await?
        .ok_or("no array histogram")?;
    let array_bytes = mongo_patterns_testkit::bsonc::to_vec(&array_doc)?.len();
    let docs: Vec<Document> = StudentDocs::ranks(db)
        .histogram_collection()
        .find(doc! {})
        .await?
        .try_collect()
        .await?;
    let docs_bytes: usize = docs
        .iter()
        .map(|d| mongo_patterns_testkit::bsonc::to_vec(d).map_or(0, |v| v.len()))
        .sum();
    commands.take();

    let names = |v: &[(String, Document)]| {
        v.iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let mut out = format!(
        "### Load\n\n{} students, {} distinct scores (half points, 0 to 100; one student alone at 100). Histogram size: array layout 1 document of {} bytes; documents layout {} documents, {} bytes in all.\n\n",
        thousands(n),
        distinct,
        thousands(array_bytes as u64),
        docs.len(),
        thousands(docs_bytes as u64)
    );
    out += "| step | round trips | seconds | students/s |\n| --- | ---: | ---: | ---: |\n";
    let batch = thousands(args.batch as u64);
    for (label, rt, d) in [
        (
            format!("`students` (array layout): `insert_many` in batches of {batch}, index `{{examId: 1, score: -1}}`"),
            array_load_rt.to_string(),
            array_load,
        ),
        (
            format!("… `Ranks::rebuild` (array): {}", names(&array_rebuild_rt)),
            array_rebuild_rt.len().to_string(),
            array_rebuild,
        ),
        (
            format!("`students_docs` (documents layout): `insert_many` in batches of {batch}, same index"),
            docs_load_rt.to_string(),
            docs_load,
        ),
        (
            format!("… `Ranks::rebuild` (documents): {}", names(&docs_rebuild_rt)),
            docs_rebuild_rt.len().to_string(),
            docs_rebuild,
        ),
        (
            format!("`students_naive` (stored rank, computed while loading): `insert_many` in batches of {batch}, same index"),
            naive_load_rt.to_string(),
            naive_load,
        ),
    ] {
        out += &format!(
            "| {label} | {rt} | {:.1} | {:.0} |\n",
            d.as_secs_f64(),
            n as f64 / d.as_secs_f64()
        );
    }
    out += "\n";
    Ok((out, [array_rebuild, docs_rebuild]))
}

// ------------------------------------------------------------ measurement

#[derive(Debug, Clone, Copy, Default)]
struct Explained {
    keys: Option<u64>,
    docs: Option<u64>,
}

fn find_stats(reply: &Document) -> Option<&Document> {
    if let Ok(s) = reply.get_document("executionStats") {
        return Some(s);
    }
    reply.get_array("stages").ok()?.iter().find_map(|st| {
        st.as_document()?
            .get_document("$cursor")
            .ok()?
            .get_document("executionStats")
            .ok()
    })
}

/// A command as sent, without what the driver adds per session.
fn bare(cmd: &Document) -> Document {
    let mut c = cmd.clone();
    for k in [
        "lsid",
        "$clusterTime",
        "$db",
        "txnNumber",
        "$readPreference",
        "autocommit",
        "startTransaction",
    ] {
        c.remove(k);
    }
    c
}

/// `explain` (`executionStats`) of a command as the driver sent it.
async fn explain(db: &Database, sent: &Document) -> BoxResult<Explained> {
    let reply = db
        .run_command(doc! {"explain": bare(sent), "verbosity": "executionStats"})
        .await?;
    Ok(match find_stats(&reply) {
        Some(s) => Explained {
            keys: stat_u64(s, "totalKeysExamined"),
            docs: stat_u64(s, "totalDocsExamined"),
        },
        None => Explained::default(),
    })
}

/// Server-side counters from `serverStatus`.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    updated: i64,
    inserted: i64,
    deleted: i64,
    op_update: i64,
    op_insert: i64,
    op_delete: i64,
    op_command: i64,
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
            inserted: get(docs, "inserted"),
            deleted: get(docs, "deleted"),
            op_update: get(ops, "update"),
            op_insert: get(ops, "insert"),
            op_delete: get(ops, "delete"),
            op_command: get(ops, "command"),
        })
    }

    fn minus(self, o: Counters) -> Counters {
        Counters {
            updated: self.updated - o.updated,
            inserted: self.inserted - o.inserted,
            deleted: self.deleted - o.deleted,
            op_update: self.op_update - o.op_update,
            op_insert: self.op_insert - o.op_insert,
            op_delete: self.op_delete - o.op_delete,
            op_command: self.op_command - o.op_command,
        }
    }
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

// ------------------------------------------------------------- rank reads

/// One way of reading a rank.
struct ReadVariant {
    name: &'static str,
    round_trips: usize,
    commands: String,
    explained: Explained,
    times: Vec<Duration>,
    rank: u64,
}

fn window_pipeline(student: i64) -> Vec<Document> {
    vec![
        doc! {"$match": {"examId": EXAM}},
        doc! {"$setWindowFields": {
            "partitionBy": "$examId",
            "sortBy": {"score": -1},
            "output": {"rank": {"$rank": {}}},
        }},
        doc! {"$match": {"_id": student}},
        doc! {"$project": {"_id": 1, "score": 1, "rank": 1}},
    ]
}

async fn window_rank(coll: &Collection<Document>, student: i64) -> BoxResult<u64> {
    let rows: Vec<Document> = coll
        .aggregate(window_pipeline(student))
        .allow_disk_use(true)
        .await?
        .try_collect()
        .await?;
    let row = rows.first().ok_or("the window found no such student")?;
    Ok(lossy_u64(row.get("rank")).ok_or("no rank in the window's reply")?)
}

async fn count_rank(coll: &Collection<Document>, score: f64) -> BoxResult<u64> {
    let above = coll
        .count_documents(doc! {"examId": EXAM, "score": {"$gt": score}})
        .await?;
    Ok(above + 1)
}

async fn reads(
    args: &Args,
    db: &Database,
    commands: &Commands,
    picks: &Picks,
) -> BoxResult<String> {
    let array = Student::ranks(db);
    let docs = StudentDocs::ranks(db);
    let students: Collection<Document> = db.collection(Student::COLLECTION);
    let cases = [
        ("top", 100.0, 0_i64),
        ("middle", 70.0, picks.middle),
        ("bottom", 0.0, picks.bottom),
    ];
    let mut rows = Vec::new();
    let mut window_explained: Option<Explained> = None;
    for (label, score, student) in cases {
        eprintln!("rank of {score} ({label})");
        let mut vs: Vec<ReadVariant> = Vec::new();
        // Round trips, the commands sent, and a first (timed) call each.
        for v in 0..4 {
            if v == 3 && !args.window {
                continue;
            }
            commands.take();
            let t = Instant::now();
            let rank = match v {
                0 => array.rank(EXAM, score).await?.rank,
                1 => docs.rank(EXAM, score).await?.rank,
                2 => count_rank(&students, score).await?,
                _ => window_rank(&students, student).await?,
            };
            let took = t.elapsed();
            let sent = commands.take();
            let main = sent
                .iter()
                .find(|(n, _)| n == "aggregate")
                .map(|(_, c)| c.clone())
                .ok_or("no aggregate sent")?;
            // `$setWindowFields` examines the whole exam at every score:
            // explained once (it runs the sort again).
            let explained = if v == 3 {
                match window_explained {
                    Some(e) => e,
                    None => {
                        let e = explain(db, &main).await?;
                        window_explained = Some(e);
                        e
                    }
                }
            } else {
                explain(db, &main).await?
            };
            commands.take();
            vs.push(ReadVariant {
                name: [
                    "histogram, array: `Ranks::rank`",
                    "histogram, documents: `Ranks::rank`",
                    "`countDocuments({examId, score: {$gt: s}})` + 1",
                    "`$setWindowFields` `$rank`, `$match` the student",
                ][v],
                round_trips: sent.len(),
                commands: names(&sent),
                explained,
                // The window's first call is one of its timed runs.
                times: if v == 3 { vec![took] } else { Vec::new() },
                rank,
            });
        }
        for w in &vs[1..] {
            if w.rank != vs[0].rank {
                return Err(format!(
                    "rank of {score}: {} says {}, {} says {}",
                    vs[0].name, vs[0].rank, w.name, w.rank
                )
                .into());
            }
        }
        // Wall time, interleaved.
        for _ in 0..args.reps {
            for (v, variant) in vs.iter_mut().enumerate().take(3) {
                let t = Instant::now();
                match v {
                    0 => {
                        black_box(array.rank(EXAM, score).await?);
                    }
                    1 => {
                        black_box(docs.rank(EXAM, score).await?);
                    }
                    _ => {
                        black_box(count_rank(&students, score).await?);
                    }
                }
                variant.times.push(t.elapsed());
            }
        }
        if args.window {
            for _ in 1..args.window_reps {
                let t = Instant::now();
                black_box(window_rank(&students, student).await?);
                vs[3].times.push(t.elapsed());
            }
        }
        commands.take();
        eprintln!(
            "  {}",
            vs.iter()
                .map(|v| format!("{:.1} ms", ms(median(&mut v.times.clone()))))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push((label, score, vs));
    }

    let mut out = String::new();
    out += "### Rank of a score: histogram vs counting vs `$setWindowFields`\n\n";
    out += &format!(
        "The rank is 1 + the students with a better score (ties share it). Round trips: commands seen by command monitoring around one call. Keys/docs examined: `explain` (`executionStats`) of the exact aggregate each sent (`countDocuments` is the driver's `$match` + `$group` aggregate; the students' index is `{{examId: 1, score: -1}}`). `$setWindowFields` sorts the whole exam at every score, so it is explained once (at the top score) and timed {} time(s) per score (its first, monitored call included); the others are timed {} times each, interleaved, median reported. `Ranks::rank` also returns the dense rank, the ties and the total in the same reply; counting gives the rank only.\n\n",
        args.window_reps, args.reps
    );
    out += "| score | design | rank | round trips | commands | keys examined | docs examined | ms (median) | time ÷ histogram array |\n| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n";
    for (label, score, vs) in &mut rows {
        let base = median(&mut vs[0].times.clone());
        for v in vs.iter_mut() {
            let m = median(&mut v.times);
            out += &format!(
                "| {score} ({label}) | {} | {} | {} | {} | {} | {} | {:.2} | {:.1}× |\n",
                v.name,
                thousands(v.rank),
                v.round_trips,
                v.commands,
                opt(v.explained.keys),
                opt(v.explained.docs),
                ms(m),
                m.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
    if !args.window {
        out += "\n`$setWindowFields` skipped (`--no-window`).\n";
    }
    out += "\n";
    Ok(out)
}

// ----------------------------------------------------------- score changes

/// The stored-rank design's score change, done correctly: the mover's new
/// rank is counted (1 + the others strictly above the new score), its score
/// and rank are set (reading the old score back), then every student the
/// change passes gets ±1. Three round trips, no transaction.
async fn naive_change(coll: &Collection<Document>, id: i64, new: f64) -> BoxResult<u64> {
    let above = coll
        .count_documents(doc! {"examId": EXAM, "score": {"$gt": new}, "_id": {"$ne": id}})
        .await?;
    let before = coll
        .find_one_and_update(
            doc! {"_id": id},
            doc! {"$set": {"score": new, "rank": above as i64 + 1}},
        )
        .projection(doc! {"score": 1})
        .await?
        .ok_or("no such student")?;
    let old = before.get_f64("score")?;
    // Down: those in [new, old) had the mover above them and no longer do.
    // Up: those in [old, new) now have the mover above them.
    let (range, by) = if new < old {
        (doc! {"$gte": new, "$lt": old}, -1_i64)
    } else if new > old {
        (doc! {"$gte": old, "$lt": new}, 1_i64)
    } else {
        return Ok(0);
    };
    let r = coll
        .update_many(
            doc! {"examId": EXAM, "score": range, "_id": {"$ne": id}},
            doc! {"$inc": {"rank": by}},
        )
        .await?;
    Ok(r.modified_count)
}

/// The stored ranks at some scores (and the mover's) equal the histogram's.
async fn check_naive(
    naive: &Collection<Document>,
    ranks: &Ranks<Student>,
    mover: i64,
) -> BoxResult<usize> {
    let mut checked = 0;
    for s in [0.0, 0.5, 35.0, 50.0, 69.5, 70.0, 70.5, 90.0, 99.5, 100.0] {
        let Some(d) = naive.find_one(doc! {"examId": EXAM, "score": s}).await? else {
            continue;
        };
        let stored = lossy_u64(d.get("rank")).ok_or("no stored rank")?;
        let want = ranks.rank(EXAM, s).await?.rank;
        if stored != want {
            return Err(format!(
                "stored rank {stored} at {s} (student {}), the histogram says {want}",
                d.get("_id").map_or("?".into(), |b| b.to_string())
            )
            .into());
        }
        checked += 1;
    }
    let d = naive
        .find_one(doc! {"_id": mover})
        .await?
        .ok_or("no mover")?;
    let s = d.get_f64("score")?;
    let stored = lossy_u64(d.get("rank")).ok_or("no stored rank")?;
    let want = ranks.rank(EXAM, s).await?.rank;
    if stored != want {
        return Err(
            format!("the mover's stored rank is {stored}, the histogram says {want}").into(),
        );
    }
    Ok(checked + 1)
}

struct ChangeRow {
    scenario: String,
    design: String,
    round_trips: usize,
    commands: String,
    /// Players' documents written, from the results.
    players: u64,
    /// Histogram documents written (from the server's counters).
    delta: Counters,
    times: Vec<Duration>,
}

/// Runs `f` once with command monitoring and `serverStatus` around it.
async fn measured<F, Fut>(
    db: &Database,
    commands: &Commands,
    baseline: Counters,
    f: F,
) -> BoxResult<(u64, Vec<(String, Document)>, Counters, Duration)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = BoxResult<u64>>,
{
    let before = Counters::read(db).await?;
    commands.take();
    let t = Instant::now();
    let players = f().await?;
    let took = t.elapsed();
    let sent = commands.take();
    let after = Counters::read(db).await?;
    commands.take();
    Ok((players, sent, after.minus(before).minus(baseline), took))
}

fn add_row(
    rows: &mut Vec<ChangeRow>,
    scenario: &str,
    design: &str,
    (players, sent, delta, took): (u64, Vec<(String, Document)>, Counters, Duration),
) {
    if let Some(r) = rows
        .iter_mut()
        .find(|r| r.scenario == scenario && r.design == design)
    {
        r.times.push(took);
        return;
    }
    rows.push(ChangeRow {
        scenario: scenario.to_owned(),
        design: design.to_owned(),
        round_trips: sent.len(),
        commands: names(&sent),
        players,
        delta,
        times: vec![took],
    });
}

async fn changes(
    args: &Args,
    db: &Database,
    commands: &Commands,
    picks: &Picks,
) -> BoxResult<String> {
    let array = Student::ranks(db);
    let docs = StudentDocs::ranks(db);
    let naive: Collection<Document> = db.collection(NAIVE);
    warm(&array, commands).await?;
    warm(&docs, commands).await?;
    // What two `serverStatus` calls in a row count, to subtract.
    let a = Counters::read(db).await?;
    let b = Counters::read(db).await?;
    let baseline = b.minus(a);
    let mut rows: Vec<ChangeRow> = Vec::new();
    let mut checks = 0;
    checks += check_naive(&naive, &array, 0).await?;

    let scenarios = [
        (
            "the top student drops to 0",
            "… and is restored to 100",
            0_i64,
            100.0,
            0.0,
            args.change_reps,
        ),
        (
            "a typical change: 70 → 70.5",
            "… and back: 70.5 → 70",
            picks.middle,
            70.0,
            70.5,
            args.small_reps,
        ),
    ];
    for (there, back, id, old, new, reps) in scenarios {
        for rep in 0..reps {
            eprintln!("{there} (rep {})", rep + 1);
            for (scenario, from, to) in [(there, old, new), (back, new, old)] {
                // Histogram only, both layouts, there and back (the
                // students' documents are not touched).
                let m = measured(db, commands, baseline, || async {
                    array.change(EXAM, from, to).await?;
                    Ok(0)
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "histogram only, array: `Ranks::change`",
                    m,
                );
                let m = measured(db, commands, baseline, || async {
                    docs.change(EXAM, from, to).await?;
                    Ok(0)
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "histogram only, documents: `Ranks::change`",
                    m,
                );
            }
            // Then the student itself moves there and back, in each design.
            for (scenario, to) in [(there, new), (back, old)] {
                let m = measured(db, commands, baseline, || async {
                    let hit = array.update_score(doc! {"_id": id}, to).await?;
                    Ok(u64::from(hit))
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "student + histogram, array: `Ranks::update_score`",
                    m,
                );
                let m = measured(db, commands, baseline, || async {
                    let hit = docs.update_score(doc! {"_id": id}, to).await?;
                    Ok(u64::from(hit))
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "student + histogram, documents: `Ranks::update_score`",
                    m,
                );
                let m = measured(db, commands, baseline, || async {
                    let passed = naive_change(&naive, id, to).await?;
                    Ok(1 + passed)
                })
                .await?;
                eprintln!(
                    "  {scenario}: naive wrote {} students in {:.1} s",
                    thousands(m.0),
                    m.3.as_secs_f64()
                );
                add_row(
                    &mut rows,
                    scenario,
                    "stored rank (naive): count + `findAndModify` + `updateMany`",
                    m,
                );
                checks += check_naive(&naive, &array, id).await?;
            }
        }
    }
    // Both layouts still agree with the players' documents.
    let h = array.histogram(EXAM).await?;
    assert_eq!(h, docs.histogram(EXAM).await?);
    assert_eq!(array.rebuild(EXAM).await?, args.students);
    assert_eq!(h, array.histogram(EXAM).await?, "no drift (array)");
    docs.rebuild(EXAM).await?;
    assert_eq!(h, docs.histogram(EXAM).await?, "no drift (documents)");
    commands.take();

    let mut out = String::new();
    out += "### Score changes: histogram vs stored rank\n\n";
    out += &format!(
        "`Ranks::update_score({{_id}}, new)` sets the student's score and moves it on the histogram in one transaction (the surrogate reports a replica set). `Ranks::change(old, new)` is the histogram write alone. The stored-rank design (each student document holds its `rank`) must count the mover's new rank, set its score and rank, and `$inc` the rank of every student between the old and the new score (`updateMany({{examId, score: {{$gte: lo, $lt: hi}}, _id: {{$ne: id}}}})`); it runs without a transaction here. Students' documents written: the results (`update_score`'s match, `findAndModify` + the `updateMany`'s `modifiedCount`). Server Δ: `serverStatus` `metrics.document` (updated / inserted / deleted) and `opcounters.update`, before minus after, less what two `serverStatus` calls count. Stored ranks were checked against the histogram's after every change ({checks} checks, all equal); both histograms were checked against `rebuild` at the end. Time: median of {} (top student) / {} (70 → 70.5) repetitions.\n\n",
        args.change_reps, args.small_reps
    );
    out += "| change | design | round trips | commands | students' documents written | server Δ documents updated / inserted / deleted | server Δ `opcounters.update` | ms (median) | time ÷ `update_score` array |\n| --- | --- | ---: | --- | ---: | :---: | ---: | ---: | ---: |\n";
    let scenarios: Vec<String> = {
        let mut s: Vec<String> = Vec::new();
        for r in &rows {
            if !s.contains(&r.scenario) {
                s.push(r.scenario.clone());
            }
        }
        s
    };
    for sc in &scenarios {
        let base = rows
            .iter()
            .find(|r| {
                &r.scenario == sc && r.design.contains("update_score") && r.design.contains("array")
            })
            .map(|r| median(&mut r.times.clone()))
            .unwrap_or(Duration::from_nanos(1));
        for r in rows.iter_mut().filter(|r| &r.scenario == sc) {
            let m = median(&mut r.times);
            out += &format!(
                "| {} | {} | {} | {} | {} | {} / {} / {} | {} | {:.2} | {:.2}× |\n",
                r.scenario,
                r.design,
                r.round_trips,
                r.commands,
                thousands(r.players),
                thousands_i(r.delta.updated),
                thousands_i(r.delta.inserted),
                thousands_i(r.delta.deleted),
                r.delta.op_update,
                ms(m),
                m.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
    out += "\n";
    Ok(out)
}

// ------------------------------------------------- round trips per call

struct OpStats {
    name: &'static str,
    /// [array, documents]
    rts: [Vec<usize>; 2],
    cmds: [String; 2],
    times: [Vec<Duration>; 2],
}

async fn one_op<T: Exam>(ranks: &Ranks<T>, op: usize, k: i64) -> BoxResult<()> {
    let id = SCRATCH_ID + k;
    match op {
        0 => ranks.record(EXAM, 42.5).await?,
        1 => ranks.change(EXAM, 42.5, 43.0).await?,
        2 => ranks.remove(EXAM, 43.0).await?,
        3 => {
            black_box(ranks.rank(EXAM, 70.0).await?);
        }
        4 => {
            black_box(ranks.top(EXAM, 10).await?);
        }
        5 => {
            black_box(ranks.histogram(EXAM).await?);
        }
        6 => ranks.insert(&T::new(id, 55.0)).await?,
        7 => {
            if !ranks.update_score(doc! {"_id": id}, 56.0).await? {
                return Err("update_score matched nothing".into());
            }
        }
        _ => {
            if !ranks.delete(doc! {"_id": id}).await? {
                return Err("delete matched nothing".into());
            }
        }
    }
    Ok(())
}

/// Inserts and deletes a scratch student, so that the repository has asked
/// whether the deployment runs transactions; returns the insert's commands.
async fn warm<T: Exam>(
    ranks: &Ranks<T>,
    commands: &Commands,
) -> BoxResult<Vec<(String, Document)>> {
    commands.take();
    ranks.insert(&T::new(SCRATCH_ID - 1, 50.0)).await?;
    let sent = commands.take();
    if !ranks.delete(doc! {"_id": SCRATCH_ID - 1}).await? {
        return Err("the scratch student is gone".into());
    }
    commands.take();
    Ok(sent)
}

const OPS: [&str; 9] = [
    "`record(exam, 42.5)`",
    "`change(exam, 42.5, 43)`",
    "`remove(exam, 43)`",
    "`rank(exam, 70)`",
    "`top(exam, 10)`",
    "`histogram(exam)` (all scores)",
    "`insert(student)` (student + histogram)",
    "`update_score({_id}, 56)` (student + histogram)",
    "`delete({_id})` (student + histogram)",
];

async fn round_trips(
    args: &Args,
    db: &Database,
    commands: &Commands,
    rebuilt: [Duration; 2],
) -> BoxResult<String> {
    eprintln!("round trips per call ({} each)", args.ops);
    let array = Student::ranks(db);
    let docs = StudentDocs::ranks(db);
    let mut stats: Vec<OpStats> = OPS
        .iter()
        .map(|&name| OpStats {
            name,
            rts: [Vec::new(), Vec::new()],
            cmds: [String::new(), String::new()],
            times: [Vec::new(), Vec::new()],
        })
        .collect();
    // The first student write of a repository value sends `hello` (does
    // the deployment run transactions?): seen here, then warm.
    let first_insert = warm(&array, commands).await?;
    warm(&docs, commands).await?;
    let before = array.histogram(EXAM).await?;
    for k in 0..args.ops as i64 {
        for (op, st) in stats.iter_mut().enumerate() {
            for layout in 0..2 {
                commands.take();
                let t = Instant::now();
                if layout == 0 {
                    one_op(&array, op, k).await?;
                } else {
                    one_op(&docs, op, k).await?;
                }
                st.times[layout].push(t.elapsed());
                let sent = commands.take();
                st.rts[layout].push(sent.len());
                if k == 0 {
                    st.cmds[layout] = names(&sent);
                }
            }
        }
    }
    assert_eq!(before, array.histogram(EXAM).await?, "net zero (array)");
    assert_eq!(before, docs.histogram(EXAM).await?, "net zero (documents)");
    commands.take();

    let mut out = format!(
        "### Round trips per call, both layouts ({} calls each)\n\nOn exam_001 (its {} distinct scores, {} students), interleaved: `record` + `change` + `remove` (net zero), the reads, then `insert` + `update_score` + `delete` of a new student (net zero). Round trips: commands seen by command monitoring per call (mean and max over the calls); commands: those of the first call. The student writes run in a transaction (the surrogate reports a replica set). Time: median, surrogate, ratio to `rank` of the same layout.\n\n",
        args.ops,
        before.len(),
        thousands(args.students)
    );
    out += "| call | round trips array (mean / max) | commands array | round trips documents (mean / max) | commands documents | ms array / documents (median) | time ÷ `rank` array / documents |\n| --- | :---: | --- | :---: | --- | :---: | :---: |\n";
    let rank_m = [
        median(&mut stats[3].times[0].clone()),
        median(&mut stats[3].times[1].clone()),
    ];
    for st in &mut stats {
        let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len() as f64;
        let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        let (ma, md) = (median(&mut st.times[0]), median(&mut st.times[1]));
        out += &format!(
            "| {} | {:.2} / {} | {} | {:.2} / {} | {} | {:.2} / {:.2} | {:.1}× / {:.1}× |\n",
            st.name,
            mean(&st.rts[0]),
            max(&st.rts[0]),
            st.cmds[0],
            mean(&st.rts[1]),
            max(&st.rts[1]),
            st.cmds[1],
            ms(ma),
            ms(md),
            ma.as_secs_f64() / rank_m[0].as_secs_f64(),
            md.as_secs_f64() / rank_m[1].as_secs_f64(),
        );
    }
    out += "\n";
    let n = args.students as f64;
    let (ra, rd) = (
        median(&mut stats[0].times[0].clone()),
        median(&mut stats[0].times[1].clone()),
    );
    out += &format!(
        "The first student write of a new `Ranks` value sends one more command first: {} (the repository asks once whether the deployment runs transactions; clones share the answer, a new `T::ranks(&db)` asks again). The calls above ran on warmed repositories.\n\n",
        names(&first_insert)
    );
    out += &format!(
        "Loading the histogram by `record`, one call per student, would take about {} × the median `record` above: {:.0} s (array) / {:.0} s (documents) for {} round trips, where `rebuild` took {:.1} s / {:.1} s.\n\n",
        thousands(args.students),
        n * ra.as_secs_f64(),
        n * rd.as_secs_f64(),
        thousands(args.students),
        rebuilt[0].as_secs_f64(),
        rebuilt[1].as_secs_f64()
    );
    Ok(out)
}

// ------------------------------------------- generated vs hand-written

/// The rank aggregation written by hand, array layout.
fn array_rank_by_hand(score: f64) -> Vec<Document> {
    vec![
        doc! {"$match": {"_id": EXAM}},
        doc! {"$project": {
            "_id": 0,
            "above": {"$sum": {"$map": {
                "input": {"$filter": {"input": "$scores", "as": "e", "cond": {"$gt": ["$$e.score", score]}}},
                "as": "e", "in": "$$e.count",
            }}},
            "distinctAbove": {"$size": {"$filter": {
                "input": "$scores", "as": "e",
                "cond": {"$and": [{"$gt": ["$$e.score", score]}, {"$gt": ["$$e.count", 0]}]},
            }}},
            "ties": {"$sum": {"$map": {
                "input": {"$filter": {"input": "$scores", "as": "e", "cond": {"$eq": ["$$e.score", score]}}},
                "as": "e", "in": "$$e.count",
            }}},
            "total": {"$sum": {"$map": {"input": "$scores", "as": "e", "in": "$$e.count"}}},
        }},
    ]
}

/// The rank aggregation written by hand, documents layout.
fn docs_rank_by_hand(score: f64) -> Vec<Document> {
    vec![
        doc! {"$match": {"_id": {
            "$gte": {"b": EXAM, "s": Bson::MinKey},
            "$lte": {"b": EXAM, "s": Bson::MaxKey},
        }}},
        doc! {"$group": {
            "_id": Bson::Null,
            "above": {"$sum": {"$cond": [{"$gt": ["$_id.s", score]}, "$count", 0]}},
            "distinctAbove": {"$sum": {"$cond": [
                {"$and": [{"$gt": ["$_id.s", score]}, {"$gt": ["$count", 0]}]}, 1, 0,
            ]}},
            "ties": {"$sum": {"$cond": [{"$eq": ["$_id.s", score]}, "$count", 0]}},
            "total": {"$sum": "$count"},
        }},
    ]
}

/// What a hand-written caller reads from the reply.
#[derive(Debug, PartialEq)]
struct HandRank {
    rank: u64,
    dense: u64,
    ties: u64,
    total: u64,
}

async fn rank_by_hand(coll: &Collection<Document>, pipeline: Vec<Document>) -> BoxResult<HandRank> {
    let mut cursor = coll.aggregate(pipeline).await?;
    let d = cursor.try_next().await?.ok_or("unknown exam")?;
    let get = |k: &str| lossy_u64(d.get(k)).ok_or_else(|| format!("no `{k}` in {d}"));
    Ok(HandRank {
        rank: get("above")? + 1,
        dense: get("distinctAbove")? + 1,
        ties: get("ties")?,
        total: get("total")?,
    })
}

/// The histogram change written by hand, array layout: one pipeline update
/// of the exam's document, `-1` at `old` and `+1` at `new` (inserted in
/// order when new), emptied scores dropped.
async fn array_change_by_hand(coll: &Collection<Document>, old: f64, new: f64) -> BoxResult<()> {
    let step = |arr: Bson, s: f64, by: i64| -> Bson {
        bson::bson!({"$let": {
            "vars": {"a": arr},
            "in": {"$cond": [
                {"$in": [s, {"$map": {"input": "$$a", "as": "e", "in": "$$e.score"}}]},
                {"$map": {"input": "$$a", "as": "e", "in": {"$cond": [
                    {"$eq": ["$$e.score", s]},
                    {"$mergeObjects": ["$$e", {"count": {"$add": ["$$e.count", by]}}]},
                    "$$e",
                ]}}},
                {"$concatArrays": [
                    {"$filter": {"input": "$$a", "as": "e", "cond": {"$gt": ["$$e.score", s]}}},
                    [{"score": s, "count": by}],
                    {"$filter": {"input": "$$a", "as": "e", "cond": {"$lt": ["$$e.score", s]}}},
                ]},
            ]},
        }})
    };
    let arr = Bson::from(doc! {"$ifNull": ["$scores", []]});
    let arr = step(step(arr, old, -1), new, 1);
    let pipeline = vec![doc! {"$set": {"scores": {"$filter": {
        "input": arr, "as": "e", "cond": {"$gt": ["$$e.count", 0]},
    }}}}];
    let filter = doc! {
        "_id": EXAM,
        "scores": {"$elemMatch": {"score": old, "count": {"$gt": 0}}},
        "$or": [{"scores.score": new}, {"scores.99999": {"$exists": false}}],
    };
    let r = coll.update_one(filter, pipeline).upsert(false).await?;
    if r.matched_count != 1 {
        return Err("nobody holds the old score".into());
    }
    Ok(())
}

/// The histogram change written by hand, documents layout: one `update`
/// command of two statements.
async fn docs_change_by_hand(db: &Database, old: f64, new: f64) -> BoxResult<()> {
    let reply = db
        .run_command(doc! {
            "update": "students_docs_ranks",
            "updates": [
                {"q": {"_id": {"b": EXAM, "s": old}, "count": {"$gt": 0}}, "u": {"$inc": {"count": -1_i64}}},
                {"q": {"_id": {"b": EXAM, "s": new}}, "u": {"$inc": {"count": 1_i64}}, "upsert": true},
            ],
            "ordered": true,
        })
        .await?;
    if reply.get_array("writeErrors").is_ok_and(|e| !e.is_empty()) {
        return Err(format!("write error: {reply}").into());
    }
    if lossy_u64(reply.get("n")) != Some(2) {
        return Err("nobody holds the old score".into());
    }
    Ok(())
}

struct Ctx {
    db: Database,
    array: Ranks<Student>,
    docs: Ranks<StudentDocs>,
    array_hist: Collection<Document>,
    docs_hist: Collection<Document>,
}

impl Ctx {
    fn new(db: &Database) -> Ctx {
        let array = Student::ranks(db);
        let docs = StudentDocs::ranks(db);
        Ctx {
            db: db.clone(),
            array_hist: array.histogram_collection().clone(),
            docs_hist: docs.histogram_collection().clone(),
            array,
            docs,
        }
    }

    /// Operation `op` (rank array, rank documents, change array, change
    /// documents), generated or by hand; changes alternate 70 → 70.5 and back
    /// by `k`.
    async fn run(&self, op: usize, hand: bool, k: u64) -> BoxResult<()> {
        let (from, to) = if k.is_multiple_of(2) {
            (70.0, 70.5)
        } else {
            (70.5, 70.0)
        };
        match (op, hand) {
            (0, false) => {
                black_box(self.array.rank(EXAM, 70.0).await?);
            }
            (0, true) => {
                black_box(rank_by_hand(&self.array_hist, array_rank_by_hand(70.0)).await?);
            }
            (1, false) => {
                black_box(self.docs.rank(EXAM, 70.0).await?);
            }
            (1, true) => {
                black_box(rank_by_hand(&self.docs_hist, docs_rank_by_hand(70.0)).await?);
            }
            (2, false) => self.array.change(EXAM, from, to).await?,
            (2, true) => array_change_by_hand(&self.array_hist, from, to).await?,
            (3, false) => self.docs.change(EXAM, from, to).await?,
            _ => docs_change_by_hand(&self.db, from, to).await?,
        }
        Ok(())
    }
}

const HAND_OPS: [&str; 4] = [
    "`rank`, array (aggregate `$match` + `$project`)",
    "`rank`, documents (aggregate `$match` + `$group`)",
    "`change` 70 ⇄ 70.5, array (pipeline `updateOne`)",
    "`change` 70 ⇄ 70.5, documents (`update` of 2 statements)",
];

async fn generated_vs_hand(
    args: &Args,
    uri: &str,
    db: &Database,
    commands: &Commands,
) -> BoxResult<String> {
    eprintln!("generated vs hand-written");
    // The hand-written pipelines are the ones `rank_pipeline` gives.
    let (b, s) = (Bson::String(EXAM.into()), Bson::Double(70.0));
    assert_eq!(
        Student::ranks(db).rank_pipeline(&b, &s),
        array_rank_by_hand(70.0)
    );
    assert_eq!(
        StudentDocs::ranks(db).rank_pipeline(&b, &s),
        docs_rank_by_hand(70.0)
    );
    // Same commands, same answers, on the monitored client.
    let ctx = Ctx::new(db);
    let want = ctx.array.rank(EXAM, 70.0).await?;
    for (op, name) in HAND_OPS.iter().enumerate() {
        let mut sent = [Vec::new(), Vec::new()];
        for k in 0..2 {
            for (v, hand) in [false, true].into_iter().enumerate() {
                commands.take();
                ctx.run(op, hand, k).await?;
                let mut c = commands.take();
                sent[v].append(&mut c);
            }
        }
        let strip = |v: &[(String, Document)]| -> Vec<(String, Document)> {
            v.iter().map(|(n, c)| (n.clone(), bare(c))).collect()
        };
        if strip(&sent[0]) != strip(&sent[1]) {
            return Err(format!(
                "{name}: the commands differ:\n generated {:?}\n by hand   {:?}",
                strip(&sent[0]),
                strip(&sent[1])
            )
            .into());
        }
    }
    let hand = rank_by_hand(&ctx.array_hist, array_rank_by_hand(70.0)).await?;
    let gen = HandRank {
        rank: want.rank,
        dense: want.dense,
        ties: want.ties,
        total: want.total,
    };
    assert_eq!(hand, gen, "hand-written rank equals the generated one");
    assert_eq!(
        rank_by_hand(&ctx.docs_hist, docs_rank_by_hand(70.0)).await?,
        gen
    );
    let rts: Vec<usize> = {
        let mut v = Vec::new();
        for op in 0..4 {
            commands.take();
            ctx.run(op, false, 0).await?;
            v.push(commands.take_count());
            ctx.run(op, true, 1).await?;
            commands.take();
        }
        v
    };

    // CPU, on a client without command monitoring.
    let plain = Client::with_uri_str(uri).await?;
    let pctx = Ctx::new(&plain.database(db.name()));
    for op in 0..4 {
        for hand in [false, true] {
            pctx.run(op, hand, 0).await?;
            pctx.run(op, hand, 1).await?;
        }
    }
    let ops = args.cpu_ops as u64;
    // [op][generated | hand]
    let mut cpu: Vec<[Vec<f64>; 2]> = (0..4).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut ticks = [[0u64; 2]; 4];
    for rep in 0..args.cpu_reps {
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for op in 0..4 {
            for &v in &order {
                let (c0, t0) = (cpu_ns(), cpu_ticks());
                for k in 0..ops {
                    pctx.run(op, v == 1, k).await?;
                }
                cpu[op][v].push((cpu_ns() - c0) as f64);
                ticks[op][v] += cpu_ticks() - t0;
            }
        }
    }
    plain.shutdown().await;
    assert_eq!(
        ctx.array.rank(EXAM, 70.0).await?,
        want,
        "the changes went there and back"
    );

    let mut out = format!(
        "### Generated vs hand-written: client CPU, {} interleaved repetitions of {} calls\n\n",
        args.cpu_reps, ops
    );
    out += "Hand-written: the same commands through a `Collection<Document>` (the rank pipelines written out by hand and checked equal to `rank_pipeline`; the `change` filter and pipeline update reproduced from the source); every command of both was checked equal, field by field, on the monitored client. Client CPU is this process's on-CPU time over its threads (`/proc/self/task/*/schedstat`), on a client without command monitoring; the server's CPU is not included. Changes alternate 70 → 70.5 and back.\n\n";
    out += "| call | round trips generated / hand | µs CPU per call generated (median rep) | µs CPU per call hand (median rep) | CPU generated ÷ hand (ratio of medians) | per-rep ratio median (min – max) | utime+stime ticks generated / hand |\n| --- | :---: | ---: | ---: | ---: | :---: | :---: |\n";
    for (op, name) in HAND_OPS.iter().enumerate() {
        let per_rep: Vec<f64> = {
            let mut r: Vec<f64> = cpu[op][0]
                .iter()
                .zip(&cpu[op][1])
                .map(|(g, h)| g / h)
                .collect();
            r.sort_by(f64::total_cmp);
            r
        };
        let mut g = cpu[op][0].clone();
        let mut h = cpu[op][1].clone();
        g.sort_by(f64::total_cmp);
        h.sort_by(f64::total_cmp);
        let (gm, hm) = (median_f64(&g), median_f64(&h));
        out += &format!(
            "| {name} | {} / {} | {:.1} | {:.1} | {:.3} | {:.3} ({:.3} – {:.3}) | {} / {} |\n",
            rts[op],
            rts[op],
            gm / ops as f64 / 1e3,
            hm / ops as f64 / 1e3,
            gm / hm,
            median_f64(&per_rep),
            per_rep[0],
            per_rep[per_rep.len() - 1],
            ticks[op][0],
            ticks[op][1]
        );
    }
    out += "\n";
    Ok(out)
}

// ------------------------------------------------------------ helpers

fn thousands_i(n: i64) -> String {
    if n < 0 {
        format!("-{}", thousands(n.unsigned_abs()))
    } else {
        thousands(n as u64)
    }
}
