//! Adopting a flat collection (one document per item, written by the raw
//! driver as the application did before buckets) into the bucket layout:
//! `adopt_from` writes, on the server, the buckets `push_many` would have
//! written, leaves the source as it was, can run twice or be cut and run
//! again with the same result, refuses keys the repository has written
//! to since, and reports its progress. Checked with the raw driver and
//! against an oracle computed here from the flat data.

use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
use mongo_patterns::progress::Progress;
use mongo_patterns_testkit::{bounded, fresh_db};

/// A customer's trades, sorted by time across buckets of 10.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 10, key = "customer", order = "at")]
struct Trade {
    customer: i64,
    at: DateTime,
    n: i64,
}

/// The same, in arrival order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals")]
#[bucket(size = 10, key = "customer")]
struct Arrival {
    customer: i64,
    n: i64,
}

/// A model whose items have an `_id` of their own, which they keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "fills")]
#[bucket(size = 4, key = "desk")]
struct Fill {
    #[serde(rename = "_id")]
    id: i64,
    desk: String,
    qty: i64,
}

const T0: i64 = 1_767_225_600_000;

/// Items per customer: below `size`, exactly `size`, several buckets,
/// past twice `size`, and one bucket and one item.
const COUNTS: [(i64, i64); 5] = [(1, 7), (2, 10), (3, 25), (4, 37), (5, 11)];

/// Trade `n` of `customer`: its time repeats (ties) and goes back and
/// forth (inserted out of order).
fn trade(customer: i64, n: i64, of: i64) -> Trade {
    let slot = (n * 7 + customer) % (of / 2 + 1);
    Trade {
        customer,
        at: DateTime::from_millis(T0 + slot * 1000),
        n,
    }
}

/// Every trade of `COUNTS`, keys interleaved, each key's `n` rising: the
/// order the flat collection got them in (its `_id`s rise with it).
fn flat_trades() -> Vec<Trade> {
    let max = COUNTS.iter().map(|(_, c)| *c).max().unwrap();
    let mut all = Vec::new();
    for n in 0..max {
        for (k, c) in COUNTS {
            if n < c {
                all.push(trade(k, n, c));
            }
        }
    }
    all
}

/// The flat collection `name`, written by the raw driver.
async fn write_flat<S: Serialize>(db: &Database, name: &str, items: &[S]) {
    let docs: Vec<Document> = items
        .iter()
        .map(|t| mongo_patterns_testkit::bsonc::to_document(t).unwrap())
        .collect();
    db.collection::<Document>(name)
        .insert_many(docs)
        .await
        .unwrap();
}

/// The oracle: a key's trades sorted by time, equal times in arrival order.
fn oracle(all: &[Trade], key: i64) -> Vec<Trade> {
    let mut mine: Vec<Trade> = all.iter().filter(|t| t.customer == key).cloned().collect();
    mine.sort_by_key(|t| (t.at, t.n));
    mine
}

/// Every document of `coll`, in `_id` order.
async fn all_docs(db: &Database, coll: &str) -> Vec<Document> {
    db.collection::<Document>(coll)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// The same, without the write ids (`mp_ops`), which differ by writer.
async fn buckets_without_ops(db: &Database, coll: &str) -> Vec<Document> {
    let mut docs = all_docs(db, coll).await;
    for d in &mut docs {
        d.remove("mp_ops");
    }
    docs
}

/// Every page of `key` of `size` items, oldest first and newest first
/// (the newest-first walk put back in order).
async fn pages<T: mongo_patterns::bucket::Bucketed<Key = i64> + Clone>(
    repo: &Buckets<T>,
    key: i64,
    size: u32,
) -> (Vec<T>, Vec<T>) {
    let mut oldest = Vec::new();
    let mut newest = Vec::new();
    for dir in [false, true] {
        for page in 1.. {
            let mut req = PageRequest::page(page).page_size(size);
            if dir {
                req = req.newest_first();
            }
            let p = repo.page(&key, req).await.unwrap();
            match dir {
                false => oldest.extend(p.items.iter().cloned()),
                true => newest.extend(p.items.iter().cloned()),
            }
            if !p.has_more {
                break;
            }
        }
    }
    newest.reverse();
    (oldest, newest)
}

/// Count, every page in both directions (several page sizes) and the
/// stream of `key` equal `want`.
async fn check_reads<T>(repo: &Buckets<T>, key: i64, want: &[T])
where
    T: mongo_patterns::bucket::Bucketed<Key = i64> + Clone + PartialEq + std::fmt::Debug,
{
    assert_eq!(
        repo.count(&key).await.unwrap(),
        want.len() as u64,
        "key {key}"
    );
    for size in [1, 3, 10, 25] {
        let (oldest, newest) = pages(repo, key, size).await;
        assert_eq!(oldest, want, "key {key}, oldest first, pages of {size}");
        assert_eq!(newest, want, "key {key}, newest first, pages of {size}");
    }
    let streamed: Vec<T> = repo.stream(&key).try_collect().await.unwrap();
    assert_eq!(streamed, want, "key {key}, stream");
}

fn int(d: &Document, f: &str) -> i64 {
    match d.get(f) {
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Int32(v)) => i64::from(*v),
        other => panic!("`{f}` is {other:?} in {d:?}"),
    }
}

