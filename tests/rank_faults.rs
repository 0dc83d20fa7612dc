//! The rank histogram under faults: calls cut by timeouts, sixteen writers
//! on one board, documents another client damaged, a deployment without
//! transactions, a server killed and restarted. After each, the stored
//! histogram is read with the raw driver and checked against the players.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::{Layout, RankHistogram};
use mongo_patterns::Error;
use mongo_patterns_testkit::{bounded, client, FaultServer, OwnServer, ServerOptions};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "fault_scores")]
#[rank_histogram(precision = 0.5)]
struct ArrayScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "fault_scores_docs")]
#[rank_histogram(
    board = "examId",
    score = "score",
    precision = 0.5,
    layout = "documents"
)]
struct DocsScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// Every model's declarations: the fault suites set their validators at
/// `strict` (`testkit::strict_validators`), so that nothing these faults
/// make the repositories write, retry or repair may break the pattern's
/// invariants.
fn declared(db: &Database) -> Vec<mongo_patterns::ensure::Declared> {
    [ArrayScore::declared(db), DocsScore::declared(db)].concat()
}

/// A fresh database with [`declared`]'s validators at `strict`. A test
/// that stores a broken document on purpose takes the test kit's own
/// `fresh_db`.
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    mongo_patterns_testkit::fresh_db_strict(test, declared).await
}

trait Exam: RankHistogram<Board = String, Score = f64> + Clone {
    fn new(student: String, exam: &str, score: f64) -> Self;
}

impl Exam for ArrayScore {
    fn new(student: String, exam: &str, score: f64) -> Self {
        ArrayScore {
            student,
            exam_id: exam.to_owned(),
            score,
        }
    }
}

impl Exam for DocsScore {
    fn new(student: String, exam: &str, score: f64) -> Self {
        DocsScore {
            student,
            exam_id: exam.to_owned(),
            score,
        }
    }
}

/// The board as stored, read with the raw driver: score in half points →
/// count. Panics on a score stored twice or a count below 1.
async fn stored<T: Exam>(db: &Database, board: &str) -> BTreeMap<i64, i64> {
    held::<T>(db, board, false).await
}

/// [`stored`], where `zeros_ok` lets a score stay at count 0 (left out of
/// the map): what a call cut between the fallback's `update` and `delete`
/// commands leaves.
async fn held<T: Exam>(db: &Database, board: &str, zeros_ok: bool) -> BTreeMap<i64, i64> {
    let hist = db.collection::<Document>(T::RANK.histogram);
    let mut out = BTreeMap::new();
    let mut put = |s: &Bson, c: i64| {
        let s = (s.as_f64().unwrap_or_else(|| panic!("score {s}")) * 2.0) as i64;
        if zeros_ok && c == 0 {
            return;
        }
        assert!(c >= 1, "count {c} stored at {s}/2");
        assert!(out.insert(s, c).is_none(), "score {s}/2 stored twice");
    };
    match T::RANK.layout {
        Layout::Array => {
            if let Some(d) = hist.find_one(doc! {"_id": board}).await.unwrap() {
                for e in d.get_array("scores").unwrap() {
                    let e = e.as_document().unwrap();
                    put(e.get("score").unwrap(), e.get_i64("count").unwrap());
                }
            }
        }
        Layout::Documents => {
            let docs: Vec<Document> = hist
                .find(doc! {"_id.b": board})
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            for d in docs {
                let s = d.get_document("_id").unwrap().get("s").unwrap().clone();
                let c = d.get_i64("count").unwrap();
                if s == Bson::MinKey {
                    assert_eq!(c, 0, "the board's marker");
                    continue;
                }
                put(&s, c);
            }
        }
    }
    out
}

/// The players of `board` regrouped by score, read with the raw driver.
async fn regrouped<T: Exam>(db: &Database, board: &str) -> BTreeMap<i64, i64> {
    let docs: Vec<Document> = db
        .collection::<Document>(T::COLLECTION)
        .find(doc! {"examId": board})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for d in docs {
        *out.entry((d.get_f64("score").unwrap() * 2.0) as i64)
            .or_default() += 1;
    }
    out
}

/// The invariant: the histogram is the players regrouped.
async fn assert_consistent<T: Exam>(db: &Database, board: &str, when: &str) {
    consistent::<T>(db, board, when, false).await
}

async fn consistent<T: Exam>(db: &Database, board: &str, when: &str, zeros_ok: bool) {
    assert_eq!(
        held::<T>(db, board, zeros_ok).await,
        regrouped::<T>(db, board).await,
        "{when}: histogram vs players"
    );
}

/// Cut windows that follow the machine: each window is 0 to 2× a scale,
/// so that some calls are cut before sending, some with a command in
/// flight, some between commands, some not at all. The scale shrinks after
/// a call that completed and grows after one that was cut, so about half
/// of each stage's calls are cut however fast the server answers (a window
/// fixed by one calibration cut too few calls when the machine sped up);
/// each stage starts again from the calibrated scale.
struct Cuts {
    scale: Duration,
    /// The calibrated scale (a one-command write's): each stage starts
    /// from it, so that a stage of fast calls after one of slow
    /// transactions does not begin with windows too long to cut (a record
    /// stage after the delete stage once cut only 9 of 60).
    base: Duration,
    /// Calls made and cut in the current stage; calls cut in all stages.
    calls: u64,
    stage: u64,
    total: u64,
}

