//! What real deployments answer that a single test server does not, given
//! by the test server's `failCommand` fail point as `mongod` gives it:
//! MongoDB 7.0's and 6.0's refusals of `bulkWrite`, the errors of an
//! election (without the `RetryableWriteError` label, as `mongod` sends
//! them to a command that carries no transaction number), a connection
//! lost after the write was sent, a step-down reported after the write;
//! and a client whose URI says `readPreference=secondaryPreferred`,
//! discovered as a replica set, so that the read preference travels on the
//! wire and the commands show where each read was sent.
//!
//! Each test runs on a `FaultServer`: `MONGODB_URI` when it takes test
//! commands (a real mongod or mongos; the test's fail points scoped to its
//! own clients, one fault test at a time), else a surrogate server of its
//! own.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::bson::{doc, Bson, Document};
use mongo_patterns::mongodb::ClientSession;
use mongo_patterns::prelude::*;
use mongo_patterns::Error;
use mongo_patterns_testkit::{bounded, client, Commands, FaultServer};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "dep_scores")]
#[rank_histogram(board = "examId", score = "score", layout = "documents")]
struct Score {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "dep_items")]
struct Item {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 10, upsert = true)]
    sampled: i64,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    buffered: i64,
}

/// Pushed in arrival order: the one-command push.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "dep_events")]
#[bucket(size = 3, key = "acct", items = "events")]
struct Event {
    acct: String,
    n: u32,
}

