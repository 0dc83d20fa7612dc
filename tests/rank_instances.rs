//! `insert`, `update_score` and `delete` on one board from several
//! instances of a service at once: clients stand in for processes (each
//! has its own pool, sessions and repository handle; nothing in memory is
//! shared between them), on one server and one board, in both layouts.
//!
//! Each task owns players of its own (no two tasks move one player), and
//! turns through its calls: an `update_score` of one of its players, an
//! `insert` of a new player, another `update_score`, a `delete` of a
//! player it inserted. Every call must succeed (no `Contended`, no error
//! at all), the instances together must send at most 4 commands a call
//! (every command every client sent, counted by command monitoring), and
//! afterwards an independent reader (the raw driver) must find the board's
//! stored histogram equal to the stored players regrouped by score.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::{RankHistogram, Ranks};
use mongo_patterns_testkit::{bounded, client, server_uri, with_pool, Commands};

const BOARD: &str = "season_1";
/// Players on the board before the calls start.
const PLAYERS: i64 = 256;
/// How long the tasks run.
const SECS: u64 = 8;
/// The most any single call may take: the transaction's 120 s of retries.
const CALL_BOUND: Duration = Duration::from_secs(150);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "players")]
#[rank_histogram(board = "board", score = "score")]
struct Player {
    #[serde(rename = "_id")]
    id: i64,
    board: String,
    score: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "players_docs")]
#[rank_histogram(board = "board", score = "score", layout = "documents")]
struct PlayerDoc {
    #[serde(rename = "_id")]
    id: i64,
    board: String,
    score: i64,
}

/// The models of both layouts, alike.
trait Make: RankHistogram<Score = i64, Board = String> + Clone {
    fn make(id: i64, score: i64) -> Self;
}

impl Make for Player {
    fn make(id: i64, score: i64) -> Self {
        Player {
            id,
            board: BOARD.to_owned(),
            score,
        }
    }
}

impl Make for PlayerDoc {
    fn make(id: i64, score: i64) -> Self {
        PlayerDoc {
            id,
            board: BOARD.to_owned(),
            score,
        }
    }
}

fn score_of(x: u64) -> i64 {
    // Scores 0 to 99: a hundred histogram entries.
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as i64 % 100
}

/// What a run measured.
struct Measured {
    calls: u64,
    commands: usize,
    errors: Vec<String>,
    slowest: Duration,
}

