//! What a write call returns when a failover's error reaches it: the
//! driver's retry is off (`retryWrites=false`) or spent (a second fault).
//! `Error::is_retryable()` must be true only where a resend cannot double
//! anything, and a write the server may have stored must come back as
//! `OutcomeUnknown` (or `Ok`, where the pattern can read whether it
//! landed), never as something that invites a second send.
//!
//! The faults are the test kit's proxy's, after the server ran the write
//! (11602, 50, the reply lost, a step-down's `writeConcernError`) or before
//! it (the connection closed first), and `failCommand`'s refusal (10107,
//! as a node that is no longer primary answers before running anything).

use futures::TryStreamExt;
use mongo_patterns::bson::{doc, Bson, Document};
use mongo_patterns::mongodb::{Client, Database};
use mongo_patterns::prelude::*;
use mongo_patterns::Error;
use mongo_patterns_testkit::proxy::{Fault, Proxy, Rule};
use mongo_patterns_testkit::{
    bounded, client, fail_command, strict_validators, OwnServer, ServerOptions,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "uo_ticks")]
#[bucket(size = 50, key = "sym", order = "day")]
struct Tick {
    sym: String,
    day: i64,
}

/// Buckets of 4 (late items grow one to 8, then it splits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "uo_marks")]
#[bucket(size = 4, key = "sym", order = "day")]
struct Mark {
    sym: String,
    day: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "uo_items")]
struct Item {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 2, upsert = true)]
    sampled: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "uo_logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
    msg: String,
}

/// A server, the proxy before it, a client through the proxy with the
/// driver's retry off (unless `retry`), and one straight to the server.
struct Rig {
    proxy: Proxy,
    db: Database,
    direct: Database,
    _clients: (Client, Client),
    _server: OwnServer,
}

impl Rig {
    async fn new(name: &str) -> Rig {
        Rig::with(name, false).await
    }

    async fn with(name: &str, retry: bool) -> Rig {
        let server = OwnServer::start(ServerOptions {
            test_commands: true,
            ..ServerOptions::default()
        });
        let proxy = Proxy::start(server.uri());
        let uri = format!(
            "{}&heartbeatFrequencyMS=500&retryWrites={retry}",
            proxy.uri()
        );
        let (through, _) = client(&uri).await;
        let (direct, _) = client(server.uri()).await;
        // Every model's validator at `strict`: no retry, lookup or
        // replay after a fault may store what an invariant refuses.
        let direct = direct.database(name);
        strict_validators(
            &direct,
            [
                Tick::declared(&direct),
                Mark::declared(&direct),
                Item::declared(&direct),
                Log::declared(&direct),
            ]
            .concat(),
        )
        .await;
        Rig {
            db: through.database(name),
            direct: direct.clone(),
            proxy,
            _clients: (through, direct.client().clone()),
            _server: server,
        }
    }

    async fn count(&self, coll: &str, filter: Document) -> u64 {
        let c = self.direct.collection::<Document>(coll);
        bounded(10, c.count_documents(filter)).await.unwrap()
    }

    async fn counter(&self, id: &str) -> Option<i64> {
        let c = self.direct.collection::<Document>("uo_items");
        let d = bounded(10, c.find_one(doc! {"_id": id})).await.unwrap();
        d.and_then(|d| d.get("sampled").and_then(int))
    }
}

