//! Faults for approximate counters, against real servers: futures cut at
//! every point, servers paused, killed and restarted in place, a counter
//! field another client damaged, arguments that used to panic, and 16 tasks
//! on one key. Every invariant is checked with the raw driver.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use mongo_patterns::approx_counter::{Counter, CounterSpec, Mode};
use mongo_patterns::bson::spec::ElementType;
use mongo_patterns::bson::Bson;
use mongo_patterns::prelude::*;
use mongo_patterns::{Error, Found};
use mongo_patterns_testkit::{client, OwnServer, ServerOptions};

/// Buffered, no timed flush within a test.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "buffered")]
struct Buffered {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 100, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    views: i64,
}

/// Sampled, one in 10.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "sampled")]
struct Sampled {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 10, upsert = true)]
    views: i64,
}

/// Geometric, N = 10.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "geometric")]
struct Geometric {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 10, mode = "geometric", upsert = true)]
    views: i64,
}

/// Every model's declarations: the fault suites set their validators at
/// `strict` (`testkit::strict_validators`), so that nothing these faults
/// make the repositories write, retry or repair may break the pattern's
/// invariants.
fn declared(db: &Database) -> Vec<mongo_patterns::ensure::Declared> {
    [
        Buffered::declared(db),
        Sampled::declared(db),
        Geometric::declared(db),
    ]
    .concat()
}

/// A fresh database with [`declared`]'s validators at `strict`. A test
/// that stores a broken document on purpose takes the test kit's own
/// `fresh_db`.
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    mongo_patterns_testkit::fresh_db_strict(test, declared).await
}

const BOUND: Duration = Duration::from_secs(60);

/// `f` within [`BOUND`], or the test fails.
async fn bounded<F: std::future::IntoFuture>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took over {BOUND:?}"))
}

/// [`stored`] once two reads 200 ms apart agree (at most 10 s).
async fn settled(db: &Database, coll: &str, id: i64) -> i64 {
    let mut last = stored(db, coll, id).await;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = stored(db, coll, id).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("{coll} {id} still moving after 10 s: {last}");
}

async fn stored(db: &Database, coll: &str, id: i64) -> i64 {
    let d = db
        .collection::<Document>(coll)
        .find_one(doc! {"_id": id})
        .await
        .unwrap();
    match d.as_ref().and_then(|d| d.get("views")) {
        None => 0,
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(other) => panic!("views holds {other:?}"),
    }
}

