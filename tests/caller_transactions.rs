//! A pattern's write cut inside the caller's transaction (a request
//! timeout drops the call's future) while its command is held on the
//! server (`failCommand` with `blockConnection`): the held command arrives
//! after the call has gone, perhaps as the transaction's first, and would
//! then start the transaction on the server and hold its locks for the
//! transaction's 60 s lifetime. The call must see to it that nothing stays
//! open: no transaction open on the server, and a fresh writer of the same
//! key, in a transaction of its own, succeeds at once. Then the caller's
//! session: `abort_transaction()` returns at once, and a new transaction
//! on it runs and commits.
//!
//! Each test runs on a `FaultServer`: `MONGODB_URI` when it takes test
//! commands (its fail points scoped to the test's own clients, one fault
//! test at a time), else a surrogate server of its own. The count of
//! transactions open on the server (`serverStatus`) is checked on a server
//! of the test's own only, since a shared deployment counts other tests'
//! transactions too; the rest (the caller's abort and next transaction,
//! the fresh writer at once) on both.

use std::time::{Duration, Instant};

use mongo_patterns::mongodb::ClientSession;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, client, FaultServer};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cut_ticks")]
#[bucket(size = 4, key = "sym")]
struct Tick {
    sym: String,
    n: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "cut_scores")]
#[rank_histogram(precision = 0.5)]
struct ArrayScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "cut_scores_docs")]
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

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "cut_items")]
struct Item {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 10, upsert = true)]
    sampled: i64,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    buffered: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cut_logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
    msg: String,
}

const OCT: i64 = 1_635_132_899; // 2021-10-25T03:34:59Z

fn log(id: i64, msg: &str) -> Log {
    Log {
        id,
        kind: "app".to_owned(),
        ts: OCT,
        msg: msg.to_owned(),
    }
}

/// A test's server, its client, and the database of the caller's own
/// writes (collection `other`, created by the test).
struct Setup {
    server: FaultServer,
    c: Client,
    other: Database,
}

/// The server for `test` ([`FaultServer`]), started outside the test's
/// time bound.
async fn setup(test: &str) -> Setup {
    let server = FaultServer::start(test).await;
    let (c, _) = client(server.uri()).await;
    let other = c.database(&server.db_name("cut_other"));
    Setup { server, c, other }
}

impl Setup {
    /// A database for `name` on the test's server.
    fn db(&self, name: &str) -> Database {
        self.c.database(&self.server.db_name(name))
    }

    /// Holds the next command the call sends 300 ms on the server,
    /// whichever it is (a write, or a read that decides one).
    async fn hold_next_command(&self) {
        let held = doc! {
            "failCommands": ["insert", "update", "delete", "findAndModify", "bulkWrite", "find", "aggregate"],
            "blockConnection": true,
            "blockTimeMS": 300,
        };
        self.server.fail(&self.c, Some(1), held).await;
    }

    /// Transactions open on the server now, where the count is the test's
    /// alone (a server of its own).
    async fn open_transactions(&self) -> Option<i64> {
        self.server.open_transactions(&self.c).await
    }
}

/// Where the call is cut.
#[derive(Debug, Clone, Copy)]
enum Point {
    /// The call's command is the transaction's first.
    First,
    /// The caller wrote in the transaction before the call.
    AfterCallers,
}

