//! The test kit's fault-injecting proxy (`testkit::proxy`) in front of the
//! test server: each fault does what its doc says, checked against the
//! server directly (a second client that does not go through the proxy).
//!
//! Every test starts a server of its own (`OwnServer`, always the test
//! server, even with `MONGODB_URI` set), so that what is asserted here is
//! what the test server does. Each prints what it observed (commands seen,
//! labels, counts): run with `--no-capture` to read how the server behaves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_patterns::bson::{doc, Bson, Document};
use mongo_patterns::mongodb::error::{Error, ErrorKind, WriteFailure};
use mongo_patterns::mongodb::event::command::CommandEvent;
use mongo_patterns::mongodb::event::sdam::SdamEvent;
use mongo_patterns::mongodb::event::EventHandler;
use mongo_patterns::mongodb::options::{ClientOptions, InsertOneModel, ReadConcern};
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns_testkit::proxy::{Fault, Proxy, Rule};
use mongo_patterns_testkit::{bounded, client, Commands, OwnServer, ServerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A server, the proxy in front of it, a client through the proxy and one
/// straight to the server.
struct Rig {
    proxy: Proxy,
    client: Client,
    commands: Commands,
    direct: Client,
    db: String,
    // Last: the server stops after the clients and the proxy are gone.
    _server: OwnServer,
}

impl Rig {
    /// The client checks the server every 500 ms (the least the driver
    /// takes), so that after an election error it finds the server again
    /// quickly.
    async fn new(test: &str) -> Rig {
        let server = OwnServer::start(ServerOptions::default());
        let proxy = Proxy::start(server.uri());
        let (client, commands) = client(&format!("{}&heartbeatFrequencyMS=500", proxy.uri())).await;
        let (direct, _) = mongo_patterns_testkit::client(server.uri()).await;
        Rig {
            proxy,
            client,
            commands,
            direct,
            db: format!("proxy_{test}"),
            _server: server,
        }
    }

    fn coll(&self) -> Collection<Document> {
        self.client.database(&self.db).collection("c")
    }

    fn direct_coll(&self) -> Collection<Document> {
        self.direct.database(&self.db).collection("c")
    }

    /// Runs `cmd` on the test's database through the proxy.
    async fn run(&self, cmd: Document) -> Result<Document, Error> {
        bounded(20, self.client.database(&self.db).run_command(cmd)).await
    }

    /// The document `_id: id` as stored, read straight from the server.
    async fn stored(&self, id: i32) -> Option<Document> {
        bounded(10, self.direct_coll().find_one(doc! {"_id": id}))
            .await
            .unwrap()
    }

    /// How many documents are stored, read straight from the server.
    async fn count(&self) -> u64 {
        bounded(10, self.direct_coll().count_documents(doc! {}))
            .await
            .unwrap()
    }

    /// The commands named `name` the driver sent since the last call.
    fn sent(&self, name: &str) -> Vec<Document> {
        let all = self.commands.take();
        all.into_iter()
            .filter(|(n, _)| n == name)
            .map(|(_, c)| c)
            .collect()
    }

    /// How many commands named `name` went through the proxy.
    fn seen(&self, name: &str) -> usize {
        self.proxy.seen().iter().filter(|n| *n == name).count()
    }
}

/// The server's error code in `e`, wherever the driver put it.
fn code(e: &Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

fn txn_numbers(cmds: &[Document]) -> Vec<Option<i64>> {
    cmds.iter().map(|c| c.get_i64("txnNumber").ok()).collect()
}

fn inc(id: i32) -> Document {
    doc! {"q": {"_id": id}, "u": {"$inc": {"n": 1}}}
}

/// `ReplyWith(11602)` on an `update` sent as a plain command (no
/// `txnNumber`): the caller gets the error; the server applied it once.
#[tokio::test]
async fn reply_with_reports_an_error_for_an_applied_update() {
    let rig = Rig::new("reply_with").await;
    rig.direct_coll()
        .insert_one(doc! {"_id": 1, "n": 0})
        .await
        .unwrap();
    rig.proxy.on(Rule::new(
        "update",
        1,
        Fault::interrupted_due_to_repl_state_change(),
    ));
    let err = rig
        .run(doc! {"update": "c", "updates": [inc(1)]})
        .await
        .unwrap_err();
    let stored = rig.stored(1).await.unwrap();
    println!(
        "update with ReplyWith(11602): error code {:?}, labels {:?}; stored {stored}; updates seen by the proxy {}",
        code(&err),
        err.labels(),
        rig.seen("update")
    );
    assert_eq!(code(&err), Some(11602), "{err}");
    assert!(err.labels().is_empty(), "no label without txnNumber");
    assert_eq!(stored.get_i32("n").ok(), Some(1), "applied once");
    assert_eq!(rig.proxy.hits(), [1]);
}

/// `Fault::election(11602)` on the driver's own `update_one`, a retryable
/// write (it carries `lsid` and `txnNumber`): the proxy labels the error
/// `RetryableWriteError` as `mongod` would, the driver retries once with the
/// same `txnNumber`, and the server answers the retry from its record of the
/// first attempt instead of applying the update again.
#[tokio::test]
async fn election_after_a_retryable_update_is_retried_and_applied_once() {
    let rig = Rig::new("election_update").await;
    rig.direct_coll()
        .insert_one(doc! {"_id": 1, "n": 0})
        .await
        .unwrap();
    rig.commands.take();
    rig.proxy.on(Rule::new("update", 1, Fault::election(11602)));
    let res = bounded(
        30,
        rig.coll()
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}}),
    )
    .await;
    let updates = rig.sent("update");
    let stored = rig.stored(1).await.unwrap();
    println!(
        "update_one with election(11602): {res:?}; updates sent {} with txnNumber {:?}, same lsid: {}; stored {stored}",
        updates.len(),
        txn_numbers(&updates),
        updates.windows(2).all(|w| w[0].get("lsid") == w[1].get("lsid")),
    );
    let res = res.expect("the retry answers Ok");
    assert_eq!(updates.len(), 2, "one retry");
    assert!(updates[0].get_i64("txnNumber").is_ok(), "a retryable write");
    assert_eq!(txn_numbers(&updates[..1]), txn_numbers(&updates[1..]));
    assert_eq!((res.matched_count, res.modified_count), (1, 1));
    assert_eq!(rig.seen("update"), 2, "the retry reached the server");
    assert_eq!(
        stored.get_i32("n").ok(),
        Some(1),
        "the server de-duplicated the retry"
    );
}