fn int(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

/// What a fault leaves: stored or not, and what a caller is told.
struct Case {
    what: &'static str,
    fault: Fault,
    stored: bool,
}

/// The proxy's faults, each on a write that carries no transaction number
/// (the driver's retry is off): nothing retries it.
fn cases() -> Vec<Case> {
    vec![
        Case {
            what: "11602 after it ran",
            fault: Fault::election(11602),
            stored: true,
        },
        Case {
            what: "50 after it ran",
            fault: Fault::max_time_ms_expired(),
            stored: true,
        },
        Case {
            what: "reply lost",
            fault: Fault::CloseAfter,
            stored: true,
        },
        Case {
            what: "step-down after it was stored (writeConcernError 189)",
            fault: Fault::write_concern_error(189, "PrimarySteppedDown"),
            stored: true,
        },
        Case {
            what: "connection closed before it was sent on",
            fault: Fault::CloseBefore,
            stored: false,
        },
    ]
}

/// The counter's write cannot tell afterwards whether it counted: every
/// fault that may have stored it is `OutcomeUnknown`, which
/// `is_retryable()` calls unsafe to send again; and it is stored at most
/// once (the library sent nothing more). A refusal before it ran is
/// `is_retryable()`, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_retryable_only_where_a_resend_cannot_double() {
    let rig = Rig::new("uo_counter").await;
    let sampled = Item::sampled_counter(&rig.db);
    for (i, case) in cases().into_iter().enumerate() {
        let id = format!("k{i}");
        rig.proxy.clear();
        rig.proxy.on(Rule::new("update", 1, case.fault.clone()));
        rig.proxy
            .on(Rule::new("findAndModify", 1, case.fault.clone()));
        let r = bounded(30, sampled.incr_by(&id, 10)).await;
        rig.proxy.clear();
        let e = r.expect_err(case.what);
        assert!(
            matches!(e, Error::OutcomeUnknown { .. }),
            "{}: OutcomeUnknown, got {e:?}",
            case.what
        );
        assert!(!e.is_retryable(), "{}: not retryable", case.what);
        let want = case.stored.then_some(10);
        assert_eq!(
            rig.counter(&id).await,
            want,
            "{}: stored at most once",
            case.what
        );
    }
    // Refused before it ran.
    let (admin, _) = client(&rig.proxy.uri()).await;
    fail_command(
        &admin,
        Some(1),
        doc! {"failCommands": ["update", "findAndModify"], "errorCode": 10107},
    )
    .await;
    let e = bounded(30, sampled.incr_by("refused", 10))
        .await
        .expect_err("refused");
    assert!(
        e.is_retryable(),
        "10107 before it ran: retryable, got {e:?}"
    );
    assert_eq!(rig.counter("refused").await, None, "10107: nothing stored");
    bounded(30, sampled.incr_by("refused", 10)).await.unwrap();
    assert_eq!(rig.counter("refused").await, Some(10), "the resend, once");
}

/// The driver's retry of a write whose first attempt was stored (its
/// reply lost) meets a node that is no longer primary: the call's error is
/// that refusal (10107, labelled `RetryableWriteError` as `mongod` labels
/// it on a retryable write), which says nothing of the first attempt. It
/// must not pass for "not stored": the counter's write is
/// `OutcomeUnknown`, not retryable, and counted once; a bucket push reads
/// whether it landed and returns `Ok`, stored once. Before, the refusal
/// was taken for "never ran": `is_retryable()` advised a resend of a
/// stored increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_the_drivers_retry_is_not_taken_for_not_stored() {
    let rig = Rig::with("uo_refused", true).await;
    let sampled = Item::sampled_counter(&rig.db);
    let ticks = Tick::buckets(&rig.db);
    // The driver's retry refused with `code` after a first attempt whose
    // reply was lost.
    let refused_after_lost = |code: i32| {
        rig.proxy.clear();
        for command in ["update", "findAndModify"] {
            rig.proxy.on(Rule::new(command, 1, Fault::CloseAfter));
            rig.proxy.on(Rule::new(command, 1, Fault::election(code)));
        }
    };
    // 10107 as a node no longer primary answers; then the same through
    // `mongos`, whose retry met a shard it cannot reach (SocketException,
    // HostUnreachable, NetworkTimeout), labelled as `mongod` labels them.
    // Before, a code outside the election's was taken for the server's
    // answer: `Database`, with the first attempt stored.
    for code in [10107, 9001, 6, 89] {
        let key = format!("k{code}");
        refused_after_lost(code);
        let e = bounded(30, sampled.incr_by(&key, 10))
            .await
            .expect_err("both attempts failed");
        rig.proxy.clear();
        assert!(e.contains_label("RetryableWriteError"), "{code}: {e:?}");
        assert!(matches!(e, Error::OutcomeUnknown { .. }), "{code}: {e:?}");
        assert!(!e.is_retryable(), "{code}: {e:?}");
        assert_eq!(rig.counter(&key).await, Some(10), "{code}: counted once");
    }

    let tick = |day| Tick {
        sym: "r".into(),
        day,
    };
    bounded(10, ticks.push(&tick(1))).await.unwrap();
    refused_after_lost(10107);
    let r = bounded(30, ticks.push(&tick(2))).await;
    rig.proxy.clear();
    r.unwrap();
    let n = rig
        .count("uo_ticks", doc! {"sym": "r", "items.day": 2})
        .await;
    assert_eq!(n, 1, "stored once");
}