async fn run<M: Make>(name: &str, clients: usize, tasks: usize) -> (Measured, Database) {
    let uri = with_pool(&server_uri(), tasks as u32 + 4);
    let db_name = format!("mp_{name}_{}", std::process::id());
    let mut dbs: Vec<(Database, Commands)> = Vec::new();
    for _ in 0..clients {
        let (c, commands) = client(&uri).await;
        dbs.push((c.database(&db_name), commands));
    }
    let db = dbs[0].0.clone();
    bounded(30, db.drop()).await.unwrap();
    let first = M::ranks(&db);
    bounded(30, first.ensure()).await.unwrap();
    let players: Vec<M> = (0..PLAYERS)
        .map(|id| M::make(id, score_of(id as u64)))
        .collect();
    bounded(30, db.collection::<M>(M::COLLECTION).insert_many(&players))
        .await
        .unwrap();
    bounded(30, first.rebuild(BOARD)).await.unwrap();
    for (_, c) in &dbs {
        c.take();
    }

    let total = clients * tasks;
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let until = Instant::now() + Duration::from_secs(SECS);
    let mut handles = Vec::new();
    for (c, (db, _)) in dbs.iter().enumerate() {
        // One handle per instance, shared by its tasks.
        let ranks: Ranks<M> = M::ranks(db);
        for t in 0..tasks {
            let me = (c * tasks + t) as i64;
            let ranks = ranks.clone();
            let (calls, errors, slowest) = (calls.clone(), errors.clone(), slowest.clone());
            handles.push(tokio::spawn(async move {
                let mine: Vec<i64> = (0..PLAYERS).filter(|id| id % total as i64 == me).collect();
                let mut inserted: Vec<i64> = Vec::new();
                let mut seq: u64 = 0;
                while Instant::now() < until {
                    let x = (me as u64) << 32 | seq;
                    let started = Instant::now();
                    let call = async {
                        match seq % 4 {
                            1 => {
                                let id = 1_000_000 + me * 100_000 + seq as i64;
                                ranks.insert(&M::make(id, score_of(x))).await?;
                                inserted.push(id);
                                Ok(true)
                            }
                            3 if !inserted.is_empty() => {
                                let id = inserted.remove(0);
                                ranks.delete(doc! {"_id": id}).await
                            }
                            _ if !mine.is_empty() => {
                                let id = mine[(seq / 2) as usize % mine.len()];
                                ranks.update_score(doc! {"_id": id}, score_of(x)).await
                            }
                            _ => Ok(true),
                        }
                    };
                    let r = tokio::time::timeout(CALL_BOUND, call).await;
                    let took = started.elapsed();
                    {
                        let mut s = slowest.lock().unwrap();
                        *s = (*s).max(took);
                    }
                    match r {
                        Ok(Ok(true)) => {}
                        Ok(Ok(false)) => errors
                            .lock()
                            .unwrap()
                            .push(format!("task {me} call {seq}: its player was not found")),
                        Ok(Err(e)) => errors
                            .lock()
                            .unwrap()
                            .push(format!("task {me} call {seq}: {e}")),
                        Err(_) => errors
                            .lock()
                            .unwrap()
                            .push(format!("task {me} call {seq}: longer than {CALL_BOUND:?}")),
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                    seq += 1;
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut commands = 0;
    for (_, c) in &dbs {
        for (n, _) in c.take() {
            *names.entry(n).or_default() += 1;
            commands += 1;
        }
    }
    println!("{name}: commands by name {names:?}");
    let m = Measured {
        calls: calls.load(Ordering::Relaxed),
        commands,
        errors: std::mem::take(&mut *errors.lock().unwrap()),
        slowest: *slowest.lock().unwrap(),
    };
    println!(
        "{name}: {} calls from {clients} instances x {tasks} tasks in {SECS} s, {} commands \
         ({:.2} a call), {} errors, slowest call {:?}",
        m.calls,
        m.commands,
        m.commands as f64 / m.calls.max(1) as f64,
        m.errors.len(),
        m.slowest,
    );
    (m, db)
}

/// The players regrouped by score, read with the raw driver.
async fn players_by_score(db: &Database, collection: &str) -> BTreeMap<i64, i64> {
    let mut by = BTreeMap::new();
    let players: Vec<Document> = db
        .collection::<Document>(collection)
        .find(doc! {"board": BOARD})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    for p in players {
        *by.entry(int(p.get("score"))).or_default() += 1;
    }
    by
}

fn int(b: Option<&Bson>) -> i64 {
    match b {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Double(v)) if v.fract() == 0.0 => *v as i64,
        other => panic!("not an integer: {other:?}"),
    }
}

/// The array layout's stored board, read with the raw driver.
async fn array_histogram(db: &Database) -> BTreeMap<i64, i64> {
    let hist = db
        .collection::<Document>(Player::RANK.histogram)
        .find_one(doc! {"_id": BOARD})
        .await
        .unwrap()
        .expect("the board's document");
    let mut by = BTreeMap::new();
    for s in hist.get_array("scores").unwrap() {
        let s = s.as_document().unwrap();
        let n = int(s.get("count"));
        assert!(n > 0, "a score held by nobody is listed: {s}");
        assert!(
            by.insert(int(s.get("score")), n).is_none(),
            "a score listed twice: {s}"
        );
    }
    by
}

/// The documents layout's stored board (a document per score, the board's
/// marker and emptied scores left out), read with the raw driver.
async fn documents_histogram(db: &Database) -> BTreeMap<i64, i64> {
    let docs: Vec<Document> = db
        .collection::<Document>(PlayerDoc::RANK.histogram)
        .find(doc! {"_id.b": BOARD})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut by = BTreeMap::new();
    for d in docs {
        let id = d.get_document("_id").unwrap();
        if matches!(id.get("s"), Some(Bson::MinKey)) {
            continue;
        }
        let n = int(d.get("count"));
        if n == 0 {
            continue;
        }
        assert!(n > 0, "a negative count: {d}");
        assert!(by.insert(int(id.get("s")), n).is_none(), "twice: {d}");
    }
    by
}

fn check(name: &str, m: &Measured, stored: &BTreeMap<i64, i64>, players: &BTreeMap<i64, i64>) {
    assert!(
        m.errors.is_empty(),
        "{name}: {} calls failed, first: {:?}",
        m.errors.len(),
        &m.errors[..m.errors.len().min(5)]
    );
    assert!(m.calls > 0, "{name}: no call ran");
    assert_eq!(stored, players, "{name}: the histogram is not the players");
    let per_call = m.commands as f64 / m.calls as f64;
    assert!(
        per_call <= 4.0,
        "{name}: {per_call:.2} round trips a call ({} commands for {} calls), more than 4",
        m.commands,
        m.calls
    );
}

async fn array(name: &str, clients: usize, tasks: usize) {
    let (m, db) = run::<Player>(name, clients, tasks).await;
    let stored = bounded(30, array_histogram(&db)).await;
    let players = bounded(30, players_by_score(&db, Player::COLLECTION)).await;
    check(name, &m, &stored, &players);
    bounded(30, db.drop()).await.unwrap();
}

async fn documents(name: &str, clients: usize, tasks: usize) {
    let (m, db) = run::<PlayerDoc>(name, clients, tasks).await;
    let stored = bounded(30, documents_histogram(&db)).await;
    let players = bounded(30, players_by_score(&db, PlayerDoc::COLLECTION)).await;
    check(name, &m, &stored, &players);
    bounded(30, db.drop()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_4x16_array() {
    bounded(240, array("ri_4x16_array", 4, 16)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_16x4_array() {
    bounded(240, array("ri_16x4_array", 16, 4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_4x16_documents() {
    bounded(240, documents("ri_4x16_docs", 4, 16)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_16x4_documents() {
    bounded(240, documents("ri_16x4_docs", 16, 4)).await;
}
