//! A seeded fault campaign: two clients (two instances of a service;
//! nothing in memory is shared between them), several tasks each, run every
//! pattern's writes for a while through the test kit's proxy, which strikes
//! a random few percent of the commands as failovers do: the reply replaced
//! by an election's error after the server ran the command (11602, labelled
//! as `mongod` labels it), the reply lost (the connection closed after the
//! command ran), the command dropped before it reached the server, a
//! step-down reported after the write was stored (a `writeConcernError`),
//! a reply held back, and a majority read answered empty.
//!
//! Then the faults stop and an independent reader (a client straight to
//! the server) checks what is stored:
//! - bucket pushes, unordered, ordered (some late: the library's own
//!   transactions) and inside a caller's transaction beside an order:
//!   every acknowledged push once, every other at most once, a
//!   transaction's push and order both or neither, `count` the items'
//!   number, `start` the items before, an ordered key's items sorted;
//! - the rank histogram: a board's histogram equals its players
//!   regrouped by score (players inserted and moved by `insert` and
//!   `update_score`), and a board moved by `change` alone (both layouts)
//!   holds what the acknowledged moves made of it plus some of the moves
//!   whose outcome is unknown, each at most once;
//! - buffered counters, one handle per client: exact after `flush` and
//!   `shutdown`;
//! - shard key inserts: every acknowledged document stored.
//!
//! It prints a table: calls by kind and outcome (`Ok`, `OutcomeUnknown`,
//! any other error), faults by kind, anomalies (must be 0). A call during
//! which the proxy struck one command at most, of any client, met one
//! failover: it must end `Ok` (or an answer that is not
//! `OutcomeUnknown`), as MongoDB's retryable writes promise; one that met
//! more (its retry cut by a pool another fault cleared, say) may end
//! `OutcomeUnknown`. Two runs: `campaign` strikes no command twice (the
//! driver's retry of a write is the same command);
//! `campaign_with_repeated_faults` lets the retry be struck too.
//!
//! Environment: `MP_CAMPAIGN_SECS` (default 20) and `MP_CAMPAIGN_SEED`
//! (default: the clock; printed, so that a run can be repeated in its
//! faults, if not in its timing). `MP_CAMPAIGN_FAULTS=off` runs without
//! the proxy against `MONGODB_URI` (a real replica set whose primary is
//! stepped down meanwhile: the CI's replset3 job) or, without it, a
//! server of its own. `MP_CAMPAIGN_TABLE=path` also writes the table
//! there (`benches/campaign-results.md` comes from it).
//! `MP_CAMPAIGN_KINDS` narrows the calls to some kinds (parts of their
//! names, separated by commas).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::{ClientSession, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::Layout;
use mongo_patterns_testkit::proxy::{Fault, Proxy, Rule};
use mongo_patterns_testkit::{bounded, client, with_pool, OwnServer, ServerOptions};

/// Unordered buckets: a push is one `findAndModify`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cmp_arrivals")]
#[bucket(size = 8, key = "acct")]
struct Arrival {
    acct: i64,
    task: u32,
    seq: u32,
}

/// Ordered buckets: a push is an `update`; a late one a transaction of the
/// library's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cmp_ticks")]
#[bucket(size = 8, key = "sym", order = "day")]
struct Tick {
    sym: i64,
    day: i64,
    task: u32,
    seq: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cmp_players")]
#[rank_histogram(board = "board", score = "score", layout = "documents")]
struct Player {
    #[serde(rename = "_id")]
    id: String,
    board: String,
    score: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cmp_docs_scores")]
#[rank_histogram(board = "board", score = "score", layout = "documents")]
struct DocsMove {
    #[serde(rename = "_id")]
    id: String,
    board: String,
    score: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cmp_array_scores")]
#[rank_histogram(board = "board", score = "score")]
struct ArrayMove {
    #[serde(rename = "_id")]
    id: String,
    board: String,
    score: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "cmp_items")]
struct Item {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 200, upsert = true)]
    views: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "cmp_logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

/// The most a call may take (bucket races 120 s, a transaction of the
/// library's own 120 s more); a call that outlives it fails the run.
const BOUND: Duration = Duration::from_secs(240);
const CLIENTS: u32 = 2;
const TASKS: u32 = 6;
/// Scores a moved board spreads over, and players per score at the start.
const SCORES: i64 = 8;
const START: i64 = 100;
const COUNTER_KEYS: i64 = 4;

/// The kinds of calls, in the table's order.
const KINDS: &[&str] = &[
    "bucket push",
    "ordered push",
    "push in a caller's transaction",
    "rank insert",
    "rank update_score",
    "rank change (documents)",
    "rank change (array)",
    "counter incr_by (buffered)",
    "shard key insert",
];

/// The kinds this run makes: `MP_CAMPAIGN_KINDS` (names, or parts of
/// names, separated by commas) narrows them, to chase one finding.
/// Read once: every call of every task draws from it.
fn kinds() -> &'static [&'static str] {
    static PICKED: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    PICKED.get_or_init(picked_kinds)
}

