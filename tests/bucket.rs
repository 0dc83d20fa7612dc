//! The bucket pattern against a real MongoDB-wire server.

use std::collections::HashMap;
use std::future::IntoFuture;

use futures::{StreamExt, TryStreamExt};
use mongo_patterns::bucket::{PageRequest, MAX_PAGE_SIZE};
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use mongo_patterns::Error;
use mongo_patterns_testkit::{assert_small_futures, client, future_size, Commands, SMALL_FUTURE};

/// A fresh database ([`mongo_patterns_testkit::fresh_db`]). In CI's mongos
/// job (`MP_SHARD_PATTERN_COLLECTIONS=1`) this suite's bucket collections
/// are sharded on their keys through `ensure` first
/// ([`mongo_patterns_testkit::shard_declared`]).
async fn fresh_db(test: &str) -> (Database, Commands) {
    let (db, commands) = mongo_patterns_testkit::fresh_db(test).await;
    let declared = Trade::declared(&db).into_iter().chain(Dated::declared(&db));
    mongo_patterns_testkit::shard_declared(&db, &commands, declared).await;
    (db, commands)
}

const SIZE: usize = 100;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 100, key = "customerId", items = "trades")]
struct Trade {
    customer_id: i64,
    task: u32,
    seq: u32,
    ticker: String,
}

fn trade(customer_id: i64, task: u32, seq: u32) -> Trade {
    Trade {
        customer_id,
        task,
        seq,
        ticker: format!("T{}", seq % 7),
    }
}

/// Reads every bucket once (one pass over the collection) and checks each
/// key's buckets: within `size`, `count` equal to the array, `start` equal
/// to the items before. Returns each key's items in stored order.
async fn check_buckets(db: &Database) -> HashMap<i64, Vec<Document>> {
    let buckets: Vec<Document> = db
        .collection::<Document>("history")
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let num = |b: &Document, f: &str| {
        b.get(f)
            .and_then(|c| c.as_i64().or(c.as_i32().map(i64::from)))
            .unwrap()
    };
    let mut items: HashMap<i64, Vec<Document>> = HashMap::new();
    for b in &buckets {
        let key = b.get_i64("customerId").unwrap();
        let arr = b.get_array("trades").unwrap();
        let n = arr.len() as i64;
        let before = items.get(&key).map_or(0, Vec::len) as i64;
        if b.get_bool("mp_next").unwrap_or(false) {
            // Opened ahead: empty until the bucket before is full.
            assert_eq!(n, 0, "a bucket opened ahead is empty");
            continue;
        }
        assert!(n <= SIZE as i64, "bucket over size: {n}");
        assert_eq!(num(b, "count"), n, "count matches the array");
        assert_eq!(num(b, "start"), before, "start is the items before");
        items
            .entry(key)
            .or_default()
            .extend(arr.iter().map(|t| t.as_document().unwrap().clone()));
    }
    items
}

/// Trades ordered by date: pushes take the general path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "dated")]
#[bucket(size = 100, key = "customerId", order = "date")]
struct Dated {
    customer_id: i64,
    date: DateTime,
}

/// Every operation a store runs all the time (push, page, total, remove)
/// has a future that fits a small allocation (`SMALL_FUTURE`): a larger
/// one would cost the operation after it more than the generated code may
/// (see the client-cost tables in `benches/*-results.md`). The maintenance ones
/// (`push_many`, `reindex`, `update`), which hold their rewrites
/// inline, are held to four times that. Nothing is sent: the
/// futures are built, measured and dropped.
#[tokio::test]
async fn operation_futures_fit_a_small_allocation() {
    let client = Client::with_uri_str("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=1")
        .await
        .unwrap();
    let db = client.database("sizes");
    let (b, d) = (Trade::buckets(&db), Dated::buckets(&db));
    let (t, dt) = (
        trade(1, 0, 0),
        Dated {
            customer_id: 1,
            date: DateTime::now(),
        },
    );
    let items = [t.clone()];
    let sizes = vec![
        ("push", future_size(&*b.push(&t).into_future())),
        ("push, ordered", future_size(&*d.push(&dt).into_future())),
        (
            "page",
            future_size(
                &*b.page(&1_i64, PageRequest::page(2).page_size(10))
                    .into_future(),
            ),
        ),
        (
            "page, newest first",
            future_size(
                &*b.page(&1_i64, PageRequest::page(2).page_size(10).newest_first())
                    .into_future(),
            ),
        ),
        ("count", future_size(&*b.count(&1_i64).into_future())),
        (
            "delete",
            future_size(&*b.delete(&1_i64, doc! {"seq": 1}).into_future()),
        ),
    ];
    assert_small_futures(&sizes);
    let maintenance = [
        (
            "push_many",
            future_size(&*b.push_many(&items).into_future()),
        ),
        ("reindex", future_size(&*b.reindex(&1_i64).into_future())),
        (
            "update",
            future_size(&*b.replace(&1_i64, doc! {"seq": 1}, &t).into_future()),
        ),
    ];
    assert!(
        maintenance.iter().all(|(_, n)| *n <= 4 * SMALL_FUTURE),
        "{maintenance:?}"
    );
}

