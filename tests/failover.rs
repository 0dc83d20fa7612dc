//! Every write path of the bucket, the counter and the shard key through
//! one failover that strikes after the server ran the write: the reply
//! replaced by an election's error (11602, labelled as mongod labels it:
//! `RetryableWriteError` for a retryable write, `TransientTransactionError`
//! inside a transaction), the reply lost (the connection closed), or a
//! step-down reported after the write was stored (a `writeConcernError`).
//! `failCommand` cannot show these: it refuses a command before the
//! server runs it. The test kit's proxy, between the client and the test
//! server, lets the command run and then answers for the server.
//!
//! MongoDB's promise to drivers is that one failover between a write's
//! send and its reply ends in `Ok` with the write stored once (retryable
//! writes). Each case checks that with a client straight to the server.
//! The rank histogram's paths are in `tests/rank_failover.rs`.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::bson::{doc, Bson, Document};
use mongo_patterns::mongodb::event::cmap::CmapEvent;
use mongo_patterns::mongodb::event::EventHandler;
use mongo_patterns::mongodb::options::ClientOptions;
use mongo_patterns::mongodb::{Client, Database};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::proxy::{Fault, Proxy, Rule};
use mongo_patterns_testkit::{bounded, client, strict_validators, OwnServer, ServerOptions};

/// Kept in arrival order: a push is one `findAndModify`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "fo_arrivals")]
#[bucket(size = 4, key = "acct")]
struct Arrival {
    acct: String,
    n: u32,
}

/// Kept in `day` order: a push is an `update`; a late one a transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "fo_ticks")]
#[bucket(size = 4, key = "sym", order = "day")]
struct Tick {
    sym: String,
    day: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "fo_items")]
struct Item {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 2, upsert = true)]
    sampled: i64,
    #[approx_counter(every = 2, mode = "geometric", upsert = true)]
    geometric: i64,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    buffered: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "fo_logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
    msg: String,
}

/// A server, the proxy before it, a client through the proxy and one
/// straight to the server.
struct Rig {
    proxy: Proxy,
    db: Database,
    direct: Database,
    _clients: (Client, Client),
    _server: OwnServer,
}

