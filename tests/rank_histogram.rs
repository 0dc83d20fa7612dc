//! The rank histogram against a real MongoDB-wire server, in both layouts.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::event::command::CommandEvent;
use mongo_patterns::mongodb::event::EventHandler;
use mongo_patterns::mongodb::options::ClientOptions;
use mongo_patterns::mongodb::{Client, Database};
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::{Layout, RankHistogram};
use mongo_patterns::Error;
use mongo_patterns_testkit::{assert_small_futures, client, future_size, SMALL_FUTURE};

/// A fresh database ([`mongo_patterns_testkit::fresh_db`]), with the shard
/// keys this suite's models declare given to the routing checker, which
/// `MP_ROUTING=strict` turns on for every test (see `scripts/test`).
/// In CI's mongos job (`MP_SHARD_PATTERN_COLLECTIONS=1`) the collections
/// they declare a shard key for are sharded on it through `ensure` first
/// ([`mongo_patterns_testkit::shard_declared`]).
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    let (db, commands) = mongo_patterns_testkit::fresh_db(test).await;
    let declared: Vec<_> = ExamScore::declared(&db)
        .into_iter()
        .chain(ExamScoreDocs::declared(&db))
        .chain(Lap::declared(&db))
        .collect();
    mongo_patterns_testkit::routing::declare(declared.clone());
    mongo_patterns_testkit::shard_declared(&db, &commands, declared).await;
    (db, commands)
}

