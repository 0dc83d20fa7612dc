//! The service under load: two instances (two routers over two clients, as
//! two processes would run) on loopback, behind `--clients` concurrent HTTP
//! clients for `--secs` seconds over a mix of every endpoint. Then both
//! instances stop gracefully (their counters flush) and the stored data is
//! checked against what the clients were told.
//!
//! ```text
//! cargo bench -p mongo-patterns-service-example --bench load -- --secs 20 --clients 64
//! ```
//!
//! Flags: `--secs` (20), `--clients` (64), `--deadline-ms` (10000),
//! `--boards` (8), `--products` (200).
//!
//! Every order writes its ticker's product document inside its
//! transaction, so few products make that document hot. With a 5 s
//! deadline, on the 2-core machine the committed table comes from (shared
//! with other work), 40 to 133 orders of about 1,000 were cut at the
//! deadline with 20 products (133 with one histogram document per board,
//! before the model took the documents layout), 13 with 200 products; reads
//! stayed under 1.4 s. Orders the clients
//! were not told about may be stored, whole: the check counts them apart.
//!
//! The server is `MONGODB_URI`, else the test server the testkit starts.
//! It shares the machine with the service and the clients, so the figures
//! are this machine's, not a claim about `mongod`. The table goes to
//! `benches/service-results.md` (the workspace's) and to stdout.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongo_patterns::bson::{doc, Document};
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use mongo_patterns_service_example::{serve, App, Config, FeedPage, Trade, Trader};
use serde_json::{json, Value};
use tokio::sync::oneshot;

const TRADERS: usize = 200;
/// What a request may take past its deadline on the client's clock: the
/// HTTP round trip of the 504, on a loaded machine.
const SLACK: Duration = Duration::from_millis(100);
const KINDS: [&str; 4] = ["login", "logout", "alert", "audit"];

/// The endpoints, with their share of the mix in percent.
const MIX: [(Op, u32); 9] = [
    (Op::View, 25),
    (Op::Like, 5),
    (Op::Order, 15),
    (Op::MyRank, 10),
    (Op::Top, 5),
    (Op::History, 10),
    (Op::Feed, 15),
    (Op::LogEvent, 7),
    (Op::Events, 8),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Op {
    View,
    Like,
    Order,
    MyRank,
    Top,
    History,
    Feed,
    LogEvent,
    Events,
}

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::View => "`GET /products/{id}` (a view)",
            Op::Like => "`POST /products/{id}/like`",
            Op::Order => "`POST /orders` (one transaction)",
            Op::MyRank => "`GET /traders/{id}` (my rank)",
            Op::Top => "`GET /boards/{b}/top?n=10`",
            Op::History => "`GET /customers/{id}/trades`",
            Op::Feed => "`GET /feed?after=` (up to 5 pages deep)",
            Op::LogEvent => "`POST /events`",
            Op::Events => "`GET /events/{kind}`",
        }
    }
}

/// What one client task saw.
#[derive(Default)]
struct Seen {
    /// (op, latency in µs, status).
    calls: Vec<(Op, u64, u16)>,
    /// Orders acknowledged (201): order id, customer, ticker, qty.
    orders: Vec<(String, String, String, i64)>,
    /// Orders answered otherwise (a 504 at the deadline): may be stored.
    unanswered: Vec<String>,
    /// Views and likes acknowledged (200), per product.
    views: HashMap<String, i64>,
    likes: HashMap<String, i64>,
}

struct Flags {
    secs: u64,
    clients: usize,
    deadline_ms: u64,
    boards: usize,
    products: usize,
}

static FLAGS: std::sync::OnceLock<Flags> = std::sync::OnceLock::new();

fn flags() -> &'static Flags {
    FLAGS.get_or_init(parse_flags)
}

fn parse_flags() -> Flags {
    let args: Vec<String> = std::env::args().collect();
    let num = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    };
    Flags {
        secs: num("--secs", 20),
        clients: num("--clients", 64) as usize,
        deadline_ms: num("--deadline-ms", 10_000),
        boards: num("--boards", 8) as usize,
        products: num("--products", 200) as usize,
    }
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Instance {
    base: String,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn instance(uri: &str, db_name: &str, deadline: Duration) -> Instance {
    // Its own client, as another process would have.
    let client = Client::with_uri_str(uri).await.expect("client");
    let db = client.database(db_name);
    let config = Config {
        deadline,
        token_key: b"the load run's shared feed key".to_vec().into(),
    };
    let app = App::new(client, db, config).await.expect("App::new");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, app, async {
        let _ = stopped.await;
    }));
    Instance { base, stop, task }
}