impl Rig {
    async fn new(name: &str) -> Rig {
        let server = OwnServer::start(ServerOptions::default());
        let proxy = Proxy::start(server.uri());
        let uri = format!("{}&heartbeatFrequencyMS=500", proxy.uri());
        let (through, _) = client(&uri).await;
        let (direct, _) = client(server.uri()).await;
        // Every model's validator at `strict`: no retry, lookup or
        // replay after a fault may store what an invariant refuses.
        let direct = direct.database(name);
        strict_validators(
            &direct,
            [
                Arrival::declared(&direct),
                Tick::declared(&direct),
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

    /// Runs `call` with `fault` on the first command named in `commands`
    /// (`"update|findAndModify"`: whichever the call sends) that `when`
    /// picks; the fault must have struck once.
    async fn once<F: IntoFuture>(
        &self,
        commands: &str,
        fault: Fault,
        when: impl Fn(&Document) -> bool + Send + Sync + Clone + 'static,
        call: F,
    ) -> F::Output {
        self.proxy.clear();
        // One strike in all, on whichever of the commands comes first.
        let struck = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for command in commands.split('|') {
            let (when, struck) = (when.clone(), struck.clone());
            self.proxy.on(Rule::new(command, 1, fault.clone())
                .when(move |c| when(c) && !struck.swap(true, std::sync::atomic::Ordering::SeqCst)));
        }
        let r = bounded(60, call).await;
        let hits: usize = self.proxy.hits().iter().sum();
        assert_eq!(hits, 1, "the fault struck one of {commands}");
        self.proxy.clear();
        r
    }
}

/// The three faults, by name: each after the server ran the command.
fn faults() -> Vec<(&'static str, Fault)> {
    vec![
        ("11602 after it ran", Fault::election(11602)),
        ("reply lost", Fault::CloseAfter),
        (
            "step-down after it was stored",
            Fault::write_concern_error(189, "PrimarySteppedDown"),
        ),
    ]
}

fn any(_: &Document) -> bool {
    true
}

/// Outside a transaction (no `autocommit`).
fn alone(c: &Document) -> bool {
    !c.contains_key("autocommit")
}

async fn all<T: serde::de::DeserializeOwned + Send + Sync>(db: &Database, coll: &str) -> Vec<T> {
    let c = db.collection::<T>(coll);
    bounded(10, async {
        c.find(doc! {}).await.unwrap().try_collect().await.unwrap()
    })
    .await
}

/// The items of `key`'s buckets as stored, in stored order.
async fn items(db: &Database, coll: &str, key_field: &str, key: &str, field: &str) -> Vec<i64> {
    let c = db.collection::<Document>(coll);
    let buckets: Vec<Document> = bounded(10, async {
        let find = c.find(doc! {key_field: key}).sort(doc! {"_id": 1});
        find.await.unwrap().try_collect().await.unwrap()
    })
    .await;
    let mut out = Vec::new();
    for b in &buckets {
        let arr = b.get_array("items").unwrap();
        if matches!(b.get_bool("mp_next"), Ok(true)) && arr.is_empty() {
            // Opened ahead: its `start` assumes the open one fills.
            continue;
        }
        assert_eq!(b.get("count").and_then(int), Some(arr.len() as i64), "{b}");
        assert_eq!(b.get("start").and_then(int), Some(out.len() as i64), "{b}");
        for i in arr {
            out.push(i.as_document().unwrap().get(field).and_then(int).unwrap());
        }
    }
    out
}

fn int(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

/// Bucket pushes: arrival order (`findAndModify`), in order (`update`), a
/// rollover (`insert`), a late item (a transaction of its own: its
/// statements and its commit), `push_many`, `replace` and `delete` (a
/// transaction), each through each fault: `Ok`, stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_writes_through_a_failover_store_once() {
    let rig = Rig::new("fo_bucket").await;
    let arrivals = Arrival::buckets(&rig.db);
    let ticks = Tick::buckets(&rig.db);
    for (i, (what, fault)) in faults().into_iter().enumerate() {
        let acct = format!("a{i}");
        let (first, second) = (
            Arrival {
                acct: acct.clone(),
                n: 0,
            },
            Arrival {
                acct: acct.clone(),
                n: 1,
            },
        );
        bounded(10, arrivals.push(&first)).await.unwrap();
        let r = rig
            .once("findAndModify", fault.clone(), any, arrivals.push(&second))
            .await;
        r.unwrap_or_else(|e| panic!("arrival push, {what}: {e}"));
        assert_eq!(
            items(&rig.direct, "fo_arrivals", "acct", &acct, "n").await,
            [0, 1],
            "arrival push, {what}: once"
        );

        let sym = format!("s{i}");
        let tick = |day| Tick {
            sym: sym.clone(),
            day,
        };
        bounded(10, ticks.push(&tick(10))).await.unwrap();
        // In order: one `update`.
        let t20 = tick(20);
        let r = rig
            .once("update", fault.clone(), alone, ticks.push(&t20))
            .await;
        r.unwrap_or_else(|e| panic!("push in order, {what}: {e}"));
        for day in [30, 40] {
            bounded(10, ticks.push(&tick(day))).await.unwrap();
        }
        // A rollover: the next bucket's `insert`.
        let t50 = tick(50);
        let r = rig
            .once("insert", fault.clone(), alone, ticks.push(&t50))
            .await;
        r.unwrap_or_else(|e| panic!("rollover, {what}: {e}"));
        // A late item: a transaction of the push's own, struck at its
        // commit.
        let t15 = tick(15);
        let r = rig
            .once("commitTransaction", fault.clone(), any, ticks.push(&t15))
            .await;
        r.unwrap_or_else(|e| panic!("late push at its commit, {what}: {e}"));
        // `push_many` of items in order (fills the open bucket).
        let more = [tick(60), tick(70)];
        let r = rig
            .once("update", fault.clone(), alone, ticks.push_many(&more))
            .await;
        r.unwrap_or_else(|e| panic!("push_many, {what}: {e}"));
        assert_eq!(
            items(&rig.direct, "fo_ticks", "sym", &sym, "day").await,
            [10, 15, 20, 30, 40, 50, 60, 70],
            "ticks, {what}: each once, in order"
        );
        // `replace`: one `findAndModify`.
        let t71 = tick(71);
        let r = rig
            .once(
                "findAndModify",
                fault.clone(),
                any,
                ticks.replace(&sym, doc! {"day": 70}, &t71),
            )
            .await;
        assert!(r.unwrap_or_else(|e| panic!("replace, {what}: {e}")));
        // `delete`: a transaction of its own, struck at a statement.
        let inside = |c: &Document| c.contains_key("autocommit");
        let removal = ticks.delete(&sym, doc! {"day": 15});
        let r = rig.once("update", fault.clone(), inside, removal).await;
        assert_eq!(r.unwrap_or_else(|e| panic!("delete, {what}: {e}")), 1);
        assert_eq!(
            items(&rig.direct, "fo_ticks", "sym", &sym, "day").await,
            [10, 20, 30, 40, 50, 60, 71],
            "ticks after replace and delete, {what}"
        );
    }
}

/// Counter writes: sampled with and without a time bound, geometric, a
/// buffered counter's flush, each through each fault: `Ok`, counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_writes_through_a_failover_count_once() {
    let rig = Rig::new("fo_counter").await;
    let sampled = Item::sampled_counter(&rig.db);
    let geometric = Item::geometric_counter(&rig.db);
    let buffered = Item::buffered_counter(&rig.db);
    for (i, (what, fault)) in faults().into_iter().enumerate() {
        let id = format!("k{i}");
        let r = rig
            .once(
                "update|findAndModify",
                fault.clone(),
                any,
                sampled.incr_by(&id, 10),
            )
            .await;
        r.unwrap_or_else(|e| panic!("sampled, {what}: {e}"));
        let timed = sampled.incr_by(&id, 5).max_time(Duration::from_secs(5));
        let r = rig
            .once("update|findAndModify", fault.clone(), any, timed)
            .await;
        r.unwrap_or_else(|e| panic!("sampled with max_time, {what}: {e}"));
        let r = rig
            .once(
                "findAndModify",
                fault.clone(),
                any,
                geometric.incr_by(&id, 8),
            )
            .await;
        r.unwrap_or_else(|e| panic!("geometric, {what}: {e}"));
        bounded(10, buffered.incr_by(&id, 3)).await.unwrap();
        let r = rig
            .once("update", fault.clone(), any, buffered.flush())
            .await;
        r.unwrap_or_else(|e| panic!("buffered flush, {what}: {e}"));
        let stored: Vec<Document> = all(&rig.direct, "fo_items").await;
        let d = stored
            .iter()
            .find(|d| matches!(d.get_str("_id"), Ok(s) if s == id))
            .unwrap_or_else(|| panic!("{what}: {id} stored"));
        assert_eq!(
            d.get("sampled").and_then(int),
            Some(15),
            "sampled, {what}: {d}"
        );
        assert_eq!(
            d.get("buffered").and_then(int),
            Some(3),
            "buffered, {what}: {d}"
        );
        let g = d.get("geometric").and_then(int).unwrap_or(0);
        assert!(g > 0 && g <= 8 * 2, "geometric written once, {what}: {d}");
    }
}

/// Shard key writes that name one document (`insert`, `upsert`,
/// `replace`), each through each fault: `Ok`, written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_key_writes_through_a_failover_write_once() {
    let rig = Rig::new("fo_shard").await;
    let logs = Log::sharded(&rig.db);
    for (i, (what, fault)) in faults().into_iter().enumerate() {
        let base = 100 * i as i64;
        let log = |id: i64, msg: &str| Log {
            id,
            kind: "app".into(),
            ts: 1_700_000_000,
            msg: msg.into(),
        };
        let r = rig
            .once("insert", fault.clone(), any, logs.insert(&log(base, "a")))
            .await;
        r.unwrap_or_else(|e| panic!("insert, {what}: {e}"));
        let upsert = log(base + 1, "b");
        let r = rig
            .once("update", fault.clone(), any, logs.upsert(&upsert))
            .await;
        r.unwrap_or_else(|e| panic!("upsert, {what}: {e}"));
        let replaced = log(base, "c");
        let r = rig
            .once("update", fault.clone(), any, logs.replace(&replaced))
            .await;
        r.unwrap_or_else(|e| panic!("replace, {what}: {e}"));
        let stored: Vec<Log> = all(&rig.direct, "fo_logs").await;
        let mine: Vec<&Log> = stored.iter().filter(|l| l.id / 100 == i as i64).collect();
        assert_eq!(mine.len(), 2, "{what}: {mine:?}");
        assert!(
            mine.iter().any(|l| l.id == base && l.msg == "c"),
            "{what}: {mine:?}"
        );
    }
}

/// A write already on the wire when the driver clears its pool (its
/// monitor's check of the server timed out) fails with
/// `ConnectionPoolCleared`, though the server runs it. It is a retryable
/// write: the driver sends it once more, the server answers with the first
/// attempt's result, and the call returns `Ok`, counted once. Before, a
/// counter's write with a time bound went without a transaction number,
/// and the error was taken for "never sent": it was sent again, and
/// counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_the_wire_when_the_pool_is_cleared_counts_once() {
    let server = OwnServer::start(ServerOptions::default());
    let proxy = Proxy::start(server.uri());
    // Polled checks (a streamed one is no request the proxy can hold),
    // each timed out after a second.
    let uri = format!(
        "{}&heartbeatFrequencyMS=500&connectTimeoutMS=1000&serverMonitoringMode=poll",
        proxy.uri()
    );
    let mut opts = ClientOptions::parse(&uri).await.unwrap();
    let cleared = Arc::new(AtomicUsize::new(0));
    let seen = cleared.clone();
    opts.cmap_event_handler = Some(EventHandler::callback(move |e: CmapEvent| {
        if let CmapEvent::PoolCleared(c) = e {
            if c.interrupt_in_use_connections {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }
    }));
    let through = Client::with_options(opts).unwrap();
    let (direct, _) = client(server.uri()).await;
    let db = through.database("fo_cleared");
    let sampled = Item::sampled_counter(&db);
    bounded(10, sampled.incr_by("k", 10)).await.unwrap();
    // The write held past the monitor's next check, which (with the
    // check it makes at once after a failed one) is held past its timeout.
    let held = Fault::Stall(Duration::from_secs(4));
    proxy.on(Rule::new("update", 1, held.clone()).when(alone));
    proxy.on(Rule::new("findAndModify", 1, held));
    proxy.on(Rule::new("hello", 2, Fault::Stall(Duration::from_secs(3))));
    let r = bounded(
        60,
        sampled.incr_by("k", 5).max_time(Duration::from_secs(30)),
    )
    .await;
    assert!(
        cleared.load(Ordering::SeqCst) > 0,
        "the pool was cleared under the write"
    );
    assert_eq!(
        proxy.hits()[..2].iter().sum::<usize>(),
        1,
        "the write was held"
    );
    r.unwrap_or_else(|e| panic!("{e}"));
    let d: Document = bounded(
        10,
        direct
            .database("fo_cleared")
            .collection::<Document>("fo_items")
            .find_one(doc! {"_id": "k"}),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        d.get("sampled").and_then(int),
        Some(15),
        "counted once: {d}"
    );
}