fn picked_kinds() -> Vec<&'static str> {
    let Ok(only) = std::env::var("MP_CAMPAIGN_KINDS") else {
        return KINDS.to_vec();
    };
    let parts: Vec<&str> = only.split(',').map(str::trim).collect();
    let picked: Vec<_> = KINDS
        .iter()
        .copied()
        .filter(|k| parts.iter().any(|p| k.contains(p)))
        .collect();
    assert!(
        !picked.is_empty(),
        "MP_CAMPAIGN_KINDS={only} names none of {KINDS:?}"
    );
    picked
}

/// A small seeded generator (64-bit LCG, high bits).
#[derive(Clone)]
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How a call ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    Ok,
    Unknown,
    Other,
}

fn end<T>(r: &mongo_patterns::Result<T>) -> End {
    match r {
        Ok(_) => End::Ok,
        Err(Error::OutcomeUnknown { .. }) => End::Unknown,
        Err(_) => End::Other,
    }
}

/// Everything the tasks record.
#[derive(Default)]
struct Record {
    /// By kind: (Ok, OutcomeUnknown, other).
    calls: BTreeMap<&'static str, [u64; 3]>,
    /// Errors (`OutcomeUnknown` included), by kind and message head.
    errors: BTreeMap<String, u64>,
    /// Pushes: acknowledged (once), unsure (at most once), by (task, seq).
    pushed_ok: HashSet<(u32, u32)>,
    pushed_unsure: HashSet<(u32, u32)>,
    /// Pushes in a caller's transaction that committed.
    committed: HashSet<(u32, u32)>,
    /// Players inserted with `Ok` (their ids).
    players: Vec<String>,
    /// Moves of a board by `change`: (old, new), acknowledged or unknown.
    moves_ok: HashMap<&'static str, Vec<(i64, i64)>>,
    moves_unknown: HashMap<&'static str, Vec<(i64, i64)>>,
    /// Counted increments by counter key.
    counted: HashMap<i64, u64>,
    logs_ok: HashSet<i64>,
    /// Calls that ended `OutcomeUnknown` though at most one command was
    /// struck while they ran.
    single_fault_unknown: Vec<String>,
    /// Calls during which exactly one command (of any client) was struck.
    one_fault_calls: u64,
    /// The slowest call of each kind.
    slowest: BTreeMap<&'static str, Duration>,
}

impl Record {
    fn call<T>(&mut self, kind: &'static str, r: &mongo_patterns::Result<T>) -> End {
        let e = end(r);
        let slot = self.calls.entry(kind).or_default();
        slot[e as usize] += 1;
        if let Err(err) = r {
            let cause = err
                .mongo()
                .map(|m| format!("; cause: {m}"))
                .unwrap_or_default();
            let head: String = format!("{err}{cause}").chars().take(240).collect();
            *self.errors.entry(format!("{kind}: {head}")).or_default() += 1;
        }
        e
    }
}