/// The seed's exam: one document per student, ranked per exam in half
/// points. The board and the score are inferred (`examId`, `score`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores")]
#[rank_histogram(precision = 0.5)]
struct ExamScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// The same, one histogram document per (exam, score).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "exam_scores_docs")]
#[rank_histogram(
    board = "examId",
    score = "score",
    precision = 0.5,
    layout = "documents"
)]
struct ExamScoreDocs {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// Integer scores on an ascending board: lap times, fastest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "laps")]
#[rank_histogram(board = "track", score = "millis", order = "asc")]
struct Lap {
    #[serde(rename = "_id")]
    id: i64,
    track: i32,
    millis: i64,
}

/// What both exam models share, so each test runs on both layouts.
trait Exam: RankHistogram<Board = String, Score = f64> + Clone {
    fn new(student: String, exam: &str, score: f64) -> Self;
}

impl Exam for ExamScore {
    fn new(student: String, exam: &str, score: f64) -> Self {
        ExamScore {
            student,
            exam_id: exam.to_owned(),
            score,
        }
    }
}

impl Exam for ExamScoreDocs {
    fn new(student: String, exam: &str, score: f64) -> Self {
        ExamScoreDocs {
            student,
            exam_id: exam.to_owned(),
            score,
        }
    }
}

/// A board's histogram as `score → count`.
async fn counts<T: Exam>(ranks: &Ranks<T>, board: &str) -> BTreeMap<i64, u64> {
    ranks
        .histogram(board)
        .await
        .unwrap()
        .into_iter()
        .map(|s| ((s.score * 2.0) as i64, s.count))
        .collect()
}

/// Every one-command operation's future, in both layouts, fits a small
/// allocation (`SMALL_FUTURE`): a larger one would cost the operation
/// after it more than the generated code may (see the client-cost
/// tables in `benches/rank-results.md`). The transactional ones hold the driver's
/// convenient transaction API's future, most of their size: they are
/// held to twice that. Nothing is sent: the futures are built, measured
/// and dropped.
#[tokio::test]
async fn operation_futures_fit_a_small_allocation() {
    type Sizes = Vec<(&'static str, usize)>;
    fn sizes<T: Exam>(db: &Database) -> (Sizes, Sizes) {
        let r = Ranks::<T>::new(db);
        let doc = T::new("s".to_owned(), "e", 1.0);
        let one = vec![
            ("record", future_size(&*r.record("e", 1.0).into_future())),
            (
                "change",
                future_size(&*r.change("e", 1.0, 2.0).into_future()),
            ),
            ("remove", future_size(&*r.unrecord("e", 1.0).into_future())),
            ("rank", future_size(&*r.rank("e", 1.0).into_future())),
            ("top", future_size(&*r.top("e", 3).into_future())),
            ("histogram", future_size(&*r.histogram("e").into_future())),
        ];
        let txn = vec![
            ("insert", future_size(&*r.insert(&doc).into_future())),
            (
                "update_score",
                future_size(&*r.update_score(doc! {"_id": "s"}, 2.0).into_future()),
            ),
            (
                "delete",
                future_size(&*r.delete(doc! {"_id": "s"}).into_future()),
            ),
            ("rebuild", future_size(&*r.rebuild("e").into_future())),
        ];
        (one, txn)
    }
    // No server is needed to build a future.
    let client = Client::with_uri_str("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=1")
        .await
        .unwrap();
    let db = client.database("sizes");
    for (one, txn) in [sizes::<ExamScore>(&db), sizes::<ExamScoreDocs>(&db)] {
        assert_small_futures(&one);
        assert!(txn.iter().all(|(_, n)| *n <= 2 * SMALL_FUTURE), "{txn:?}");
    }
}

const SEED: [f64; 10] = [50.0, 50.0, 50.0, 60.0, 60.0, 60.0, 60.0, 80.0, 90.0, 100.0];

async fn seed_numbers<T: Exam>(name: &str, bulk: bool) {
    let (db, commands) = fresh_db(name).await;
    // A server before 8.0 refuses `bulkWrite`: the repository learns it
    // from the seed's first write, and writes as without it after.
    let sends_bulk = bulk && mongo_patterns_testkit::takes_bulk_write(db.client(), name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    for s in SEED {
        ranks.record("exam_001", s).await.unwrap();
    }
    commands.take();

    // The seed's question: 85 ranks 3rd.
    let r = ranks.rank("exam_001", 85.0).await.unwrap();
    assert_eq!(commands.take_count(), 1, "rank is one round trip");
    assert_eq!(
        (r.rank, r.dense, r.above, r.ties, r.total),
        (3, 3, 2, 0, 10)
    );
    let r = ranks.rank("exam_001", 60.0).await.unwrap();
    assert_eq!((r.rank, r.dense, r.above, r.ties), (4, 4, 3, 4));
    assert_eq!(r.percentile(), Some(50.0));
    let r = ranks.rank("exam_001", 50.0).await.unwrap();
    assert_eq!((r.rank, r.dense, r.ties), (8, 5, 3));
    let r = ranks.rank("exam_001", 101.0).await.unwrap();
    assert_eq!((r.rank, r.above, r.ties), (1, 0, 0));

    let h = ranks.histogram("exam_001").await.unwrap();
    let got: Vec<(f64, u64, u64)> = h.iter().map(|s| (s.score, s.count, s.rank)).collect();
    assert_eq!(
        got,
        [
            (100.0, 1, 1),
            (90.0, 1, 2),
            (80.0, 1, 3),
            (60.0, 4, 4),
            (50.0, 3, 8)
        ]
    );
    let top: Vec<f64> = ranks
        .top("exam_001", 3)
        .await
        .unwrap()
        .iter()
        .map(|s| s.score)
        .collect();
    assert_eq!(top, [100.0, 90.0, 80.0]);
    let top4 = ranks.top("exam_001", 4).await.unwrap();
    assert_eq!(top4.last().map(|s| (s.score, s.count)), Some((60.0, 4)));
    assert!(ranks.top("exam_001", 0).await.unwrap().is_empty());

    // The seed's extreme: the top student drops to 0. One write, one round
    // trip, though 0 is new to the board (four without `bulkWrite`, a
    // statement each: the check of 0, -1 at 100, the removal of the
    // emptied 100, +1 at 0).
    commands.take();
    ranks.change("exam_001", 100.0, 0.0).await.unwrap();
    let trips = if sends_bulk || T::RANK.layout == Layout::Array {
        1
    } else {
        4
    };
    assert_eq!(commands.take_count(), trips, "change's round trips");
    let r = ranks.rank("exam_001", 0.0).await.unwrap();
    assert_eq!((r.rank, r.ties, r.total), (10, 1, 10));
    assert_eq!(ranks.rank("exam_001", 90.0).await.unwrap().rank, 1);
    // 100 is gone from the histogram, not left at count 0.
    assert!(!counts(&ranks, "exam_001").await.contains_key(&200));

    // Half points: 87.3 rounds to 87.5, on write and on read.
    ranks.record("exam_001", 87.3).await.unwrap();
    assert!(counts(&ranks, "exam_001").await.contains_key(&175));
    assert_eq!(ranks.rank("exam_001", 87.4).await.unwrap().ties, 1);
}

#[tokio::test]
async fn seed_numbers_array() {
    seed_numbers::<ExamScore>("rank_seed_array", true).await;
}

#[tokio::test]
async fn seed_numbers_documents() {
    seed_numbers::<ExamScoreDocs>("rank_seed_docs", true).await;
}

#[tokio::test]
async fn seed_numbers_documents_fallback() {
    seed_numbers::<ExamScoreDocs>("rank_seed_docs_fb", false).await;
}

async fn errors<T: Exam>(name: &str, bulk: bool) {
    let (db, commands) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    for s in [70.0, 70.0, 80.0] {
        ranks.record("e", s).await.unwrap();
    }
    let before = counts(&ranks, "e").await;

    // A score nobody holds: nothing is written, neither half of a change.
    let err = ranks.unrecord("e", 75.0).await.unwrap_err();
    assert!(matches!(err, Error::ScoreNotFound { .. }), "{err:?}");
    let err = ranks.change("e", 75.0, 90.0).await.unwrap_err();
    assert!(matches!(err, Error::ScoreNotFound { .. }), "{err:?}");
    assert_eq!(counts(&ranks, "e").await, before);

    // Counts stop at 0.
    ranks.unrecord("e", 80.0).await.unwrap();
    let err = ranks.unrecord("e", 80.0).await.unwrap_err();
    assert!(matches!(err, Error::ScoreNotFound { .. }), "{err:?}");
    let after = counts(&ranks, "e").await;
    assert_eq!(after.into_iter().collect::<Vec<_>>(), [(140, 2)]);

    // Unknown boards.
    for err in [
        ranks.rank("nope", 1.0).await.unwrap_err(),
        ranks.unrecord("nope", 1.0).await.unwrap_err(),
        ranks.change("nope", 1.0, 2.0).await.unwrap_err(),
        ranks.histogram("nope").await.unwrap_err(),
    ] {
        assert!(matches!(err, Error::UnknownBoard { .. }), "{err:?}");
    }
    // A board emptied by removals is still known, with nobody on it.
    ranks.record("gone", 1.0).await.unwrap();
    ranks.unrecord("gone", 1.0).await.unwrap();
    let r = ranks.rank("gone", 1.0).await.unwrap();
    assert_eq!((r.rank, r.total, r.percentile()), (1, 0, None));
    assert!(ranks.histogram("gone").await.unwrap().is_empty());

    // Scores that cannot be ranked never reach the server.
    commands.take();
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for err in [
            ranks.record("e", bad).await.unwrap_err(),
            ranks.change("e", 70.0, bad).await.unwrap_err(),
            ranks.rank("e", bad).await.unwrap_err(),
        ] {
            assert!(
                matches!(err, Error::InvalidArgument { name: "score", .. }),
                "{err:?}"
            );
        }
    }
    assert_eq!(commands.take_count(), 0);

    // A lost connection is `Unavailable`.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (c, _) = client(&format!(
        "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=300&directConnection=true"
    ))
    .await;
    let err = T::ranks(&c.database("x"))
        .bulk_write(bulk)
        .record("e", 1.0)
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test]
async fn errors_array() {
    errors::<ExamScore>("rank_errors_array", true).await;
}