/// Kept in `day` order: a late item is a transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "dep_ticks")]
#[bucket(size = 3, key = "sym", order = "day", items = "ticks")]
struct Tick {
    sym: String,
    day: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "dep_logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

async fn server(test: &str) -> FaultServer {
    FaultServer::start(test).await
}

/// A client of `server` that checks the server every 500 ms (the least
/// the driver takes), as an application's would in an election: the
/// driver marks a primary that says it stepped down as unknown, and
/// selects again once a check finds one (mongod's own step-down also
/// wakes the driver's waiting check; a fail point's answer does not).
async fn client_of(server: &FaultServer) -> (Client, Commands) {
    client(&format!("{}&heartbeatFrequencyMS=500", server.uri())).await
}

/// Board `b` as stored (score → count), read with the raw driver; the
/// board's marker and emptied scores left out, a negative count refused.
async fn stored(db: &Database, b: &str) -> BTreeMap<i64, i64> {
    let docs: Vec<Document> = db
        .collection::<Document>(Score::RANK.histogram)
        .find(doc! {"_id.b": b})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for d in docs {
        let s = d.get_document("_id").unwrap().get("s").unwrap().clone();
        let c = d.get_i64("count").unwrap();
        // The marker; and a score emptied by the fallback's `update` whose
        // `delete` did not follow (reads skip it, `rebuild` removes it).
        if s == Bson::MinKey || c == 0 {
            continue;
        }
        assert!(c >= 1, "count {c} at {s}");
        let s = match s {
            Bson::Int64(i) => i,
            Bson::Int32(i) => i64::from(i),
            Bson::Double(f) => f as i64,
            other => panic!("score {other}"),
        };
        assert!(out.insert(s, c).is_none(), "score {s} stored twice");
    }
    out
}

/// The players of board `b`, regrouped by score.
async fn players(db: &Database, b: &str) -> BTreeMap<i64, i64> {
    let docs: Vec<Score> = db
        .collection::<Score>("dep_scores")
        .find(doc! {"examId": b})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for p in docs {
        *out.entry(p.score).or_insert(0) += 1;
    }
    out
}

fn score(student: &str, b: &str, score: i64) -> Score {
    Score {
        student: student.into(),
        exam_id: b.into(),
        score,
    }
}

/// Every write of the documents layout, on a server that refuses
/// `bulkWrite` with `code` on every call.
async fn documents_layout_without_bulk_write(server: &FaultServer, code: i32) {
    let (c, _) = client_of(server).await;
    let db = c.database(&server.db_name(&format!("dep_{code}")));
    server
        .fail(
            &c,
            None,
            doc! {"failCommands": ["bulkWrite"], "errorCode": code},
        )
        .await;
    let ranks = Score::ranks(&db);
    let what = format!("bulkWrite refused with {code}");
    for (i, s) in [70, 80, 80, 90].into_iter().enumerate() {
        ranks
            .insert(&score(&format!("p{i}"), "b", s))
            .await
            .unwrap_or_else(|e| panic!("{what}: insert: {e}"));
    }
    ranks
        .update_score(doc! {"_id": "p0"}, 95)
        .await
        .unwrap_or_else(|e| panic!("{what}: update_score: {e}"));
    ranks
        .delete(doc! {"_id": "p1"})
        .await
        .unwrap_or_else(|e| panic!("{what}: delete: {e}"));
    assert_eq!(stored(&db, "b").await, players(&db, "b").await, "{what}");
    assert_eq!(ranks.rank("b", 80).await.unwrap().rank, 3, "{what}");

    // The histogram's own writes, on a board without players.
    ranks.record("solo", 5).await.unwrap();
    ranks.record("solo", 5).await.unwrap();
    ranks.change("solo", 5, 7).await.unwrap();
    ranks.unrecord("solo", 5).await.unwrap();
    assert_eq!(
        stored(&db, "solo").await,
        BTreeMap::from([(7, 1)]),
        "{what}"
    );
    server.off(&c).await;
}

/// MongoDB 7.0 has a `bulkWrite` of its own, and answers 8.0's with
/// 40415 ("BSON field 'bulkWrite.errorsOnly' is an unknown field").
#[tokio::test]
async fn documents_layout_works_on_mongodb_7_0() {
    let server = server("documents_layout_works_on_mongodb_7_0").await;
    bounded(120, documents_layout_without_bulk_write(&server, 40415)).await;
}

/// MongoDB 6.0 does not know `bulkWrite` (59); the documentdb engine
/// (Cosmos DB vCore, FerretDB 2) does not support it (115). DocumentDB's
/// 303 is classified with them (a unit test of the classifier): the test
/// server closes the connection instead of answering a fail point with it.
#[tokio::test]
async fn documents_layout_works_without_bulk_write() {
    let server = server("documents_layout_works_without_bulk_write").await;
    bounded(240, async {
        for code in [59, 115] {
            documents_layout_without_bulk_write(&server, code).await;
        }
    })
    .await;
}

/// The ways an election meets a write sent without a transaction number:
/// refused (10107), interrupted (11602), both without a label, as mongod
/// sends them; the connection closed before the reply.
fn election_faults() -> Vec<(&'static str, Document)> {
    vec![
        ("NotWritablePrimary", doc! {"errorCode": 10107}),
        ("InterruptedDueToReplStateChange", doc! {"errorCode": 11602}),
        ("closeConnection", doc! {"closeConnection": true}),
    ]
}

/// A step-down reported after the write: mongod's `writeConcernError`
/// when the primary stepped down while waiting for its write concern.
fn stepped_down() -> Document {
    doc! {"writeConcernError": {"code": 189, "codeName": "PrimarySteppedDown", "errmsg": "stepped down"}}
}

/// `data` for the next command named `command`.
fn on(command: &str, fault: &Document) -> Document {
    let mut d = doc! {"failCommands": [command]};
    d.extend(fault.clone());
    d
}

/// An error that says the outcome is unknown.
fn unknown(r: &Result<(), Error>) -> bool {
    matches!(r, Err(Error::OutcomeUnknown { .. }))
}

async fn count_of(db: &Database, id: &str, field: &str) -> i64 {
    db.collection::<Document>("dep_items")
        .find_one(doc! {"_id": id})
        .await
        .unwrap()
        .and_then(|d| d.get(field).and_then(Bson::as_i64))
        .unwrap_or(0)
}

/// A sampled counter's write with a time bound is a `findAndModify` (the
/// driver's `update` has no `maxTimeMS`), a retryable write like every
/// other: after an election's refusal, an interruption, a closed
/// connection, and a step-down reported after it was stored (as mongod
/// reports it to a retryable write: a `writeConcernError` labelled
/// `RetryableWriteError`), the driver sends it once more, the server
/// de-duplicates it, and it is stored once with `Ok`. Before, it went
/// through `run_command` without a transaction number: an interruption
/// was sent again (and counted twice when the first had run), and the
/// step-down was `OutcomeUnknown`.
#[tokio::test]
async fn counter_writes_survive_an_election() {
    let server = server("counter_writes_survive_an_election").await;
    bounded(120, async {
        let (c, _) = client_of(&server).await;
        let db = c.database(&server.db_name("dep"));
        let counter = Item::sampled_counter(&db);
        let mut faults = election_faults();
        faults.push((
            "PrimarySteppedDown after the write",
            stepped_down_retryable(),
        ));
        for (what, fault) in faults {
            let id = format!("k-{what}");
            server.fail(&c, Some(1), on("findAndModify", &fault)).await;
            let r = counter
                .incr_by(&id, 10)
                .max_time(Duration::from_secs(5))
                .await;
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                count_of(&db, &id, "sampled").await,
                10,
                "{what}: stored once"
            );
        }
    })
    .await;
}