/// One write cut in the caller's transaction at `point`. `call(s, n)` is
/// the write in session `s`: `n` = 0 for the cut call, 1 for the fresh
/// writer of the same key (another session), 2 for the caller's next
/// transaction in the session the cut call ran in.
async fn cut_in_transaction(
    t: &Setup,
    what: &str,
    point: Point,
    call: impl AsyncFn(&mut ClientSession, u32) -> mongo_patterns::Result<()>,
) {
    let what = format!("{what} ({point:?})");
    let c = &t.c;
    let mut s = c.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    if let Point::AfterCallers = point {
        t.other
            .collection::<Document>("other")
            .insert_one(doc! {"by": "caller"})
            .session(&mut s)
            .await
            .unwrap();
    }
    t.hold_next_command().await;
    let cut = tokio::time::timeout(Duration::from_millis(50), call(&mut s, 0)).await;
    assert!(cut.is_err(), "{what}: not cut: {cut:?}");
    // The held command runs now.
    tokio::time::sleep(Duration::from_millis(400)).await;
    match point {
        // The server knew the transaction before the cut: the kill ended
        // it, and the held command cannot start it again.
        Point::AfterCallers => {
            let since = Instant::now();
            while let Some(open) = t.open_transactions().await {
                if open == 0 {
                    break;
                }
                assert!(
                    since.elapsed() < Duration::from_secs(5),
                    "{what}: {open} transactions still open 5 s after the cut"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // The held command was the transaction's first: it reached the
        // server after the kill and started the transaction there, which
        // nothing kills again (a later kill could hit the next user of the
        // server session). The caller's next transaction fences it.
        Point::First => {}
    }

    // The caller's session: its abort returns at once, and its next
    // transaction runs and commits, fencing whatever the cut left.
    bounded(5, s.abort_transaction()).await.unwrap();
    bounded(10, async {
        s.start_transaction().await?;
        call(&mut s, 2).await?;
        s.commit_transaction().await?;
        Ok::<_, mongo_patterns::Error>(())
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: the caller's next transaction: {e:?}"));
    if let Some(open) = t.open_transactions().await {
        assert_eq!(open, 0, "{what}: left open");
    }

    // A fresh writer of the same key, in a transaction of its own, at once.
    let mut fresh = c.start_session().await.unwrap();
    let since = Instant::now();
    let r = bounded(90, async {
        fresh.start_transaction().await?;
        call(&mut fresh, 1).await?;
        fresh.commit_transaction().await?;
        Ok::<_, mongo_patterns::Error>(())
    })
    .await;
    let took = since.elapsed();
    assert!(
        r.is_ok(),
        "{what}: the fresh writer failed after {took:?}: {r:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "{what}: the fresh writer took {took:?}"
    );
    if let Some(open) = t.open_transactions().await {
        assert_eq!(open, 0, "{what}: left open");
    }
}

const POINTS: [Point; 2] = [Point::First, Point::AfterCallers];

/// Bucket `push`, `push_many` and `update`.
#[tokio::test]
async fn bucket_writes_cut_in_a_callers_transaction() {
    let t = setup("bucket_writes_cut_in_a_callers_transaction").await;
    let db = t.db("cut_bucket");
    bounded(120, async {
        let repo = Tick::buckets(&db);
        repo.ensure().await.unwrap();
        t.other.create_collection("other").await.unwrap();
        let tick = |n| Tick {
            sym: "s".to_owned(),
            n,
        };
        let one = tick(1);
        repo.push(&one).await.unwrap();
        for point in POINTS {
            cut_in_transaction(&t, "push", point, async |s, n| {
                repo.push(&tick(10 + n)).session(s).await
            })
            .await;
            cut_in_transaction(&t, "push_many", point, async |s, n| {
                let items = [tick(20 + n), tick(30 + n)];
                repo.push_many(&items).session(s).await
            })
            .await;
            cut_in_transaction(&t, "update", point, async |s, n| {
                repo.replace("s", doc! {"n": 1}, &tick(1))
                    .session(s)
                    .await
                    .map(|found| assert!(found, "update {n}: not found"))
            })
            .await;
        }
    })
    .await;
}

async fn rank_writes<T: RankHistogram<Board = String, Score = f64>>(
    t: &Setup,
    db: &Database,
    new: impl Fn(&str, f64) -> T,
) {
    let ranks = T::ranks(db);
    ranks.ensure().await.unwrap();
    for p in 0..20 {
        ranks.insert(&new(&format!("p{p}"), 5.0)).await.unwrap();
    }
    for _ in 0..20 {
        ranks.record("b", 7.0).await.unwrap();
    }
    let mut next = 0;
    for point in POINTS {
        cut_in_transaction(t, "record", point, async |s, _| {
            ranks.record("b", 9.0).session(s).await
        })
        .await;
        cut_in_transaction(t, "change", point, async |s, _| {
            ranks.change("b", 7.0, 8.0).session(s).await
        })
        .await;
        cut_in_transaction(t, "unrecord", point, async |s, _| {
            ranks.unrecord("b", 7.0).session(s).await
        })
        .await;
        let base = next;
        cut_in_transaction(t, "insert", point, async |s, n| {
            // The fresh writer inserts the cut call's player.
            let who = if n < 2 { base } else { base + 1 };
            ranks.insert(&new(&format!("n{who}"), 6.0)).session(s).await
        })
        .await;
        next += 2;
        cut_in_transaction(t, "update_score", point, async |s, n| {
            let r = ranks
                .update_score(doc! {"_id": "p0"}, 10.0 + f64::from(n))
                .session(s)
                .await?;
            assert!(r, "update_score {n}: not found");
            Ok(())
        })
        .await;
        let gone = match point {
            Point::First => ["p1", "p2"],
            Point::AfterCallers => ["p3", "p4"],
        };
        cut_in_transaction(t, "delete", point, async |s, n| {
            let who = if n < 2 { gone[0] } else { gone[1] };
            let r = ranks.delete(doc! {"_id": who}).session(s).await?;
            assert!(r, "delete {n}: not found");
            Ok(())
        })
        .await;
    }
}

/// Rank `record`, `change`, `unrecord`, `insert`, `update_score` and
/// `delete`, both layouts.
#[tokio::test]
async fn rank_writes_cut_in_a_callers_transaction() {
    let t = setup("rank_writes_cut_in_a_callers_transaction").await;
    t.other.create_collection("other").await.unwrap();
    bounded(240, async {
        rank_writes(&t, &t.db("cut_rank_array"), |s, score| ArrayScore {
            student: s.to_owned(),
            exam_id: "b".to_owned(),
            score,
        })
        .await;
        rank_writes(&t, &t.db("cut_rank_docs"), |s, score| DocsScore {
            student: s.to_owned(),
            exam_id: "b".to_owned(),
            score,
        })
        .await;
    })
    .await;
}

/// Counter `incr_by`, sampled (every call writes: n = every) and buffered
/// (a call in a session writes through).
#[tokio::test]
async fn counter_writes_cut_in_a_callers_transaction() {
    let t = setup("counter_writes_cut_in_a_callers_transaction").await;
    let db = t.db("cut_counter");
    bounded(120, async {
        db.create_collection("cut_items").await.unwrap();
        t.other.create_collection("other").await.unwrap();
        let sampled = Item::sampled_counter(&db);
        let buffered = Item::buffered_counter(&db);
        sampled.incr_by("k", 10).await.unwrap();
        for point in POINTS {
            cut_in_transaction(&t, "sampled incr_by", point, async |s, _| {
                sampled.incr_by("k", 10).session(s).await
            })
            .await;
            cut_in_transaction(&t, "buffered incr_by", point, async |s, _| {
                buffered.incr_by("k", 10).session(s).await
            })
            .await;
        }
    })
    .await;
}

/// Shard key `insert`, `upsert`, `replace` and `update`.
#[tokio::test]
async fn shard_key_writes_cut_in_a_callers_transaction() {
    let t = setup("shard_key_writes_cut_in_a_callers_transaction").await;
    let db = t.db("cut_shard");
    bounded(120, async {
        let repo = Log::sharded(&db);
        repo.ensure().await.unwrap();
        t.other.create_collection("other").await.unwrap();
        repo.insert(&log(1, "one")).await.unwrap();
        let mut next = 100;
        for point in POINTS {
            let base = next;
            cut_in_transaction(&t, "insert", point, async |s, n| {
                // The fresh writer inserts the cut call's `_id`.
                let id = if n < 2 { base } else { base + 1 };
                repo.insert(&log(id, "new")).session(s).await
            })
            .await;
            next += 2;
            cut_in_transaction(&t, "upsert", point, async |s, n| {
                repo.upsert(&log(1, &format!("upsert {n}")))
                    .session(s)
                    .await
                    .map(drop)
            })
            .await;
            cut_in_transaction(&t, "replace", point, async |s, n| {
                repo.replace(&log(1, &format!("replace {n}")))
                    .session(s)
                    .await
                    .map(drop)
            })
            .await;
            cut_in_transaction(&t, "update", point, async |s, n| {
                let at = DateTime::from_millis(OCT * 1000);
                repo.update(at, "app", doc! {"_id": 1}, doc! {"$set": {"n": n}})
                    .session(s)
                    .await
                    .map(drop)
            })
            .await;
        }
    })
    .await;
}

/// On a deployment that refuses `killSessions` (Atlas shared tiers and
/// Flex answer `Unauthorized`), a write cut while its command was the
/// caller's transaction's first leaves that transaction open on the server,
/// as the guide says. The caller's next transaction in the same session
/// fences it: its higher transaction number makes the server abort the
/// older one, and both the caller and a fresh writer of the same key go on.
#[tokio::test]
async fn a_cut_where_kill_sessions_is_refused_is_fenced_by_the_next_transaction() {
    let t = setup("a_cut_where_kill_sessions_is_refused_is_fenced_by_the_next_transaction").await;
    let c = &t.c;
    let db = t.db("cut_refused");
    let repo = Tick::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    let tick = |n| Tick {
        sym: "s".to_owned(),
        n,
    };
    let first = tick(1);
    bounded(10, repo.push(&first)).await.unwrap();
    let refuse =
        doc! {"failCommands": ["killSessions"], "errorCode": 13, "errorMessage": "not authorized"};
    t.server.fail(c, None, refuse).await;
    let mut s = c.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    t.hold_next_command().await;
    let cut_item = tick(2);
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        repo.push(&cut_item).session(&mut s),
    )
    .await;
    assert!(cut.is_err(), "not cut: {cut:?}");
    // The held command runs, and nothing kills its transaction.
    tokio::time::sleep(Duration::from_millis(600)).await;
    if let Some(open) = t.open_transactions().await {
        assert_eq!(open, 1, "the cut transaction stays open");
    }
    bounded(5, s.abort_transaction()).await.unwrap();
    // The next transaction in the same session fences it.
    let next = tick(3);
    bounded(30, async {
        s.start_transaction().await?;
        repo.push(&next).session(&mut s).await?;
        s.commit_transaction().await?;
        Ok::<_, mongo_patterns::Error>(())
    })
    .await
    .unwrap();
    if let Some(open) = t.open_transactions().await {
        assert_eq!(open, 0, "fenced");
    }
    let fresh = tick(4);
    bounded(10, repo.push(&fresh)).await.unwrap();
    t.server.off(c).await;
    let stored: Vec<u32> = bounded(10, repo.stream("s").try_collect::<Vec<_>>())
        .await
        .unwrap()
        .iter()
        .map(|t| t.n)
        .collect();
    assert_eq!(stored, [1, 3, 4], "the cut push not committed");
}

/// The kill after a cut is sent once, at the cut, and never again: the
/// next use of the cut session's server session (the caller's next
/// transaction in it, or the next user the driver's pool hands it to) is
/// not killed. Once the kill sent at the cut has its reply, a transaction
/// in the same session spanning the second after the cut commits, and no
/// other kill is sent. Before, a second `killSessions` a second after the
/// cut aborted it (`NoSuchTransaction` at its commit).
///
/// A next use that starts while the kill is still on its way can be hit
/// (the cut module says so); the test waits for the kill's reply so that
/// it checks what the library promises and nothing of the runtime's
/// scheduling.
#[tokio::test]
async fn the_next_use_of_a_cut_sessions_server_session_is_not_killed() {
    use mongo_patterns::mongodb::event::command::CommandEvent;
    use mongo_patterns::mongodb::event::EventHandler;
    use mongo_patterns::mongodb::options::ClientOptions;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let test = "the_next_use_of_a_cut_sessions_server_session_is_not_killed";
    let server = FaultServer::start(test).await;
    let mut opts = ClientOptions::parse(server.uri()).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    let (sent, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s2, a2) = (sent.clone(), answered.clone());
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| match ev {
        CommandEvent::Started(e) if e.command_name == "killSessions" => {
            s2.fetch_add(1, Ordering::SeqCst);
        }
        CommandEvent::Succeeded(e) if e.command_name == "killSessions" => {
            a2.fetch_add(1, Ordering::SeqCst);
        }
        CommandEvent::Failed(e) if e.command_name == "killSessions" => {
            a2.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }));
    let c = Client::with_options(opts).unwrap();
    let db = c.database(&server.db_name("cut_next_use"));
    let repo = Tick::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    let other = db.collection::<Document>("other");
    bounded(10, other.insert_one(doc! {"_id": 0}))
        .await
        .unwrap();
    let mut s = c.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    bounded(10, other.insert_one(doc! {"_id": 1}).session(&mut s))
        .await
        .unwrap();
    let held = doc! {
        "failCommands": ["insert", "update", "delete", "findAndModify", "bulkWrite", "find", "aggregate"],
        "blockConnection": true,
        "blockTimeMS": 300,
    };
    server.fail(&c, Some(1), held).await;
    let item = Tick {
        sym: "s".to_owned(),
        n: 1,
    };
    let cut =
        tokio::time::timeout(Duration::from_millis(50), repo.push(&item).session(&mut s)).await;
    assert!(cut.is_err(), "not cut: {cut:?}");
    bounded(5, s.abort_transaction()).await.unwrap();
    bounded(10, async {
        while answered.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // The next use of the same server session, across the second after
    // the cut.
    s.start_transaction().await.unwrap();
    bounded(10, other.insert_one(doc! {"_id": 2}).session(&mut s))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    bounded(10, s.commit_transaction())
        .await
        .unwrap_or_else(|e| panic!("the next transaction was killed: {e}"));
    let stored = bounded(10, other.count_documents(doc! {"_id": 2}))
        .await
        .unwrap();
    assert_eq!(stored, 1);
    assert_eq!(sent.load(Ordering::SeqCst), 1, "one kill, at the cut");
}