/// A deterministic stream for cut points (SplitMix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// A TCP proxy in front of a server that can lose replies: while `lose`
/// is set, a connection that gets a reply from the server (which has then
/// applied the request) is closed before the reply reaches the client.
/// The client sees a lost connection for a write that was applied.
struct Proxy {
    addr: std::net::SocketAddr,
    lose: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    async fn start(server_uri: &str) -> Proxy {
        let target = server_uri
            .trim_start_matches("mongodb://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lose = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = lose.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let flag = flag.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    });
                    let mut buf = vec![0_u8; 64 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if flag.load(std::sync::atomic::Ordering::SeqCst) {
                            break; // the reply is lost, and the connection
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    up.abort();
                });
            }
        });
        Proxy { addr, lose }
    }

    fn uri(&self) -> String {
        format!(
            "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=1000",
            self.addr
        )
    }

    fn lose_replies(&self, on: bool) {
        self.lose.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

fn spec(mode: Mode, every: u32) -> CounterSpec {
    CounterSpec {
        field: "views",
        every,
        mode,
        max_delay_ms: 3_600_000,
        max_keys: 100,
        upsert: true,
    }
}

/// A buffered `incr` cut by a timeout while its write hangs (the server is
/// down) leaves every increment pending, and a later flush writes them all.
#[tokio::test]
async fn cancelled_buffered_incr_keeps_its_increments() {
    let server = OwnServer::start(ServerOptions {
        sync_on_commit: true,
        ..ServerOptions::default()
    });
    let (c, _) = client(server.uri()).await;
    let db = c.database("cancel");
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    let views = Buffered::views_counter(&db);
    views.incr_by(&1, 99).await.unwrap();
    server.kill();
    // The 100th increment fills the buffer: its write waits for a server.
    let cut = tokio::time::timeout(Duration::from_secs(2), views.incr(&1)).await;
    assert!(cut.is_err(), "the write hung and was cut: {cut:?}");
    assert_eq!(views.stats().pending, 100, "the cut write left its count");
    server.restart();
    bounded("flush", views.flush()).await.unwrap();
    assert_eq!(views.stats().pending, 0);
    assert_eq!(stored(&db, "buffered", 1).await, 100);
}

/// A flush the server applied but whose reply was lost (the connection
/// dropped after the write, so its outcome was unknown to the client), then
/// the server killed and restarted in place: the same handle re-sends the
/// write with its flush id and the server refuses the repeat. Applied once.
#[tokio::test]
async fn crash_unknown_outcome_is_applied_once() {
    let server = OwnServer::start(ServerOptions {
        sync_on_commit: true,
        ..ServerOptions::default()
    });
    let proxy = Proxy::start(server.uri()).await;
    let (c, _) = client(&proxy.uri()).await;
    let db = c.database("unknown");
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    let (raw, _) = client(server.uri()).await;
    let raw = raw.database("unknown");
    let views = Buffered::views_counter(&db);
    views.incr_by(&1, 31).await.unwrap();
    views.incr_by(&2, 5).await.unwrap();
    views.flush().await.unwrap();
    assert_eq!(stored(&raw, "buffered", 2).await, 5);
    views.incr_by(&1, 31).await.unwrap();
    proxy.lose_replies(true);
    let err = bounded("flush", views.flush()).await.unwrap_err();
    proxy.lose_replies(false);
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(
        stored(&raw, "buffered", 1).await,
        62,
        "the server applied it"
    );
    assert_eq!(
        views.stats().pending,
        31,
        "its outcome is unknown: still pending"
    );
    server.kill();
    server.restart();
    assert_eq!(stored(&raw, "buffered", 1).await, 62, "and kept it");
    // The same handle resumes: the unknown write is sent again and refused.
    views.incr_by(&1, 7).await.unwrap();
    bounded("flush", views.flush()).await.unwrap();
    assert_eq!(views.stats().pending, 0);
    assert_eq!(
        stored(&raw, "buffered", 1).await,
        69,
        "31 + 31 + 7, once each"
    );
    assert_eq!(stored(&raw, "buffered", 2).await, 5);
}

/// Arguments that used to panic: an amount that overflows what is pending,
/// and `every = 0`. Both are `InvalidArgument`, refused before the buffer.
#[tokio::test]
async fn overflowing_amounts_and_zero_every_are_invalid_arguments() {
    let (db, _) = fresh_db("counter_args").await;
    let views = Buffered::views_counter(&db);
    views.incr_by(&1, 50).await.unwrap();
    for n in [u64::MAX, i64::MAX as u64 + 1, i64::MAX as u64 - 10] {
        let err = views.incr_by(&1, n).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { name: "n", .. }),
            "{err:?}"
        );
    }
    assert_eq!(
        views.stats().pending,
        50,
        "nothing refused entered the buffer"
    );
    views.flush().await.unwrap();
    assert_eq!(stored(&db, "buffered", 1).await, 50);
    for n in [u64::MAX, i64::MAX as u64 + 1] {
        let err = Sampled::views_counter(&db)
            .incr_by(&1, n)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        let err = Geometric::views_counter(&db)
            .incr_by(&1, n)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    }
    for mode in [Mode::Sampled, Mode::Buffered, Mode::Geometric] {
        for every in [0, 1_000_001, u32::MAX] {
            let bad = Counter::<Geometric>::new(&db, spec(mode, every));
            for _ in 0..20 {
                let err = bad.incr(&1).await.unwrap_err();
                assert!(
                    matches!(err, Error::InvalidArgument { name: "every", .. }),
                    "{err:?}"
                );
            }
            let err = bad.incr_by(&1, 1_000).await.unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
            assert!(bad.flush().await.is_err() && bad.shutdown().await.is_err());
            assert!(bad.estimate(&1).await.is_err());
        }
    }
    assert_eq!(
        stored(&db, "geometric", 1).await,
        0,
        "no invalid counter wrote"
    );
    let err = Counter::<Geometric>::try_new(&db, spec(Mode::Buffered, 0)).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { name: "every", .. }),
        "{err:?}"
    );
    let mut bad_field = spec(Mode::Buffered, 10);
    bad_field.field = "a.b";
    let err = Counter::<Geometric>::try_new(&db, bad_field).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { name: "field", .. }),
        "{err:?}"
    );
    assert!(Counter::<Geometric>::try_new(&db, spec(Mode::Buffered, 10)).is_ok());
}