/// [`stepped_down`], labelled as mongod labels it for a retryable write.
fn stepped_down_retryable() -> Document {
    let mut d = stepped_down();
    d.insert("errorLabels", vec!["RetryableWriteError"]);
    d
}

/// A buffered counter's flush carries a flush id, so that it is sent
/// again at once after any of these and lands once.
#[tokio::test]
async fn buffered_flushes_survive_an_election() {
    let server = server("buffered_flushes_survive_an_election").await;
    bounded(120, async {
        let (c, _) = client_of(&server).await;
        let db = c.database(&server.db_name("dep"));
        let counter = Item::buffered_counter(&db);
        let mut faults = election_faults();
        faults.push(("writeConcernError", stepped_down()));
        for (what, fault) in faults {
            let id = format!("k-{what}");
            // Below N: held in memory until the flush.
            counter.incr_by(&id, 5).await.unwrap();
            assert_eq!(counter.stats().pending, 5, "{what}");
            server.fail(&c, Some(1), on("update", &fault)).await;
            counter
                .flush()
                .max_time(Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(count_of(&db, &id, "buffered").await, 5, "{what}");
            assert_eq!(counter.stats().pending, 0, "{what}");
        }
    })
    .await;
}

async fn items(db: &Database, acct: &str) -> Vec<u32> {
    let docs: Vec<Document> = db
        .collection::<Document>("dep_events")
        .find(doc! {"acct": acct})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    docs.iter()
        .flat_map(|d| d.get_array("events").unwrap().clone())
        .map(|e| {
            e.as_document()
                .unwrap()
                .get_i64("n")
                .unwrap_or_else(|_| i64::from(e.as_document().unwrap().get_i32("n").unwrap()))
                as u32
        })
        .collect()
}

/// The one-command push (a `findAndModify` through `run_command`) after
/// each fault, and after a step-down reported once the item was stored:
/// every item stored once, in order.
#[tokio::test]
async fn bucket_pushes_survive_an_election() {
    let server = server("bucket_pushes_survive_an_election").await;
    bounded(120, async {
        let (c, _) = client_of(&server).await;
        let db = c.database(&server.db_name("dep"));
        let events = Event::buckets(&db);
        let mut faults = election_faults();
        faults.push(("writeConcernError", stepped_down()));
        for (what, fault) in faults {
            let acct = format!("a-{what}");
            let mut want = Vec::new();
            for n in 0..5u32 {
                if n == 2 {
                    server.fail(&c, Some(1), on("findAndModify", &fault)).await;
                }
                let r = events
                    .push(&Event {
                        acct: acct.clone(),
                        n,
                    })
                    .await;
                if unknown(&r) {
                    // Only when the write id could not be read back either.
                    panic!("{what}: the write id should have told: {r:?}");
                }
                r.unwrap_or_else(|e| panic!("{what}: push {n}: {e}"));
                want.push(n);
            }
            assert_eq!(
                items(&db, &acct).await,
                want,
                "{what}: each item once, in order"
            );
        }
    })
    .await;
}

/// The documents layout's histogram writes (the driver's `bulk_write`, or
/// without it its `update_one` and `delete_one`, a statement each) after
/// each fault, and after a step-down reported once the write was stored
/// (as mongod reports it to a retryable write: a `writeConcernError`
/// labelled `RetryableWriteError`): the driver sends the write once more,
/// the server de-duplicates it, and it is stored once with `Ok`. The fault
/// strikes the call's first write command: `bulkWrite`; without it the
/// check of `change`'s new score, and `unrecord`'s `-1`. Before, they went
/// through `run_command` without a transaction number: an interruption
/// (11602) and a step-down were `OutcomeUnknown`.
#[tokio::test]
async fn histogram_writes_survive_an_election() {
    let test = "histogram_writes_survive_an_election";
    let server = server(test).await;
    bounded(120, async {
        let (c, _) = client_of(&server).await;
        let db = c.database(&server.db_name("dep"));
        let mut faults = election_faults();
        faults.push((
            "PrimarySteppedDown after the write",
            stepped_down_retryable(),
        ));
        let bulks: &[bool] = if mongo_patterns_testkit::takes_bulk_write(&c, test).await {
            &[true, false]
        } else {
            &[false]
        };
        for &bulk in bulks {
            let ranks = Score::ranks(&db).bulk_write(bulk);
            let command = if bulk { "bulkWrite" } else { "update" };
            for (what, fault) in &faults {
                let b = format!("b-{bulk}-{what}");
                ranks.record(&b, 1).await.unwrap();
                ranks.record(&b, 1).await.unwrap();
                server.fail(&c, Some(1), on(command, fault)).await;
                ranks
                    .change(&b, 1, 2)
                    .await
                    .unwrap_or_else(|e| panic!("{bulk} {what}: change: {e}"));
                let held = stored(&db, &b).await;
                assert_eq!(held, BTreeMap::from([(1, 1), (2, 1)]), "{bulk} {what}");
                server.fail(&c, Some(1), on(command, fault)).await;
                ranks
                    .unrecord(&b, 1)
                    .await
                    .unwrap_or_else(|e| panic!("{bulk} {what}: unrecord: {e}"));
                let held = stored(&db, &b).await;
                assert_eq!(held, BTreeMap::from([(2, 1)]), "{bulk} {what}: once");
            }
        }
    })
    .await;
}

/// `uri` as an application writes it: no `directConnection`, so the
/// driver discovers the deployment (a replica set, or a mongos) and sends
/// each read's preference; its other options (a replica set's name, the
/// test's `appName`) kept, and `extra` added.
fn discovered(uri: &str, extra: &str) -> String {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    let mut options: Vec<&str> = query
        .split('&')
        .filter(|o| !o.is_empty() && !o.to_ascii_lowercase().starts_with("directconnection="))
        .collect();
    options.push(extra);
    format!("{base}?{}", options.join("&"))
}

/// [`discovered`], with `readPreference=secondaryPreferred`.
fn secondary_preferred(uri: &str) -> String {
    discovered(uri, "readPreference=secondaryPreferred")
}

/// The reads among `sent` (name, command) whose read preference is not
/// the primary.
fn off_primary(sent: &[(String, Document)]) -> Vec<String> {
    sent.iter()
        .filter(|(name, _)| matches!(name.as_str(), "find" | "aggregate" | "count" | "distinct"))
        .filter_map(|(name, cmd)| {
            let mode = cmd
                .get_document("$readPreference")
                .ok()
                .and_then(|rp| rp.get_str("mode").ok())
                .unwrap_or("primary");
            (mode != "primary").then(|| format!("{name} ({mode}): {cmd}"))
        })
        .collect()
}

/// Runs `f`'s commands and fails on any read among them sent to anything
/// but the primary.
async fn on_primary_only(cmds: &Commands, what: &str) {
    on_primary_only_in(&cmds.take(), what);
}

/// Fails on any read among `sent` sent to anything but the primary.
fn on_primary_only_in(sent: &[(String, Document)], what: &str) {
    let stray = off_primary(sent);
    assert!(
        stray.is_empty(),
        "{what}: reads that decide a write went elsewhere: {stray:#?}"
    );
}

/// A client whose URI says `secondaryPreferred`: every read that decides a
/// write goes to the primary (the shard key's stored-key lookup, the
/// buffered counter's check, a bucket's reads inside its transactions (a
/// late push, a reindex), the rank's own transactions and rebuild), while
/// the caller's own reads (pages, ranks) keep the caller's preference.
#[tokio::test]
async fn reads_that_decide_writes_go_to_the_primary() {
    let server = server("reads_that_decide_writes_go_to_the_primary").await;
    bounded(120, async {
        let uri = secondary_preferred(server.uri());
        let (c, cmds) = client(&format!("{uri}&heartbeatFrequencyMS=500")).await;
        let db = c.database(&server.db_name("dep"));

        // The command log shows the read preference: a caller's read.
        let ticks = Tick::buckets(&db);
        for day in [1, 2, 3, 4, 10, 11] {
            ticks
                .push(&Tick {
                    sym: "s".into(),
                    day,
                })
                .await
                .unwrap();
        }
        cmds.take();
        ticks
            .page("s", PageRequest::page(1).page_size(2))
            .await
            .unwrap();
        let page = cmds.take();
        assert!(
            !off_primary(&page).is_empty(),
            "a page follows the client's secondaryPreferred: {page:#?}"
        );

        // A late item: one transaction.
        ticks
            .push(&Tick {
                sym: "s".into(),
                day: 5,
            })
            .await
            .unwrap();
        on_primary_only(&cmds, "late push").await;
        ticks.delete("s", doc! {"day": 2}).await.unwrap();
        on_primary_only(&cmds, "remove").await;
        ticks.reindex("s").await.unwrap();
        on_primary_only(&cmds, "reindex").await;
        // Read back on the primary: a secondary of a deployment that has
        // them may not have the last writes yet.
        let on_primary = c.database_with_options(
            db.name(),
            mongo_patterns::mongodb::options::DatabaseOptions::builder()
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .build(),
        );
        let days: Vec<i64> = Tick::buckets(&on_primary)
            .stream("s")
            .map_ok(|t| t.day)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(days, [1, 3, 4, 5, 10, 11]);
        cmds.take();

        let logs = Log::sharded(&db);
        logs.upsert(&Log {
            id: 1,
            kind: "app".into(),
            ts: 1_635_132_899,
        })
        .await
        .unwrap();
        logs.upsert(&Log {
            id: 1,
            kind: "app".into(),
            ts: 1_635_132_999,
        })
        .await
        .unwrap();
        on_primary_only(&cmds, "shard key upsert").await;

        let counter = Item::buffered_counter(&db);
        counter.incr_by("k", 10).await.unwrap();
        counter.flush().await.unwrap();
        on_primary_only(&cmds, "buffered flush").await;

        let ranks = Score::ranks(&db);
        ranks.insert(&score("p", "b", 5)).await.unwrap();
        ranks.update_score(doc! {"_id": "p"}, 6).await.unwrap();
        ranks.delete(doc! {"_id": "p"}).await.unwrap();
        ranks.rebuild("b").await.unwrap();
        on_primary_only(&cmds, "rank writes").await;
    })
    .await;
}

/// `what` left the caller's transaction in `s` aborted on the server: the
/// next statement gets `NoSuchTransaction` (labelled transient, so an
/// `and_run2` that went on would run the whole transaction again), and
/// nothing of it is stored.
async fn transaction_is_gone(db: &Database, s: &mut ClientSession, what: &str) {
    let other = db.collection::<Document>("other");
    let next = other
        .insert_one(doc! {"_id": format!("after {what}")})
        .session(&mut *s)
        .await
        .unwrap_err();
    assert!(
        next.contains_label("TransientTransactionError") && next.to_string().contains("251"),
        "{what}: the next statement: {next}"
    );
    assert!(s.commit_transaction().await.is_err(), "{what}: committed");
    let stored = other
        .count_documents(doc! {"_id": format!("before {what}")})
        .await
        .unwrap();
    assert_eq!(stored, 0, "{what}: the transaction's first write was kept");
}

/// Starts a transaction in `s` with one write of the caller's before the
/// pattern's call.
async fn callers_transaction(db: &Database, s: &mut ClientSession, what: &str) {
    s.start_transaction().await.unwrap();
    db.collection::<Document>("other")
        .insert_one(doc! {"_id": format!("before {what}")})
        .session(&mut *s)
        .await
        .unwrap();
}

/// A read preference given to a repository (its default options) or to
/// one call is the caller's: it reaches pages and totals, but not the
/// reads that decide a write, which stay on the primary (a bucket push's
/// read of the newest bucket at a rollover, the reads of a late push's
/// transaction, a replace's reads when nothing matched). Before, the
/// repository's or the call's `secondaryPreferred` replaced the primary
/// for them.
#[tokio::test]
async fn a_callers_read_preference_does_not_move_the_reads_that_decide_writes() {
    let server =
        server("a_callers_read_preference_does_not_move_the_reads_that_decide_writes").await;
    bounded(120, async {
        let uri = discovered(server.uri(), "heartbeatFrequencyMS=500");
        let (c, cmds) = client(&uri).await;
        let db = c.database(&server.db_name("dep_pref"));
        let secondary = || {
            SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
                options: Default::default(),
            })
        };
        let ticks = Tick::buckets(&db).with_options(Options::new().selection_criteria(secondary()));
        // Rollovers (buckets of 3) and a late item: reads by `_id` and of
        // the newest bucket, and a transaction's reads.
        for day in [1, 2, 3, 4, 10, 11, 12, 13, 5] {
            ticks
                .push(&Tick {
                    sym: "s".into(),
                    day,
                })
                .await
                .unwrap();
        }
        let sent = cmds.take();
        assert!(
            sent.iter().any(|(n, _)| n == "find"),
            "the pushes read: {sent:#?}"
        );
        on_primary_only_in(&sent, "pushes with a repository's secondaryPreferred");
        let missing = ticks
            .replace(
                "s",
                doc! {"day": 99},
                &Tick {
                    sym: "s".into(),
                    day: 99,
                },
            )
            .selection_criteria(secondary())
            .await
            .unwrap();
        assert!(!missing);
        on_primary_only_in(&cmds.take(), "a replace's reads");
        // The caller's own reads follow it.
        ticks
            .page("s", PageRequest::page(1).page_size(2))
            .await
            .unwrap();
        assert!(
            !off_primary(&cmds.take()).is_empty(),
            "a page follows the repository's secondaryPreferred"
        );
    })
    .await;
}