/// The faults, by name, and the commands each strikes.
fn fault_kinds() -> Vec<(&'static str, Fault, &'static [&'static str])> {
    const WRITES: &[&str] = &[
        "insert",
        "update",
        "delete",
        "findAndModify",
        "bulkWrite",
        "commitTransaction",
    ];
    const ALL: &[&str] = &[
        "insert",
        "update",
        "delete",
        "findAndModify",
        "bulkWrite",
        "commitTransaction",
        "abortTransaction",
        "find",
        "aggregate",
    ];
    vec![
        ("11602 after it ran", Fault::election(11602), ALL),
        ("reply lost", Fault::CloseAfter, ALL),
        ("dropped before the server", Fault::CloseBefore, ALL),
        (
            "step-down after it was stored",
            Fault::write_concern_error(189, "PrimarySteppedDown"),
            WRITES,
        ),
        (
            "reply held 300 ms",
            Fault::Stall(Duration::from_millis(300)),
            ALL,
        ),
        (
            "majority read answered empty",
            Fault::EmptyMajorityRead,
            &["find", "aggregate"],
        ),
    ]
}

/// The rules: each command named by a fault kind is struck by it with
/// probability `rate / kinds` (so about `rate` of them in all), drawn
/// from one seeded generator. With `once`, no command is struck twice:
/// the driver's retry of a write is the same command (the same session
/// and transaction number) and goes through, so every write meets one
/// fault at most, the case MongoDB's retryable writes promise `Ok` for.
fn arm(
    proxy: &Proxy,
    seed: u64,
    rate: f64,
    once: bool,
    strikes: &Arc<AtomicUsize>,
) -> Vec<(&'static str, usize)> {
    let rng = Arc::new(Mutex::new(Lcg(seed ^ 0x9e37_79b9_7f4a_7c15)));
    let struck: Arc<Mutex<HashSet<String>>> = Arc::default();
    let kinds = fault_kinds();
    let each = rate / kinds.len() as f64;
    let mut rules = Vec::new();
    for (k, (name, fault, commands)) in kinds.into_iter().enumerate() {
        for command in commands {
            let (rng, struck, strikes) = (rng.clone(), struck.clone(), strikes.clone());
            let threshold = (each * f64::from(1u32 << 31) * 2.0) as u64;
            let strike = move |cmd: &Document| {
                if rng.lock().unwrap().below(1 << 32) >= threshold {
                    return false;
                }
                let mut same = cmd.clone();
                same.remove("$clusterTime");
                let strike = !once || struck.lock().unwrap().insert(format!("{same:?}"));
                if strike {
                    strikes.fetch_add(1, Ordering::SeqCst);
                }
                strike
            };
            proxy.on(Rule::new(command, usize::MAX, fault.clone()).when(strike));
            rules.push((name, k));
        }
    }
    rules
}

/// One fault at most per command: the driver's retry of a write is never
/// struck itself (though a fault elsewhere may clear the pool it needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign() {
    run_campaign("campaign", true).await;
}

/// Faults that may strike the driver's retry too (two in a row on one
/// write): calls may end `OutcomeUnknown`, and the invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign_with_repeated_faults() {
    run_campaign("repeated", false).await;
}