/// The same error without labels (`ReplyWith`, as `failCommand` would
/// give it with `errorLabels: []`) on `update_one`: the driver does not
/// retry (servers from 4.4 label what is retryable, and the driver goes by
/// the label), so the caller gets the error for an update that was applied.
#[tokio::test]
async fn an_unlabelled_error_is_not_retried() {
    let rig = Rig::new("unlabelled").await;
    rig.direct_coll()
        .insert_one(doc! {"_id": 1, "n": 0})
        .await
        .unwrap();
    rig.commands.take();
    rig.proxy.on(Rule::new(
        "update",
        1,
        Fault::interrupted_due_to_repl_state_change(),
    ));
    let res = bounded(
        30,
        rig.coll()
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}}),
    )
    .await;
    let updates = rig.sent("update");
    let stored = rig.stored(1).await.unwrap();
    println!(
        "update_one with an unlabelled 11602: {res:?}; updates sent {}; stored {stored}",
        updates.len()
    );
    let err = res.unwrap_err();
    assert_eq!(code(&err), Some(11602));
    assert_eq!(updates.len(), 1, "no retry");
    assert_eq!(stored.get_i32("n").ok(), Some(1));
}

/// The record behind the retries above, without the driver's retry logic:
/// the same `update` sent three times in one session, twice with one
/// `txnNumber`, once with the next. The server answers the repeat from its
/// record (the same `n`, nothing applied) and applies the new number.
#[tokio::test]
async fn the_server_answers_a_repeated_txn_number_from_its_record() {
    let rig = Rig::new("txn_number").await;
    rig.direct_coll()
        .insert_one(doc! {"_id": 1, "n": 0})
        .await
        .unwrap();
    let mut session = bounded(10, rig.direct.start_session()).await.unwrap();
    let db = rig.direct.database(&rig.db);
    let mut seen = Vec::new();
    for txn in [7_i64, 7, 8] {
        let cmd = doc! {"update": "c", "updates": [inc(1)], "txnNumber": txn};
        let reply = bounded(10, db.run_command(cmd).session(&mut session))
            .await
            .unwrap();
        let n = rig.stored(1).await.unwrap().get_i32("n").unwrap();
        seen.push((
            txn,
            reply.get_i32("n").unwrap(),
            reply.get_i32("nModified").unwrap(),
            n,
        ));
    }
    println!("(txnNumber, reply n, reply nModified, stored n): {seen:?}");
    assert_eq!(seen, [(7, 1, 1, 1), (7, 1, 1, 1), (8, 1, 1, 2)]);
}