/// The stored buckets of the `trades` collection, read with the raw driver:
/// each key's `_id`s `{k, s: 0, 1, ..}`, `start`s following the counts,
/// at most `size` items each, every bucket but the last full and closed,
/// items in the oracle's order without the key, floors the previous
/// bucket's last time.
async fn check_shape(db: &Database, all: &[Trade]) {
    let buckets = all_docs(db, "trades").await;
    for (key, count) in COUNTS {
        let mine: Vec<&Document> = buckets
            .iter()
            .filter(|b| b.get_i64("customer").ok() == Some(key))
            .collect();
        let want = oracle(all, key);
        let nb = ((count + 9) / 10) as usize;
        assert_eq!(mine.len(), nb, "key {key}: {mine:?}");
        let mut items = Vec::new();
        for (s, b) in mine.iter().enumerate() {
            let s = s as i64;
            assert_eq!(b.get_document("_id").unwrap(), &doc! {"k": key, "s": s});
            assert_eq!(int(b, "start"), s * 10, "{b:?}");
            let arr = b.get_array("items").unwrap();
            assert_eq!(int(b, "count"), arr.len() as i64, "{b:?}");
            assert!(arr.len() <= 10, "{b:?}");
            let last = s as usize + 1 == nb;
            assert_eq!(b.get_bool("sealed").ok(), (!last).then_some(true), "{b:?}");
            if !last {
                assert_eq!(arr.len(), 10);
            }
            match s {
                0 => assert!(!b.contains_key("mp_floor"), "{b:?}"),
                _ => assert_eq!(
                    b.get_datetime("mp_floor").unwrap(),
                    &want[s as usize * 10 - 1].at,
                    "{b:?}"
                ),
            }
            let bytes: i64 = arr
                .iter()
                .map(|i| {
                    let d = i.as_document().unwrap();
                    assert!(
                        !d.contains_key("customer") && !d.contains_key("_id"),
                        "{d:?}"
                    );
                    mongo_patterns_testkit::bsonc::to_vec(d).unwrap().len() as i64 + 8
                })
                .sum();
            assert_eq!(int(b, "bytes"), bytes, "{b:?}");
            items.extend(arr.iter().map(|i| {
                let d = i.as_document().unwrap();
                (
                    d.get_datetime("at").unwrap().to_owned(),
                    d.get_i64("n").unwrap(),
                )
            }));
        }
        let want: Vec<(DateTime, i64)> = want.iter().map(|t| (t.at, t.n)).collect();
        assert_eq!(items, want, "key {key}");
    }
}

/// The flat trades adopted: the buckets' shape as stored, the same
/// documents as `push_many` writes, every read equal to the oracle, and
/// the source untouched.
#[tokio::test]
async fn adopts_flat_trades_into_buckets() {
    let (db, _) = fresh_db("bucket_adopt").await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let before = all_docs(&db, "trades_flat").await;
        let trades = Trade::buckets(&db);
        trades.ensure().await.unwrap();
        let copied = trades.adopt_from("trades_flat").await.unwrap();
        assert_eq!(copied, all.len() as u64);
        check_shape(&db, &all).await;
        for (key, _) in COUNTS {
            check_reads(&trades, key, &oracle(&all, key)).await;
        }
        // What `push_many` writes, given the same trades in arrival order.
        let pushed = Trade::buckets(&db).with_collection("trades_pushed");
        for (key, _) in COUNTS {
            let mine: Vec<Trade> = all.iter().filter(|t| t.customer == key).cloned().collect();
            pushed.push_many(&mine).await.unwrap();
        }
        assert_eq!(
            buckets_without_ops(&db, "trades").await,
            buckets_without_ops(&db, "trades_pushed").await
        );
        assert_eq!(all_docs(&db, "trades_flat").await, before, "source changed");
    })
    .await;
}