impl Cuts {
    /// Starts at twice the median of five uncut one-command writes, so
    /// that a short stage (the removals, 36 calls at times) cuts enough
    /// before the scale has followed its calls.
    async fn calibrate<T: Exam>(ranks: &Ranks<T>) -> Self {
        // The first write creates the collection: not a typical write.
        bounded(30, ranks.record("calibrate", -1.0).into_future())
            .await
            .unwrap();
        let mut took = Vec::new();
        for i in 0..5 {
            let t = Instant::now();
            bounded(30, ranks.record("calibrate", f64::from(i)).into_future())
                .await
                .unwrap();
            took.push(t.elapsed());
        }
        took.sort_unstable();
        Cuts {
            scale: took[2] * 2,
            base: took[2] * 2,
            calls: 0,
            stage: 0,
            total: 0,
        }
    }

    /// Runs `f` under the `i`th window: `None` if it was cut.
    async fn run<F: std::future::IntoFuture>(&mut self, i: u64, f: F) -> Option<F::Output> {
        let window = self.scale.mul_f64((i % 40) as f64 / 20.0);
        let r = mongo_patterns_testkit::cut_after(window, f).await;
        self.calls += 1;
        if r.is_some() {
            self.scale = self.scale.mul_f64(0.9);
        } else {
            self.scale = self.scale.mul_f64(1.1);
            self.stage += 1;
            self.total += 1;
        }
        r
    }

    /// Ends a stage: a sixth of its calls at least must have been cut.
    fn stage_done(&mut self, what: &str) {
        let (cut, calls) = (self.stage, self.calls);
        eprintln!("{what}: {cut} of {calls} calls cut");
        assert!(cut * 6 >= calls, "{what}: only {cut} of {calls} calls cut");
        (self.calls, self.stage, self.scale) = (0, 0, self.base);
    }
}

const CUTS: u64 = 60;

/// Runs `f` uncut right after cancellations and returns how long it took.
async fn uncut<F: std::future::IntoFuture<Output = Result<R, Error>>, R>(what: &str, f: F) -> R {
    let t = Instant::now();
    let r = bounded(90, f.into_future()).await;
    let took = t.elapsed();
    eprintln!("{what}: uncut call after cancellations took {took:?}");
    let r = r.unwrap_or_else(|e| panic!("{what}: uncut call failed after {took:?}: {e:?}"));
    // What this guards against is a lock held for the server's transaction
    // lifetime (60 s). Less is the server's own: writes it still runs for
    // connections that cut calls closed, on the same document, delay the
    // next write there (up to 1.6 s seen on the test server; the raw
    // driver's `update_one` the same).
    assert!(
        took < Duration::from_secs(5),
        "{what}: uncut call took {took:?}"
    );
    r
}