/// The labels `Fault::election` puts on a statement inside a transaction
/// (`autocommit: false`): `TransientTransactionError`, as `mongod` does.
#[tokio::test]
async fn election_inside_a_transaction_is_transient() {
    let rig = Rig::new("election_txn").await;
    rig.direct
        .database(&rig.db)
        .create_collection("c")
        .await
        .unwrap();
    rig.proxy.on(Rule::new("insert", 1, Fault::election(11602)));
    let mut session = bounded(10, rig.client.start_session()).await.unwrap();
    bounded(10, session.start_transaction()).await.unwrap();
    let err = bounded(
        30,
        rig.coll().insert_one(doc! {"_id": 1}).session(&mut session),
    )
    .await
    .unwrap_err();
    let inserts = rig.sent("insert");
    println!(
        "insert in a transaction with election(11602): code {:?}, labels {:?}; autocommit {:?}",
        code(&err),
        err.labels(),
        inserts.first().map(|c| c.get("autocommit")),
    );
    assert_eq!(code(&err), Some(11602));
    assert!(err.contains_label("TransientTransactionError"), "{err}");
    assert!(!err.contains_label("RetryableWriteError"), "{err}");
    let _ = bounded(10, session.abort_transaction()).await;
    assert_eq!(rig.count().await, 0);
}

/// `CloseAfter` on an `insert` sent as a plain command: the insert is
/// stored, and the caller sees a network error (no retry: the command
/// carries no `txnNumber`).
#[tokio::test]
async fn close_after_loses_the_reply_of_a_stored_insert() {
    let rig = Rig::new("close_after").await;
    rig.proxy.on(Rule::new("insert", 1, Fault::CloseAfter));
    let err = rig
        .run(doc! {"insert": "c", "documents": [{"_id": 1}]})
        .await
        .unwrap_err();
    println!(
        "insert command with CloseAfter: {err}; network error: {}; inserts seen {}; stored {}",
        matches!(*err.kind, ErrorKind::Io(_)),
        rig.seen("insert"),
        rig.count().await
    );
    assert!(matches!(*err.kind, ErrorKind::Io(_)), "{err}");
    assert_eq!(rig.seen("insert"), 1);
    assert_eq!(rig.count().await, 1);
}

/// `CloseAfter` on the driver's own `insert_one` (a retryable write): the
/// driver retries once after the network error, and the server answers
/// the retry from its record, so the call returns `Ok` and the document
/// is stored once (a second insert would fail with a duplicate key).
#[tokio::test]
async fn close_after_a_retryable_insert_is_retried_and_stored_once() {
    let rig = Rig::new("close_after_retry").await;
    rig.proxy.on(Rule::new("insert", 1, Fault::CloseAfter));
    let res = bounded(30, rig.coll().insert_one(doc! {"_id": 1})).await;
    let inserts = rig.sent("insert");
    println!(
        "insert_one with CloseAfter: {res:?}; inserts sent {} with txnNumber {:?}; stored {}",
        inserts.len(),
        txn_numbers(&inserts),
        rig.count().await
    );
    res.expect("the retry answers Ok");
    assert_eq!(inserts.len(), 2, "one retry");
    assert_eq!(txn_numbers(&inserts[..1]), txn_numbers(&inserts[1..]));
    assert_eq!(rig.count().await, 1);
}