/// The flush marker a buffered counter adds to a document stays bounded:
/// 40 handles writing one document leave the last 16, and the count exact.
#[tokio::test]
async fn flush_marker_is_bounded() {
    let (db, _) = fresh_db("counter_marker").await;
    let raw = db.collection::<Document>("buffered");
    raw.insert_one(doc! {"_id": 1_i64, "views": 0_i64, "name": "p"})
        .await
        .unwrap();
    let before =
        mongo_patterns_testkit::bsonc::to_vec(&raw.find_one(doc! {}).await.unwrap().unwrap())
            .unwrap()
            .len();
    for _ in 0..40 {
        let views = Buffered::views_counter(&db);
        views.incr_by(&1, 60).await.unwrap();
        views.incr_by(&1, 60).await.unwrap(); // 120: one write
        views.incr_by(&1, 5).await.unwrap();
        views.shutdown().await.unwrap(); // and a second
    }
    let d = raw.find_one(doc! {}).await.unwrap().unwrap();
    assert_eq!(d.get_i64("views").unwrap(), 40 * 125);
    assert_eq!(d.get_str("name").unwrap(), "p", "other fields untouched");
    let marks = d
        .get_array(mongo_patterns::approx_counter::FLUSHES)
        .unwrap();
    assert_eq!(marks.len(), 16);
    let after = mongo_patterns_testkit::bsonc::to_vec(&d).unwrap().len();
    assert!(
        after - before <= 520,
        "the marker costs {} bytes",
        after - before
    );
    println!(
        "marker: {} bytes for {} handles",
        after - before,
        marks.len()
    );
}

/// A counter field another client set to a string: the write is
/// `UnsupportedValue` naming the `_id` as BSON, with that key's pending
/// count dropped and reported; other keys flush, later flushes succeed.
#[tokio::test]
async fn damaged_field_is_unsupported_value_for_that_key_only() {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("counter_damaged").await;
    for coll in ["buffered", "sampled", "geometric"] {
        db.collection::<Document>(coll)
            .insert_many([
                doc! {"_id": 1_i64, "views": "many"},
                doc! {"_id": 2_i64, "views": 0},
            ])
            .await
            .unwrap();
    }
    let views = Buffered::views_counter(&db);
    views.incr_by(&1, 7).await.unwrap();
    views.incr_by(&2, 5).await.unwrap();
    let err = views.flush().await.unwrap_err();
    match &err {
        Error::UnsupportedValue {
            id,
            field,
            found,
            dropped,
            ..
        } => {
            assert_eq!(**id, Bson::Int64(1));
            assert_eq!(field, "views");
            assert_eq!(*found, Found::Type(ElementType::String));
            assert_eq!(*dropped, Some(7));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        stored(&db, "buffered", 2).await,
        5,
        "the other key was written"
    );
    assert_eq!(
        views.stats().pending,
        0,
        "the damaged key's count was dropped"
    );
    views.flush().await.unwrap();
    views.incr_by(&2, 3).await.unwrap();
    views.shutdown().await.unwrap();
    assert_eq!(stored(&db, "buffered", 2).await, 8);
    let raw = db.collection::<Document>("buffered");
    let one = raw.find_one(doc! {"_id": 1_i64}).await.unwrap().unwrap();
    assert_eq!(
        one.get_str("views").unwrap(),
        "many",
        "nothing written on it"
    );
    // A write of at least N goes straight through: refused the same way.
    let err = views.incr_by(&1, 250).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedValue {
                dropped: Some(250),
                ..
            }
        ),
        "{err:?}"
    );

    let sampled = Sampled::views_counter(&db);
    let err = sampled.incr_by(&1, 10).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::UnsupportedValue {
                id,
                dropped: Some(10),
                ..
            } if **id == Bson::Int64(1)
        ),
        "{err:?}"
    );
    sampled.incr_by(&2, 10).await.unwrap();
    assert_eq!(stored(&db, "sampled", 2).await, 10);
    let geometric = Geometric::views_counter(&db);
    let err = geometric.incr_by(&1, 10).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::UnsupportedValue {
                id,
                dropped: Some(10),
                ..
            } if **id == Bson::Int64(1)
        ),
        "{err:?}"
    );
    geometric.incr_by(&2, 10).await.unwrap();
    assert_eq!(stored(&db, "geometric", 2).await, 10);
    let err = geometric.estimate(&1).await.unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedValue { dropped: None, .. }),
        "{err:?}"
    );
}