/// Run twice, each item is stored once; run again after the source lost
/// and gained items, the buckets follow it (no bucket left past the end).
#[tokio::test]
async fn adopting_twice_stores_each_item_once() {
    let (db, _) = fresh_db("bucket_adopt_twice").await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let trades = Trade::buckets(&db);
        trades.adopt_from("trades_flat").await.unwrap();
        let once = all_docs(&db, "trades").await;
        let again = trades
            .adopt_from("trades_flat")
            .batch_items(7)
            .await
            .unwrap();
        assert_eq!(again, all.len() as u64);
        assert_eq!(all_docs(&db, "trades").await, once);
        check_shape(&db, &all).await;
        // Key 4 loses 20 items and key 1 gains 5: adopted again, each
        // has its items, once.
        let flat = db.collection::<Document>("trades_flat");
        flat.delete_many(doc! {"customer": 4, "n": {"$gte": 17}})
            .await
            .unwrap();
        let more: Vec<Trade> = (100..105).map(|n| trade(1, n, 40)).collect();
        write_flat(&db, "trades_flat", &more).await;
        trades.adopt_from("trades_flat").await.unwrap();
        let now: Vec<Trade> = all
            .iter()
            .filter(|t| !(t.customer == 4 && t.n >= 17))
            .cloned()
            .chain(more)
            .collect();
        for key in [1, 4] {
            check_reads(&trades, key, &oracle(&now, key)).await;
        }
        assert_eq!(
            db.collection::<Document>("trades")
                .count_documents(doc! {"customer": 4})
                .await
                .unwrap(),
            2
        );
    })
    .await;
}

/// A call cut after its first batch (the future dropped), then run again,
/// leaves what an uncut run leaves.
#[tokio::test]
async fn a_cut_adoption_finishes_when_run_again() {
    let (db, _) = fresh_db("bucket_adopt_cut").await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let trades = Trade::buckets(&db);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let cut = trades
            .adopt_from("trades_flat")
            .batch_items(10)
            .on_progress(move |p| {
                let _ = tx.send(p);
            });
        tokio::select! {
            r = cut => panic!("finished before the cut: {r:?}"),
            p = rx.recv() => {
                let p = p.unwrap();
                assert!(p.done < p.of, "{p:?}");
            }
        }
        let partial = all_docs(&db, "trades").await;
        assert!(!partial.is_empty() && partial.len() < 11, "{partial:?}");
        trades
            .adopt_from("trades_flat")
            .batch_items(10)
            .await
            .unwrap();
        let uncut = Trade::buckets(&db).with_collection("trades_uncut");
        uncut.adopt_from("trades_flat").await.unwrap();
        assert_eq!(
            all_docs(&db, "trades").await,
            all_docs(&db, "trades_uncut").await
        );
        check_shape(&db, &all).await;
    })
    .await;
}