/// `CloseBefore`: the command never reaches the server; a plain command
/// gets a network error, a retryable write is retried and lands once.
#[tokio::test]
async fn close_before_never_reaches_the_server() {
    let rig = Rig::new("close_before").await;
    rig.proxy.on(Rule::new("insert", 1, Fault::CloseBefore));
    let err = rig
        .run(doc! {"insert": "c", "documents": [{"_id": 1}]})
        .await
        .unwrap_err();
    let stored = rig.count().await;
    println!("insert command with CloseBefore: {err}; stored {stored}");
    assert!(matches!(*err.kind, ErrorKind::Io(_)), "{err}");
    assert_eq!(stored, 0);

    rig.proxy.on(Rule::new("insert", 1, Fault::CloseBefore));
    rig.commands.take();
    bounded(30, rig.coll().insert_one(doc! {"_id": 2}))
        .await
        .expect("retried");
    let inserts = rig.sent("insert");
    println!(
        "insert_one with CloseBefore: Ok after {} inserts; stored {}",
        inserts.len(),
        rig.count().await
    );
    assert_eq!(inserts.len(), 2);
    assert_eq!(rig.count().await, 1);
    assert_eq!(rig.proxy.hits(), [1, 1]);
}

/// `write_concern_error(189)` on an `update`: the reply is the server's own
/// (its `n` and `nModified`) with the `writeConcernError` added; a plain
/// command (no `txnNumber`) gets no label.
#[tokio::test]
async fn write_concern_error_keeps_the_servers_reply() {
    let rig = Rig::new("wce").await;
    rig.direct_coll()
        .insert_one(doc! {"_id": 1, "n": 0})
        .await
        .unwrap();
    rig.proxy.on(Rule::new(
        "update",
        1,
        Fault::write_concern_error(189, "PrimarySteppedDown"),
    ));
    let reply = rig.run(doc! {"update": "c", "updates": [inc(1)]}).await;
    println!("update command with write_concern_error(189): {reply:?}");
    // `run_command` hands back an `ok: 1` reply as it is.
    let reply = reply.expect("ok: 1 with a writeConcernError");
    assert_eq!(reply.get_i32("n").ok(), Some(1));
    let wce = reply.get_document("writeConcernError").unwrap();
    assert_eq!(wce.get_i32("code").ok(), Some(189));
    assert_eq!(wce.get_str("codeName").ok(), Some("PrimarySteppedDown"));
    assert!(!reply.contains_key("errorLabels"));
    assert_eq!(rig.stored(1).await.unwrap().get_i32("n").ok(), Some(1));
}

/// The same on the driver's `update_one` (a retryable write): the proxy
/// labels the reply `RetryableWriteError` as `mongod` does, the driver
/// retries, and the server answers the retry from its record.
#[tokio::test]
async fn write_concern_error_on_a_retryable_update_is_retried() {
    let rig = Rig::new("wce_retry").await;
    rig.direct_coll()
        .insert_one(doc! {"_id": 1, "n": 0})
        .await
        .unwrap();
    rig.commands.take();
    rig.proxy.on(Rule::new(
        "update",
        1,
        Fault::write_concern_error(91, "ShutdownInProgress"),
    ));
    let res = bounded(
        30,
        rig.coll()
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}}),
    )
    .await;
    let updates = rig.sent("update");
    let stored = rig.stored(1).await.unwrap();
    println!(
        "update_one with write_concern_error(91): {res:?}; updates sent {} with txnNumber {:?}; stored {stored}",
        updates.len(),
        txn_numbers(&updates)
    );
    let res = res.expect("the retry answers Ok");
    assert_eq!(updates.len(), 2);
    assert_eq!((res.matched_count, res.modified_count), (1, 1));
    assert_eq!(stored.get_i32("n").ok(), Some(1));
}