#[tokio::test]
async fn errors_documents() {
    errors::<ExamScoreDocs>("rank_errors_docs", true).await;
}

#[tokio::test]
async fn errors_documents_fallback() {
    errors::<ExamScoreDocs>("rank_errors_docs_fb", false).await;
}

#[tokio::test]
async fn ascending_integer_board() {
    let (db, _) = fresh_db("rank_laps").await;
    let ranks = Lap::ranks(&db);
    for ms in [61_000, 59_500, 59_500, 70_000] {
        ranks.record(&7, ms).await.unwrap();
    }
    let r = ranks.rank(&7, 60_000).await.unwrap();
    assert_eq!((r.rank, r.dense, r.above), (3, 2, 2));
    let h = ranks.histogram(&7).await.unwrap();
    let got: Vec<(i64, u64, u64)> = h.iter().map(|s| (s.score, s.count, s.rank)).collect();
    assert_eq!(got, [(59_500, 2, 1), (61_000, 1, 3), (70_000, 1, 4)]);
    // Integers are stored as integers.
    let doc = ranks
        .histogram_collection()
        .find_one(doc! {"_id": 7})
        .await
        .unwrap()
        .unwrap();
    let first = doc.get_array("scores").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(first.get_i64("score").ok(), Some(59_500));
}