/// After adoption the repository takes over: pushes in order and late
/// ones land where they belong, and every read stays exact. Adopting
/// again refuses the key pushed to, naming it, and writes nothing of it;
/// `only_keys_of` adopts the others.
#[tokio::test]
async fn pushes_after_adoption_and_a_second_adoption_refused() {
    let (db, _) = fresh_db("bucket_adopt_push").await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let trades = Trade::buckets(&db);
        trades.adopt_from("trades_flat").await.unwrap();
        let mut now = all.clone();
        // Key 3 (25 items, a last bucket of 5): in order, past its last.
        let late_end = DateTime::from_millis(T0 + 100_000);
        for n in 200..210 {
            let t = Trade {
                customer: 3,
                at: DateTime::from_millis(T0 + 100_000 + n),
                n,
            };
            trades.push(&t).await.unwrap();
            now.push(t);
        }
        // Late: into its first bucket, and into the last but one.
        for (n, secs) in [(300, 0), (301, 9)] {
            let t = Trade {
                customer: 3,
                at: DateTime::from_millis(T0 + secs * 1000),
                n,
            };
            trades.push(&t).await.unwrap();
            now.push(t);
        }
        // Key 1 (7 items, one open bucket): one in order, one late.
        for (n, at) in [(400, late_end), (401, DateTime::from_millis(T0))] {
            let t = Trade { customer: 1, at, n };
            trades.push(&t).await.unwrap();
            now.push(t);
        }
        for (key, _) in COUNTS {
            check_reads(&trades, key, &oracle(&now, key)).await;
        }
        let before = all_docs(&db, "trades").await;
        let err = trades.adopt_from("trades_flat").await.unwrap_err();
        match &err {
            Error::AlreadyBucketed {
                collection, key, ..
            } => {
                assert_eq!(collection, "trades");
                assert_eq!(**key, Bson::Int64(1));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(all_docs(&db, "trades").await, before);
        // The keys not written to can still be adopted again.
        let copied = trades
            .adopt_from("trades_flat")
            .only_keys_of(doc! {"customer": {"$in": [2, 4]}})
            .await
            .unwrap();
        assert_eq!(copied, 10 + 37);
        assert_eq!(all_docs(&db, "trades").await, before);
    })
    .await;
}

/// Progress after each batch: `done` rises, `of` is the source's count,
/// and the last report has every item done.
#[tokio::test]
async fn progress_reports_each_batch() {
    let (db, _) = fresh_db("bucket_adopt_progress").await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
        let log = seen.clone();
        let copied = Trade::buckets(&db)
            .adopt_from("trades_flat")
            .batch_items(20)
            .on_progress(move |p| log.lock().unwrap().push(p))
            .await
            .unwrap();
        let seen = seen.lock().unwrap().clone();
        let total = all.len() as u64;
        assert_eq!(copied, total);
        assert!(seen.len() >= 4, "{seen:?}");
        for w in seen.windows(2) {
            assert!(w[0].done < w[1].done, "{seen:?}");
            assert!(w[0].elapsed <= w[1].elapsed, "{seen:?}");
        }
        assert!(seen.iter().all(|p| p.of == total), "{seen:?}");
        assert_eq!(seen.last().unwrap().done, total);
        assert!(seen.last().unwrap().rate() > 0.0);
    })
    .await;
}

/// Without `order`, items keep their arrival (`_id`) order, and the next
/// push appends after them.
#[tokio::test]
async fn adopts_in_arrival_order_without_order() {
    let (db, _) = fresh_db("bucket_adopt_arrivals").await;
    bounded(120, async {
        let all: Vec<Arrival> = (0..47)
            .map(|n| Arrival {
                customer: n % 2,
                n: (n * 31) % 47,
            })
            .collect();
        write_flat(&db, "arrivals_flat", &all).await;
        let arrivals = Arrival::buckets(&db);
        assert_eq!(arrivals.adopt_from("arrivals_flat").await.unwrap(), 47);
        let pushed = Arrival::buckets(&db).with_collection("arrivals_pushed");
        for key in 0..2 {
            let mine: Vec<Arrival> = all.iter().filter(|a| a.customer == key).cloned().collect();
            pushed.push_many(&mine).await.unwrap();
        }
        assert_eq!(
            buckets_without_ops(&db, "arrivals").await,
            buckets_without_ops(&db, "arrivals_pushed").await
        );
        for key in 0..2 {
            let mut want: Vec<Arrival> =
                all.iter().filter(|a| a.customer == key).cloned().collect();
            check_reads(&arrivals, key, &want).await;
            for n in 100..112 {
                let a = Arrival { customer: key, n };
                arrivals.push(&a).await.unwrap();
                want.push(a);
            }
            check_reads(&arrivals, key, &want).await;
        }
    })
    .await;
}