/// What a pattern's refusal leaves of the caller's transaction, as the
/// errors' docs say. A refusal by the server (a statement that failed: a
/// rank `+1` on a damaged count, `Damaged`; `UnsupportedValue`) has
/// aborted it, as mongod aborts a transaction on any failed statement. A
/// refusal found by a read, or of the call's own, before it sent any
/// write (a rank `-1` of a score nobody holds, `ScoreNotFound`;
/// `InvalidArgument` for a filter it cannot translate), leaves it going.
#[tokio::test]
async fn refusals_inside_a_callers_transaction_say_what_is_left_of_it() {
    let server = server("refusals_inside_a_callers_transaction_say_what_is_left_of_it").await;
    bounded(60, async {
        let (c, _) = client_of(&server).await;
        let db = c.database(&server.db_name("dep"));
        let ranks = Score::ranks(&db);
        ranks.record("b", 1).await.unwrap();
        db.collection::<Document>("dep_items")
            .insert_one(doc! {"_id": "text", "sampled": "many"})
            .await
            .unwrap();

        let damaged = doc! {"_id": {"b": "b", "s": 9_i64}, "count": "x"};
        db.collection::<Document>(Score::RANK.histogram)
            .insert_one(damaged)
            .await
            .unwrap();

        let mut s = c.start_session().await.unwrap();
        callers_transaction(&db, &mut s, "ScoreNotFound").await;
        let e = ranks.unrecord("b", 7).session(&mut s).await.unwrap_err();
        assert!(matches!(e, Error::ScoreNotFound { .. }), "{e:?}");
        assert!(!e.is_transient(), "not worth running again: {e}");
        s.commit_transaction().await.unwrap();
        assert_eq!(kept(&db, "ScoreNotFound").await, 1, "found by a read");

        callers_transaction(&db, &mut s, "Damaged").await;
        let e = ranks.record("b", 9).session(&mut s).await.unwrap_err();
        assert!(matches!(e, Error::Damaged { .. }), "{e:?}");
        transaction_is_gone(&db, &mut s, "Damaged").await;

        callers_transaction(&db, &mut s, "UnsupportedValue").await;
        let e = Item::sampled_counter(&db)
            .incr_by("text", 10)
            .session(&mut s)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::UnsupportedValue { .. }), "{e:?}");
        transaction_is_gone(&db, &mut s, "UnsupportedValue").await;

        callers_transaction(&db, &mut s, "InvalidArgument").await;
        let e = Tick::buckets(&db)
            .delete("s", doc! {"day": {"$regex": "1"}})
            .session(&mut s)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        s.commit_transaction().await.unwrap();
        assert_eq!(
            kept(&db, "InvalidArgument").await,
            1,
            "nothing was sent: the transaction went on"
        );
    })
    .await;
}