async fn cancelled_writes<T: Exam>(name: &str, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    // A server before 8.0 refuses `bulkWrite`: there the repository is
    // built without it (a call cut while it learns the refusal is not what
    // this test is about).
    let bulk = bulk && mongo_patterns_testkit::takes_bulk_write(db.client(), name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    let mut cuts = Cuts::calibrate(&ranks).await;
    eprintln!("{name}: cut windows start at 0 to {:?}", cuts.scale * 2);
    // Without `bulkWrite`, a cut call's statements go on in a task of their
    // own: one still running when the board is read may show an emptied
    // score at count 0; the calls read past it.
    let zeros_ok = !bulk;

    // insert
    for i in 0..CUTS {
        let p = T::new(format!("i{i}"), "b", (i % 7) as f64);
        cuts.run(i, ranks.insert(&p)).await;
    }
    cuts.stage_done("insert");
    uncut("insert", ranks.insert(&T::new("fresh".into(), "b", 1.0))).await;
    consistent::<T>(&db, "b", "after cut inserts", zeros_ok).await;

    // update_score, all on one player: the case.
    for i in 0..CUTS {
        let f = ranks.update_score(doc! {"_id": "fresh"}, (i % 20) as f64);
        cuts.run(i, f).await;
    }
    cuts.stage_done("update_score");
    let matched = uncut(
        "update_score",
        ranks.update_score(doc! {"_id": "fresh"}, 3.0),
    )
    .await;
    assert!(matched);
    consistent::<T>(&db, "b", "after cut updates", zeros_ok).await;

    // delete
    for i in 0..CUTS {
        let f = ranks.delete(doc! {"_id": format!("i{i}")});
        cuts.run(i, f).await;
    }
    cuts.stage_done("delete");
    uncut("delete", ranks.delete(doc! {"_id": "fresh"})).await;
    consistent::<T>(&db, "b", "after cut deletes", zeros_ok).await;

    // The histogram alone: a cut call is applied entirely or not at all.
    let total = |m: BTreeMap<i64, i64>| m.values().sum::<i64>();
    let (mut done, mut maybe) = (0_i64, 0_i64);
    for i in 0..CUTS {
        match cuts.run(i, ranks.record("h", (i % 9) as f64)).await {
            Some(r) => {
                r.unwrap();
                done += 1
            }
            None => maybe += 1,
        }
    }
    cuts.stage_done("record");
    uncut("record", ranks.record("h", 1.0)).await;
    let after_records = total(held::<T>(&db, "h", zeros_ok).await);
    assert!(
        (done + 1..=done + 1 + maybe).contains(&after_records),
        "{after_records} records stored, {done} + 1 acknowledged, {maybe} cut"
    );
    for i in 0..CUTS {
        // Move someone off the best score held.
        let now = held::<T>(&db, "h", zeros_ok).await;
        let from = *now.keys().next().unwrap() as f64 / 2.0;
        let f = ranks.change("h", from, ((i % 9) + 1) as f64);
        // A cut change still in flight may have moved that player.
        if let Some(r) = cuts.run(i, f).await {
            assert!(
                matches!(r, Ok(()) | Err(Error::ScoreNotFound { .. })),
                "{r:?}"
            );
        }
    }
    cuts.stage_done("change");
    let now = held::<T>(&db, "h", zeros_ok).await;
    let from = *now.keys().next().unwrap() as f64 / 2.0;
    uncut("change", ranks.change("h", from, 2.0)).await;
    // Each change happened entirely or not at all: the total is conserved.
    assert_eq!(total(held::<T>(&db, "h", zeros_ok).await), after_records);
    let (mut done, mut maybe) = (0_i64, 0_i64);
    let now = held::<T>(&db, "h", zeros_ok).await;
    let mut plan: Vec<f64> = now
        .iter()
        .flat_map(|(s, c)| std::iter::repeat_n(*s as f64 / 2.0, *c as usize))
        .collect();
    let last = plan.pop().unwrap();
    for (i, s) in plan.iter().enumerate() {
        match cuts.run(i as u64, ranks.unrecord("h", *s)).await {
            Some(r) => {
                r.unwrap();
                done += 1
            }
            None => maybe += 1,
        }
    }
    cuts.stage_done("remove");
    uncut("remove", ranks.unrecord("h", last)).await;
    let left = total(held::<T>(&db, "h", zeros_ok).await);
    assert!(
        left <= maybe,
        "{left} left, {maybe} removals cut, {done} done"
    );
    if T::RANK.layout == Layout::Documents {
        let zeros = db
            .collection::<Document>(T::RANK.histogram)
            .find(doc! {"count": 0})
            .await
            .unwrap()
            .try_collect::<Vec<Document>>()
            .await
            .unwrap()
            .iter()
            .filter(|d| d.get_document("_id").unwrap().get("s") != Some(&Bson::MinKey))
            .count();
        eprintln!("{name}: {zeros} scores left at count 0 by cut calls");
        if bulk {
            assert_eq!(zeros, 0, "bulkWrite deletes in the same command");
        }
    }
    // What the calls read skips a score left at 0.
    for board in ["b", "h"] {
        let api: BTreeMap<i64, i64> = ranks
            .histogram(board)
            .await
            .unwrap()
            .iter()
            .map(|s| ((s.score * 2.0) as i64, s.count as i64))
            .collect();
        assert_eq!(api, held::<T>(&db, board, zeros_ok).await, "{board}");
        let r = ranks.rank(board, -1.0).await.unwrap();
        assert_eq!(r.dense as usize, api.len() + 1, "{board}: {r:?}");
        assert_eq!(r.above as i64, api.values().sum::<i64>(), "{board}");
    }
    // `rebuild` clears them.
    ranks.rebuild("b").await.unwrap();
    assert_consistent::<T>(&db, "b", "after rebuild").await;
    eprintln!("{name}: {} calls cut", cuts.total);
}

#[tokio::test]
async fn cancelled_writes_array() {
    bounded(
        240,
        cancelled_writes::<ArrayScore>("rank_f_cancel_array", true),
    )
    .await;
}

#[tokio::test]
async fn cancelled_writes_documents() {
    bounded(
        240,
        cancelled_writes::<DocsScore>("rank_f_cancel_docs", true),
    )
    .await;
}

/// The same with `update` + `delete` commands instead of `bulkWrite`.
#[tokio::test]
async fn cancelled_writes_documents_fallback() {
    bounded(
        240,
        cancelled_writes::<DocsScore>("rank_f_cancel_docs_fb", false),
    )
    .await;
}

/// Cuts `f` while its first write is held 300 ms on the server, so that
/// the write starts the call's transaction after the call has gone; then
/// no transaction may stay open (counted on a server of the test's own: a
/// shared deployment counts other tests' transactions too), and the next
/// writer of the same player must not wait for the server's 60 s
/// transaction lifetime (`uncut`, after each cut).
async fn cut_while_held<F: IntoFuture>(server: &FaultServer, c: &Client, what: &str, f: F) {
    let held = doc! {
        "failCommands": ["insert", "update", "delete", "findAndModify", "bulkWrite"],
        "blockConnection": true,
        "blockTimeMS": 300,
    };
    server.fail(c, Some(1), held).await;
    let cut = tokio::time::timeout(Duration::from_millis(50), f.into_future()).await;
    assert!(cut.is_err(), "{what}: not cut");
    // The held write runs now.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t = Instant::now();
    while let Some(open) = server.open_transactions(c).await {
        if open == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: {open} transactions still open 5 s after the cut"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn late_writes<T: Exam>(server: &FaultServer, c: &Client, name: &str) {
    let db = c.database(&server.db_name(name));
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    let ranks = T::ranks(&db);
    ranks.insert(&T::new("a".into(), "b", 1.0)).await.unwrap();
    let late = T::new("late".into(), "b", 2.0);
    cut_while_held(server, c, "insert", ranks.insert(&late)).await;
    uncut("insert", ranks.insert(&T::new("next".into(), "b", 2.0))).await;
    cut_while_held(
        server,
        c,
        "update_score",
        ranks.update_score(doc! {"_id": "a"}, 3.0),
    )
    .await;
    uncut("update_score", ranks.update_score(doc! {"_id": "a"}, 4.0)).await;
    cut_while_held(server, c, "delete", ranks.delete(doc! {"_id": "a"})).await;
    uncut("delete", ranks.delete(doc! {"_id": "next"})).await;
    assert_consistent::<T>(&db, "b", name).await;
}

/// A call cut while its transaction's first command is still on its way
/// leaves nothing open once that command arrives.
#[tokio::test]
async fn cut_calls_whose_write_arrives_late_hold_nothing() {
    let server = FaultServer::start("cut_calls_whose_write_arrives_late_hold_nothing").await;
    let (c, _) = client(server.uri()).await;
    bounded(120, async {
        late_writes::<ArrayScore>(&server, &c, "late_array").await;
        late_writes::<DocsScore>(&server, &c, "late_docs").await;
    })
    .await;
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

const PLAYERS: usize = 32;

/// `writers` tasks move players of one board for `run`; every call must
/// succeed (none `Contended`). Returns the calls made and the commands they
/// sent.
async fn writers_on_one_board<T: Exam>(
    (db, commands): (Database, mongo_patterns_testkit::Commands),
    writers: usize,
    run: Duration,
    bulk: bool,
) -> (usize, usize) {
    let ranks = T::ranks(&db).bulk_write(bulk);
    for p in 0..PLAYERS {
        ranks
            .insert(&T::new(format!("p{p}"), "hot", 50.0))
            .await
            .unwrap();
    }
    commands.take();
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let ranks = ranks.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9 + w as u64);
            let mut calls = 0;
            while Instant::now() < until {
                let p = rng.below(PLAYERS as u64);
                let s = rng.below(21) as f64 * 5.0;
                let t = Instant::now();
                let r = ranks.update_score(doc! {"_id": format!("p{p}")}, s).await;
                assert!(
                    matches!(r, Ok(true)),
                    "writer {w}, call {calls} after {:?}: {r:?}",
                    t.elapsed()
                );
                calls += 1;
            }
            calls
        }));
    }
    let mut calls = 0;
    for t in tasks {
        calls += t.await.unwrap();
    }
    let sent = commands.take_count();
    assert_consistent::<T>(&db, "hot", "after contention").await;
    (calls, sent)
}