fn customer(i: usize) -> String {
    format!("c{i:03}")
}

fn product(i: usize) -> String {
    format!("T{i:02}")
}

#[tokio::main]
async fn main() {
    let f = flags();
    let deadline = Duration::from_millis(f.deadline_ms);
    let uri = mongo_patterns_testkit::server_uri();
    let db_name = format!("mp_service_load_{}", std::process::id());
    let instances = [
        instance(&uri, &db_name, deadline).await,
        instance(&uri, &db_name, deadline).await,
    ];
    let bases: Arc<Vec<String>> = Arc::new(instances.iter().map(|i| i.base.clone()).collect());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(f.clients)
        .build()
        .unwrap();

    for i in 0..TRADERS {
        let r = http
            .post(format!("{}/traders", bases[i % 2]))
            .json(&json!({"id": customer(i), "board": format!("board{}", i % f.boards)}))
            .send()
            .await
            .expect("setup");
        assert_eq!(r.status().as_u16(), 201, "setup: {:?}", r.text().await);
    }
    eprintln!(
        "{} traders on {} boards; {} clients for {} s",
        TRADERS, f.boards, f.clients, f.secs
    );

    let start = Instant::now();
    let end = start + Duration::from_secs(f.secs);
    let tasks: Vec<_> = (0..f.clients)
        .map(|t| {
            let (http, bases) = (http.clone(), bases.clone());
            tokio::spawn(async move { client_task(t, http, bases, end).await })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.expect("client task"));
    }
    let elapsed = start.elapsed();
    for i in instances {
        let _ = i.stop.send(());
        i.task.await.expect("serve task").expect("serve");
    }

    let (client, _) = mongo_patterns_testkit::client(&uri).await;
    let db = client.database(&db_name);
    let checks = invariants(&db, &seen).await;
    let table = report(f, elapsed, &seen, &checks, deadline);
    print!("{table}");
    let out = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../benches/service-results.md"
    );
    std::fs::write(out, table).expect("write benches/service-results.md");
    db.drop().await.expect("drop");
    if checks.iter().any(|(_, ok)| !ok) {
        std::process::exit(1);
    }
}

async fn client_task(
    t: usize,
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    end: Instant,
) -> Seen {
    let mut rng = 0x5eed_0000_u64 + t as u64;
    let mut seen = Seen::default();
    let mut feed: Option<(String, u32)> = None;
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        // Alternate the instances, so both serve every key.
        let base = &bases[(t + n as usize) % bases.len()];
        let mut pick = (splitmix(&mut rng) % 100) as u32;
        let op = MIX
            .iter()
            .find(|(_, share)| {
                if pick < *share {
                    true
                } else {
                    pick -= share;
                    false
                }
            })
            .map(|(op, _)| *op)
            .unwrap_or(Op::View);
        let who = customer((splitmix(&mut rng) % TRADERS as u64) as usize);
        let what = product((splitmix(&mut rng) % flags().products as u64) as usize);
        let since = Instant::now();
        let (status, body) = match op {
            Op::View => call(http.get(format!("{base}/products/{what}"))).await,
            Op::Like => call(http.post(format!("{base}/products/{what}/like"))).await,
            Op::Order => {
                let qty = 1 + (splitmix(&mut rng) % 100) as i64;
                let id = format!("o{t}-{n}");
                let r =
                    call(http.post(format!("{base}/orders")).json(
                        &json!({"order_id": id, "customer": who, "ticker": what, "qty": qty}),
                    ))
                    .await;
                if r.0 == 201 {
                    seen.orders.push((id, who.clone(), what.clone(), qty));
                } else {
                    seen.unanswered.push(id);
                }
                r
            }
            Op::MyRank => call(http.get(format!("{base}/traders/{who}"))).await,
            Op::Top => {
                let b = splitmix(&mut rng) % flags().boards as u64;
                call(http.get(format!("{base}/boards/board{b}/top?n=10"))).await
            }
            Op::History => {
                let page = 1 + splitmix(&mut rng) % 3;
                call(http.get(format!(
                    "{base}/customers/{who}/trades?page={page}&page_size=10"
                )))
                .await
            }
            Op::Feed => {
                let url = match &feed {
                    Some((token, _)) => format!("{base}/feed?limit=10&after={token}"),
                    None => format!("{base}/feed?limit=10"),
                };
                let r = call(http.get(url)).await;
                let depth = feed.as_ref().map_or(0, |(_, d)| *d);
                feed = serde_json::from_value::<FeedPage>(r.1.clone())
                    .ok()
                    .and_then(|p| p.next)
                    .filter(|_| depth < 4)
                    .map(|t| (t, depth + 1));
                r
            }
            Op::LogEvent => {
                let kind = KINDS[(splitmix(&mut rng) % 4) as usize];
                call(
                    http.post(format!("{base}/events"))
                        .json(&json!({"kind": kind, "detail": who})),
                )
                .await
            }
            Op::Events => {
                let kind = KINDS[(splitmix(&mut rng) % 4) as usize];
                call(http.get(format!("{base}/events/{kind}?days=1&limit=20"))).await
            }
        };
        let micros = since.elapsed().as_micros() as u64;
        if status == 200 {
            match op {
                Op::View => *seen.views.entry(what).or_default() += 1,
                Op::Like => *seen.likes.entry(what).or_default() += 1,
                _ => {}
            }
        }
        if !(200..300).contains(&status) && seen.calls.iter().filter(|c| c.2 >= 300).count() < 5 {
            eprintln!("{op:?}: {status} {body}");
        }
        seen.calls.push((op, micros, status));
    }
    seen
}