/// Buffered: calls cut at random points (before, during and after their
/// write) in every write path — `incr`, `incr_by` (below and above N),
/// `flush`, `shutdown` and the writes through after it. Every increment a
/// call took is stored exactly once after a final uncut flush.
#[tokio::test]
async fn cancellation_loop_buffered_loses_and_doubles_nothing() {
    let (db, _) = fresh_db("counter_cancel_loop").await;
    let views = Buffered::views_counter(&db);
    // Cut points spread over three times a write's median time (writes
    // of key 9, not in the loop; the first opens the connection), so that
    // calls are cut before, during and after their write however loaded
    // the machine is.
    let mut times = Vec::new();
    for _ in 0..8 {
        let t = Instant::now();
        views.incr_by(&9, 100).await.unwrap();
        times.push(t.elapsed().as_micros() as u64);
    }
    times[1..].sort_unstable();
    let mut span = 3 * times[4];
    let (mut recent, mut spans) = (0, Vec::new());
    let mut rng = Rng(7);
    let mut truth = [0_i64; 4];
    let mut cuts = 0;
    let t = Instant::now();
    for round in 0..1_200_u32 {
        if round == 900 {
            // Shutdown cut too, then increments written through, cut.
            for _ in 0..20 {
                let d = Duration::from_micros(rng.below(span));
                cuts += usize::from(tokio::time::timeout(d, views.shutdown()).await.is_err());
            }
        }
        let key = rng.below(4) as i64;
        let d = Duration::from_micros(rng.below(span));
        let r = match rng.below(4) {
            0 => {
                truth[key as usize] += 1;
                tokio::time::timeout(d, views.incr(&key)).await
            }
            1 => {
                let n = 1 + rng.below(60);
                truth[key as usize] += n as i64;
                tokio::time::timeout(d, views.incr_by(&key, n)).await
            }
            2 => {
                let n = 100 + rng.below(200);
                truth[key as usize] += n as i64;
                tokio::time::timeout(d, views.incr_by(&key, n)).await
            }
            _ => tokio::time::timeout(d, views.flush()).await,
        };
        match r {
            Ok(r) => r.unwrap(),
            Err(_) => {
                cuts += 1;
                recent += 1;
            }
        }
        // The load on the machine changes: keep about half the calls cut.
        if round % 50 == 49 {
            spans.push(span);
            if recent < 15 {
                span = (span / 2).max(200);
            } else if recent > 35 {
                span += span / 2;
            }
            recent = 0;
        }
    }
    bounded("shutdown", views.shutdown()).await.unwrap();
    assert_eq!(views.stats().pending, 0);
    assert!(cuts > 200, "only {cuts} calls were cut");
    for key in 0..4 {
        assert_eq!(
            stored(&db, "buffered", key).await,
            truth[key as usize],
            "key {key} ({cuts} cuts)"
        );
    }
    assert_eq!(stored(&db, "buffered", 9).await, 800);
    assert_eq!(
        views.stats().increments as i64,
        truth.iter().sum::<i64>() + 800
    );
    println!(
        "{cuts} of 1,220 calls cut at 0 to {:?} µs, in {:?}",
        (spans.iter().min(), spans.iter().max()),
        t.elapsed()
    );
}

/// Sampled and geometric: a cut call's write may or may not have landed
/// (its outcome is unknown), but nothing is applied twice and nothing
/// breaks: the stored value lies between what acknowledged writes and what
/// acknowledged plus cut writes added.
#[tokio::test]
async fn cancellation_loop_sampled_and_geometric() {
    let (db, _) = fresh_db("counter_cancel_sampled").await;
    let sampled = Sampled::views_counter(&db).seeded(1);
    let geometric = Geometric::views_counter(&db).seeded(2);
    let mut rng = Rng(9);
    let mut cut = [0_u64; 2];
    let (mut span, mut recent) = (3_000, 0);
    for round in 0..3_000_u32 {
        if round == 2_000 {
            sampled.shutdown().await.unwrap();
            geometric.shutdown().await.unwrap();
        }
        // Keep a fifth to a half of the calls cut, whatever the load.
        if round % 100 == 99 {
            if recent < 20 {
                span = (span / 2).max(200);
            } else if recent > 50 {
                span += span / 2;
            }
            recent = 0;
        }
        let d = Duration::from_micros(rng.below(span));
        // `incr`, and `incr_by` of N (written at once).
        let n = [1, 10][rng.below(2) as usize];
        let (i, r) = if rng.below(2) == 0 {
            (0, tokio::time::timeout(d, sampled.incr_by(&1, n)).await)
        } else {
            (1, tokio::time::timeout(d, geometric.incr_by(&1, n)).await)
        };
        match r {
            Ok(r) => r.unwrap(),
            Err(_) => {
                cut[i] += 1;
                recent += 1;
            }
        }
    }
    assert!(cut[0] > 100 && cut[1] > 100, "cut {cut:?}");
    let acked = sampled.stats().writes;
    // A cut call's command may still be running on the server (the
    // driver sent it; dropping the call does not recall it): read once
    // the stored value has stopped moving.
    let s = settled(&db, "sampled", 1).await as u64;
    // Each write adds 1 to 10.
    assert!(
        s >= acked && s <= 10 * (acked + cut[0]),
        "{s} from {acked} acked, {} cut",
        cut[0]
    );
    let g = stored(&db, "geometric", 1).await as u64;
    assert!(g >= geometric.stats().writes, "{g}");
    // Both resume uncut.
    sampled.incr(&1).await.unwrap();
    geometric.incr(&1).await.unwrap();
    assert_eq!(stored(&db, "sampled", 1).await as u64, s + 1);
    println!("cut {cut:?}");
}