/// Both layouts at once, 64 writers each on one board each, for 20 s:
/// every call succeeds, the histogram equals the players, and the calls
/// do not collapse into reruns (before the boards' queues: 73 round trips
/// a call at 64 tasks on the array layout, and `Contended` calls).
#[tokio::test]
async fn contention_64_writers_one_board() {
    let run = Duration::from_secs(20);
    let t = Instant::now();
    let ((a, a_sent), (d, d_sent)) = bounded(170, async {
        tokio::join!(
            writers_on_one_board::<ArrayScore>(fresh_db("rank_f_hot_array").await, 64, run, true),
            writers_on_one_board::<DocsScore>(fresh_db("rank_f_hot_docs").await, 64, run, true),
        )
    })
    .await;
    let (a_rt, d_rt) = (a_sent as f64 / a as f64, d_sent as f64 / d as f64);
    eprintln!(
        "contention: {a} update_score calls (array, {a_rt:.2} round trips each), {d} (documents, {d_rt:.2}) in {:?}, none Contended",
        t.elapsed()
    );
    assert!(a > 0 && d > 0);
    // 3 a call, 4 for a filter not seen before while the board is busy;
    // the margin is for the first calls, before the queue forms.
    assert!(a_rt <= 4.5, "array layout: {a_rt:.2} round trips a call");
    assert!(
        d_rt <= 4.5,
        "documents layout: {d_rt:.2} round trips a call"
    );
}

/// The documents layout's fallback (`update` + `delete` commands), sixteen
/// writers on one board.
#[tokio::test]
async fn contention_sixteen_writers_one_board_fallback() {
    let t = Instant::now();
    let (d, _) = bounded(
        150,
        writers_on_one_board::<DocsScore>(
            fresh_db("rank_f_hot_docs_fb").await,
            16,
            Duration::from_secs(15),
            false,
        ),
    )
    .await;
    eprintln!(
        "contention (fallback): {d} update_score calls (documents) in {:?}, none Contended",
        t.elapsed()
    );
    assert!(d > 0);
}

fn assert_damaged(r: Result<impl std::fmt::Debug, Error>, id: &Bson, what: &str) {
    match r {
        Err(Error::Damaged {
            id: got,
            field,
            problem,
            ..
        }) => {
            assert_eq!(&*got, id, "{what}: {field} {problem}");
        }
        other => panic!("{what}: expected Damaged naming {id}, got {other:?}"),
    }
}

/// Every call that meets the damaged board fails with `Damaged` naming it,
/// and writes nothing: neither the histogram nor the player.
async fn damaged_array_board(board: Document, what: &str) {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("rank_f_damage_array").await;
    let ranks = ArrayScore::ranks(&db);
    let hist = db.collection::<Document>(ArrayScore::RANK.histogram);
    let players = db.collection::<Document>(ArrayScore::COLLECTION);
    hist.insert_one(&board).await.unwrap();
    players
        .insert_one(doc! {"_id": "p", "examId": "b", "score": 10.0})
        .await
        .unwrap();
    let id = Bson::String("b".into());
    let what = |call: &str| format!("{what}: {call}");
    assert_damaged(ranks.record("b", 30.0).await, &id, &what("record new"));
    assert_damaged(ranks.record("b", 10.0).await, &id, &what("record"));
    assert_damaged(ranks.unrecord("b", 10.0).await, &id, &what("remove"));
    assert_damaged(ranks.unrecord("b", 40.0).await, &id, &what("remove none"));
    assert_damaged(ranks.change("b", 10.0, 20.0).await, &id, &what("change"));
    assert_damaged(ranks.rank("b", 15.0).await, &id, &what("rank"));
    assert_damaged(ranks.top("b", 1).await, &id, &what("top"));
    assert_damaged(ranks.histogram("b").await, &id, &what("histogram"));
    let p = ArrayScore::new("q".into(), "b", 10.0);
    assert_damaged(ranks.insert(&p).await, &id, &what("insert"));
    assert_damaged(
        ranks.update_score(doc! {"_id": "p"}, 20.0).await,
        &id,
        &what("update_score"),
    );
    assert_damaged(ranks.delete(doc! {"_id": "p"}).await, &id, &what("delete"));
    assert_eq!(
        hist.find_one(doc! {"_id": "b"}).await.unwrap(),
        Some(board),
        "{}",
        what("nothing written")
    );
    let left: Vec<Document> = players
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        left,
        [doc! {"_id": "p", "examId": "b", "score": 10.0}],
        "{}",
        what("players untouched")
    );
}