/// A bucket push carries a write id the bucket keeps: after any fault the
/// push reads (on the primary) whether it landed, and returns `Ok`,
/// stored once, or sends it once more where it did not land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_push_finds_out_whether_it_landed() {
    let rig = Rig::new("uo_bucket").await;
    let ticks = Tick::buckets(&rig.db);
    for (i, case) in cases().into_iter().enumerate() {
        let sym = format!("s{i}");
        let tick = |day| Tick {
            sym: sym.clone(),
            day,
        };
        bounded(10, ticks.push(&tick(1))).await.unwrap();
        rig.proxy.clear();
        rig.proxy.on(Rule::new("update", 1, case.fault.clone()));
        rig.proxy
            .on(Rule::new("findAndModify", 1, case.fault.clone()));
        let r = bounded(30, ticks.push(&tick(2))).await;
        rig.proxy.clear();
        r.unwrap_or_else(|e| panic!("{}: {e}", case.what));
        let n = rig
            .count("uo_ticks", doc! {"sym": &sym, "items.day": 2})
            .await;
        assert_eq!(n, 1, "{}: stored once", case.what);
    }
}

/// A late item's transaction commits, and the answer to its commit says
/// the server has no such transaction (251, labelled
/// `TransientTransactionError` as `mongod` labels it): the driver runs the
/// move again, which must find the item where the first run put it,
/// here in a bucket a split placed between two others (a `seq` that is a
/// double), and leave it there. Before, the rerun read that bucket's
/// `seq` as none, placed the item again, found its write id there (a
/// write that matches nothing: a race, rerun), and went round until the
/// move's 120 s bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_move_run_again_finds_its_item_in_a_split_bucket() {
    let rig = Rig::new("uo_split").await;
    let marks = Mark::buckets(&rig.db);
    let mark = |day| Mark {
        sym: "s".into(),
        day,
    };
    // Buckets [0..30], [40..70] and [80..110]; four late items bring the
    // middle one to its cap of 8.
    let first: Vec<Mark> = (0..12).map(|i| mark(i * 10)).collect();
    bounded(30, marks.push_many(&first)).await.unwrap();
    for day in [41, 42, 43, 44] {
        bounded(30, marks.push(&mark(day))).await.unwrap();
    }
    // 65 belongs in the middle bucket, full: it splits, its upper half
    // goes to a new bucket before [80..110] (no room there), and 65 with it.
    let lost = doc! {
        "ok": 0, "code": 251, "codeName": "NoSuchTransaction",
        "errmsg": "Transaction with { txnNumber: 1 } has been aborted.",
    };
    rig.proxy.clear();
    rig.proxy.on(Rule::new(
        "commitTransaction",
        1,
        Fault::ReplyAsMongod(lost),
    ));
    let pushed = bounded(30, marks.push(&mark(65))).await;
    let hits = rig.proxy.hits();
    rig.proxy.clear();
    pushed.unwrap();
    assert_eq!(hits, vec![1], "the commit's answer was replaced");

    let buckets: Vec<Document> = bounded(
        10,
        rig.direct
            .collection::<Document>("uo_marks")
            .find(doc! {"sym": "s"})
            .sort(doc! {"_id": 1}),
    )
    .await
    .unwrap()
    .try_collect()
    .await
    .unwrap();
    let days = |b: &Document| -> Vec<i64> {
        b.get_array("items")
            .unwrap()
            .iter()
            .map(|i| int(i.as_document().unwrap().get("day").unwrap()).unwrap())
            .collect()
    };
    let holding: Vec<&Document> = buckets.iter().filter(|b| days(b).contains(&65)).collect();
    assert_eq!(holding.len(), 1, "65 stored once: {buckets:?}");
    let seq = holding[0].get_document("_id").unwrap().get("s").unwrap();
    assert!(
        matches!(seq, Bson::Double(s) if s.fract() != 0.0),
        "65 went to the bucket the split placed between two others: {seq:?}"
    );
    // Every item once, in order, and every `start` the sum before it.
    let all: Vec<i64> = buckets.iter().flat_map(days).collect();
    let mut expected: Vec<i64> = (0..12)
        .map(|i| i * 10)
        .chain([41, 42, 43, 44, 65])
        .collect();
    expected.sort();
    assert_eq!(all, expected);
    let mut at = 0;
    for b in &buckets {
        assert_eq!(int(b.get("start").unwrap()), Some(at), "{b:?}");
        at += days(b).len() as i64;
    }
    assert_eq!(bounded(10, marks.count("s")).await.unwrap(), 17);
}