/// A small deterministic generator (xorshift64*), so that a failure
/// replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Exact ranks from the players' documents, by `$setWindowFields`:
/// `score → (rank, dense rank)` per board.
async fn window_ranks(db: &Database, coll: &str) -> BTreeMap<(String, i64), (u64, u64)> {
    let rows: Vec<Document> = db
        .collection::<Document>(coll)
        .aggregate(vec![doc! {"$setWindowFields": {
            "partitionBy": "$examId",
            "sortBy": {"score": -1},
            "output": {"rank": {"$rank": {}}, "dense": {"$denseRank": {}}},
        }}])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let num = |d: &Document, f: &str| match d.get(f).unwrap() {
        Bson::Int32(i) => *i as u64,
        Bson::Int64(i) => *i as u64,
        other => panic!("{f}: {other}"),
    };
    rows.iter()
        .map(|d| {
            let key = (
                d.get_str("examId").unwrap().to_owned(),
                (d.get_f64("score").unwrap() * 2.0) as i64,
            );
            (key, (num(d, "rank"), num(d, "dense")))
        })
        .collect()
}

/// Random inserts, score updates and deletes through the players'
/// collection; after each round every board's ranks must equal what
/// `$setWindowFields` computes from the players' documents.
async fn property<T: Exam>(name: &str, seed: u64, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    ranks.ensure().await.unwrap();
    let boards = ["a", "b", "c"];
    let mut rng = Rng(seed);
    let mut next_student = 0;
    let mut live: Vec<String> = Vec::new();
    for round in 0..12 {
        for _ in 0..25 {
            let op = rng.below(10);
            if live.is_empty() || op < 5 {
                let student = format!("s{next_student}");
                next_student += 1;
                let board = boards[rng.below(3) as usize];
                // Scores 0..=20 in half points: many ties.
                let score = rng.below(41) as f64 / 2.0;
                ranks
                    .insert(&T::new(student.clone(), board, score))
                    .await
                    .unwrap();
                live.push(student);
            } else if op < 8 {
                let student = &live[rng.below(live.len() as u64) as usize];
                let score = rng.below(41) as f64 / 2.0;
                assert!(ranks
                    .update_score(doc! {"_id": student}, score)
                    .await
                    .unwrap());
            } else {
                let i = rng.below(live.len() as u64) as usize;
                let student = live.swap_remove(i);
                assert!(ranks.delete(doc! {"_id": &student}).await.unwrap());
            }
        }
        let exact = window_ranks(&db, T::COLLECTION).await;
        for board in boards {
            let totals = exact.keys().filter(|(b, _)| b == board).count();
            if totals == 0 {
                continue;
            }
            // Every score held, and the ones between, above and below.
            for half in -1..=42 {
                let r = ranks.rank(board, half as f64 / 2.0).await.unwrap();
                let expected_above: u64 = {
                    let docs: Vec<Document> = db
                        .collection::<Document>(T::COLLECTION)
                        .find(doc! {"examId": board, "score": {"$gt": half as f64 / 2.0}})
                        .await
                        .unwrap()
                        .try_collect()
                        .await
                        .unwrap();
                    docs.len() as u64
                };
                assert_eq!(
                    r.above, expected_above,
                    "round {round} board {board} score {half}/2"
                );
                if let Some(&(rank, dense)) = exact.get(&(board.to_owned(), half)) {
                    assert_eq!(
                        (r.rank, r.dense),
                        (rank, dense),
                        "round {round} board {board} score {half}/2"
                    );
                    assert!(r.ties > 0);
                } else {
                    assert_eq!(r.ties, 0, "round {round} board {board} score {half}/2");
                }
            }
        }
    }
    // No drift: rebuilding from the players' documents changes nothing.
    for board in boards {
        let before = counts(&ranks, board).await;
        ranks.rebuild(board).await.unwrap();
        assert_eq!(counts(&ranks, board).await, before, "board {board}");
    }
}

#[tokio::test]
async fn property_matches_set_window_fields_array() {
    property::<ExamScore>("rank_prop_array", 0x5eed_0001, true).await;
}

#[tokio::test]
async fn property_matches_set_window_fields_documents() {
    property::<ExamScoreDocs>("rank_prop_docs", 0x5eed_0002, true).await;
}

#[tokio::test]
async fn property_matches_set_window_fields_documents_fallback() {
    property::<ExamScoreDocs>("rank_prop_docs_fb", 0x5eed_0003, false).await;
}