#[tokio::test]
async fn damaged_array_duplicate_score() {
    let board = doc! {"_id": "b", "scores": [
        {"score": 20.0, "count": 1_i64}, {"score": 10.0, "count": 2_i64}, {"score": 10.0, "count": 1_i64},
    ]};
    damaged_array_board(board, "duplicated score").await;
}

#[tokio::test]
async fn damaged_array_negative_count() {
    let board = doc! {"_id": "b", "scores": [
        {"score": 20.0, "count": 1_i64}, {"score": 10.0, "count": -1_i64},
    ]};
    damaged_array_board(board, "negative count").await;
}

#[tokio::test]
async fn damaged_array_other_shapes() {
    for (board, what) in [
        (
            doc! {"_id": "b", "scores": [{"score": 10.0, "count": "3"}]},
            "count a string",
        ),
        (
            doc! {"_id": "b", "scores": [{"score": 10.0, "count": 1.5}]},
            "count a double",
        ),
        (
            doc! {"_id": "b", "scores": [{"score": "ten", "count": 1_i64}]},
            "score a string",
        ),
        (doc! {"_id": "b", "scores": "none"}, "scores not an array"),
        (
            doc! {"_id": "b", "scores": [{"score": 10.0, "count": 1_i64}, {"score": 20.0, "count": 1_i64}]},
            "scores out of order",
        ),
    ] {
        damaged_array_board(board, what).await;
    }
}

/// The documents layout: a call that meets the damaged document fails with
/// `Damaged` naming that document's `_id`, and writes nothing.
async fn damaged_documents(count: Bson, what: &str, bulk: bool) {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("rank_f_damage_docs").await;
    let ranks = DocsScore::ranks(&db).bulk_write(bulk);
    let hist = db.collection::<Document>(DocsScore::RANK.histogram);
    let players = db.collection::<Document>(DocsScore::COLLECTION);
    ranks.record("b", 10.0).await.unwrap();
    ranks.record("b", 30.0).await.unwrap();
    players
        .insert_one(doc! {"_id": "p", "examId": "b", "score": 10.0})
        .await
        .unwrap();
    let id = Bson::Document(doc! {"b": "b", "s": 20.0});
    hist.insert_one(doc! {"_id": &id, "count": count})
        .await
        .unwrap();
    let before: Vec<Document> = hist
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let what = |call: &str| format!("{what}: {call}");
    assert_damaged(ranks.record("b", 20.0).await, &id, &what("record"));
    assert_damaged(ranks.unrecord("b", 20.0).await, &id, &what("remove"));
    assert_damaged(ranks.change("b", 10.0, 20.0).await, &id, &what("change to"));
    assert_damaged(
        ranks.change("b", 20.0, 10.0).await,
        &id,
        &what("change from"),
    );
    assert_damaged(ranks.rank("b", 15.0).await, &id, &what("rank"));
    assert_damaged(ranks.top("b", 2).await, &id, &what("top"));
    assert_damaged(ranks.histogram("b").await, &id, &what("histogram"));
    let p = DocsScore::new("q".into(), "b", 20.0);
    assert_damaged(ranks.insert(&p).await, &id, &what("insert"));
    assert_damaged(
        ranks.update_score(doc! {"_id": "p"}, 20.0).await,
        &id,
        &what("update_score"),
    );
    let after: Vec<Document> = hist
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(after, before, "{}", what("nothing written"));
    let p = players.find_one(doc! {"_id": "p"}).await.unwrap().unwrap();
    assert_eq!(
        p.get_f64("score").ok(),
        Some(10.0),
        "{}",
        what("player untouched")
    );
    assert!(players.find_one(doc! {"_id": "q"}).await.unwrap().is_none());
    // A call that does not meet it still works: 30 is above it.
    assert_eq!(ranks.top("b", 1).await.unwrap()[0].score, 30.0);
}

#[tokio::test]
async fn damaged_documents_counts() {
    for (count, what) in [
        (Bson::Int64(-1), "negative count"),
        (Bson::Double(2.5), "fractional count"),
        (Bson::String("2".into()), "count a string"),
    ] {
        for bulk in [true, false] {
            let what = format!("{what} (bulkWrite {bulk})");
            damaged_documents(count.clone(), &what, bulk).await;
        }
    }
}

/// The names of the commands sent since the last look.
fn sent(commands: &mongo_patterns_testkit::Commands) -> Vec<String> {
    commands.take().into_iter().map(|(n, _)| n).collect()
}