/// `Stall(2 s)` on an `insert` cut by a 500 ms client-side timeout: the
/// call is cut, and the insert lands all the same.
#[tokio::test]
async fn stall_outlasts_a_client_timeout() {
    let rig = Rig::new("stall").await;
    rig.proxy
        .on(Rule::new("insert", 1, Fault::Stall(Duration::from_secs(2))));
    let started = std::time::Instant::now();
    let cut = tokio::time::timeout(
        Duration::from_millis(500),
        rig.coll().insert_one(doc! {"_id": 1}),
    )
    .await;
    println!(
        "insert_one with Stall(2 s), cut at 500 ms: cut {} after {:?}",
        cut.is_err(),
        started.elapsed()
    );
    assert!(cut.is_err(), "the timeout fired first: {cut:?}");
    let mut stored = 0;
    for _ in 0..50 {
        stored = rig.count().await;
        if stored == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("stored {stored} after {:?}", started.elapsed());
    assert_eq!(stored, 1);
}

/// `EmptyMajorityRead`: a majority read finds nothing though the document
/// is there; a local read (no read concern) through the same proxy finds it.
#[tokio::test]
async fn empty_majority_read_hides_a_stored_document() {
    let rig = Rig::new("majority").await;
    rig.direct_coll().insert_one(doc! {"_id": 1}).await.unwrap();
    rig.proxy
        .on(Rule::new("find", usize::MAX, Fault::EmptyMajorityRead));
    let majority = rig
        .client
        .database(&rig.db)
        .collection_with_options::<Document>(
            "c",
            mongo_patterns::mongodb::options::CollectionOptions::builder()
                .read_concern(ReadConcern::majority())
                .build(),
        );
    let read = bounded(10, majority.find_one(doc! {"_id": 1}))
        .await
        .unwrap();
    let local = bounded(10, rig.coll().find_one(doc! {"_id": 1}))
        .await
        .unwrap();
    println!(
        "find_one majority: {read:?}; find_one local: {local:?}; hits {:?}",
        rig.proxy.hits()
    );
    assert_eq!(read, None);
    assert_eq!(local, Some(doc! {"_id": 1}));
    assert_eq!(rig.proxy.hits(), [1], "the local read did not match");
}

/// A rule for one match applies once; a predicate picks the command (here
/// by the filter of its update statement, from the `updates` sequence).
#[tokio::test]
async fn a_rule_applies_to_its_first_matches_only() {
    let rig = Rig::new("first_n").await;
    rig.direct_coll()
        .insert_many([doc! {"_id": 1, "n": 0}, doc! {"_id": 3, "n": 0}])
        .await
        .unwrap();
    let names_3 = |cmd: &Document| {
        let first = cmd.get_array("updates").ok().and_then(|u| u.first());
        let filter = first
            .and_then(Bson::as_document)
            .and_then(|u| u.get_document("q").ok());
        filter.and_then(|q| q.get("_id")) == Some(&Bson::Int32(3))
    };
    rig.proxy
        .on(Rule::new("update", 1, Fault::max_time_ms_expired()).when(names_3));
    let mut codes = Vec::new();
    for id in [1, 3, 1, 3] {
        let res = rig.run(doc! {"update": "c", "updates": [inc(id)]}).await;
        codes.push((id, res.err().and_then(|e| code(&e))));
    }
    let (one, three) = (rig.stored(1).await.unwrap(), rig.stored(3).await.unwrap());
    println!(
        "updates (id, error code): {codes:?}; hits {:?}; stored {one}, {three}",
        rig.proxy.hits()
    );
    assert_eq!(codes, [(1, None), (3, Some(50)), (1, None), (3, None)]);
    assert_eq!(rig.proxy.hits(), [1]);
    // ReplyWith lets the server apply the command: both updates of 3 ran.
    assert_eq!(three.get_i32("n").ok(), Some(2));
    rig.proxy.clear();
    assert!(rig.proxy.hits().is_empty());
}

/// A predicate sees the command as the server does: the driver sends
/// `insert`'s `documents` as a document sequence (an `OP_MSG` kind-1
/// section), which the proxy folds into the command as an array; so it
/// does with `bulkWrite`'s `ops` when they come as one.
#[tokio::test]
async fn a_predicate_sees_document_sequences() {
    let rig = Rig::new("sequences").await;
    let two =
        |key: &'static str| move |cmd: &Document| cmd.get_array(key).map(Vec::len).ok() == Some(2);
    rig.proxy
        .on(Rule::new("insert", usize::MAX, Fault::Stall(Duration::ZERO)).when(two("documents")));
    rig.proxy
        .on(Rule::new("bulkWrite", usize::MAX, Fault::Stall(Duration::ZERO)).when(two("ops")));
    let coll = rig.coll();
    bounded(10, coll.insert_one(doc! {"_id": 1})).await.unwrap();
    bounded(10, coll.insert_many([doc! {"_id": 2}, doc! {"_id": 3}]))
        .await
        .unwrap();
    let ns = coll.namespace();
    let ops = [
        InsertOneModel::builder()
            .namespace(ns.clone())
            .document(doc! {"_id": 4})
            .build(),
        InsertOneModel::builder()
            .namespace(ns)
            .document(doc! {"_id": 5})
            .build(),
    ];
    bounded(10, rig.client.bulk_write(ops)).await.unwrap();
    let sent: Vec<String> = rig.commands.take().into_iter().map(|(n, _)| n).collect();
    println!(
        "driver sent {sent:?}; hits (2 documents, 2 ops) {:?}; stored {}",
        rig.proxy.hits(),
        rig.count().await
    );
    assert_eq!(rig.proxy.hits(), [1, 1]);
    assert_eq!(rig.count().await, 5);
}

/// Replica-set mode: given `replica_set_uri()`, the driver discovers a
/// replica set whose only member is the proxy's address (the upstream's
/// `hello` names itself; the proxy renames it), and sends every command,
/// and every heartbeat, to the proxy.
#[tokio::test]
async fn replica_set_mode_keeps_the_driver_on_the_proxy() {
    let rig = Rig::new("replica_set").await;
    let own = rig.proxy.addr().to_string();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut opts = ClientOptions::parse(rig.proxy.replica_set_uri())
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    let sent = log.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(ev) = ev {
            let to = ev.connection.address.to_string();
            sent.lock()
                .unwrap()
                .push(format!("{} to {to}", ev.command_name));
        }
    }));
    let sdam = log.clone();
    opts.sdam_event_handler = Some(EventHandler::callback(move |ev: SdamEvent| {
        let line = match ev {
            SdamEvent::TopologyDescriptionChanged(ev) => {
                let d = &ev.new_description;
                let servers: Vec<String> = d.servers().keys().map(ToString::to_string).collect();
                format!("topology {:?} {servers:?}", d.topology_type())
            }
            SdamEvent::ServerHeartbeatStarted(ev) => format!("heartbeat to {}", ev.server_address),
            _ => return,
        };
        sdam.lock().unwrap().push(line);
    }));
    let client = Client::with_options(opts).unwrap();
    let coll = client.database(&rig.db).collection::<Document>("c");

    rig.proxy.on(Rule::new(
        "insert",
        usize::MAX,
        Fault::Stall(Duration::ZERO),
    ));
    for id in 0..3 {
        bounded(20, coll.insert_one(doc! {"_id": id}))
            .await
            .unwrap();
    }
    let found = bounded(10, coll.count_documents(doc! {})).await.unwrap();
    let hello = bounded(10, client.database("admin").run_command(doc! {"hello": 1}))
        .await
        .unwrap();
    let direct = bounded(
        10,
        rig.direct.database("admin").run_command(doc! {"hello": 1}),
    )
    .await
    .unwrap();
    let fields = |h: &Document| {
        let get = |k: &str| h.get(k).map(ToString::to_string).unwrap_or_default();
        let (set, hosts) = (get("setName"), get("hosts"));
        format!(
            "setName {set} hosts {hosts} primary {} me {}",
            get("primary"),
            get("me")
        )
    };
    println!("hello from the server: {}", fields(&direct));
    println!("hello through the proxy: {}", fields(&hello));
    let log = log.lock().unwrap().clone();
    let mut events = log.clone();
    events.dedup();
    println!("the driver's events (repeats folded): {events:#?}");
    println!("insert hits {:?}", rig.proxy.hits());

    assert_eq!(found, 3);
    assert_eq!(rig.proxy.hits(), [3]);
    assert!(hello.contains_key("setName"), "a replica set member");
    assert_eq!(hello.get_str("me").ok(), Some(own.as_str()));
    assert_eq!(hello.get_str("primary").ok(), Some(own.as_str()));
    assert_eq!(
        hello.get_array("hosts").unwrap(),
        &vec![Bson::from(own.clone())]
    );
    let topology = format!("topology ReplicaSetWithPrimary [{own:?}]");
    assert_eq!(
        log.iter().rev().find(|l| l.starts_with("topology")),
        Some(&topology)
    );
    for line in &log {
        if !line.starts_with("topology") {
            assert!(
                line.ends_with(&format!(" to {own}")),
                "went around the proxy: {line}"
            );
        }
    }
}