async fn rebuild_repairs<T: Exam>(name: &str, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    for (i, s) in SEED.iter().enumerate() {
        ranks
            .insert(&T::new(format!("s{i}"), "exam_001", *s))
            .await
            .unwrap();
    }
    // A stray document the histogram must skip.
    db.collection::<Document>(T::COLLECTION)
        .insert_one(doc! {"_id": "broken", "examId": "exam_001", "score": "n/a"})
        .await
        .unwrap();
    let good = counts(&ranks, "exam_001").await;
    ranks.histogram_collection().drop().await.unwrap();
    assert!(matches!(
        ranks.rank("exam_001", 85.0).await.unwrap_err(),
        Error::UnknownBoard { .. }
    ));
    // With the histogram gone, a player's update fails and, being one
    // transaction with the histogram's write, leaves the player unchanged.
    let err = ranks
        .update_score(doc! {"_id": "s9"}, 10.0)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownBoard { .. }), "{err:?}");
    let s9 = db
        .collection::<Document>(T::COLLECTION)
        .find_one(doc! {"_id": "s9"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s9.get_f64("score").ok(), Some(100.0));
    assert_eq!(ranks.rebuild("exam_001").await.unwrap(), 10);
    // A player inserted twice is the caller's error, and counts once.
    let err = ranks
        .insert(&T::new("s0".into(), "exam_001", 50.0))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database(_)), "{err:?}");
    assert_eq!(counts(&ranks, "exam_001").await, good);
    assert_eq!(ranks.rank("exam_001", 85.0).await.unwrap().rank, 3);
    // The rebuilt histogram takes writes as before.
    ranks.change("exam_001", 50.0, 85.0).await.unwrap();
    assert_eq!(ranks.rank("exam_001", 85.0).await.unwrap().ties, 1);
    // A board without players rebuilds empty, and is known.
    assert_eq!(ranks.rebuild("nobody").await.unwrap(), 0);
    assert_eq!(ranks.rank("nobody", 1.0).await.unwrap().total, 0);
}

#[tokio::test]
async fn rebuild_repairs_array() {
    rebuild_repairs::<ExamScore>("rank_rebuild_array", true).await;
}

#[tokio::test]
async fn rebuild_repairs_documents() {
    rebuild_repairs::<ExamScoreDocs>("rank_rebuild_docs", true).await;
}

#[tokio::test]
async fn rebuild_repairs_documents_fallback() {
    rebuild_repairs::<ExamScoreDocs>("rank_rebuild_docs_fb", false).await;
}

const TASKS: usize = 16;
const PLAYERS: usize = 8;
const CHANGES: usize = 150;

/// 16 tasks move their own players between scores at once, on one board;
/// every first change of a task lands on a score new to the board at the
/// same moment as the others'. Each task knows its players' scores, so the
/// final histogram is known exactly.
async fn concurrent<T: Exam>(name: &str, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let ranks = ranks.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678 + task as u64);
            let mut scores = vec![0.0_f64; PLAYERS];
            for _ in 0..PLAYERS {
                ranks.record("live", 0.0).await.unwrap();
            }
            // Everyone's first change goes to 100, new to the board.
            ranks.change("live", 0.0, 100.0).await.unwrap();
            scores[0] = 100.0;
            for _ in 0..CHANGES {
                let p = rng.below(PLAYERS as u64) as usize;
                let new = rng.below(201) as f64 / 2.0;
                ranks.change("live", scores[p], new).await.unwrap();
                scores[p] = new;
            }
            scores
        }));
    }
    let mut expected: BTreeMap<i64, u64> = BTreeMap::new();
    for h in handles {
        for s in h.await.unwrap() {
            *expected.entry((s * 2.0) as i64).or_default() += 1;
        }
    }
    let got = counts(&ranks, "live").await;
    assert_eq!(
        got.values().sum::<u64>(),
        (TASKS * PLAYERS) as u64,
        "total conserved"
    );
    assert_eq!(got, expected);
    // Straight from the stored documents: no score twice, no count below 1.
    let stored: Vec<(Bson, i64)> = match T::RANK.layout {
        Layout::Array => {
            let d = ranks
                .histogram_collection()
                .find_one(doc! {"_id": "live"})
                .await
                .unwrap()
                .unwrap();
            d.get_array("scores")
                .unwrap()
                .iter()
                .map(|e| {
                    let e = e.as_document().unwrap();
                    (e.get("score").unwrap().clone(), e.get_i64("count").unwrap())
                })
                .collect()
        }
        _ => ranks
            .histogram_collection()
            .find(doc! {})
            .await
            .unwrap()
            .try_collect::<Vec<Document>>()
            .await
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d.get_document("_id").unwrap().get("s").unwrap().clone(),
                    d.get_i64("count").unwrap(),
                )
            })
            .collect(),
    };
    let mut seen = std::collections::HashSet::new();
    for (s, c) in &stored {
        assert!(*c >= 0, "negative count at {s}");
        assert!(seen.insert(s.to_string()), "score {s} twice");
    }
}