/// A score whose count reaches 0 is removed by the call that empties it
/// (in the same round trip with `bulkWrite`; without it, by a statement of
/// its own, as each of the call's statements is); the board stays known.
async fn emptied_scores_removed(bulk: bool) {
    let (db, commands) = fresh_db("rank_f_emptied").await;
    // A server before 8.0 refuses `bulkWrite`: there the repository is
    // built without it, and the commands are the fallback's.
    let bulk =
        bulk && mongo_patterns_testkit::takes_bulk_write(db.client(), "rank_f_emptied").await;
    let ranks = DocsScore::ranks(&db).bulk_write(bulk);
    let hist = db.collection::<Document>(DocsScore::RANK.histogram);
    for s in [10.0, 10.0, 20.0] {
        ranks.record("b", s).await.unwrap();
    }
    commands.take();
    ranks.record("b", 40.0).await.unwrap();
    let one: &[&str] = if bulk { &["bulkWrite"] } else { &["update"] };
    assert_eq!(sent(&commands), one, "record");
    // Without `bulkWrite`: `-1`, the board's marker, the removal.
    let remove: &[&str] = if bulk {
        &["bulkWrite"]
    } else {
        &["update", "update", "delete"]
    };
    // The check of the new score, `-1`, the removal, `+1`.
    let change: &[&str] = if bulk {
        &["bulkWrite"]
    } else {
        &["update", "update", "delete", "update"]
    };
    ranks.unrecord("b", 40.0).await.unwrap();
    assert_eq!(sent(&commands), remove, "remove");
    ranks.unrecord("b", 10.0).await.unwrap();
    assert_eq!(sent(&commands), remove, "remove");
    ranks.change("b", 10.0, 30.0).await.unwrap();
    assert_eq!(sent(&commands), change, "change");
    ranks.change("b", 20.0, 30.0).await.unwrap();
    assert_eq!(sent(&commands), change, "change");
    let ids: Vec<Bson> = hist
        .find(doc! {})
        .await
        .unwrap()
        .try_collect::<Vec<Document>>()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.get_document("_id").unwrap().get("s").unwrap().clone())
        .collect();
    let mut ids: Vec<String> = ids.iter().map(Bson::to_string).collect();
    ids.sort();
    eprintln!("stored after emptying 10 and 20: {ids:?}");
    assert_eq!(ids.len(), 2, "30 and the board's marker: {ids:?}");
    assert!(ids.contains(&Bson::Double(30.0).to_string()));
    ranks.unrecord("b", 30.0).await.unwrap();
    ranks.unrecord("b", 30.0).await.unwrap();
    let r = ranks.rank("b", 30.0).await.unwrap();
    assert_eq!((r.rank, r.total), (1, 0), "an emptied board is known");
    assert!(ranks.histogram("b").await.unwrap().is_empty());
    assert_eq!(hist.count_documents(doc! {}).await.unwrap(), 1);
    let err = ranks.unrecord("b", 30.0).await.unwrap_err();
    assert!(matches!(err, Error::ScoreNotFound { .. }), "{err:?}");
    let err = ranks.unrecord("nope", 30.0).await.unwrap_err();
    assert!(matches!(err, Error::UnknownBoard { .. }), "{err:?}");
    assert_eq!(
        hist.count_documents(doc! {}).await.unwrap(),
        1,
        "a refused write creates nothing"
    );
    commands.take();
    // In a transaction: the player's write, the histogram's, the commit;
    // an insert's two writes are one `bulkWrite` where it is allowed.
    ranks
        .insert(&DocsScore::new("p".into(), "b", 5.0))
        .await
        .unwrap();
    let insert: &[&str] = if bulk { &[] } else { &["insert"] };
    assert_eq!(
        sent(&commands),
        [insert, one, &["commitTransaction"]].concat(),
        "insert"
    );
    // Inside a transaction without `bulkWrite`: an `update` command and a
    // `delete` command.
    let two: &[&str] = if bulk {
        &["bulkWrite"]
    } else {
        &["update", "delete"]
    };
    assert!(ranks.update_score(doc! {"_id": "p"}, 6.0).await.unwrap());
    assert_eq!(
        sent(&commands),
        [&["findAndModify"], two, &["commitTransaction"]].concat(),
        "update_score"
    );
    assert_consistent::<DocsScore>(&db, "b", "after the transactions").await;
}

#[tokio::test]
async fn emptied_scores_are_removed_documents() {
    bounded(60, emptied_scores_removed(true)).await;
}

#[tokio::test]
async fn emptied_scores_are_removed_documents_fallback() {
    bounded(60, emptied_scores_removed(false)).await;
}

async fn top_one_round_trip<T: Exam>(name: &str) {
    let (db, commands) = fresh_db(name).await;
    let ranks = T::ranks(&db);
    let hist = db.collection::<Document>(T::RANK.histogram);
    // 150 distinct scores, written directly: more than a default first batch.
    match T::RANK.layout {
        Layout::Array => {
            let scores: Vec<Document> = (0..150)
                .rev()
                .map(|s| doc! {"score": s as f64, "count": 1_i64})
                .collect();
            hist.insert_one(doc! {"_id": "b", "scores": scores})
                .await
                .unwrap();
        }
        Layout::Documents => {
            let docs: Vec<Document> = (0..150)
                .map(|s| doc! {"_id": {"b": "b", "s": s as f64}, "count": 1_i64})
                .collect();
            hist.insert_many(docs).await.unwrap();
        }
    }
    commands.take();
    let top = ranks.top("b", 120).await.unwrap();
    let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    eprintln!("{name}: top(120) sent {sent:?}");
    assert_eq!(top.len(), 120);
    assert_eq!(
        (top[0].score, top[119].score, top[119].rank),
        (149.0, 30.0, 120)
    );
    assert_eq!(sent.len(), 1, "top is one round trip: {sent:?}");
    let all = ranks.histogram("b").await.unwrap();
    let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    assert_eq!(all.len(), 150);
    assert_eq!(sent.len(), 1, "histogram is one round trip: {sent:?}");
}

#[tokio::test]
async fn top_is_one_round_trip_array() {
    top_one_round_trip::<ArrayScore>("rank_f_top_array").await;
}

#[tokio::test]
async fn top_is_one_round_trip_documents() {
    top_one_round_trip::<DocsScore>("rank_f_top_docs").await;
}