/// The campaign (see the module docs); `once`: see [`arm`].
async fn run_campaign(name: &str, once: bool) -> Record {
    let secs: u64 = env_num("MP_CAMPAIGN_SECS").unwrap_or(20);
    let seed: u64 = env_num("MP_CAMPAIGN_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let faults = std::env::var("MP_CAMPAIGN_FAULTS").as_deref() != Ok("off");
    let given = std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty());
    // The server: our own behind the proxy; without faults, MONGODB_URI
    // when given.
    let own = match (&given, faults) {
        (Some(_), false) => None,
        _ => Some(OwnServer::start(ServerOptions::default())),
    };
    let server_uri = match &own {
        Some(s) => s.uri().to_owned(),
        None => given.clone().unwrap(),
    };
    let proxy = faults.then(|| Proxy::start(&server_uri));
    let through = match &proxy {
        Some(p) => format!("{}&heartbeatFrequencyMS=500", p.uri()),
        None => server_uri.clone(),
    };
    let db_name = format!("mp_{name}_{}", std::process::id());
    let (direct, _) = client(&server_uri).await;
    let direct = direct.database(&db_name);
    let (mut dbs, mut logs) = (Vec::new(), Vec::new());
    for _ in 0..CLIENTS {
        let (c, log) = client(&with_pool(&through, TASKS + 4)).await;
        dbs.push(c.database(&db_name));
        logs.push(log);
    }
    setup(&dbs[0]).await;
    for l in &logs {
        l.take();
    }
    println!(
        "{name}: seed {seed}, {secs} s, {CLIENTS} clients x {TASKS} tasks, faults {}",
        if faults { "on" } else { "off" }
    );
    let strikes = Arc::new(AtomicUsize::new(0));
    let rules = match &proxy {
        Some(p) => arm(p, seed, 0.06, once, &strikes),
        None => Vec::new(),
    };

    let record = Arc::new(Mutex::new(Record::default()));
    let sent = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    for (c, db) in dbs.iter().enumerate() {
        // One handle of each kind per instance, shared by its tasks.
        let counter = Item::views_counter(db);
        counters.push(counter.clone());
        let handles = Handles {
            arrivals: Arrival::buckets(db),
            ticks: Tick::buckets(db),
            players: Player::ranks(db),
            docs: DocsMove::ranks(db),
            array: ArrayMove::ranks(db),
            counter,
            logs: Log::sharded(db),
            orders: db.collection::<Document>("cmp_orders"),
        };
        for t in 0..TASKS {
            let task = c as u32 * 1000 + t;
            let (handles, db) = (handles.clone(), db.clone());
            let (record, sent, strikes) = (record.clone(), sent.clone(), strikes.clone());
            let mut rng = Lcg(seed.wrapping_add(u64::from(task) * 7919));
            tasks.push(tokio::spawn(async move {
                let mut s = db.client().start_session().await.unwrap();
                let mut seq = 0;
                while Instant::now() < until {
                    let started = Instant::now();
                    let mut ended = None;
                    let before = strikes.load(Ordering::SeqCst);
                    let one = handles.one(&mut rng, task, seq, &mut s, &record, &mut ended);
                    let kind = tokio::time::timeout(BOUND, one)
                        .await
                        .unwrap_or_else(|_| panic!("call {task}/{seq} outlived {BOUND:?}"));
                    let took = started.elapsed();
                    let mut r = record.lock().unwrap();
                    let slowest = r.slowest.entry(kind).or_default();
                    *slowest = (*slowest).max(took);
                    // At most one command struck, of any client, while the
                    // call ran: one failover, which must end in `Ok`.
                    let during = strikes.load(Ordering::SeqCst) - before;
                    if faults && during == 1 {
                        r.one_fault_calls += 1;
                    }
                    // (Without the proxy nothing is counted: the faults are
                    // a real deployment's, unseen here.)
                    if faults && during <= 1 && ended == Some(End::Unknown) {
                        r.single_fault_unknown
                            .push(format!("{kind} ({task}/{seq})"));
                    }
                    drop(r);
                    sent.fetch_add(1, Ordering::Relaxed);
                    seq += 1;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The faults stop; what is buffered is written.
    let hits = proxy.as_ref().map(|p| p.hits()).unwrap_or_default();
    if let Some(p) = &proxy {
        p.clear();
    }
    for counter in &counters {
        bounded(120, async {
            loop {
                match counter.flush().await {
                    Ok(()) => break,
                    Err(e) => eprintln!("flush after the campaign: {e} (again)"),
                }
            }
        })
        .await;
        bounded(60, counter.shutdown()).await.unwrap();
    }
    let record = Arc::into_inner(record).unwrap().into_inner().unwrap();
    let mut anomalies = check(&direct, &record).await;
    for call in &record.single_fault_unknown {
        anomalies.push(format!(
            "{call}: OutcomeUnknown though one command at most was struck while it ran"
        ));
    }

    let mut faults_by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for ((name, _), n) in rules.iter().zip(&hits) {
        *faults_by_kind.entry(name).or_default() += n;
    }
    let run = Run {
        name: if !faults {
            "no faults"
        } else if once {
            "one fault per command at most"
        } else {
            "faults that may strike the driver's retry too"
        },
        seed,
        secs,
        faults,
        calls: sent.load(Ordering::Relaxed),
        commands: logs.iter().map(|l| l.take_count()).sum(),
    };
    let table = table(&run, &record, &faults_by_kind, &anomalies);
    println!("{table}");
    if let Ok(path) = std::env::var("MP_CAMPAIGN_TABLE") {
        std::fs::write(&path, &table).unwrap();
    }
    if own.is_none() {
        bounded(30, direct.drop()).await.unwrap();
    }
    assert!(anomalies.is_empty(), "anomalies: {anomalies:#?}");
    if faults {
        let struck: usize = hits.iter().sum();
        assert!(struck > 0, "no fault struck");
    }
    record
}

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Collections, indexes and the moved boards' starting players.
async fn setup(db: &Database) {
    bounded(60, async {
        db.drop().await.unwrap();
        Arrival::buckets(db).ensure().await.unwrap();
        Tick::buckets(db).ensure().await.unwrap();
        Player::ranks(db).ensure().await.unwrap();
        DocsMove::ranks(db).ensure().await.unwrap();
        ArrayMove::ranks(db).ensure().await.unwrap();
        Item::views_counter(db).ensure().await.unwrap();
        Log::sharded(db).ensure().await.unwrap();
        // Collections are not created inside a transaction.
        db.create_collection("cmp_orders").await.unwrap();
        let docs = DocsMove::ranks(db);
        let array = ArrayMove::ranks(db);
        for s in 0..SCORES {
            for _ in 0..START {
                docs.record("moved", s).await.unwrap();
            }
            for _ in 0..START {
                array.record("moved", s).await.unwrap();
            }
        }
    })
    .await;
}

#[derive(Clone)]
struct Handles {
    arrivals: Buckets<Arrival>,
    ticks: Buckets<Tick>,
    players: Ranks<Player>,
    docs: Ranks<DocsMove>,
    array: Ranks<ArrayMove>,
    counter: Counter<Item>,
    logs: Sharded<Log>,
    orders: Collection<Document>,
}

impl Handles {
    /// One call, of a kind drawn from `rng`.
    async fn one(
        &self,
        rng: &mut Lcg,
        task: u32,
        seq: u32,
        s: &mut ClientSession,
        record: &Mutex<Record>,
        ended: &mut Option<End>,
    ) -> &'static str {
        let kinds = kinds();
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let id = (task, seq);
        match kind {
            "bucket push" => {
                let a = Arrival {
                    acct: rng.below(3) as i64,
                    task,
                    seq,
                };
                let r = self.arrivals.push(&a).await;
                *ended = Some(pushed(record, kind, id, &r));
            }
            "ordered push" => {
                // Mostly now, one in four up to 3 s back (late: the
                // library's own transaction when it falls behind the key's
                // last buckets).
                let now = DateTime::now().timestamp_millis();
                let back = if rng.below(4) == 0 {
                    rng.below(3000) as i64
                } else {
                    0
                };
                let t = Tick {
                    sym: rng.below(2) as i64,
                    day: now - back,
                    task,
                    seq,
                };
                let r = self.ticks.push(&t).await;
                *ended = Some(pushed(record, kind, id, &r));
            }
            "push in a caller's transaction" => {
                let a = Arrival {
                    acct: 10 + rng.below(2) as i64,
                    task,
                    seq,
                };
                let r = in_transaction(&self.arrivals, &a, s, &self.orders).await;
                let mut rec = record.lock().unwrap();
                match *ended.insert(rec.call(kind, &r)) {
                    End::Ok => drop(rec.committed.insert(id)),
                    _ => drop(rec.pushed_unsure.insert(id)),
                }
            }
            "rank insert" => {
                let p = Player {
                    id: format!("p{task}-{seq}"),
                    board: "players".into(),
                    score: rng.below(20) as i64,
                };
                let r = self.players.insert(&p).await;
                let mut rec = record.lock().unwrap();
                if *ended.insert(rec.call(kind, &r)) == End::Ok {
                    rec.players.push(p.id);
                }
            }
            "rank update_score" => {
                let mine: Vec<String> = {
                    let rec = record.lock().unwrap();
                    let prefix = format!("p{task}-");
                    rec.players
                        .iter()
                        .filter(|p| p.starts_with(&prefix))
                        .cloned()
                        .collect()
                };
                let Some(p) = mine.get(rng.below(mine.len().max(1) as u64) as usize) else {
                    return kind;
                };
                let new = rng.below(20) as i64;
                let r = self.players.update_score(doc! {"_id": p}, new).await;
                *ended = Some(record.lock().unwrap().call(kind, &r));
            }
            "rank change (documents)" | "rank change (array)" => {
                let old = rng.below(SCORES as u64) as i64;
                let new = (old + 1 + rng.below(SCORES as u64 - 1) as i64) % SCORES;
                let r = if kind == "rank change (documents)" {
                    self.docs.change("moved", old, new).await
                } else {
                    self.array.change("moved", old, new).await
                };
                let mut rec = record.lock().unwrap();
                match *ended.insert(rec.call(kind, &r)) {
                    End::Ok => rec.moves_ok.entry(kind).or_default().push((old, new)),
                    End::Unknown => rec.moves_unknown.entry(kind).or_default().push((old, new)),
                    // Refused: nothing moved (the check below holds it to
                    // that).
                    End::Other => {}
                }
            }
            "counter incr_by (buffered)" => {
                let key = rng.below(COUNTER_KEYS as u64) as i64;
                let n = 1 + rng.below(5);
                let r = self.counter.incr_by(&key, n).await;
                let mut rec = record.lock().unwrap();
                *ended = Some(rec.call(kind, &r));
                // Counted whatever the call returned: a write error leaves
                // the increments pending (the counter's docs).
                *rec.counted.entry(key).or_default() += n;
            }
            "shard key insert" => {
                let log = Log {
                    id: i64::from(task) * 1_000_000 + i64::from(seq),
                    kind: "app".into(),
                    ts: 1_700_000_000_000 + i64::from(seq) * 1000,
                };
                let r = self.logs.insert(&log).await;
                let mut rec = record.lock().unwrap();
                if *ended.insert(rec.call(kind, &r)) == End::Ok {
                    rec.logs_ok.insert(log.id);
                }
            }
            _ => unreachable!("{kind}"),
        }
        kind
    }
}

fn pushed(
    record: &Mutex<Record>,
    kind: &'static str,
    id: (u32, u32),
    r: &mongo_patterns::Result<()>,
) -> End {
    let mut rec = record.lock().unwrap();
    let end = rec.call(kind, r);
    match end {
        End::Ok => drop(rec.pushed_ok.insert(id)),
        _ => drop(rec.pushed_unsure.insert(id)),
    }
    end
}

/// A push and its order in one caller's transaction, run again on a
/// transient error and its commit retried, as `and_run2` does (written
/// out: its closure is not `Send`, which a spawned task needs).
async fn in_transaction(
    repo: &Buckets<Arrival>,
    a: &Arrival,
    s: &mut ClientSession,
    orders: &Collection<Document>,
) -> mongo_patterns::Result<()> {
    let started = Instant::now();
    'run: loop {
        s.start_transaction().await?;
        let r: mongo_patterns::Result<()> = async {
            repo.push(a).session(&mut *s).await?;
            let order = doc! {"task": a.task, "seq": a.seq};
            orders.insert_one(order).session(&mut *s).await?;
            Ok(())
        }
        .await;
        if let Err(e) = r {
            let _ = s.abort_transaction().await;
            if e.is_transient() && started.elapsed() < Duration::from_secs(120) {
                continue 'run;
            }
            return Err(e);
        }
        loop {
            match s.commit_transaction().await {
                Ok(()) => return Ok(()),
                Err(e) if e.contains_label("UnknownTransactionCommitResult") => continue,
                Err(e) if e.contains_label("TransientTransactionError") => continue 'run,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A stored integer, as an `int`, a `long` or a whole `double`.
fn int(v: Option<&Bson>) -> Option<i64> {
    match v {
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Double(f)) if f.fract() == 0.0 => Some(*f as i64),
        _ => None,
    }
}

async fn all(db: &Database, coll: &str, filter: Document) -> Vec<Document> {
    let c = db.collection::<Document>(coll);
    bounded(60, async {
        let find = c.find(filter).sort(doc! {"_id": 1});
        find.await.unwrap().try_collect().await.unwrap()
    })
    .await
}

/// The invariants (see the module docs), as a list of what broke.
async fn check(db: &Database, r: &Record) -> Vec<String> {
    let mut bad = Vec::new();
    // Buckets: each key's buckets in order, `count` and `start` exact, the
    // ordered keys sorted; every item by (task, seq).
    let mut times: HashMap<(u32, u32), usize> = HashMap::new();
    for (coll, key, keys, order) in [
        ("cmp_arrivals", "acct", &[0i64, 1, 2, 10, 11][..], None),
        ("cmp_ticks", "sym", &[0, 1][..], Some("day")),
    ] {
        for &k in keys {
            let buckets = all(db, coll, doc! {key: k}).await;
            let (mut before, mut last) = (0i64, i64::MIN);
            for b in &buckets {
                let id = b.get("_id").cloned().unwrap_or(Bson::Null);
                let items = b.get_array("items").cloned().unwrap_or_default();
                if int(b.get("count")) != Some(items.len() as i64) {
                    bad.push(format!(
                        "{coll} bucket {id}: count {:?} for {} items",
                        b.get("count"),
                        items.len()
                    ));
                }
                // An empty bucket opened ahead has a tentative `start`,
                // set right as it takes its first item; reads pass over it.
                let ahead = matches!(b.get_bool("mp_next"), Ok(true)) && items.is_empty();
                if !ahead && int(b.get("start")) != Some(before) {
                    let all: Vec<String> = buckets
                        .iter()
                        .map(|b| {
                            let mut b = b.clone();
                            let n = b.get_array("items").map_or(0, |i| i.len());
                            b.remove("items");
                            b.remove("mp_ops");
                            format!("{b} ({n} items)")
                        })
                        .collect();
                    bad.push(format!(
                        "{coll} bucket {id}: start {:?}, {before} items before; the key's buckets: {all:?}",
                        b.get("start")
                    ));
                }
                before += items.len() as i64;
                for item in items {
                    let item = item.as_document().cloned().unwrap_or_default();
                    if let Some(o) = order {
                        let v = int(item.get(o)).unwrap_or(i64::MIN);
                        if v < last {
                            bad.push(format!("{coll} bucket {id}: {o} {v} after {last}"));
                        }
                        last = v;
                    }
                    let t = int(item.get("task")).unwrap_or(-1) as u32;
                    let s = int(item.get("seq")).unwrap_or(-1) as u32;
                    *times.entry((t, s)).or_default() += 1;
                }
            }
        }
    }
    for id in r.pushed_ok.iter().chain(&r.committed) {
        if times.get(id) != Some(&1) {
            bad.push(format!(
                "acknowledged push {id:?} stored {:?} times",
                times.get(id)
            ));
        }
    }
    for (id, n) in &times {
        if *n > 1 {
            bad.push(format!("push {id:?} stored {n} times"));
        } else if !r.pushed_ok.contains(id)
            && !r.committed.contains(id)
            && !r.pushed_unsure.contains(id)
        {
            bad.push(format!("push {id:?} stored, never made"));
        }
    }
    // A caller's transaction: its push and its order both or neither.
    let orders: HashSet<(u32, u32)> = all(db, "cmp_orders", doc! {})
        .await
        .iter()
        .map(|d| {
            (
                int(d.get("task")).unwrap_or(-1) as u32,
                int(d.get("seq")).unwrap_or(-1) as u32,
            )
        })
        .collect();
    for id in &r.committed {
        if !orders.contains(id) {
            bad.push(format!("committed transaction {id:?}: no order"));
        }
    }
    for id in &orders {
        let stored = times.get(id).copied().unwrap_or(0);
        if stored != 1 {
            bad.push(format!("order {id:?} stored, its push {stored} times"));
        }
    }
    // The rank histogram against its players.
    let players = all(db, "cmp_players", doc! {"board": "players"}).await;
    let mut by_score: BTreeMap<i64, i64> = BTreeMap::new();
    for p in &players {
        *by_score
            .entry(int(p.get("score")).unwrap_or(-1))
            .or_default() += 1;
    }
    let held = histogram(db, Player::RANK.histogram, Layout::Documents, "players").await;
    if held != by_score {
        bad.push(format!("players' histogram {held:?}, players {by_score:?}"));
    }
    let ids: HashSet<String> = players
        .iter()
        .filter_map(|p| p.get_str("_id").ok().map(str::to_owned))
        .collect();
    for p in &r.players {
        if !ids.contains(p) {
            bad.push(format!("acknowledged player {p} not stored"));
        }
    }
    // The moved boards: the start, the acknowledged moves, and some of the
    // unknown ones.
    for (kind, hist, layout) in [
        (
            "rank change (documents)",
            DocsMove::RANK.histogram,
            Layout::Documents,
        ),
        (
            "rank change (array)",
            ArrayMove::RANK.histogram,
            Layout::Array,
        ),
    ] {
        let held = histogram(db, hist, layout, "moved").await;
        let mut want: BTreeMap<i64, i64> = (0..SCORES).map(|s| (s, START)).collect();
        for (old, new) in r.moves_ok.get(kind).into_iter().flatten() {
            *want.entry(*old).or_default() -= 1;
            *want.entry(*new).or_default() += 1;
        }
        want.retain(|_, c| *c != 0);
        let unknown = r.moves_unknown.get(kind).cloned().unwrap_or_default();
        if !explained(&held, &want, &unknown) {
            bad.push(format!(
                "{kind}: stored {held:?}; acknowledged moves make {want:?}, unknown moves {unknown:?}"
            ));
        }
    }
    // Counters: exact after flush and shutdown.
    let items = all(db, "cmp_items", doc! {}).await;
    for k in 0..COUNTER_KEYS {
        let stored = items
            .iter()
            .find(|d| int(d.get("_id")) == Some(k))
            .and_then(|d| int(d.get("views")))
            .unwrap_or(0);
        let want = r.counted.get(&k).copied().unwrap_or(0) as i64;
        if stored != want {
            bad.push(format!("counter {k}: stored {stored}, counted {want}"));
        }
    }
    // Shard key inserts: every acknowledged one stored (an `_id` can be
    // stored once only).
    let logs: HashSet<i64> = all(db, "cmp_logs", doc! {})
        .await
        .iter()
        .filter_map(|d| int(d.get("_id")))
        .collect();
    for id in &r.logs_ok {
        if !logs.contains(id) {
            bad.push(format!("acknowledged log {id} not stored"));
        }
    }
    bad
}

/// Whether `held` is `want` with some of the `unknown` moves applied, each
/// at most once: a flow problem. Each unknown move `old → new` is an edge
/// of capacity 1 from `old` to `new`; a score holding fewer than `want`
/// must send that many, one holding more must receive them. Max flow
/// (augmenting paths) from the senders to the receivers decides it.
fn explained(held: &BTreeMap<i64, i64>, want: &BTreeMap<i64, i64>, unknown: &[(i64, i64)]) -> bool {
    let n = SCORES as usize;
    // Nodes 0..n the scores, n the source, n + 1 the sink.
    let (src, sink) = (n, n + 1);
    let mut cap = vec![vec![0i64; n + 2]; n + 2];
    for (old, new) in unknown {
        cap[*old as usize][*new as usize] += 1;
    }
    let mut need = 0;
    for s in 0..SCORES {
        let d = held.get(&s).copied().unwrap_or(0) - want.get(&s).copied().unwrap_or(0);
        if d < 0 {
            cap[src][s as usize] = -d;
            need += -d;
        } else {
            cap[s as usize][sink] = d;
        }
    }
    let scores = |m: &BTreeMap<i64, i64>| m.keys().all(|s| (0..SCORES).contains(s));
    if !scores(held) || !scores(want) {
        return false;
    }
    let total = |m: &BTreeMap<i64, i64>| m.values().sum::<i64>();
    if total(held) != total(want) {
        return false;
    }
    let mut flow = 0;
    loop {
        // Breadth-first search for an augmenting path.
        let mut prev = vec![usize::MAX; n + 2];
        prev[src] = src;
        let mut queue = std::collections::VecDeque::from([src]);
        while let Some(u) = queue.pop_front() {
            for v in 0..n + 2 {
                if prev[v] == usize::MAX && cap[u][v] > 0 {
                    prev[v] = u;
                    queue.push_back(v);
                }
            }
        }
        if prev[sink] == usize::MAX {
            return flow == need;
        }
        let mut v = sink;
        while v != src {
            let u = prev[v];
            cap[u][v] -= 1;
            cap[v][u] += 1;
            v = u;
        }
        flow += 1;
    }
}

/// A board as stored (score → count), counts of 0 and markers left out.
async fn histogram(db: &Database, coll: &str, layout: Layout, board: &str) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    match layout {
        Layout::Array => {
            for d in all(db, coll, doc! {"_id": board}).await {
                for e in d.get_array("scores").cloned().unwrap_or_default() {
                    let e = e.as_document().cloned().unwrap_or_default();
                    if let (Some(s), Some(c)) = (int(e.get("score")), int(e.get("count"))) {
                        if c != 0 {
                            *out.entry(s).or_default() += c;
                        }
                    }
                }
            }
        }
        Layout::Documents => {
            for d in all(db, coll, doc! {"_id.b": board}).await {
                let s = d.get_document("_id").ok().and_then(|id| int(id.get("s")));
                if let (Some(s), Some(c)) = (s, int(d.get("count"))) {
                    if c != 0 {
                        *out.entry(s).or_default() += c;
                    }
                }
            }
        }
    }
    out
}

/// What a run was.
struct Run {
    name: &'static str,
    seed: u64,
    secs: u64,
    faults: bool,
    calls: usize,
    commands: usize,
}

/// The campaign's table, in Markdown.
fn table(run: &Run, r: &Record, struck: &BTreeMap<&str, usize>, anomalies: &[String]) -> String {
    use std::fmt::Write;
    let Run {
        name,
        seed,
        secs,
        faults,
        calls,
        commands,
    } = *run;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Fault campaign, {name}: seed {seed}, {secs} s, \
         {CLIENTS} clients x {TASKS} tasks, {calls} calls, {commands} commands sent, faults {}.\n",
        if faults { "on" } else { "off" },
    );
    let _ = writeln!(
        t,
        "| calls | Ok | OutcomeUnknown | other error | slowest (s) |"
    );
    let _ = writeln!(t, "| --- | ---: | ---: | ---: | ---: |");
    for kind in KINDS {
        let [ok, unknown, other] = r.calls.get(kind).copied().unwrap_or_default();
        let slowest = r.slowest.get(kind).map_or(0.0, Duration::as_secs_f64);
        let _ = writeln!(t, "| {kind} | {ok} | {unknown} | {other} | {slowest:.1} |");
    }
    if !struck.is_empty() {
        let all: usize = struck.values().sum();
        let share = 100.0 * all as f64 / commands.max(1) as f64;
        let _ = writeln!(t, "\n| fault | commands struck |");
        let _ = writeln!(t, "| --- | ---: |");
        for (name, n) in struck {
            let _ = writeln!(t, "| {name} | {n} |");
        }
        let _ = writeln!(t, "| all | {all} ({share:.1}% of the commands) |");
    }
    if !r.errors.is_empty() {
        let _ = writeln!(t, "\nErrors:\n");
        for (e, n) in &r.errors {
            let _ = writeln!(t, "- {n} x {e}");
        }
    }
    if faults {
        let _ = writeln!(
            t,
            "\nCalls during which exactly one command (of any client) was struck: {}; \
             of those, and of the calls that met none, {} ended `OutcomeUnknown`.",
            r.one_fault_calls,
            r.single_fault_unknown.len()
        );
    }
    let _ = writeln!(t, "\nAnomalies: {}.", anomalies.len());
    for a in anomalies.iter().take(20) {
        let _ = writeln!(t, "- {a}");
    }
    t
}