#[tokio::test]
async fn concurrent_changes_array() {
    concurrent::<ExamScore>("rank_conc_array", true).await;
}

#[tokio::test]
async fn concurrent_changes_documents() {
    concurrent::<ExamScoreDocs>("rank_conc_docs", true).await;
}

#[tokio::test]
async fn concurrent_changes_documents_fallback() {
    concurrent::<ExamScoreDocs>("rank_conc_docs_fb", false).await;
}

/// 16 tasks move students through the players' collection at once: each
/// update is a transaction, and the histogram ends equal to the students'
/// scores.
#[tokio::test]
async fn concurrent_score_updates_with_players() {
    let (db, _) = fresh_db("rank_conc_players").await;
    let ranks = ExamScore::ranks(&db);
    for i in 0..TASKS * 4 {
        ranks
            .insert(&ExamScore::new(format!("s{i}"), "x", 50.0))
            .await
            .unwrap();
    }
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let ranks = ranks.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng(0xabcd + task as u64);
            for _ in 0..40 {
                let student = format!("s{}", task * 4 + rng.below(4) as usize);
                let score = rng.below(21) as f64 * 5.0;
                assert!(ranks
                    .update_score(doc! {"_id": student}, score)
                    .await
                    .unwrap());
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let before = counts(&ranks, "x").await;
    assert_eq!(before.values().sum::<u64>(), (TASKS * 4) as u64);
    ranks.rebuild("x").await.unwrap();
    assert_eq!(
        counts(&ranks, "x").await,
        before,
        "histogram equals the players"
    );
}

/// The commands a client sent, and the cursor id of each reply that holds
/// a cursor (0: the first batch was the whole answer).
#[derive(Clone, Default)]
struct Wire {
    sent: Arc<Mutex<Vec<String>>>,
    cursors: Arc<Mutex<Vec<(String, i64)>>>,
}

impl Wire {
    /// What was sent since the last look, and the cursor ids of the
    /// replies.
    fn take(&self) -> (Vec<String>, Vec<(String, i64)>) {
        let sent = std::mem::take(&mut *self.sent.lock().unwrap());
        let cursors = std::mem::take(&mut *self.cursors.lock().unwrap());
        (sent, cursors)
    }
}

/// A database of its own on a client that records [`Wire`].
async fn watched_db(test: &str) -> (Database, Wire) {
    let mut opts = ClientOptions::parse(mongo_patterns_testkit::server_uri())
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    let wire = Wire::default();
    let w = wire.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| match ev {
        CommandEvent::Started(ev) => w.sent.lock().unwrap().push(ev.command_name),
        CommandEvent::Succeeded(ev) => {
            if let Ok(c) = ev.reply.get_document("cursor") {
                let id = c.get("id").and_then(|id| match id {
                    Bson::Int64(n) => Some(*n),
                    Bson::Int32(n) => Some(i64::from(*n)),
                    _ => None,
                });
                w.cursors
                    .lock()
                    .unwrap()
                    .push((ev.command_name, id.unwrap_or(-1)));
            }
        }
        _ => {}
    }));
    let client = Client::with_options(opts).unwrap();
    (
        client.database(&format!("mp_{test}_{}", std::process::id())),
        wire,
    )
}