/// A model with an `_id` of its own keeps it in its items; a source
/// document that is not the model's item is refused before anything is
/// written.
#[tokio::test]
async fn items_keep_an_id_the_model_has() {
    let (db, _) = fresh_db("bucket_adopt_ids").await;
    bounded(120, async {
        let all: Vec<Fill> = (0..9)
            .map(|i| Fill {
                id: 100 - i,
                desk: "fx".to_owned(),
                qty: i,
            })
            .collect();
        write_flat(&db, "fills_flat", &all).await;
        let fills = Fill::buckets(&db);
        fills.adopt_from("fills_flat").await.unwrap();
        let stored = all_docs(&db, "fills").await;
        assert_eq!(stored.len(), 3);
        let first = stored[0].get_array("items").unwrap()[0]
            .as_document()
            .unwrap();
        assert_eq!(first, &doc! {"_id": 92_i64, "qty": 8_i64});
        let mut want = all.clone();
        want.sort_by_key(|f| f.id);
        let got: Vec<Fill> = fills.stream("fx").try_collect().await.unwrap();
        assert_eq!(got, want);

        db.collection::<Document>("junk")
            .insert_one(doc! {"desk": "eq", "qty": "many"})
            .await
            .unwrap();
        let err = Fill::buckets(&db)
            .with_collection("junk_buckets")
            .adopt_from("junk")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::UnexpectedDocument { .. }), "{err:?}");
        assert!(all_docs(&db, "junk_buckets").await.is_empty());
    })
    .await;
}

/// On a sharded bucket collection (hashed on its key, as `ensure`
/// shards it), every write of an adoption is one `mongos` targets: the
/// `$merge` matches on the document key (`_id` and the shard key; `on:
/// "_id"` alone is refused there), and the buckets a second run removes
/// are named by key. Judged by the test kit's routing checker.
#[tokio::test]
async fn adoption_targets_a_sharded_bucket_collection() {
    use mongo_patterns_testkit::routing::{Routing, ShardKey};
    let routing = Routing::new().key(Trade::COLLECTION, ShardKey::hashed(Trade::BUCKET.key));
    let (db, _) =
        mongo_patterns_testkit::fresh_db_with("bucket_adopt_sharded", Some(routing.clone())).await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let trades = Trade::buckets(&db);
        trades.adopt_from("trades_flat").await.unwrap();
        // Key 4 loses items: the second run removes its buckets past the end.
        db.collection::<Document>("trades_flat")
            .delete_many(doc! {"customer": 4, "n": {"$gte": 17}})
            .await
            .unwrap();
        trades
            .adopt_from("trades_flat")
            .batch_items(7)
            .await
            .unwrap();
        routing.assert_clean();
        // The `$merge`s (one a batch; no other write of an adoption is
        // targeted to one shard) were judged.
        let counts = routing.counts();
        assert!(counts.targeted_writes >= 2, "{counts:?}");
    })
    .await;
}

/// Two services adopt the same flat collection at once, each with a
/// client of its own, in batches of different sizes: the buckets are the
/// ones one adoption writes, each item stored once.
#[tokio::test]
async fn two_services_adopting_at_once_store_each_item_once() {
    use std::future::IntoFuture;
    let (db, _) = fresh_db("bucket_adopt_services").await;
    bounded(120, async {
        let all = flat_trades();
        write_flat(&db, "trades_flat", &all).await;
        let uri = mongo_patterns_testkit::server_uri();
        let (a, _) = mongo_patterns_testkit::client(&uri).await;
        let (b, _) = mongo_patterns_testkit::client(&uri).await;
        let (ta, tb) = (
            Trade::buckets(&a.database(db.name())),
            Trade::buckets(&b.database(db.name())),
        );
        let (ra, rb) = tokio::join!(
            ta.adopt_from("trades_flat").batch_items(7).into_future(),
            tb.adopt_from("trades_flat").batch_items(25).into_future()
        );
        assert_eq!(
            (ra.unwrap(), rb.unwrap()),
            (all.len() as u64, all.len() as u64)
        );
        check_shape(&db, &all).await;
        let trades = Trade::buckets(&db);
        for (key, _) in COUNTS {
            check_reads(&trades, key, &oracle(&all, key)).await;
        }
        let twice = all_docs(&db, "trades").await;
        Trade::buckets(&db)
            .with_collection("trades_once")
            .adopt_from("trades_flat")
            .await
            .unwrap();
        let once = all_docs(&db, "trades_once").await;
        assert_eq!(twice, once);
    })
    .await;
}
