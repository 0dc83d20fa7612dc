//! Retention on buckets with `order`: `delete_before` for a key and
//! `delete_all_before` for every key drop the history older than a cutoff,
//! in whole buckets where they can and trimming the boundary one, with
//! `count` and every page (both directions) exact afterwards and pushes
//! running beside them unharmed. The stored buckets are checked with the
//! raw driver.

use futures::TryStreamExt;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
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

/// The same, in arrival order: no retention by date.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals")]
#[bucket(size = 10, key = "customer")]
struct Arrival {
    customer: i64,
    n: i64,
}

const T0: i64 = 1_767_225_600_000;

/// Trade `n` of `customer`, `n` seconds after `T0`.
fn trade(customer: i64, n: i64) -> Trade {
    Trade {
        customer,
        at: DateTime::from_millis(T0 + n * 1000),
        n,
    }
}

fn at(n: i64) -> DateTime {
    DateTime::from_millis(T0 + n * 1000)
}

/// Every page of `key` of `size` items, oldest first and newest first,
/// as the `n`s they hold (the newest-first walk put back in order).
async fn pages(repo: &Buckets<Trade>, key: i64, size: u32) -> (Vec<i64>, Vec<i64>) {
    let mut oldest = Vec::new();
    let mut newest = Vec::new();
    for dir in [false, true] {
        for page in 1.. {
            let mut req = PageRequest::page(page).page_size(size);
            if dir {
                req = req.newest_first();
            }
            let p = repo.page(&key, req).await.unwrap();
            let ns = p.items.iter().map(|t| t.n);
            match dir {
                false => oldest.extend(ns),
                true => newest.extend(ns),
            }
            if !p.has_more {
                break;
            }
        }
    }
    newest.reverse();
    (oldest, newest)
}

/// The key's buckets as stored, in `_id` order: every `start` follows the
/// counts before it from 0, and no bucket but the last is empty.
async fn check_stored(db: &Database, key: i64) {
    let buckets: Vec<Document> = db
        .collection::<Document>("trades")
        .find(doc! {"customer": key})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut next = 0;
    for (i, b) in buckets.iter().enumerate() {
        let count = b.get_i64("count").or(b.get_i32("count").map(i64::from));
        let start = b.get_i64("start").or(b.get_i32("start").map(i64::from));
        let (count, start) = (count.unwrap(), start.unwrap());
        assert_eq!(start, next, "bucket {i} of key {key}: {b:?}");
        assert_eq!(b.get_array("items").unwrap().len() as i64, count, "{b:?}");
        assert!(
            count > 0 || i + 1 == buckets.len(),
            "an empty bucket left: {b:?}"
        );
        next += count;
    }
}

/// 95 trades of customer 1, 40 of customer 2; the first 33 of customer 1
/// go while 40 newer ones are pushed beside the removal. Customer 2 is
/// left whole.
#[tokio::test]
async fn delete_before_keeps_count_and_pages_exact() {
    let (db, _) = fresh_db("bucket_retention").await;
    let trades = Trade::buckets(&db);
    bounded(120, async {
        for n in 0..95 {
            trades.push(&trade(1, n)).await.unwrap();
        }
        for n in 0..40 {
            trades.push(&trade(2, n)).await.unwrap();
        }
        // Four pushers beside the removal, each with a handle of its own
        // (as other instances would be).
        let pushers: Vec<_> = (0..4)
            .map(|p| {
                let trades = Trade::buckets(&db);
                tokio::spawn(async move {
                    for n in (1000 + p * 10)..(1010 + p * 10) {
                        trades.push(&trade(1, n)).await.unwrap();
                    }
                })
            })
            .collect();
        let removed = trades.delete_before(&1, at(33)).await.unwrap();
        for p in pushers {
            p.await.unwrap();
        }
        assert_eq!(removed, 33);
        let want: Vec<i64> = (33..95).chain(1000..1040).collect();
        assert_eq!(trades.count(&1).await.unwrap(), want.len() as u64);
        for size in [1, 7, 10, 100] {
            let (oldest, newest) = pages(&trades, 1, size).await;
            assert_eq!(oldest, want, "oldest first, pages of {size}");
            assert_eq!(newest, want, "newest first, pages of {size}");
        }
        let streamed: Vec<i64> = trades
            .stream(&1)
            .map_ok(|t| t.n)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(streamed, want);
        check_stored(&db, 1).await;
        // Three whole buckets went; the boundary one was trimmed.
        let left = db
            .collection::<Document>("trades")
            .count_documents(doc! {"customer": 1, "items.at": {"$lt": at(33)}})
            .await
            .unwrap();
        assert_eq!(left, 0);
        assert_eq!(trades.count(&2).await.unwrap(), 40);
        let (two, _) = pages(&trades, 2, 10).await;
        assert_eq!(two, (0..40).collect::<Vec<_>>());
        // A late push older than the cutoff still lands in order.
        trades.push(&trade(1, 20)).await.unwrap();
        let (oldest, newest) = pages(&trades, 1, 7).await;
        let mut want = want;
        want.insert(0, 20);
        assert_eq!((oldest.clone(), newest), (want.clone(), want));
        check_stored(&db, 1).await;
    })
    .await;
}

/// Every key at once: three customers, one of them entirely older than the
/// cutoff; its next push opens its history again at position 0.
#[tokio::test]
async fn delete_all_before_every_key() {
    let (db, _) = fresh_db("bucket_retention_all").await;
    let trades = Trade::buckets(&db);
    bounded(120, async {
        for key in 1..=3 {
            for n in 0..25 {
                // Customer 3's trades are all before the cutoff.
                let n = if key == 3 { n - 100 } else { n };
                trades.push(&trade(key, n)).await.unwrap();
            }
        }
        let removed = trades.delete_all_before(at(12)).await.unwrap();
        assert_eq!(removed, 12 + 12 + 25);
        for key in 1..=2 {
            assert_eq!(trades.count(&key).await.unwrap(), 13);
            let (oldest, newest) = pages(&trades, key, 4).await;
            assert_eq!(oldest, (12..25).collect::<Vec<_>>());
            assert_eq!(newest, oldest);
            check_stored(&db, key).await;
        }
        assert_eq!(trades.count(&3).await.unwrap(), 0);
        check_stored(&db, 3).await;
        trades.push(&trade(3, 50)).await.unwrap();
        assert_eq!(trades.count(&3).await.unwrap(), 1);
        assert_eq!(pages(&trades, 3, 4).await.0, vec![50]);
        check_stored(&db, 3).await;
        // Nothing left before the cutoff: a second run removes nothing.
        assert_eq!(trades.delete_all_before(at(12)).await.unwrap(), 0);
    })
    .await;
}

/// Without `order` there is no date to cut by: a typed error, nothing
/// sent.
#[tokio::test]
async fn retention_needs_order() {
    let (db, commands) = fresh_db("bucket_retention_order").await;
    let arrivals = Arrival::buckets(&db);
    arrivals.push(&Arrival { customer: 1, n: 0 }).await.unwrap();
    commands.take();
    for e in [
        bounded(30, arrivals.delete_before(&1, at(0)))
            .await
            .unwrap_err(),
        bounded(30, arrivals.delete_all_before(at(0)))
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(e, Error::InvalidArgument { name: "order", .. }),
            "{e:?}"
        );
    }
    assert_eq!(commands.take_count(), 0);
}