/// How many of the caller's writes made before `what` are stored.
async fn kept(db: &Database, what: &str) -> u64 {
    db.collection::<Document>("other")
        .count_documents(doc! {"_id": format!("before {what}")})
        .await
        .unwrap()
}

/// Writes the driver sends with its own helpers carry a transaction
/// number, so the server labels an election's error itself, as mongod
/// does (`RetryableWriteError`; inside a transaction,
/// `TransientTransactionError`; no label is forced here), and the driver
/// retries the write, or the transaction's runner reruns the
/// transaction: each write lands once, and the log shows it sent again.
#[tokio::test]
async fn driver_helper_writes_survive_an_election() {
    let server = server("driver_helper_writes_survive_an_election").await;
    bounded(120, async {
        let (c, cmds) = client_of(&server).await;
        // The command the fail point refused, sent again: twice in the log.
        let sent_twice = |what: &str| {
            let sent = cmds.take();
            let mut names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            assert!(
                names
                    .windows(2)
                    .any(|w| w[0] == w[1] && w[0] != "find" && w[0] != "aggregate"),
                "{what}: no write sent again: {names:?}"
            );
        };
        let db = c.database(&server.db_name("dep"));
        let retryable = doc! {"errorCode": 10107};

        // An ordered push: the general path's `update`.
        let ticks = Tick::buckets(&db);
        ticks
            .push(&Tick {
                sym: "s".into(),
                day: 1,
            })
            .await
            .unwrap();
        server.fail(&c, Some(1), on("update", &retryable)).await;
        cmds.take();
        ticks
            .push(&Tick {
                sym: "s".into(),
                day: 2,
            })
            .await
            .unwrap();
        sent_twice("ordered push");
        let days: Vec<i64> = ticks
            .stream("s")
            .map_ok(|t| t.day)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(days, [1, 2], "the ordered push stored once");

        // A shard key upsert.
        let logs = Log::sharded(&db);
        let log = Log {
            id: 7,
            kind: "app".into(),
            ts: 1_635_132_899,
        };
        let mut fault = retryable.clone();
        fault.insert("failCommands", vec!["update", "findAndModify", "insert"]);
        server.fail(&c, Some(1), fault).await;
        cmds.take();
        logs.upsert(&log).await.unwrap();
        sent_twice("upsert");
        let n = db
            .collection::<Document>("dep_logs")
            .count_documents(doc! {"_id": 7})
            .await
            .unwrap();
        assert_eq!(n, 1, "the upsert stored once");

        // The rank's own transaction: its statement fails as a statement
        // of a transaction does in an election, and the transaction reruns.
        let ranks = Score::ranks(&db);
        ranks.insert(&score("p", "e", 5)).await.unwrap();
        server
            .fail(
                &c,
                Some(1),
                doc! {
                    "failCommands": ["findAndModify"],
                    "errorCode": 10107,
                },
            )
            .await;
        cmds.take();
        ranks.update_score(doc! {"_id": "p"}, 6).await.unwrap();
        sent_twice("update_score");
        assert_eq!(stored(&db, "e").await, players(&db, "e").await);
        assert_eq!(stored(&db, "e").await, BTreeMap::from([(6, 1)]));
    })
    .await;
}