/// 16 tasks on one key in each mode: bounded in time, exact when buffered
/// (after shutdown), within 4σ of the documented error otherwise.
#[tokio::test]
async fn contention_16_tasks_on_one_counter_key() {
    let (db, _) = fresh_db("counter_contention").await;
    const PER_TASK: u64 = 6_000;
    let total = 16 * PER_TASK;
    let t = Instant::now();
    let buffered = Buffered::views_counter(&db);
    let sampled = Sampled::views_counter(&db).seeded(3);
    let geometric = Geometric::views_counter(&db).seeded(4);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (b, s, g) = (buffered.clone(), sampled.clone(), geometric.clone());
            tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    b.incr(&7).await.unwrap();
                    s.incr(&7).await.unwrap();
                    g.incr(&7).await.unwrap();
                }
            })
        })
        .collect();
    bounded("16 tasks", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    bounded("shutdown", buffered.shutdown()).await.unwrap();
    let elapsed = t.elapsed();
    assert_eq!(stored(&db, "buffered", 7).await, total as i64);
    assert!(
        buffered.stats().writes <= total / 100 + 16,
        "{:?}",
        buffered.stats()
    );
    for (name, got, c) in [
        (
            "sampled",
            stored(&db, "sampled", 7).await,
            sampled.relative_error(total),
        ),
        (
            "geometric",
            stored(&db, "geometric", 7).await,
            geometric.relative_error(total),
        ),
    ] {
        let err = (got as f64 - total as f64).abs() / total as f64;
        assert!(
            err <= 4.0 * c,
            "{name}: {got} of {total}, relative error {err} > 4 × {c}"
        );
    }
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");
    println!(
        "contention: {elapsed:?}, {:?} {:?} {:?}",
        buffered.stats(),
        sampled.stats(),
        geometric.stats()
    );
}

/// 64 tasks on one buffered key (N = 100): the key never holds more than
/// N − 1 acknowledged increments plus one for each call under way (163),
/// so no flush write carries more and a crash could lose no more (before,
/// increments piled up behind the write in flight: one write carried
/// 126,000 of 128,000); exact after shutdown, with the rule's minimum of
/// writes.
#[tokio::test]
async fn contention_64_tasks_no_write_carries_more_than_n() {
    let (db, commands) = fresh_db("counter_hot_key").await;
    const PER_TASK: u64 = 2_000;
    let total = 64 * PER_TASK;
    let views = Buffered::views_counter(&db);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Samples what the process holds while the tasks count.
    let watcher = {
        let (views, done) = (views.clone(), done.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(views.stats().pending);
                tokio::task::yield_now().await;
            }
            most
        })
    };
    let t = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let v = views.clone();
            tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    v.incr(&7).await.unwrap();
                }
            })
        })
        .collect();
    bounded("64 tasks", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    let elapsed = t.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most_held = watcher.await.unwrap();
    bounded("shutdown", views.shutdown()).await.unwrap();
    assert_eq!(stored(&db, "buffered", 7).await, total as i64);
    let amounts: Vec<i64> = commands
        .take()
        .into_iter()
        .filter(|(name, c)| name == "update" && c.get_str("update").ok() == Some("buffered"))
        .map(|(_, c)| {
            let u = c.get_array("updates").unwrap()[0].as_document().unwrap();
            let stage = u.get_array("u").unwrap()[0].as_document().unwrap();
            let add = stage
                .get_document("$set")
                .and_then(|s| s.get_document("views"))
                .and_then(|v| v.get_array("$add"))
                .unwrap();
            add[1].as_i64().or(add[1].as_i32().map(i64::from)).unwrap()
        })
        .collect();
    let largest = amounts.iter().copied().max().unwrap();
    println!(
        "64 tasks × {PER_TASK}: {elapsed:?}, {:.0} increments/s, {} writes, largest {largest}, most held {most_held}",
        total as f64 / elapsed.as_secs_f64(),
        amounts.len()
    );
    assert!(largest <= 99 + 64, "a write carried {largest} increments");
    assert!(most_held <= 99 + 64, "the process held {most_held}");
    assert_eq!(amounts.iter().sum::<i64>(), total as i64, "sent once each");
    assert!(
        amounts.len() as u64 <= total / 100 + 1,
        "{} writes for {total}",
        amounts.len()
    );
}