/// Rounding to `precision` never overflows to infinity: such a score is
/// refused before anything is sent.
#[tokio::test]
async fn rounding_never_overflows() {
    let (db, commands) = fresh_db("rank_f_round").await;
    let ranks = ArrayScore::ranks(&db);
    commands.take();
    for s in [f64::MAX, f64::MIN] {
        let err = ranks.record("b", s).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { name: "score", .. }),
            "{err:?}"
        );
        let err = ranks
            .insert(&ArrayScore::new("p".into(), "b", s))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { name: "score", .. }),
            "{err:?}"
        );
    }
    assert_eq!(commands.take_count(), 0, "refused before sending");
    // Large scores that round within range still work.
    ranks.record("b", 1e300).await.unwrap();
    let stored = stored::<ArrayScore>(&db, "b").await;
    assert_eq!(stored.len(), 1);
    let h = ranks.histogram("b").await.unwrap();
    assert!(h[0].score.is_finite() && h[0].score == 1e300, "{h:?}");
}

/// On a standalone: whether it runs transactions is measured, not assumed.
/// Without transactions (the deliberate switch), the player and histogram
/// writes are refused unless the caller allows them one after the other;
/// allowed, concurrent writers of the same players leave no drift.
#[tokio::test]
async fn standalone_without_transactions() {
    let server = OwnServer::start(ServerOptions {
        standalone: true,
        ..ServerOptions::default()
    });
    let (c, _) = client(server.uri()).await;
    let db = c.database("standalone");
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    bounded(150, async {
        // Does this standalone commit transactions?
        let probe = db.collection::<Document>("probe");
        let mut s = c.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        let wrote = probe
            .insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .is_ok();
        let committed = wrote && s.commit_transaction().await.is_ok();
        eprintln!("standalone: transaction committed = {committed}");

        // The default repository works there either way (a transaction, or
        // a refusal that is reported).
        let ranks = ArrayScore::ranks(&db);
        let r = ranks.insert(&ArrayScore::new("a".into(), "b", 1.0)).await;
        if committed {
            r.unwrap();
        } else {
            assert!(matches!(r, Err(Error::NoTransactions { .. })), "{r:?}");
        }

        // Told not to use transactions and not allowed non-atomic writes:
        // refused, nothing written.
        let strict = ArrayScore::ranks(&db).transactions(false);
        let players = db.collection::<Document>(ArrayScore::COLLECTION);
        let before = players.count_documents(doc! {}).await.unwrap();
        let err = strict
            .insert(&ArrayScore::new("x".into(), "b", 1.0))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoTransactions {
                    operation: "insert",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = strict
            .update_score(doc! {"_id": "a"}, 5.0)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NoTransactions { .. }), "{err:?}");
        assert_eq!(players.count_documents(doc! {}).await.unwrap(), before);

        // Allowed: eight writers move the same four players at once.
        for layout in [Layout::Array, Layout::Documents] {
            match layout {
                Layout::Array => non_atomic_writers::<ArrayScore>(&db, true).await,
                Layout::Documents => non_atomic_writers::<DocsScore>(&db, true).await,
            }
        }
        // The documents layout without `bulkWrite`.
        non_atomic_writers::<DocsScore>(&c.database("standalone_fb"), false).await;
    })
    .await;
}

/// Non-atomic writes, allowed. First the race, made to happen: a
/// writer moved player `z` from 1 to 5 and has not written its histogram
/// half yet when `update_score` moves `z` on to 7. That call must wait for
/// the `-1` at 5 to become possible, not fail and leave the board wrong for
/// good. Then eight writers at once (each with players of its own: the
/// test server's `findAndModify` is not atomic between two writers of one
/// document, see the failure behaviour in the `rank_histogram` module docs).
async fn non_atomic_writers<T: Exam>(db: &Database, bulk: bool) {
    let ranks = T::ranks(db)
        .transactions(false)
        .allow_non_atomic(true)
        .bulk_write(bulk);
    let players = db.collection::<Document>(T::COLLECTION);
    ranks
        .insert(&T::new("z".into(), "race", 1.0))
        .await
        .unwrap();
    players
        .update_one(doc! {"_id": "z"}, doc! {"$set": {"score": 5.0}})
        .await
        .unwrap();
    let late = {
        let ranks = ranks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ranks.change("race", 1.0, 5.0).await
        })
    };
    let t = Instant::now();
    let r = ranks.update_score(doc! {"_id": "z"}, 7.0).await;
    eprintln!(
        "{:?}: update_score behind a late histogram half: {r:?} after {:?}",
        T::RANK.layout,
        t.elapsed()
    );
    late.await.unwrap().unwrap();
    assert!(matches!(r, Ok(true)), "{r:?}");
    assert_consistent::<T>(db, "race", "after the late half").await;

    for p in 0..32 {
        ranks
            .insert(&T::new(format!("n{p}"), "na", 0.0))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let ranks = ranks.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0xfeed + w);
            for _ in 0..30 {
                let p = w * 4 + rng.below(4);
                let s = rng.below(10) as f64;
                let t = Instant::now();
                let r = ranks.update_score(doc! {"_id": format!("n{p}")}, s).await;
                assert!(
                    matches!(r, Ok(true)),
                    "{:?} writer {w} n{p} → {s} after {:?}: {r:?}",
                    T::RANK.layout,
                    t.elapsed()
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_consistent::<T>(db, "na", "non-atomic writers").await;
}

/// The test server's `findAndModify` is not atomic between concurrent
/// writers of one document: two of them can get the same pre-image. Kept
/// as a measurement (printed), since the rank histogram's non-atomic mode
/// relies on it; transactions are not affected (the second writer meets a
/// write conflict).
#[tokio::test]
async fn server_find_and_modify_pre_images() {
    let (db, _) = fresh_db("rank_f_fam").await;
    let coll = db.collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "n": 0}).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let coll = coll.clone();
        tasks.push(tokio::spawn(async move {
            let mut olds = Vec::new();
            for _ in 0..50 {
                let d = coll
                    .find_one_and_update(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
                    .await
                    .unwrap()
                    .unwrap();
                olds.push(d.get_i32("n").unwrap());
            }
            olds
        }));
    }
    let mut all = Vec::new();
    for t in bounded(120, futures::future::join_all(tasks)).await {
        all.extend(t.unwrap());
    }
    all.sort();
    let n = all.len();
    all.dedup();
    let last = coll.find_one(doc! {}).await.unwrap().unwrap();
    eprintln!(
        "findAndModify: {n} pre-images returned, {} distinct; n = {}",
        all.len(),
        last.get_i32("n").unwrap()
    );
    // Every increment applied, whatever the pre-images said.
    assert_eq!(last.get_i32("n").unwrap(), n as i32);
}

