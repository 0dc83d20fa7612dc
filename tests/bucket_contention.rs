//! Hot keys: many tasks pushing to one key with `order`, each item dated
//! when its push is called (the way an application records trades), on
//! their own and inside callers' transactions. Every item is checked to be
//! stored once, with the raw driver, and every page to be exact in `order`.
//! The round trips per push and the pushes per second are printed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, client, server_uri, with_pool};

/// Buckets of 100, as in the throughput benchmark.
const SIZE: i64 = 100;

/// A trade, dated when it is pushed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 100, key = "customerId", order = "date")]
struct Trade {
    customer_id: i64,
    task: u32,
    seq: u32,
    date: DateTime,
}

/// A client of its own (a connection per task) and a fresh database.
async fn fresh(test: &str, pool: u32) -> (Database, mongo_patterns_testkit::Commands) {
    let (c, commands) = client(&with_pool(&server_uri(), pool)).await;
    let name = format!("mp_{test}_{}", std::process::id());
    let db = c.database(&name);
    bounded(30, db.drop()).await.unwrap();
    (db, commands)
}

/// Every bucket of the key, checked: `count` the array's length and at
/// most twice `size`, `start` the items before, no mark or half-done split,
/// and the dates sorted across all buckets. Returns the items in stored
/// order as `(date, task, seq)`.
async fn sorted_buckets(db: &Database, key: i64) -> Vec<(i64, i64, i64)> {
    let buckets: Vec<Document> = bounded(60, async {
        db.collection::<Document>("trades")
            .find(doc! {"customerId": key})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let mut out: Vec<(i64, i64, i64)> = Vec::new();
    for b in &buckets {
        let id = b.get("_id").unwrap();
        let arr = b.get_array("items").unwrap();
        let int = |f: &str| match b.get(f) {
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Int32(n)) => i64::from(*n),
            other => panic!("bucket {id}: {f} {other:?}"),
        };
        assert_eq!(int("count"), arr.len() as i64, "bucket {id}: count");
        assert!(
            arr.len() as i64 <= 2 * SIZE,
            "bucket {id}: {} items",
            arr.len()
        );
        assert_eq!(int("start"), out.len() as i64, "bucket {id}: start");
        for t in arr {
            let t = t.as_document().unwrap();
            let task = t
                .get("task")
                .and_then(Bson::as_i64)
                .unwrap_or_else(|| i64::from(t.get_i32("task").unwrap()));
            let seq = t
                .get("seq")
                .and_then(Bson::as_i64)
                .unwrap_or_else(|| i64::from(t.get_i32("seq").unwrap()));
            out.push((
                t.get_datetime("date").unwrap().timestamp_millis(),
                task,
                seq,
            ));
        }
    }
    for w in out.windows(2) {
        assert!(w[0].0 <= w[1].0, "key {key}: {:?} before {:?}", w[0], w[1]);
    }
    out
}

/// Every item each task pushed (`pushed[t]` items, `0..pushed[t]`) stored
/// exactly once.
fn once_each(stored: &[(i64, i64, i64)], pushed: &HashMap<i64, u64>) {
    let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
    for (_, t, s) in stored {
        seen.entry(*t).or_default().push(*s);
    }
    let total: u64 = pushed.values().sum();
    assert_eq!(stored.len() as u64, total, "as many items as pushes");
    for (t, n) in pushed {
        let mut got = seen.remove(t).unwrap_or_default();
        got.sort();
        let want: Vec<i64> = (0..*n as i64).collect();
        assert_eq!(got, want, "task {t}: every push once");
    }
    assert!(seen.is_empty(), "items of no task: {seen:?}");
}

/// Pages of 100 and of a size that straddles buckets (7 for a short
/// history, 250 for a long one, to keep the reads bounded), both ways,
/// list the stored items exactly.
async fn pages_exact(repo: &Buckets<Trade>, key: i64, want: &[(i64, i64, i64)]) {
    let straddle = if want.len() <= 3_000 { 7 } else { 250 };
    for per in [100_u32, straddle] {
        for newest in [false, true] {
            let got = paged(repo, key, per, newest, |t| {
                (
                    t.date.timestamp_millis(),
                    i64::from(t.task),
                    i64::from(t.seq),
                )
            })
            .await;
            assert_eq!(got, want, "pages of {per}, newest first: {newest}");
        }
    }
}

/// Every page of `per` of `key`, oldest first (a newest-first walk is
/// turned around), as (date, task, seq); every page before the last full.
async fn paged<T: mongo_patterns::bucket::Bucketed<Key = i64>>(
    repo: &Buckets<T>,
    key: i64,
    per: u32,
    newest: bool,
    row: impl Fn(&T) -> (i64, i64, i64),
) -> Vec<(i64, i64, i64)> {
    let mut got = Vec::new();
    for page in 1.. {
        let mut req = PageRequest::page(page).page_size(per);
        if newest {
            req = req.newest_first();
        }
        let p = bounded(30, repo.page(&key, req)).await.unwrap();
        if p.has_more {
            assert_eq!(
                p.items.len(),
                per as usize,
                "a page before the last is full"
            );
        }
        got.extend(p.items.iter().map(&row));
        if !p.has_more {
            break;
        }
        assert!(page < 1_000_000, "paging does not end");
    }
    if newest {
        got.reverse();
    }
    got
}

async fn hot_dated(test: &str, tasks: u32, secs: f64) -> (f64, f64) {
    let (db, commands) = fresh(test, tasks.max(10)).await;
    let repo = Trade::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    const KEY: i64 = 7;
    let done = Arc::new(AtomicU64::new(0));
    // The key's first bucket, seen by the handle: what follows is steady
    // state.
    bounded(
        10,
        repo.push(&Trade {
            customer_id: KEY,
            task: tasks,
            seq: 0,
            date: DateTime::now(),
        }),
    )
    .await
    .unwrap();
    commands.take();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (repo, done) = (repo.clone(), done.clone());
            tokio::spawn(async move {
                let mut seq = 0;
                while Instant::now() < until {
                    let trade = Trade {
                        customer_id: KEY,
                        task: t,
                        seq,
                        date: DateTime::now(),
                    };
                    repo.push(&trade).await.unwrap();
                    seq += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                (t, seq)
            })
        })
        .collect();
    let mut pushed: HashMap<i64, u64> = bounded(secs as u64 + 120, async {
        let mut out = HashMap::new();
        for h in handles {
            let (t, n) = h.await.unwrap();
            out.insert(i64::from(t), u64::from(n));
        }
        out
    })
    .await;
    let took = start.elapsed().as_secs_f64();
    let sent = commands.take_count() as f64;
    let n = done.load(Ordering::Relaxed);
    pushed.insert(i64::from(tasks), 1);
    let stored = sorted_buckets(&db, KEY).await;
    once_each(&stored, &pushed);
    pages_exact(&repo, KEY, &stored).await;
    let per = sent / n as f64;
    let rate = n as f64 / took;
    println!(
        "{tasks} tasks, {n} pushes with `order` to one key in {took:.1} s: \
         {per:.3} round trips a push, {rate:.0} pushes/s"
    );
    bounded(30, db.drop()).await.unwrap();
    (per, rate)
}