/// Status and body (0 for a request that got no answer).
async fn call(req: reqwest::RequestBuilder) -> (u16, Value) {
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
        Err(e) => (0, Value::String(e.to_string())),
    }
}

/// Each check with whether it held.
async fn invariants(db: &Database, seen: &[Seen]) -> Vec<(String, bool)> {
    let mut checks = Vec::new();

    // The histogram of every board equals its traders' volumes.
    let ranks = Trader::ranks(db);
    let traders: Vec<Trader> = Trader::collection(db)
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut boards_ok = 0;
    let boards = flags().boards;
    for b in 0..boards {
        let board = format!("board{b}");
        let mut want: HashMap<i64, u64> = HashMap::new();
        for t in traders.iter().filter(|t| t.board == board) {
            *want.entry(t.volume).or_default() += 1;
        }
        let got: HashMap<i64, u64> = ranks
            .histogram(board.as_str())
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.count > 0)
            .map(|s| (s.score, s.count))
            .collect();
        boards_ok += usize::from(got == want);
    }
    checks.push((
        format!(
            "histogram equals players: {boards_ok} of {boards} boards match their {} traders' volumes",
            traders.len()
        ),
        boards_ok == boards && traders.len() == TRADERS,
    ));

    // Every acknowledged trade stored once, and nothing else stored; each
    // trader's volume is the sum of their stored trades.
    let acked: Vec<&(String, String, String, i64)> = seen.iter().flat_map(|s| &s.orders).collect();
    let trades = Trade::buckets(db);
    let mut stored: HashMap<String, u32> = HashMap::new();
    let mut stored_tickers: Vec<String> = Vec::new();
    let mut volume_ok = 0;
    for t in &traders {
        let mine: Vec<Trade> = trades.stream(&t.id).try_collect().await.unwrap();
        let sum: i64 = mine.iter().map(|x| i64::from(x.qty)).sum();
        volume_ok += usize::from(sum == t.volume);
        for x in mine {
            *stored.entry(x.order_id).or_default() += 1;
            stored_tickers.push(x.ticker);
        }
    }
    let once = acked
        .iter()
        .filter(|o| stored.get(&o.0) == Some(&1))
        .count();
    let unanswered: Vec<&String> = seen.iter().flat_map(|s| &s.unanswered).collect();
    let cut_stored = unanswered
        .iter()
        .filter(|id| stored.contains_key(id.as_str()))
        .count();
    checks.push((
        format!(
            "every acknowledged trade stored once: {once} of {} acknowledged orders stored exactly once; {} trades stored in all, none twice",
            acked.len(),
            stored.values().sum::<u32>()
        ),
        once == acked.len()
            && stored.len() == acked.len() + cut_stored
            && stored.values().all(|n| *n == 1),
    ));
    if !unanswered.is_empty() {
        checks.push((
            format!(
                "orders not acknowledged (cut at the deadline, answered \"may or may not be stored\"): {} of {} stored, whole (trade, volume and view together)",
                cut_stored,
                unanswered.len()
            ),
            true,
        ));
    }
    checks.push((
        format!("volumes equal trades: {volume_ok} of {} traders' volume is the sum of their stored trades", traders.len()),
        volume_ok == traders.len(),
    ));

    // Counters exact once both instances have shut down: views are the
    // acknowledged product views plus one per stored trade of the ticker
    // (counted in the order's transaction: stored with it or not at all);
    // likes the acknowledged likes.
    let mut want_views: HashMap<String, i64> = HashMap::new();
    let mut want_likes: HashMap<String, i64> = HashMap::new();
    for s in seen {
        for (p, n) in &s.views {
            *want_views.entry(p.clone()).or_default() += n;
        }
        for (p, n) in &s.likes {
            *want_likes.entry(p.clone()).or_default() += n;
        }
    }
    for ticker in stored_tickers {
        *want_views.entry(ticker).or_default() += 1;
    }
    let products: Vec<Document> = db
        .collection::<Document>("products")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let num = |d: &Document, f: &str| match d.get(f) {
        Some(mongo_patterns::bson::Bson::Int32(n)) => i64::from(*n),
        Some(mongo_patterns::bson::Bson::Int64(n)) => *n,
        _ => 0,
    };
    let mut exact = 0;
    let (mut views, mut likes) = (0, 0);
    for p in &products {
        let id = p.get_str("_id").unwrap_or_default();
        let (v, l) = (num(p, "views"), num(p, "likes"));
        views += v;
        likes += l;
        exact += usize::from(
            v == want_views.get(id).copied().unwrap_or(0)
                && l == want_likes.get(id).copied().unwrap_or(0),
        );
    }
    let (wv, wl): (i64, i64) = (want_views.values().sum(), want_likes.values().sum());
    checks.push((
        format!(
            "counters exact after both instances shut down: {exact} of {} products exact; views {views} stored of {wv}, likes {likes} of {wl}",
            products.len()
        ),
        exact == products.len() && views == wv && likes == wl,
    ));
    checks
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