/// A queued batch of pushes to one key, its reply lost, just after an
/// election where the majority commit point lags (majority reads come
/// back empty): the batch's write id is read on the primary's own copy,
/// found, and every push returns `Ok`, each item stored once. Before, the
/// lookup read majority, found nothing, and sent the items again one by
/// one under new write ids: stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_batch_whose_reply_is_lost_is_stored_once() {
    let rig = Rig::new("uo_batch").await;
    let ticks = Tick::buckets(&rig.db);
    let tick = |day| Tick {
        sym: "b".into(),
        day,
    };
    bounded(10, ticks.push(&tick(0))).await.unwrap();
    // The first update that appends more than one item.
    let batch = |c: &Document| {
        let each = c
            .get_array("updates")
            .ok()
            .and_then(|u| u.first())
            .and_then(Bson::as_document)
            .and_then(|u| u.get_document("u").ok())
            .and_then(|u| u.get_document("$push").ok())
            .and_then(|p| p.get_document("items").ok())
            .and_then(|i| i.get_array("$each").ok())
            .map_or(0, Vec::len);
        each > 1 && !c.contains_key("autocommit")
    };
    rig.proxy
        .on(Rule::new("update", 1, Fault::CloseAfter).when(batch));
    rig.proxy
        .on(Rule::new("find", 100, Fault::EmptyMajorityRead));
    rig.proxy
        .on(Rule::new("aggregate", 100, Fault::EmptyMajorityRead));
    // Sixteen pushes at once, in order: the queue sends them in batches.
    let mut tasks = Vec::new();
    for day in 1..=16 {
        let ticks = ticks.clone();
        let t = tick(day);
        tasks.push(tokio::spawn(async move { ticks.push(&t).await }));
    }
    for t in tasks {
        bounded(60, t).await.unwrap().unwrap();
    }
    assert_eq!(rig.proxy.hits()[0], 1, "a batch's reply was lost");
    let c = rig.direct.collection::<Document>("uo_ticks");
    let buckets: Vec<Document> = bounded(10, async {
        c.find(doc! {"sym": "b"})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let mut days: Vec<i64> = buckets
        .iter()
        .flat_map(|b| b.get_array("items").unwrap().clone())
        .map(|i| i.as_document().unwrap().get("day").and_then(int).unwrap())
        .collect();
    days.sort_unstable();
    assert_eq!(days, (0..=16).collect::<Vec<_>>(), "each item once");
}

/// A shard-key document's insert whose outcome is unknown (here with
/// `retryWrites=false`, so that every fault reaches the library; with
/// retryable writes, two faults in a row): an `_id` cannot be stored
/// twice, so the insert is sent once more, and a duplicate `_id` is the
/// first attempt, stored, when the stored document is this one. `Ok`, and
/// stored once, after every fault. Before, each fault that may have
/// stored it was `OutcomeUnknown` (the fault campaign met it with
/// retryable writes: a retry cut by the pool another fault cleared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_key_insert_with_its_id_is_stored_once() {
    let rig = Rig::new("uo_shard").await;
    let logs = Log::sharded(&rig.db);
    for (i, case) in cases().into_iter().enumerate() {
        let log = Log {
            id: i as i64,
            kind: "a".into(),
            ts: 1_700_000_000_000 + i as i64,
            msg: "m".into(),
        };
        rig.proxy.clear();
        rig.proxy.on(Rule::new("insert", 1, case.fault.clone()));
        let r = bounded(30, logs.insert(&log)).await;
        rig.proxy.clear();
        r.unwrap_or_else(|e| panic!("{}: {e:?}", case.what));
        let n = rig.count("uo_logs", doc! {"_id": i as i64}).await;
        assert_eq!(n, 1, "{}", case.what);
    }
    // Another document under the same `_id`: the duplicate is not taken
    // for this insert's first attempt; it is the duplicate-key error a
    // plain insert gets.
    let other = Log {
        id: 100,
        kind: "a".into(),
        ts: 1_700_000_000_000,
        msg: "another writer's".into(),
    };
    bounded(30, logs.insert(&other)).await.unwrap();
    let mine = Log {
        msg: "mine".into(),
        ..other.clone()
    };
    rig.proxy.on(Rule::new("insert", 1, Fault::CloseBefore));
    let r = bounded(30, logs.insert(&mine)).await;
    rig.proxy.clear();
    assert!(
        r.as_ref().is_err_and(Error::is_duplicate_key),
        "a duplicate of another document: {r:?}"
    );
}