/// 64 tasks on one key, dates taken at the call: racing pushes land
/// below the bucket another task has just opened. Nothing is lost or
/// doubled, pages stay exact, and the cost stays near one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_push_dated_at_the_call_to_one_key() {
    let (one_rt, one_rate) = hot_dated("contention_dated_1", 1, 3.0).await;
    let (rt, rate) = hot_dated("contention_dated_64", 64, 8.0).await;
    println!(
        "1 task: {one_rt:.3} round trips, {one_rate:.0}/s; 64 tasks: {rt:.3} round trips, \
         {rate:.0}/s ({:.2}x)",
        rate / one_rate
    );
    assert!(one_rt <= 1.05, "{one_rt:.3} round trips a quiet push");
    assert!(rt <= 1.5, "{rt:.3} round trips a push at 64 tasks");
}

/// A trade in buckets of 10: rollovers every few transactions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "small")]
#[bucket(size = 10, key = "customerId", order = "date")]
struct Small {
    customer_id: i64,
    task: u32,
    seq: u32,
    date: DateTime,
}

/// The README's trading example under concurrency: 16 tasks, each pushing
/// trades dated at the call, one per transaction of its own through
/// `and_run2`. Racing transactions make some pushes late; such a push
/// lands inside the transaction (or loses a race there, which `and_run2`
/// runs again), and every committed trade is stored once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_callers_transactions_push_dated_at_the_call() {
    let (db, commands) = fresh("contention_txn_16", 16).await;
    let repo = Small::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    // Collections are not created inside a transaction.
    bounded(30, db.create_collection("orders")).await.unwrap();
    const KEY: i64 = 9;
    const EACH: u32 = 25;
    let attempts = AtomicU64::new(0);
    let tasks: Vec<_> = (0..16_u32)
        .map(|t| {
            let (repo, attempts) = (&repo, &attempts);
            let client = db.client().clone();
            let orders = db.collection::<Document>("orders");
            async move {
                let mut s = client.start_session().await?;
                for seq in 0..EACH {
                    s.start_transaction()
                        .and_run2(async |s| {
                            attempts.fetch_add(1, Ordering::Relaxed);
                            let trade = Small {
                                customer_id: KEY,
                                task: t,
                                seq,
                                date: DateTime::now(),
                            };
                            // The application's work between taking the
                            // date and writing (a price check, say): other
                            // transactions commit trades dated later.
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            repo.push(&trade).session(&mut *s).await?;
                            // The order the trade fills, in the same
                            // transaction.
                            orders
                                .insert_one(doc! {"task": t, "seq": seq, "date": trade.date})
                                .session(s)
                                .await?;
                            Ok(())
                        })
                        .await?;
                }
                Ok::<_, mongo_patterns::mongodb::error::Error>(())
            }
        })
        .collect();
    // Concurrent on the server, polled on this task (an `and_run2` closure
    // that borrows is not `Send` for `tokio::spawn`).
    for r in bounded(120, futures::future::join_all(tasks)).await {
        r.unwrap();
    }
    // Late pushes placed inside the transactions: into the last bucket
    // (an update allowed up to twice `size`), or into the one before with
    // the last one's `start` moved (`$inc`).
    let (mut in_last, mut before_last) = (0, 0);
    for (name, c) in commands.take() {
        let Ok(u) = c.get_array("updates") else {
            continue;
        };
        let Some(Bson::Document(u)) = u.first() else {
            continue;
        };
        if name != "update" {
            continue;
        }
        let shifts = u
            .get_document("u")
            .ok()
            .and_then(|u| u.get_document("$inc").ok())
            .is_some_and(|inc| inc.contains_key("start"));
        let lte = u
            .get_document("q")
            .ok()
            .and_then(|q| q.get_document("count").ok())
            .and_then(|c| c.get("$lte"))
            .and_then(|n| n.as_i64().or(n.as_i32().map(i64::from)));
        if shifts {
            before_last += 1;
        } else if lte == Some(19) {
            in_last += 1;
        }
    }
    let buckets: Vec<Document> = bounded(30, async {
        db.collection::<Document>("small")
            .find(doc! {"customerId": KEY})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let mut stored: Vec<(i64, i64, i64)> = Vec::new();
    for b in &buckets {
        let arr = b.get_array("items").unwrap();
        let num = |f: &str| {
            b.get(f)
                .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
        };
        assert_eq!(num("count"), Some(arr.len() as i64), "count: {b}");
        assert!(arr.len() <= 20, "at most twice size: {b}");
        assert_eq!(num("start"), Some(stored.len() as i64), "start: {b}");
        for t in arr {
            let t = t.as_document().unwrap();
            let int = |f: &str| {
                t.get(f)
                    .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
                    .unwrap()
            };
            stored.push((
                t.get_datetime("date").unwrap().timestamp_millis(),
                int("task"),
                int("seq"),
            ));
        }
    }
    for w in stored.windows(2) {
        assert!(w[0].0 <= w[1].0, "{:?} before {:?}", w[0], w[1]);
    }
    let pushed: HashMap<i64, u64> = (0..16).map(|t| (t, u64::from(EACH))).collect();
    once_each(&stored, &pushed);
    for newest in [false, true] {
        let got = paged(&repo, KEY, 7, newest, |t| {
            (
                t.date.timestamp_millis(),
                i64::from(t.task),
                i64::from(t.seq),
            )
        })
        .await;
        assert_eq!(got, stored, "pages of 7, newest first: {newest}");
    }
    println!(
        "16 tasks, {} transactions committed in {} attempts, {} buckets; late pushes \
         placed in them: {in_last} into the last bucket, {before_last} into the one before",
        16 * EACH,
        attempts.load(Ordering::Relaxed),
        buckets.len()
    );
    bounded(30, db.drop()).await.unwrap();
}

fn small(day: i64, seq: u32) -> Small {
    Small {
        customer_id: 5,
        task: 0,
        seq,
        date: DateTime::from_millis(day * 86_400_000),
    }
}

/// Every bucket of key 5 in `small`, checked as above; the items' days.
async fn small_days(db: &Database) -> Vec<i64> {
    let buckets: Vec<Document> = bounded(30, async {
        db.collection::<Document>("small")
            .find(doc! {"customerId": 5_i64})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let mut days = Vec::new();
    for b in &buckets {
        let arr = b.get_array("items").unwrap();
        let num = |f: &str| {
            b.get(f)
                .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
        };
        assert_eq!(num("count"), Some(arr.len() as i64), "count: {b}");
        assert_eq!(num("start"), Some(days.len() as i64), "start: {b}");
        for t in arr {
            let d = t.as_document().unwrap().get_datetime("date").unwrap();
            days.push(d.timestamp_millis() / 86_400_000);
        }
    }
    days
}

/// Pages of 3 both ways, and the total, give `want`.
async fn small_pages(repo: &Buckets<Small>, want: &[i64]) {
    for newest in [false, true] {
        let mut got = Vec::new();
        for page in 1.. {
            let mut req = PageRequest::page(page).page_size(3);
            if newest {
                req = req.newest_first();
            }
            let p = bounded(30, repo.page(&5, req)).await.unwrap();
            got.extend(
                p.items
                    .iter()
                    .map(|t| t.date.timestamp_millis() / 86_400_000),
            );
            if !p.has_more {
                break;
            }
            assert!(page < 1000);
        }
        if newest {
            got.reverse();
        }
        assert_eq!(got, want, "pages, newest first: {newest}");
    }
    assert_eq!(
        bounded(10, repo.count(&5)).await.unwrap(),
        want.len() as u64
    );
}

/// Late items near the end, outside and inside a caller's transaction:
/// below a full last bucket, between the bucket just closed and the one
/// just opened (its floor), and below the bucket just opened. The first
/// two land in one update, the last in one transaction (of the push's own,
/// or the caller's: an abort leaves nothing, a commit everything), and
/// nothing but the buckets is ever written.
#[tokio::test]
async fn late_items_near_the_end_land_in_one_write_or_one_transaction() {
    let (db, commands) = fresh("contention_near", 10).await;
    let repo = Small::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    // Bucket 0: days 0, 2, …, 18 (full).
    for i in 0..10 {
        bounded(10, repo.push(&small(2 * i, 0))).await.unwrap();
    }
    commands.take();
    // Below the full last bucket's last item: into it, one update.
    bounded(10, repo.push(&small(7, 0))).await.unwrap();
    let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    println!("below a full last bucket: {sent:?}");
    assert!(sent.len() <= 3, "{sent:?}");
    // Day 30 opens bucket 1, its floor 18. Day 25: above the floor, below
    // the bucket's first item: into bucket 1.
    bounded(10, repo.push(&small(30, 0))).await.unwrap();
    commands.take();
    bounded(10, repo.push(&small(25, 0))).await.unwrap();
    let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    println!("between the floor and the first item: {sent:?}");
    assert_eq!(sent, ["update"], "one update");
    // Day 9: below bucket 1's floor, into bucket 0 with bucket 1's
    // `start` moved, in a transaction of the push's own.
    bounded(10, repo.push(&small(9, 0))).await.unwrap();
    let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    println!("below the floor of the last bucket: {sent:?}");
    assert_eq!(
        sent,
        [
            "update",
            "find",
            "find",
            "update",
            "update",
            "commitTransaction"
        ],
        "the update that missed, the last bucket; in a transaction: the last two, the insert, \
         the `start` after it, the commit"
    );
    let mut want = vec![0, 2, 4, 6, 7, 8, 9, 10, 12, 14, 16, 18, 25, 30];
    assert_eq!(small_days(&db).await, want);
    small_pages(&repo, &want).await;

    // Inside a caller's transaction: aborted, nothing stays.
    let client = db.client().clone();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    bounded(10, repo.push(&small(11, 1)).session(&mut s))
        .await
        .unwrap();
    bounded(10, repo.push(&small(26, 1)).session(&mut s))
        .await
        .unwrap();
    bounded(10, s.abort_transaction()).await.unwrap();
    assert_eq!(small_days(&db).await, want);
    // Committed, both stay: day 11 in bucket 0 (and bucket 1's `start`
    // moved), day 26 in bucket 1.
    s.start_transaction().await.unwrap();
    bounded(10, repo.push(&small(11, 2)).session(&mut s))
        .await
        .unwrap();
    bounded(10, repo.push(&small(26, 2)).session(&mut s))
        .await
        .unwrap();
    bounded(10, s.commit_transaction()).await.unwrap();
    want = vec![0, 2, 4, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 25, 26, 30];
    assert_eq!(small_days(&db).await, want);
    small_pages(&repo, &want).await;
    // `ensure`'s registry of validator parts aside.
    let mut names = bounded(10, db.list_collection_names()).await.unwrap();
    names.retain(|n| n != mongo_patterns::ensure::VALIDATOR_REGISTRY);
    assert_eq!(names, ["small"], "nothing but the buckets written");
    bounded(30, db.drop()).await.unwrap();
}

/// The same trade kept in arrival order (no `order`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "arrivals")]
#[bucket(size = 100, key = "customerId")]
struct Arrival {
    customer_id: i64,
    task: u32,
    seq: u32,
    date: DateTime,
}

/// 64 tasks push without `order` to one key the repository has not seen,
/// for 5 s: every item stored once, each task's in the order it pushed,
/// positions exact, and at most 1.05 round trips a push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_push_in_arrival_order_to_a_new_key() {
    let (db, commands) = fresh("contention_arrival_64", 64).await;
    let repo = Arrival::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    commands.take();
    const KEY: i64 = 3;
    let start = Instant::now();
    let until = start + Duration::from_secs(5);
    let handles: Vec<_> = (0..64_u32)
        .map(|t| {
            let repo = repo.clone();
            tokio::spawn(async move {
                let mut seq = 0;
                while Instant::now() < until {
                    let a = Arrival {
                        customer_id: KEY,
                        task: t,
                        seq,
                        date: DateTime::now(),
                    };
                    repo.push(&a).await.unwrap();
                    seq += 1;
                }
                (t, seq)
            })
        })
        .collect();
    let pushed: HashMap<i64, u64> = bounded(120, async {
        let mut out = HashMap::new();
        for h in handles {
            let (t, n) = h.await.unwrap();
            out.insert(i64::from(t), u64::from(n));
        }
        out
    })
    .await;
    let took = start.elapsed().as_secs_f64();
    let sent = commands.take_count() as f64;
    let n: u64 = pushed.values().sum();
    let buckets: Vec<Document> = bounded(60, async {
        db.collection::<Document>("arrivals")
            .find(doc! {"customerId": KEY})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let mut stored: Vec<(i64, i64, i64)> = Vec::new();
    let mut next: HashMap<i64, i64> = HashMap::new();
    for b in &buckets {
        let arr = b.get_array("items").unwrap();
        let num = |f: &str| {
            b.get(f)
                .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
        };
        assert_eq!(num("count"), Some(arr.len() as i64), "count: {b}");
        assert!(arr.len() as i64 <= SIZE, "over size: {b}");
        if b.get_bool("mp_next").unwrap_or(false) {
            assert!(arr.is_empty(), "opened ahead, and not empty: {b}");
            continue;
        }
        assert_eq!(num("start"), Some(stored.len() as i64), "start: {b}");
        for a in arr {
            let a = a.as_document().unwrap();
            let int = |f: &str| {
                a.get(f)
                    .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
                    .unwrap()
            };
            let (t, s) = (int("task"), int("seq"));
            let want = next.entry(t).or_insert(0);
            assert_eq!(s, *want, "task {t}: in the order it pushed");
            *want += 1;
            stored.push((0, t, s));
        }
    }
    once_each(&stored, &pushed);
    assert_eq!(bounded(30, repo.count(&KEY)).await.unwrap(), n);
    let per = sent / n as f64;
    println!(
        "64 tasks, {n} pushes without `order` to a new key in {took:.1} s: {per:.3} round trips \
         a push, {:.0} pushes/s",
        n as f64 / took
    );
    assert!(per <= 1.05, "{per:.3} round trips a push at 64 tasks");
    bounded(30, db.drop()).await.unwrap();
}

/// Clones on other collections (tenants) or with other options queue
/// apart: 16 tasks pushing to the same key through two tenants' handles,
/// and a third with a write concern of its own, store each item in its
/// own tenant's collection, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_options_queue_apart() {
    let (db, commands) = fresh("contention_tenants", 16).await;
    let repo = Arrival::buckets(&db);
    let a = repo.clone().with_collection("tenant_a");
    let b = repo.clone().with_collection("tenant_b");
    let majority = repo.clone().with_options(
        mongo_patterns::action::Options::new()
            .write_concern(mongo_patterns::mongodb::options::WriteConcern::majority()),
    );
    bounded(30, a.ensure()).await.unwrap();
    bounded(30, b.ensure()).await.unwrap();
    bounded(30, repo.ensure()).await.unwrap();
    commands.take();
    let tasks: Vec<_> = (0..24_u32)
        .map(|t| {
            let r = match t % 3 {
                0 => a.clone(),
                1 => b.clone(),
                _ => majority.clone(),
            };
            tokio::spawn(async move {
                for seq in 0..30 {
                    let item = Arrival {
                        customer_id: 1,
                        task: t,
                        seq,
                        date: DateTime::now(),
                    };
                    r.push(&item).await.unwrap();
                }
            })
        })
        .collect();
    bounded(120, async {
        for h in tasks {
            h.await.unwrap();
        }
    })
    .await;
    for (coll, rest) in [("tenant_a", 0), ("tenant_b", 1), ("arrivals", 2)] {
        let docs: Vec<Document> = bounded(30, async {
            db.collection::<Document>(coll)
                .find(doc! {})
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap()
        })
        .await;
        let mut stored = Vec::new();
        for b in &docs {
            for i in b.get_array("items").unwrap() {
                let i = i.as_document().unwrap();
                let int = |f: &str| {
                    i.get(f)
                        .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
                        .unwrap()
                };
                stored.push((0, int("task"), int("seq")));
            }
        }
        let pushed: HashMap<i64, u64> =
            (0..24).filter(|t| t % 3 == rest).map(|t| (t, 30)).collect();
        once_each(&stored, &pushed);
    }
    // The third handle's writes (the only ones to `arrivals`) carry its
    // write concern.
    let sent = commands.take();
    let writes: Vec<&Document> = sent
        .iter()
        .filter(|(n, c)| {
            matches!(n.as_str(), "update" | "findAndModify" | "insert" | "delete")
                && c.get_str(n.as_str()).ok() == Some("arrivals")
        })
        .map(|(_, c)| c)
        .collect();
    assert!(!writes.is_empty());
    for c in writes {
        assert_eq!(
            c.get_document("writeConcern").ok(),
            Some(&doc! {"w": "majority"}),
            "{c}"
        );
    }
    bounded(30, db.drop()).await.unwrap();
}