fn report(
    f: &Flags,
    elapsed: Duration,
    seen: &[Seen],
    checks: &[(String, bool)],
    deadline: Duration,
) -> String {
    let mut by_op: HashMap<Op, (Vec<u64>, u64)> = HashMap::new();
    let mut all = Vec::new();
    let mut errors = 0;
    let mut over = 0;
    for s in seen {
        for &(op, us, status) in &s.calls {
            let e = by_op.entry(op).or_default();
            e.0.push(us);
            let bad = !(200..300).contains(&status);
            e.1 += u64::from(bad);
            errors += u64::from(bad);
            // Answered past the deadline by more than the HTTP round trip.
            over += u64::from(us > (deadline + SLACK).as_micros() as u64);
            all.push(us);
        }
    }
    let secs = elapsed.as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- Generated by `cargo bench -p mongo-patterns-service-example --bench load -- --secs {} --clients {} --deadline-ms {} --boards {} --products {}`; do not edit. -->\n",
        f.secs, f.clients, f.deadline_ms, f.boards, f.products
    );
    let _ = writeln!(out, "# The example service under load\n");
    let _ = writeln!(
        out,
        "Two instances of `examples/service` (two routers over two driver clients, as two processes) on loopback, \
         behind {} concurrent HTTP clients (`reqwest`, keep-alive) for {:.1} s, alternating instances per request; \
         {TRADERS} traders on {} boards, {} products, a {} ms deadline per request. \
         The server is the test server (or `MONGODB_URI`) on the same {}-core machine as the service and the clients: \
         the figures are this machine's, not `mongod`'s. Latencies are the clients' (request sent to body read).\n",
        f.clients,
        secs,
        f.boards,
        f.products,
        f.deadline_ms,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let _ = writeln!(
        out,
        "| endpoint | share | requests | req/s | p50 ms | p99 ms | max ms | errors |"
    );
    let _ = writeln!(
        out,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (op, share) in MIX {
        let Some((lat, errs)) = by_op.get_mut(&op) else {
            continue;
        };
        lat.sort_unstable();
        let _ = writeln!(
            out,
            "| {} | {share} % | {} | {:.0} | {:.1} | {:.1} | {:.1} | {errs} |",
            op.label(),
            lat.len(),
            lat.len() as f64 / secs,
            pct(lat, 0.50),
            pct(lat, 0.99),
            pct(lat, 1.0),
        );
    }
    all.sort_unstable();
    let _ = writeln!(
        out,
        "| **all** | 100 % | {} | **{:.0}** | **{:.1}** | **{:.1}** | {:.1} | **{errors}** |\n",
        all.len(),
        all.len() as f64 / secs,
        pct(&all, 0.50),
        pct(&all, 0.99),
        pct(&all, 1.0),
    );
    let _ = writeln!(
        out,
        "Requests answered more than {} ms after the {} ms deadline (client-side): **{over}**; the slowest took {:.1} ms.\n",
        SLACK.as_millis(),
        f.deadline_ms,
        pct(&all, 1.0)
    );
    let _ = writeln!(
        out,
        "Afterwards, with both instances shut down (counters flushed):\n"
    );
    for (what, ok) in checks {
        let _ = writeln!(out, "- {} {what}", if *ok { "✓" } else { "✗ FAILED:" });
    }
    out
}
