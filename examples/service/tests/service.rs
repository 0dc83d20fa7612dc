//! The service end to end: started on loopback against the test server,
//! driven over HTTP by `reqwest`. Every wait is bounded (`bounded`).

use std::time::{Duration, Instant};

use mongo_patterns::bson::{doc, Document};
use mongo_patterns::mongodb::{Client, Database};
use mongo_patterns::prelude::Documents as _;
use mongo_patterns_service_example::{
    serve, Activity, App, Config, FeedPage, History, Place, Placed, Standing,
};
use mongo_patterns_testkit::{bounded, client, fresh_db, Commands, FaultServer};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running instance: its base URL, its stop switch and its task.
struct Running {
    base: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Stops it as SIGTERM would, and waits for the counters' flush.
    async fn stop(self) {
        let _ = self.stop.send(());
        bounded(30, self.task)
            .await
            .expect("the serve task")
            .expect("serve");
    }
}

fn config() -> Config {
    Config {
        deadline: Duration::from_secs(10),
        token_key: b"the tests' feed token key".to_vec().into(),
    }
}

/// Serves `app` on 127.0.0.1:0.
async fn start(app: App) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(serve(listener, app, async {
        let _ = stopped.await;
    }));
    Running { base, stop, task }
}

async fn app_on(db: &Database) -> App {
    bounded(30, App::new(db.client().clone(), db.clone(), config()))
        .await
        .expect("App::new")
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn get(h: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = bounded(30, h.get(url).send()).await.expect(url);
    let status = r.status().as_u16();
    let text = bounded(30, r.text()).await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post(h: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let r = bounded(30, h.post(url).json(&body).send())
        .await
        .expect(url);
    let status = r.status().as_u16();
    let text = bounded(30, r.text()).await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A counter as stored (an int32 or an int64).
fn num(d: &Document, field: &str) -> Option<i64> {
    match d.get(field)? {
        mongo_patterns::bson::Bson::Int32(n) => Some(i64::from(*n)),
        mongo_patterns::bson::Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// The `find`s sent to `collection` since the last `take`.
fn finds_on(commands: &Commands, collection: &str) -> usize {
    commands
        .take()
        .iter()
        .filter(|(name, c)| name == "find" && c.get_str("find").ok() == Some(collection))
        .count()
}

#[tokio::test]
async fn every_endpoint() {
    let (db, commands) = fresh_db("service_every_endpoint").await;
    let app = app_on(&db).await;
    let s = start(app).await;
    let h = http();

    assert_eq!(get(&h, &s.url("/healthz")).await, (200, json!("ok")));

    // Leaderboard: join, then orders move the volumes.
    for (id, board) in [("ada", "b1"), ("bob", "b1"), ("cy", "b2")] {
        let (st, body) = post(&h, &s.url("/traders"), json!({"id": id, "board": board})).await;
        assert_eq!(st, 201, "{body}");
    }
    let (st, _) = post(&h, &s.url("/traders"), json!({"id": "ada", "board": "b1"})).await;
    assert_eq!(st, 409, "a second ada");

    let mut ada_orders = Vec::new();
    for i in 0..25 {
        let (st, body) = post(
            &h,
            &s.url("/orders"),
            json!({"customer": "ada", "ticker": "MDB", "qty": 2, "order_id": format!("ada-{i}")}),
        )
        .await;
        assert_eq!(st, 201, "{body}");
        let p: Placed = parse(body);
        assert_eq!(p.volume, 2 * (i + 1));
        ada_orders.push(p.order_id);
    }
    let (st, body) = post(
        &h,
        &s.url("/orders"),
        json!({"customer": "bob", "ticker": "AAPL", "qty": 7}),
    )
    .await;
    assert_eq!(st, 201, "{body}");
    let (st, body) = post(
        &h,
        &s.url("/orders"),
        json!({"customer": "nobody", "ticker": "MDB", "qty": 1}),
    )
    .await;
    assert_eq!(st, 404, "{body}");
    let (st, _) = post(
        &h,
        &s.url("/orders"),
        json!({"customer": "ada", "ticker": "MDB", "qty": 0}),
    )
    .await;
    assert_eq!(st, 400);

    let (st, body) = get(&h, &s.url("/traders/ada")).await;
    assert_eq!(st, 200, "{body}");
    let ada: Standing = parse(body);
    assert_eq!((ada.volume, ada.rank, ada.total), (50, 1, 2));
    let bob: Standing = parse(get(&h, &s.url("/traders/bob")).await.1);
    assert_eq!((bob.volume, bob.rank), (7, 2));
    assert_eq!(get(&h, &s.url("/traders/zed")).await.0, 404);
    let (st, body) = get(&h, &s.url("/boards/b1/top?n=2")).await;
    assert_eq!(st, 200, "{body}");
    let top: Vec<Place> = parse(body);
    assert_eq!(
        top.iter()
            .map(|p| (p.rank, p.volume, p.traders))
            .collect::<Vec<_>>(),
        [(1, 50, 1), (2, 7, 1)]
    );
    assert_eq!(get(&h, &s.url("/boards/nowhere/top")).await.0, 404);
    assert_eq!(get(&h, &s.url("/boards/b1/top?n=0")).await.0, 400);

    // Trade history: newest first, pages of 10.
    let (st, body) = get(&h, &s.url("/customers/ada/trades?page=1&page_size=10")).await;
    assert_eq!(st, 200, "{body}");
    let first: History = parse(body);
    assert!(first.has_more);
    assert_eq!(first.trades[0].order_id, "ada-24");
    let third: History = parse(
        get(&h, &s.url("/customers/ada/trades?page=3&page_size=10"))
            .await
            .1,
    );
    assert!(!third.has_more);
    let shown: Vec<&str> = third.trades.iter().map(|t| t.order_id.as_str()).collect();
    assert_eq!(shown, ["ada-4", "ada-3", "ada-2", "ada-1", "ada-0"]);
    assert_eq!(get(&h, &s.url("/customers/ada/trades?page=0")).await.0, 400);

    // The feed: 26 lines, newest first, by tokens.
    let mut seen = Vec::new();
    let mut url = s.url("/feed?limit=10");
    loop {
        let (st, body) = get(&h, &url).await;
        assert_eq!(st, 200, "{body}");
        let page: FeedPage = parse(body);
        seen.extend(page.items.into_iter().map(|l| l.text));
        match page.next {
            Some(t) => url = s.url(&format!("/feed?limit=10&after={t}")),
            None => break,
        }
    }
    assert_eq!(seen.len(), 26);
    assert_eq!(seen[0], "bob bought 7 AAPL");
    assert_eq!(seen[25], "ada bought 2 MDB");
    assert_eq!(get(&h, &s.url("/feed?limit=0")).await.0, 400);

    // Counters: each order counted a view of its ticker, in its transaction.
    let (st, body) = get(&h, &s.url("/products/MDB")).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        (body["views"].clone(), body["likes"].clone()),
        (json!(26), json!(0))
    );
    let (st, body) = post(&h, &s.url("/products/MDB/like"), json!({})).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        (body["views"].clone(), body["likes"].clone()),
        (json!(26), json!(1))
    );

    // The event log.
    for kind in ["login", "login", "logout"] {
        let (st, body) = post(
            &h,
            &s.url("/events"),
            json!({"kind": kind, "detail": "from the test"}),
        )
        .await;
        assert_eq!(st, 201, "{body}");
    }
    let (st, body) = get(&h, &s.url("/events/login?days=1")).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(2));
    assert_eq!(
        get(&h, &s.url("/events/logout"))
            .await
            .1
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(get(&h, &s.url("/events/login?days=0")).await.0, 400);

    s.stop().await;
    let stored = db
        .collection::<Document>("products")
        .find_one(doc! {"_id": "MDB"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (num(&stored, "views"), num(&stored, "likes")),
        (Some(26), Some(1)),
        "{stored}"
    );
    drop(commands);
    db.drop().await.unwrap();
}

/// A forged, a truncated, an altered and a foreign page token: 400 each,
/// and no `find` reaches the server for any of them.
#[tokio::test]
async fn bad_page_tokens_are_400_and_send_nothing() {
    let (db, commands) = fresh_db("service_bad_tokens").await;
    let app = app_on(&db).await;
    let s = start(app).await;
    let h = http();
    let (st, _) = post(&h, &s.url("/traders"), json!({"id": "ada", "board": "b"})).await;
    assert_eq!(st, 201);
    for _ in 0..3 {
        let (st, body) = post(
            &h,
            &s.url("/orders"),
            json!({"customer": "ada", "ticker": "MDB", "qty": 1}),
        )
        .await;
        assert_eq!(st, 201, "{body}");
    }
    let page: FeedPage = parse(get(&h, &s.url("/feed?limit=1")).await.1);
    let token = page.next.expect("a next page");
    commands.take();
    let (st, body) = get(&h, &s.url(&format!("/feed?limit=1&after={token}"))).await;
    assert_eq!(st, 200, "the genuine token: {body}");
    assert_eq!(finds_on(&commands, "activities"), 1);

    // A signed token for another key: what another deployment (or a forger
    // who read the format) would hand us.
    let other = Activity::keyset(&db)
        .signing_key(b"somebody else's key, 32 bytes..".to_vec())
        .page_size(1)
        .page()
        .await
        .unwrap()
        .next
        .unwrap()
        .to_string();
    let mut altered = token.clone().into_bytes();
    let mid = altered.len() / 2;
    altered[mid] = if altered[mid] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    commands.take();
    for (what, bad) in [
        ("forged", "AQAAAAA".to_owned()),
        ("truncated", token[..token.len() / 2].to_owned()),
        ("truncated by one", token[..token.len() - 1].to_owned()),
        ("altered", altered),
        ("another key's", other),
        ("not base64", "%%%".to_owned()),
    ] {
        for dir in ["after", "before"] {
            let (st, body) = get(&h, &s.url(&format!("/feed?{dir}={bad}"))).await;
            assert_eq!(st, 400, "{what} token ({dir}): {body}");
            assert!(
                body.as_str().unwrap_or_default().contains("page token"),
                "{what}: {body}"
            );
        }
    }
    assert_eq!(
        finds_on(&commands, "activities"),
        0,
        "a bad token reached the server"
    );
    s.stop().await;
    db.drop().await.unwrap();
}

/// An order cut by a tiny deadline while its transaction's write is held
/// on the server: 504 at the deadline, nothing committed, and the next
/// order of the same customer (the same trader, histogram and bucket key)
/// succeeds at once.
#[tokio::test]
async fn a_request_cut_by_its_deadline() {
    let server = FaultServer::start("service_deadline").await;
    let (c, _) = client(server.uri()).await;
    let db: Database = c.database(&server.db_name("svc_deadline"));
    let app = app_on(&db).await;
    let normal = start(app.clone()).await;
    let tiny = start(app.with_deadline(Duration::from_millis(100))).await;
    let h = http();
    let (st, _) = post(
        &h,
        &normal.url("/traders"),
        json!({"id": "ada", "board": "b"}),
    )
    .await;
    assert_eq!(st, 201);
    let (st, body) = post(
        &h,
        &normal.url("/orders"),
        json!({"customer": "ada", "ticker": "MDB", "qty": 1}),
    )
    .await;
    assert_eq!(st, 201, "{body}");

    hold_next_write(&server, &c).await;
    let since = Instant::now();
    let (st, body) = post(
        &h,
        &tiny.url("/orders"),
        json!({"customer": "ada", "ticker": "MDB", "qty": 1, "order_id": "cut"}),
    )
    .await;
    let took = since.elapsed();
    assert_eq!(st, 504, "{body}");
    assert!(
        body.as_str().unwrap_or_default().contains("may or may not"),
        "{body}"
    );
    assert!(
        took < Duration::from_millis(1_000),
        "the cut answered after {took:?}"
    );
    // The held command runs on the server now.
    tokio::time::sleep(Duration::from_millis(600)).await;

    let since = Instant::now();
    let (st, body) = post(
        &h,
        &normal.url("/orders"),
        json!({"customer": "ada", "ticker": "MDB", "qty": 1, "order_id": "next"}),
    )
    .await;
    let took = since.elapsed();
    assert_eq!(st, 201, "{body}");
    // A cut transaction left open would hold the trader, histogram and
    // bucket documents for the server's transaction lifetime (60 s), and
    // this order would wait or rerun until then.
    assert!(
        took < Duration::from_secs(3),
        "the next order took {took:?}"
    );
    let placed: Placed = parse(body);
    assert_eq!(placed.volume, 2, "the cut order was committed");
    let history: History = parse(get(&h, &normal.url("/customers/ada/trades")).await.1);
    let ids: Vec<&str> = history.trades.iter().map(|t| t.order_id.as_str()).collect();
    assert!(!ids.contains(&"cut"), "{ids:?}");
    if let Some(open) = server.open_transactions(&c).await {
        assert_eq!(open, 0, "transactions left open");
    }
    tiny.stop().await;
    normal.stop().await;
}

/// Holds the next write 500 ms on the server: the order's bucket push,
/// after the transaction's first command (the trader's `find`), so the
/// server knows the transaction when the deadline cuts it.
async fn hold_next_write(server: &FaultServer, c: &Client) {
    let held = doc! {
        "failCommands": ["insert", "update", "findAndModify", "bulkWrite"],
        "blockConnection": true,
        "blockTimeMS": 500,
    };
    server.fail(c, Some(1), held).await;
}

/// Views and likes from 8 concurrent clients, then a graceful stop: the
/// stored counts equal the requests made (the buffered counters held most
/// of them until the stop flushed).
#[tokio::test]
async fn shutdown_flushes_the_counters() {
    let (db, _) = fresh_db("service_shutdown").await;
    let app = app_on(&db).await;
    let s = start(app).await;
    let h = http();
    let (views, likes) = (240_i64, 37_i64);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (h, view, like) = (h.clone(), s.url("/products/p1"), s.url("/products/p1/like"));
            tokio::spawn(async move {
                for i in 0..views / 8 {
                    assert_eq!(get(&h, &view).await.0, 200);
                    if (i * 8 + t) < likes {
                        assert_eq!(post(&h, &like, json!({})).await.0, 200);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        bounded(60, t).await.unwrap();
    }
    s.stop().await;
    let stored = db
        .collection::<Document>("products")
        .find_one(doc! {"_id": "p1"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (num(&stored, "views"), num(&stored, "likes")),
        (Some(views), Some(likes)),
        "{stored}"
    );
    db.drop().await.unwrap();
}