async fn all_pages(repo: &Buckets<Trade>, key: i64, per: u32, newest: bool) -> Vec<Trade> {
    let mut out = Vec::new();
    for page in 1.. {
        let mut req = PageRequest::page(page).page_size(per);
        if newest {
            req = req.newest_first();
        }
        let p = repo.page(&key, req).await.unwrap();
        assert!(p.items.len() <= per as usize);
        out.extend(p.items);
        if !p.has_more {
            break;
        }
        assert!(page < 1_000_000, "paging does not end");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_to_one_key_are_stored_once_in_order() {
    let (db, _) = fresh_db("bucket_one_key").await;
    let repo = Trade::buckets(&db);
    repo.ensure().await.unwrap();
    repo.ensure().await.unwrap(); // idempotent
    let tasks: Vec<_> = (0..16u32)
        .map(|t| {
            let repo = repo.clone();
            tokio::spawn(async move {
                for s in 0..5_000u32 {
                    repo.push(&trade(7, t, s)).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(repo.count(&7).await.unwrap(), 80_000);
    assert_eq!(check_buckets(&db).await[&7].len(), 80_000);
    let all: Vec<Trade> = repo.stream(&7).take(80_001).try_collect().await.unwrap();
    assert_eq!(all.len(), 80_000);
    // Each task's items once each, in the order the task pushed them.
    let mut next = HashMap::new();
    for t in &all {
        let n = next.entry(t.task).or_insert(0u32);
        assert_eq!(t.seq, *n, "task {} out of order", t.task);
        *n += 1;
    }
    assert!(next.values().all(|&n| n == 5_000));
    // Pages of several sizes, at sampled depths, match the stream.
    for per in [1u32, 37, 99, 100, 101, 200] {
        for page in [1u32, 2, 57, 400, 80_000 / per] {
            let p = repo
                .page(&7, PageRequest::page(page).page_size(per))
                .await
                .unwrap();
            let from = (page as usize - 1) * per as usize;
            let want = &all[from.min(all.len())..(from + per as usize).min(all.len())];
            assert_eq!(p.items, want, "page {page} of {per}");
            assert_eq!(p.has_more, from + (per as usize) < all.len());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_over_many_keys_page_exactly_with_any_page_size() {
    let (db, _) = fresh_db("bucket_many_keys").await;
    let repo = Trade::buckets(&db);
    repo.ensure().await.unwrap();
    let tasks: Vec<_> = (0..16u32)
        .map(|t| {
            let repo = repo.clone();
            tokio::spawn(async move {
                for s in 0..1_300u32 {
                    repo.push(&trade(i64::from(s % 100), t, s)).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Every item once, each task's items of a key in the order it pushed them.
    let stored = check_buckets(&db).await;
    assert_eq!(stored.len(), 100);
    let mut seen = std::collections::HashSet::new();
    for items in stored.values() {
        let mut last: HashMap<i64, i64> = HashMap::new();
        for t in items {
            let (task, seq) = (t.get_i64("task").unwrap(), t.get_i64("seq").unwrap());
            assert!(seen.insert((task, seq)), "({task}, {seq}) stored twice");
            assert!(
                last.insert(task, seq).is_none_or(|prev| prev < seq),
                "task {task} out of order"
            );
        }
    }
    assert_eq!(seen.len(), 16 * 1_300);
    // 1,300 pushes a task over 100 keys: 13 a key from each task.
    assert_eq!(stored[&3].len(), 16 * 13);
    assert_eq!(repo.count(&3).await.unwrap(), 16 * 13);
    let reference: Vec<Trade> = repo.stream(&3).try_collect().await.unwrap();
    assert_eq!(reference.len(), 16 * 13);
    for per in (1..=2 * SIZE as u32)
        .step_by(13)
        .chain([SIZE as u32, 2 * SIZE as u32])
    {
        assert_eq!(
            all_pages(&repo, 3, per, false).await,
            reference,
            "per_page {per}"
        );
    }
    let mut newest = reference.clone();
    newest.reverse();
    for per in [1, 25, 99, 100, 101, 200] {
        assert_eq!(
            all_pages(&repo, 3, per, true).await,
            newest,
            "newest first, per_page {per}"
        );
    }
}

#[tokio::test]
async fn push_many_fills_then_opens_buckets_in_few_round_trips() {
    let (db, commands) = fresh_db("bucket_push_many").await;
    let repo = Trade::buckets(&db);
    repo.push(&trade(1, 0, 0)).await.unwrap();
    let items: Vec<Trade> = (1..1_000).map(|s| trade(1, 0, s)).collect();
    commands.take();
    repo.push_many(&items).await.unwrap();
    let sent = commands.take();
    check_buckets(&db).await;
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["find", "update", "update", "insert"],
        "read the head, fill it, offer the next items to a bucket opened ahead (none here), \
         insert the rest"
    );
    check_buckets(&db).await;
    let all: Vec<u32> = repo
        .stream(&1)
        .map_ok(|t| t.seq)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all, (0..1_000).collect::<Vec<_>>());
    // Then single pushes go on after them.
    repo.push(&trade(1, 0, 1_000)).await.unwrap();
    assert_eq!(repo.count(&1).await.unwrap(), 1_001);
}

/// `push_many` reads each item's key, as `push` does: one batch of several
/// customers lands in each customer's own buckets, in the order given.
#[tokio::test]
async fn push_many_takes_each_items_key_from_the_item() {
    let (db, commands) = fresh_db("bucket_push_many_keys").await;
    let repo = Trade::buckets(&db);
    let mixed: Vec<Trade> = (0..30u32)
        .map(|s| trade(10 + i64::from(s % 3), 0, s))
        .collect();
    commands.take();
    repo.push_many(&mixed).await.unwrap();
    let sent = commands.take();
    check_buckets(&db).await;
    for key in 10..13 {
        let seqs: Vec<u32> = repo
            .stream(&key)
            .map_ok(|t| t.seq)
            .try_collect()
            .await
            .unwrap();
        let expected: Vec<u32> = (0..30u32)
            .filter(|s| 10 + i64::from(s % 3) == key)
            .collect();
        assert_eq!(seqs, expected, "key {key}");
    }
    // Keys go one after another, each in its few round trips.
    assert!(sent.len() <= 3 * 4, "{} commands: {sent:?}", sent.len());
    // An item that cannot be stored stops the call before anything is
    // written, whichever key it has.
    let before = repo.count(&10).await.unwrap();
    let bad = Trade {
        ticker: "x".repeat(17 * 1024 * 1024),
        ..trade(10, 0, 99)
    };
    let refused = repo.push_many(&[trade(10, 0, 98), bad]).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(repo.count(&10).await.unwrap(), before);
}

#[tokio::test]
async fn a_push_is_one_round_trip() {
    let (db, commands) = fresh_db("bucket_round_trips").await;
    let repo = Trade::buckets(&db);
    repo.ensure().await.unwrap();
    repo.push(&trade(1, 0, 0)).await.unwrap();
    commands.take();
    for s in 1..SIZE as u32 {
        repo.push(&trade(1, 0, s)).await.unwrap();
    }
    assert_eq!(
        commands.take_count(),
        SIZE - 1 + 1,
        "one update per push while the bucket has room (a findAndModify \
         at the key's first bucket's half), and there one insert that \
         opens the next bucket ahead"
    );
    repo.push(&trade(1, 0, SIZE as u32)).await.unwrap();
    assert_eq!(
        commands.take_count(),
        3,
        "a full bucket: the push lands in the bucket opened ahead, opens the \
         one after it, and reads the one before to check its start"
    );
    let page = repo
        .page(&1, PageRequest::page(1).page_size(100))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 100);
    assert_eq!(
        commands.take_count(),
        1,
        "an oldest-first page is one aggregation"
    );
    // A page across two buckets: the server sends the page and its look-ahead
    // item, nothing more.
    for s in SIZE as u32 + 1..2 * SIZE as u32 {
        repo.push(&trade(1, 0, s)).await.unwrap();
    }
    let pipeline = repo
        .page_pipeline(&1, PageRequest::page(2).page_size(60))
        .unwrap();
    let slices: Vec<Document> = db
        .collection::<Document>("history")
        .aggregate(pipeline)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(slices.len(), 2, "items 60..121 span two buckets");
    let sent: usize = slices
        .iter()
        .map(|b| b.get_array("trades").unwrap().len())
        .sum();
    assert_eq!(sent, 61);
    let page = repo
        .page(&1, PageRequest::page(2).page_size(60))
        .await
        .unwrap();
    assert_eq!(
        page.items.iter().map(|t| t.seq).collect::<Vec<_>>(),
        (60..120).collect::<Vec<_>>()
    );
    // A handle that has not seen the key goes straight to its newest bucket
    // (full here, so it opens the next).
    let fresh = Trade::buckets(&db);
    commands.take();
    fresh.push(&trade(1, 0, 2 * SIZE as u32)).await.unwrap();
    let names: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    // Into the bucket opened ahead, the opening of the next, then the read
    // that checks its start.
    assert_eq!(names, ["insert", "find", "findAndModify", "insert", "find"]);
    check_buckets(&db).await;
}

/// Every newest-first page of `key`, at several sizes and depths, against
/// `oldest` (the key's items, oldest first): each must equal its slice and
/// cost the commands `trips` allows.
async fn newest_pages_cost(
    repo: &Buckets<Trade>,
    commands: &Commands,
    key: i64,
    oldest: &[Trade],
    trips: impl Fn(usize, usize) -> &'static [&'static [&'static str]],
) -> usize {
    let mut second = 0;
    let newest: Vec<Trade> = oldest.iter().rev().cloned().collect();
    for per in [1u32, 7, 60, 100, 150] {
        let last = newest.len().div_ceil(per as usize) as u32;
        for page in [1, 2, last / 2 + 1, last, last + 1] {
            commands.take();
            let p = repo
                .page(&key, PageRequest::page(page).page_size(per).newest_first())
                .await
                .unwrap();
            let names: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
            let from = ((page - 1) * per) as usize;
            let to = (from + per as usize).min(newest.len());
            let want = &newest[from.min(newest.len())..to];
            assert_eq!(p.items, want, "page {page} of {per}");
            assert_eq!(p.has_more, from + (per as usize) < newest.len());
            // Positions counted from the oldest item, as buckets hold them.
            let (lo, hi) = (newest.len() - to, newest.len() - from.min(newest.len()));
            assert!(
                trips(lo, hi).contains(
                    &names
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .as_slice()
                ),
                "page {page} of {per}: {names:?}"
            );
            second += usize::from(names.len() == 2);
        }
    }
    second
}

#[tokio::test]
async fn a_newest_first_page_is_one_round_trip_at_any_depth() {
    let (db, commands) = fresh_db("bucket_newest_trips").await;
    let repo = Trade::buckets(&db);
    repo.ensure().await.unwrap();
    for s in 0..1_050u32 {
        repo.push(&trade(3, 0, s)).await.unwrap();
    }
    let oldest = all_pages(&repo, 3, 1_000, false).await;
    assert_eq!(oldest.len(), 1_050);
    // Full buckets: one aggregate at every depth, the oldest page too.
    let second = newest_pages_cost(&repo, &commands, 3, &oldest, |_, _| &[&["aggregate"]]).await;
    assert_eq!(second, 0);

    // A removal in bucket 9 (positions 900..1000) leaves it short: a page
    // in it or above it still costs one aggregate; one below it may be
    // read by position, a second aggregate, and is exact either way.
    let gone = repo
        .delete(&3, doc! {"seq": {"$gte": 950, "$lt": 960}})
        .await
        .unwrap();
    assert_eq!(gone, 10);
    let oldest = all_pages(&repo, 3, 1_000, false).await;
    assert_eq!(oldest.len(), 1_040);
    let second = newest_pages_cost(&repo, &commands, 3, &oldest, |lo, hi| {
        if lo >= 900 || hi == lo {
            &[&["aggregate"]]
        } else {
            &[&["aggregate"], &["aggregate", "aggregate"]]
        }
    })
    .await;
    assert!(second > 0, "no page was read by position");

    // A key without buckets: an empty page, from the same one command.
    commands.take();
    let p = repo
        .page(&4, PageRequest::page(1).page_size(10).newest_first())
        .await
        .unwrap();
    assert!(p.items.is_empty() && !p.has_more);
    assert_eq!(commands.take_count(), 1);
}

#[tokio::test]
async fn removal_leaves_no_gaps_and_pages_stay_exact() {
    let (db, _) = fresh_db("bucket_remove").await;
    let repo = Trade::buckets(&db);
    repo.ensure().await.unwrap();
    for s in 0..1_000u32 {
        repo.push(&trade(9, 0, s)).await.unwrap();
    }
    // Every seventh ticker, across all ten buckets.
    let removed = repo.delete(&9, doc! {"ticker": "T3"}).await.unwrap();
    check_buckets(&db).await;
    let want: Vec<u32> = (0..1_000).filter(|s| s % 7 != 3).collect();
    assert_eq!(removed, 1_000 - want.len() as u64, "items removed");
    assert_eq!(repo.count(&9).await.unwrap(), want.len() as u64);
    for per in [1, 30, 100, 150] {
        let got: Vec<u32> = all_pages(&repo, 9, per, false)
            .await
            .iter()
            .map(|t| t.seq)
            .collect();
        assert_eq!(got, want, "per_page {per}");
    }
    // New pushes go after the last item, never into a gap.
    for s in 1_000..1_010u32 {
        repo.push(&trade(9, 0, s)).await.unwrap();
    }
    let last = repo
        .page(&9, PageRequest::page(1).page_size(10).newest_first())
        .await
        .unwrap();
    assert_eq!(
        last.items.iter().map(|t| t.seq).collect::<Vec<_>>(),
        (1_000..1_010).rev().collect::<Vec<_>>()
    );
    check_buckets(&db).await;
    // A `$` string is compared as a value, not read as a field path.
    assert_eq!(
        repo.delete(&9, doc! {"ticker": "$ticker"}).await.unwrap(),
        0
    );
    assert_eq!(repo.count(&9).await.unwrap(), want.len() as u64 + 10);
    // Update in place keeps the position.
    let mut t = trade(9, 0, 501);
    t.ticker = "EDITED".into();
    assert!(repo.replace(&9, doc! {"seq": 501}, &t).await.unwrap());
    assert!(
        !repo.replace(&9, doc! {"seq": 500}, &t).await.unwrap(),
        "500 was removed"
    );
    let page = all_pages(&repo, 9, 1000, false).await;
    let at = page.iter().position(|x| x.seq == 501).unwrap();
    assert_eq!(page[at].ticker, "EDITED");
    assert_eq!(at, want.iter().position(|&s| s == 501).unwrap());
}

#[tokio::test]
async fn errors_are_typed() {
    let (db, commands) = fresh_db("bucket_errors").await;
    let repo = Trade::buckets(&db);
    commands.take();
    for req in [
        PageRequest::page(0).page_size(10),
        PageRequest::page(1).page_size(0),
        PageRequest::page(1).page_size(MAX_PAGE_SIZE + 1),
    ] {
        match repo.page(&1, req).await {
            Err(Error::InvalidArgument { .. }) => {}
            other => panic!("{req:?} gave {other:?}"),
        }
    }
    assert_eq!(commands.take_count(), 0, "refused before sending");
    // A page past the end is empty, not an error.
    let p = repo
        .page(&1, PageRequest::page(5).page_size(10))
        .await
        .unwrap();
    assert!(p.items.is_empty() && !p.has_more);
    // An item larger than any bucket can hold.
    let mut big = trade(1, 0, 0);
    big.ticker = "x".repeat(17 << 20);
    match repo.push(&big).await {
        Err(Error::DocumentTooLarge { bytes: Some(_), .. }) => {}
        other => panic!("{other:?}"),
    }
    // Items of 3 MB: buckets close by bytes, well before 100 items.
    big.ticker = "x".repeat(3 << 20);
    for s in 0..12 {
        big.seq = s;
        repo.push(&big).await.unwrap();
    }
    check_buckets(&db).await;
    let n = db
        .collection::<Document>("history")
        .count_documents(doc! {"customerId": 1_i64})
        .await
        .unwrap();
    assert!(n >= 3, "split into {n} buckets");
    let seqs: Vec<u32> = repo
        .stream(&1)
        .map_ok(|t| t.seq)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(seqs, (0..12).collect::<Vec<_>>());

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (c, _) = client(&format!(
        "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=300&directConnection=true"
    ))
    .await;
    let err = Trade::buckets(&c.database("x"))
        .push(&trade(1, 0, 0))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}