/// Writers on both layouts while the server is killed (`kill -9`) and
/// restarted in place: no panic, every call returns, the same handles go
/// on, and the histogram equals the players.
#[tokio::test]
async fn crash_kill_and_restart_mid_run() {
    let server = OwnServer::start(ServerOptions {
        sync_on_commit: true,
        ..ServerOptions::default()
    });
    let (c, _) = client(server.uri()).await;
    let db = c.database("crash");
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    let array = ArrayScore::ranks(&db);
    let docs = DocsScore::ranks(&db);
    for p in 0..8 {
        array
            .insert(&ArrayScore::new(format!("p{p}"), "b", 0.0))
            .await
            .unwrap();
        docs.insert(&DocsScore::new(format!("p{p}"), "b", 0.0))
            .await
            .unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (array, docs, stop) = (array.clone(), docs.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0xc0ffee + w);
            let (mut ok, mut failed) = (0, Vec::new());
            let mut next = 100 * (w + 1);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let p = format!("p{}", rng.below(8));
                let s = rng.below(10) as f64;
                let r = match rng.below(6) {
                    0 => {
                        next += 1;
                        array
                            .insert(&ArrayScore::new(format!("q{next}"), "b", s))
                            .await
                            .map(|()| true)
                    }
                    1 => {
                        next += 1;
                        docs.insert(&DocsScore::new(format!("q{next}"), "b", s))
                            .await
                            .map(|()| true)
                    }
                    2 | 3 => array.update_score(doc! {"_id": &p}, s).await,
                    _ => docs.update_score(doc! {"_id": &p}, s).await,
                };
                match r {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(format!("{e}")),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.kill();
    eprintln!("crash: killed");
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart();
    eprintln!("crash: restarted");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    bounded(150, async {
        for t in tasks {
            let (o, f) = t.await.expect("no panic");
            ok += o;
            failed.extend(f);
        }
    })
    .await;
    eprintln!(
        "crash: {ok} calls succeeded, {} failed: {failed:?}",
        failed.len()
    );
    assert!(ok > 0);
    // The same handles go on.
    assert!(array.update_score(doc! {"_id": "p0"}, 9.0).await.unwrap());
    assert!(docs.update_score(doc! {"_id": "p0"}, 9.0).await.unwrap());
    assert_consistent::<ArrayScore>(&db, "b", "after the crash (array)").await;
    assert_consistent::<DocsScore>(&db, "b", "after the crash (documents)").await;
}

/// A deployment that refuses `bulkWrite` (mongod before 8.0 answers
/// CommandNotFound, code 59). The test server knows `bulkWrite` and has no
/// fail points here, so a command of a name it does not know is sent in
/// its place, and its real refusal is met: learnt once per handle (clones
/// included), no further `bulkWrite` is sent, and every write goes on
/// with the driver's `update_one` and `delete_one`, a statement each (in
/// a transaction, an `update` command and a `delete` command); in a
/// transaction the refused attempt is rerun, nothing doubled.
#[tokio::test]
async fn bulk_write_refusal_is_learnt_once() {
    bounded(60, async {
        let (db, commands) = fresh_db("rank_f_refused").await;
        const OLD: &str = "bulkWriteBefore8";
        let ranks = DocsScore::ranks(&db).__bulk_write_command(OLD);
        let clone = ranks.clone();
        let hist = db.collection::<Document>(DocsScore::RANK.histogram);
        commands.take();
        ranks.record("b", 10.0).await.unwrap();
        assert_eq!(
            sent(&commands),
            [OLD, "update"],
            "the refusal, then the fallback"
        );
        clone.record("b", 10.0).await.unwrap();
        clone.record("b", 20.0).await.unwrap();
        assert_eq!(
            sent(&commands),
            ["update", "update"],
            "the clone learnt it too"
        );
        ranks.change("b", 10.0, 20.0).await.unwrap();
        clone.unrecord("b", 10.0).await.unwrap();
        assert_eq!(
            sent(&commands),
            ["update", "update", "delete", "update", "update", "update", "delete"]
        );
        let docs: Vec<Document> = hist
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(
            docs,
            [
                doc! {"_id": {"b": "b", "s": Bson::MinKey}, "count": 0_i64},
                doc! {"_id": {"b": "b", "s": 20.0}, "count": 2_i64},
            ],
            "10 emptied and removed"
        );

        // A handle of its own meets the refusal inside a transaction.
        let fresh = DocsScore::ranks(&db).__bulk_write_command(OLD);
        fresh
            .insert(&DocsScore::new("p".into(), "t", 1.0))
            .await
            .unwrap();
        let names = sent(&commands);
        eprintln!("insert meeting the refusal in a transaction sent {names:?}");
        assert_eq!(names.iter().filter(|n| *n == OLD).count(), 1, "{names:?}");
        assert!(fresh.update_score(doc! {"_id": "p"}, 2.0).await.unwrap());
        assert_eq!(
            sent(&commands),
            ["findAndModify", "update", "delete", "commitTransaction"]
        );
        assert_consistent::<DocsScore>(&db, "t", "after the refused transaction").await;
    })
    .await;
}