/// The server killed (`kill -9`) and restarted in place while 8 tasks count
/// on 5 keys in every mode: no panic, the same handles resume, and the
/// buffered counts are exact per key after a final shutdown.
#[tokio::test]
async fn crash_server_killed_and_restarted_mid_run() {
    let server = OwnServer::start(ServerOptions {
        sync_on_commit: true,
        ..ServerOptions::default()
    });
    // Calls made while the server is down fail fast (unknown outcomes).
    let (c, _) = client(&format!("{}&serverSelectionTimeoutMS=300", server.uri())).await;
    let db = c.database("restart");
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    let buffered = Buffered::views_counter(&db);
    let sampled = Sampled::views_counter(&db);
    let geometric = Geometric::views_counter(&db);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..8_i64)
        .map(|t| {
            let (b, s, g, stop) = (
                buffered.clone(),
                sampled.clone(),
                geometric.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut counted = [0_i64; 5];
                let mut errors = 0_u64;
                let mut i = t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = i % 5;
                    i += 1;
                    counted[key as usize] += 3;
                    // An error leaves the buffered increments pending.
                    if b.incr_by(&key, 3).await.is_err() {
                        errors += 1;
                    }
                    let _ = s.incr(&key).await;
                    let _ = g.incr(&key).await;
                }
                (counted, errors)
            })
        })
        .collect();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(700)).await;
        server.restart();
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut truth = [0_i64; 5];
    let mut errors = 0;
    for t in tasks {
        let (counted, e) = bounded("a task", t).await.unwrap();
        errors += e;
        for k in 0..5 {
            truth[k] += counted[k];
        }
    }
    assert!(errors > 0, "no buffered call met the dead server");
    bounded("shutdown", buffered.shutdown()).await.unwrap();
    let (raw, _) = client(server.uri()).await;
    let raw = raw.database("restart");
    for key in 0..5 {
        assert_eq!(
            stored(&raw, "buffered", key).await,
            truth[key as usize],
            "key {key}"
        );
        assert_eq!(stored(&raw, "sampled", key).await % 10, 0);
    }
    // The same handles resume.
    sampled.incr_by(&0, 10).await.unwrap();
    geometric.incr_by(&0, 10).await.unwrap();
    println!(
        "truth {truth:?}, {errors} buffered errors, {:?}",
        buffered.stats()
    );
}

/// A call's future polled once (its write under way) and then kept without
/// being polled holds its key: `flush` waits for it 30 s at most, then is
/// `Contended` with the key still pending; dropped, the key flushes exactly.
#[tokio::test]
async fn contention_a_parked_write_holds_flush_30_s_at_most() {
    let (db, _) = fresh_db("counter_parked").await;
    let views = Buffered::views_counter(&db);
    views.incr_by(&1, 99).await.unwrap();
    views.incr_by(&2, 5).await.unwrap();
    let mut parked = Box::pin(views.incr(&1).into_future());
    assert!(
        futures::poll!(parked.as_mut()).is_pending(),
        "its write is under way"
    );
    let t = Instant::now();
    let err = bounded("flush", views.flush()).await.unwrap_err();
    let waited = t.elapsed();
    assert!(
        matches!(
            err,
            Error::Contended {
                operation: "flush",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        waited >= Duration::from_secs(29) && waited < Duration::from_secs(45),
        "{waited:?}"
    );
    assert_eq!(
        stored(&db, "buffered", 2).await,
        5,
        "other keys were written"
    );
    assert_eq!(views.stats().pending, 100);
    drop(parked);
    bounded("flush", views.flush()).await.unwrap();
    assert_eq!(views.stats().pending, 0);
    assert_eq!(stored(&db, "buffered", 1).await, 100);
}