/// A handshake over `OP_QUERY` (which older drivers send) comes back as an
/// `OP_REPLY`, and the proxy renames the upstream in its `hello` too.
#[tokio::test]
async fn op_query_handshake_reply_is_rewritten() {
    let rig = Rig::new("op_query").await;
    let mut sock = bounded(10, tokio::net::TcpStream::connect(rig.proxy.addr()))
        .await
        .unwrap();
    let mut query = Vec::new();
    doc! {"isMaster": 1}.to_writer(&mut query).unwrap();
    let mut msg = Vec::new();
    for field in [0, 7, 0, 2004, 0] {
        msg.extend_from_slice(&i32::to_le_bytes(field));
    }
    msg.extend_from_slice(b"admin.$cmd\0");
    msg.extend_from_slice(&0_i32.to_le_bytes());
    msg.extend_from_slice(&(-1_i32).to_le_bytes());
    msg.extend_from_slice(&query);
    let len = msg.len() as i32;
    msg[..4].copy_from_slice(&len.to_le_bytes());
    bounded(10, sock.write_all(&msg)).await.unwrap();
    let mut header = [0u8; 16];
    bounded(10, sock.read_exact(&mut header)).await.unwrap();
    let len = i32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let mut body = vec![0; len - 16];
    bounded(10, sock.read_exact(&mut body)).await.unwrap();
    let op = i32::from_le_bytes(header[12..].try_into().unwrap());
    let reply = Document::from_reader(&body[20..]).unwrap();
    println!(
        "OP_QUERY isMaster: opCode {op}, me {:?}, hosts {:?}; the proxy logged {:?}",
        reply.get("me"),
        reply.get("hosts"),
        rig.proxy.seen().last()
    );
    assert_eq!(op, 1, "OP_REPLY");
    let own = rig.proxy.addr().to_string();
    assert_eq!(reply.get_str("me").ok(), Some(own.as_str()));
}

/// `stop` closes the listener and the open connections.
#[tokio::test]
async fn stop_closes_everything() {
    let rig = Rig::new("stop").await;
    let addr = rig.proxy.addr();
    let mut open = bounded(10, tokio::net::TcpStream::connect(addr))
        .await
        .unwrap();
    let Rig { proxy, .. } = rig;
    bounded(10, proxy.stop()).await;
    let mut buf = [0u8; 1];
    let read = bounded(10, open.read(&mut buf)).await;
    let again = tokio::net::TcpStream::connect(addr).await;
    println!(
        "after stop: open connection read {read:?}; new connection {:?}",
        again.as_ref().map(|_| ())
    );
    assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
    assert!(again.is_err(), "no listener");
}