/// `top(n)` is one command whose first batch holds the whole answer (no
/// `getMore`, no `killCursors`), whether the board holds fewer, as many or
/// more scores than `n`, and inside a transaction too.
async fn top_in_one_batch<T: Exam>(test: &str) {
    let (db, wire) = watched_db(test).await;
    let ranks = T::ranks(&db);
    // 150 distinct scores, more than a default first batch (101), and a tie.
    for s in 0..150 {
        ranks.record("b", f64::from(s)).await.unwrap();
    }
    ranks.record("b", 149.0).await.unwrap();
    wire.take();
    let read = |sent: &[String]| sent == ["aggregate"] || sent == ["find"];
    for n in [1, 2, 101, 102, 120, 149, 150, 151, 1000] {
        let top = ranks.top("b", n).await.unwrap();
        // A dropped cursor would be killed in the background: give it time.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (sent, cursors) = wire.take();
        assert!(read(&sent), "top({n}) sent {sent:?}");
        assert_eq!(
            cursors,
            [(sent[0].clone(), 0)],
            "top({n}): one closed cursor"
        );
        // Two at 149 share place 1, so `n` places hold one score fewer.
        let want = (n as usize).saturating_sub(1).clamp(1, 150);
        assert_eq!(top.len(), want, "top({n})");
        assert_eq!((top[0].score, top[0].count, top[0].rank), (149.0, 2, 1));
        if want > 1 {
            assert_eq!(top.last().unwrap().rank, want as u64 + 1, "top({n})");
        }
    }
    let mut s = db.client().start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    let top = ranks.top("b", 120).session(&mut s).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (sent, cursors) = wire.take();
    assert!(read(&sent), "top in a transaction sent {sent:?}");
    assert_eq!(cursors, [(sent[0].clone(), 0)], "in a transaction");
    assert_eq!(top.len(), 119);
    s.commit_transaction().await.unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn top_is_one_batch_array() {
    top_in_one_batch::<ExamScore>("rank_top_batch_array").await;
}

#[tokio::test]
async fn top_is_one_batch_documents() {
    top_in_one_batch::<ExamScoreDocs>("rank_top_batch_docs").await;
}

/// The names of the commands sent since the last look.
fn names(commands: &mongo_patterns_testkit::Commands) -> Vec<String> {
    commands.take().into_iter().map(|(n, _)| n).collect()
}

/// `insert` in a transaction of its own: one cross-collection `bulkWrite`
/// and the commit where the server takes it, the player's `insert`, the
/// histogram's write and the commit where it does not (switched off, or
/// refused: learnt once, nothing lost or counted twice). `update_score`
/// and `delete` need the old score first: three either way (four on the
/// documents layout without `bulkWrite`: the emptied score's `delete`).
///
/// On a server before 8.0, which refuses `bulkWrite` (`maxWireVersion`
/// below 25), the repositories are built without it (`bulk_write(false)`)
/// and expect the separate commands throughout; what a refusal costs once
/// is the `bulkWriteUnknown` section, on every server.
async fn insert_round_trips<T: Exam>(test: &str) {
    let (db, commands) = fresh_db(test).await;
    let bulk = mongo_patterns_testkit::takes_bulk_write(db.client(), test).await;
    commands.take();
    let layout = T::RANK.layout;
    // The histogram's write of a `+1`, and of a `-1` (which may empty a
    // score).
    let (hist, hist_dec) = match (layout, bulk) {
        (Layout::Array, _) => (vec!["update"], vec!["update"]),
        (Layout::Documents, true) => (vec!["bulkWrite"], vec!["bulkWrite"]),
        (Layout::Documents, false) => (vec!["update"], vec!["update", "delete"]),
    };
    let separate = |first: &str, hist: &[&str]| {
        let mut v = vec![first.to_owned()];
        v.extend(hist.iter().map(|s| s.to_string()));
        v.push("commitTransaction".into());
        v
    };
    let one_bulk_write: Vec<String> = if bulk {
        vec!["bulkWrite".into(), "commitTransaction".into()]
    } else {
        separate("insert", &["update"])
    };
    let ranks = T::ranks(&db).bulk_write(bulk);
    // The board's first insert creates it; the next ones add a score and
    // count an existing one.
    for (i, s) in [50.0, 60.0, 50.0].into_iter().enumerate() {
        ranks
            .insert(&T::new(format!("a{i}"), "b", s))
            .await
            .unwrap();
        assert_eq!(names(&commands), one_bulk_write, "insert {i}");
    }
    assert!(ranks.update_score(doc! {"_id": "a0"}, 70.0).await.unwrap());
    assert_eq!(names(&commands), separate("findAndModify", &hist_dec));
    assert!(ranks.delete(doc! {"_id": "a1"}).await.unwrap());
    assert_eq!(names(&commands), separate("findAndModify", &hist_dec));
    assert_eq!(
        counts(&ranks, "b").await,
        BTreeMap::from([(100, 1), (140, 1)])
    );
    commands.take();

    // A read concern would ride on the transaction's first command, and
    // a session of the caller's may have read before: the separate
    // commands.
    let rc = mongo_patterns::mongodb::options::ReadConcern::majority();
    let with_rc = T::ranks(&db)
        .bulk_write(bulk)
        .with_options(mongo_patterns::action::Options::new().read_concern(rc));
    with_rc
        .insert(&T::new("r0".into(), "b", 50.0))
        .await
        .unwrap();
    assert_eq!(names(&commands), separate("insert", &hist), "read concern");
    let mut session = db.client().start_session().await.unwrap();
    ranks
        .insert(&T::new("r1".into(), "b", 50.0))
        .session(&mut session)
        .await
        .unwrap();
    assert_eq!(
        names(&commands),
        separate("insert", &hist),
        "caller's session"
    );
    assert!(ranks.delete(doc! {"_id": "r0"}).await.unwrap());
    assert!(ranks.delete(doc! {"_id": "r1"}).await.unwrap());
    commands.take();

    // A server that refuses `readConcern` on `bulkWrite` (this test server
    // does, as the transaction's first command): the refused transaction
    // never started, nothing was written; the call reruns it as separate
    // commands, and the repository remembers. A server that takes it
    // commits the one `bulkWrite`, each time. (A server without
    // `bulkWrite` refuses it whatever it carries: the section after.)
    if bulk {
        let rc = mongo_patterns::mongodb::options::ReadConcern::majority();
        let forced = T::ranks(&db)
            .with_options(mongo_patterns::action::Options::new().read_concern(rc))
            .__bulk_write_with_read_concern(true);
        forced
            .insert(&T::new("q0".into(), "b", 50.0))
            .await
            .unwrap();
        let sent = names(&commands);
        assert_eq!(sent[0], "bulkWrite", "{sent:?}");
        let again = if sent == one_bulk_write {
            eprintln!("{test}: this server takes readConcern on a transaction's first bulkWrite");
            one_bulk_write.clone()
        } else {
            assert!(sent.ends_with(&separate("insert", &hist)), "{sent:?}");
            separate("insert", &hist)
        };
        forced
            .insert(&T::new("q1".into(), "b", 50.0))
            .await
            .unwrap();
        assert_eq!(names(&commands), again, "remembered");
        assert!(ranks.delete(doc! {"_id": "q0"}).await.unwrap());
        assert!(ranks.delete(doc! {"_id": "q1"}).await.unwrap());
        commands.take();
    }

    // Switched off: the separate commands.
    let off = T::ranks(&db).bulk_write(false);
    off.insert(&T::new("c0".into(), "b", 50.0)).await.unwrap();
    let update = vec!["update"];
    assert_eq!(names(&commands), separate("insert", &update));

    // A server that does not know the command: refused once, nothing
    // written, then the separate commands for this repository and its
    // clones.
    let refusing = T::ranks(&db).__bulk_write_command("bulkWriteUnknown");
    refusing
        .insert(&T::new("d0".into(), "b", 60.0))
        .await
        .unwrap();
    let sent = names(&commands);
    assert_eq!(sent[0], "bulkWriteUnknown", "{sent:?}");
    assert!(sent.ends_with(&separate("insert", &update)), "{sent:?}");
    let clone = refusing.clone();
    clone.insert(&T::new("d1".into(), "b", 60.0)).await.unwrap();
    assert_eq!(names(&commands), separate("insert", &update));
    assert_eq!(
        counts(&ranks, "b").await,
        BTreeMap::from([(100, 2), (120, 2), (140, 1)])
    );
    ranks.rebuild("b").await.unwrap();
    assert_eq!(
        counts(&ranks, "b").await,
        BTreeMap::from([(100, 2), (120, 2), (140, 1)]),
        "the histogram equals the players"
    );
    commands.take();

    // A player inserted twice: the driver's duplicate-key error, nothing
    // counted.
    let e = ranks
        .insert(&T::new("a0".into(), "b", 90.0))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("11000"), "{e:?}");
    let first = if bulk { "bulkWrite" } else { "insert" };
    assert_eq!(names(&commands), [first, "abortTransaction"]);
    assert!(!counts(&ranks, "b").await.contains_key(&180));
    db.drop().await.unwrap();
}

#[tokio::test]
async fn insert_is_two_round_trips_array() {
    insert_round_trips::<ExamScore>("rank_insert_trips_array").await;
}

#[tokio::test]
async fn insert_is_two_round_trips_documents() {
    insert_round_trips::<ExamScoreDocs>("rank_insert_trips_docs").await;
}
