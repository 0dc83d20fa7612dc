//! A bucket model's `size` raised with data already stored: the buckets
//! written under the old size keep working. Pushes go on (late ones into
//! the old buckets too), `count` and every page (both directions, every
//! page size) stay exact against an oracle, a delete moves the positions
//! right, and the stored buckets hold contiguous positions (read with the
//! raw driver). `size` lowered below what stored buckets hold, or `order`
//! declared over buckets filled in arrival order: `plan` finds them, reads
//! refuse the former as `Damaged`, and `rebucket_all` (or `rebucket` of a
//! key) writes the keys again under the new declaration, with pushes
//! going on meanwhile; every page is then exact against the oracle.

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, fresh_db, stored_conflicts};

/// The declaration the data was written under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 10, key = "customer", order = "at")]
struct Before {
    customer: i64,
    at: i64,
    n: i64,
}

/// The same collection after `size` went up to 25.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 25, key = "customer", order = "at")]
struct Larger {
    customer: i64,
    at: i64,
    n: i64,
}

/// The same collection after `size` went down to 4 (with `order`, a
/// bucket holds at most twice that: a bucket of 10 is over it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 4, key = "customer", order = "at")]
struct Smaller {
    customer: i64,
    at: i64,
    n: i64,
}

/// Filled in arrival order...
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 5, key = "customer")]
struct Arrived {
    customer: i64,
    at: i64,
    n: i64,
}

/// ... then `order` declared over them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 5, key = "customer", order = "at")]
struct InOrder {
    customer: i64,
    at: i64,
    n: i64,
}

macro_rules! check_pages {
    ($repo:expr, $key:expr, $want:expr) => {{
        let want: &Vec<i64> = $want;
        assert_eq!($repo.count(&$key).await.unwrap(), want.len() as u64);
        for size in [1_u32, 3, 7, 100] {
            for newest in [false, true] {
                let mut got = Vec::new();
                for page in 1.. {
                    let mut req = PageRequest::page(page).page_size(size);
                    if newest {
                        req = req.newest_first();
                    }
                    let p = $repo.page(&$key, req).await.unwrap();
                    got.extend(p.items.iter().map(|t| t.n));
                    if !p.has_more {
                        break;
                    }
                }
                if newest {
                    got.reverse();
                }
                assert_eq!(&got, want, "pages of {size}, newest first: {newest}");
            }
        }
    }};
}

/// The buckets of `key` as stored, in `_id` order.
async fn buckets_of(db: &Database, key: i64) -> Vec<Document> {
    db.collection::<Document>("trades")
        .find(doc! {"customer": key})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Positions as stored: each bucket's `start` follows the counts before
/// it, and `count` is its items' length.
async fn contiguous(db: &Database, key: i64) {
    let buckets = buckets_of(db, key).await;
    let mut next = 0;
    for b in &buckets {
        let int = |f: &str| b.get_i64(f).or(b.get_i32(f).map(i64::from)).unwrap();
        assert_eq!(int("start"), next, "{b:?}");
        assert_eq!(b.get_array("items").unwrap().len() as i64, int("count"));
        next += int("count");
    }
}

#[tokio::test]
async fn size_raised_on_stored_buckets() {
    let (db, _) = fresh_db("bucket_size_change").await;
    bounded(120, async {
        let before = Before::buckets(&db);
        for n in 0..37 {
            before
                .push(&Before {
                    customer: 1,
                    at: n * 10,
                    n,
                })
                .await
                .unwrap();
        }
        let mut want: Vec<i64> = (0..37).collect();

        // Late items, into the old buckets.
        for n in [100, 101, 102] {
            let at = (n - 100) * 10 + 5;
            before.push(&Before { customer: 1, at, n }).await.unwrap();
        }
        want.splice(1..1, [100]);
        want.splice(3..3, [101]);
        want.splice(5..5, [102]);
        check_pages!(before, 1_i64, &want);
        contiguous(&db, 1).await;

        // Up to 25: buckets of 10 (and split ones) under it.
        let larger = Larger::buckets(&db);
        for n in 50..80 {
            larger
                .push(&Larger {
                    customer: 1,
                    at: n * 10,
                    n,
                })
                .await
                .unwrap();
            want.push(n);
        }
        check_pages!(larger, 1_i64, &want);
        let removed = larger
            .delete(&1_i64, doc! {"n": {"$lt": 10}})
            .await
            .unwrap();
        assert_eq!(removed, 10);
        want.retain(|&n| n >= 10);
        check_pages!(larger, 1_i64, &want);
        contiguous(&db, 1).await;
    })
    .await;
}

/// How many stored documents each `Conflict::Stored` of `plan` counts.
fn stored(plan: &mongo_patterns::ensure::Plan) -> Vec<u64> {
    let found = stored_conflicts(&plan.conflicts);
    found.into_iter().map(|(_, count, _)| count).collect()
}

/// `size` lowered from 10 to 4 over stored buckets: reads refuse them as
/// `Damaged`, `plan` counts them; `rebucket_all` (progress reported)
/// writes every such key again while another task pushes to one of them,
/// and afterwards every page is exact, positions are contiguous as the
/// raw driver reads them, no bucket is over the new limit, pushes (late
/// ones too) go on, and a second call moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_lowered_then_rebucketed() {
    let (db, _) = fresh_db("bucket_size_lowered").await;
    bounded(120, async {
        let before = Before::buckets(&db);
        let mut want: std::collections::BTreeMap<i64, Vec<(i64, i64)>> = Default::default();
        for customer in 1..=3_i64 {
            let items = if customer == 3 { 6 } else { 33 };
            for n in 0..items {
                // Every fourth arrives late, below the bucket just opened.
                let at = if n % 4 == 3 { n * 10 - 25 } else { n * 10 };
                before.push(&Before { customer, at, n }).await.unwrap();
                want.entry(customer).or_default().push((at, n));
            }
        }
        let smaller = Smaller::buckets(&db);
        let e = smaller
            .page(&1_i64, PageRequest::page(1))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Damaged { .. }), "{e:?}");
        let found = stored(&Smaller::plan(&db).await.unwrap());
        assert!(found.iter().sum::<u64>() > 0, "{found:?}");

        // A push to key 1 from another task while the keys move: it waits
        // for, or conflicts with, the key's transaction, and is kept.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pushing = {
            let (smaller, done) = (smaller.clone(), done.clone());
            tokio::spawn(async move {
                let (mut pushed, mut refused, mut after) = (Vec::new(), 0, 0);
                for n in 1000.. {
                    if done.load(std::sync::atomic::Ordering::SeqCst) {
                        after += 1;
                        if after > 5 {
                            break;
                        }
                    }
                    let at = 5_000 + n;
                    match smaller.push(&Smaller { customer: 1, at, n }).await {
                        Ok(()) => pushed.push((at, n)),
                        // Before its key moved, the open bucket was over
                        // the new limit.
                        Err(Error::Damaged { .. }) => refused += 1,
                        Err(e) => panic!("{e:?}"),
                    }
                }
                (pushed, refused)
            })
        };
        let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = heard.clone();
        let moved = smaller
            .rebucket_all()
            .on_progress(move |p| h.lock().unwrap().push((p.done, p.of)))
            .await
            .unwrap();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let (pushed, refused) = pushing.await.unwrap();
        eprintln!(
            "pushes during the move: {} kept, {refused} refused",
            pushed.len()
        );
        assert!(pushed.len() >= 5, "{pushed:?}");
        assert!(moved.items >= 66 && moved.too_large.is_empty(), "{moved:?}");
        let heard = heard.lock().unwrap().clone();
        assert_eq!(
            heard.last().map(|p| p.0),
            heard.last().map(|p| p.1),
            "{heard:?}"
        );
        assert!(heard.last().is_some_and(|p| p.0 >= 2), "{heard:?}");
        want.get_mut(&1).unwrap().extend(pushed);

        for (customer, items) in want.iter_mut() {
            // Late pushes after the move, into the new buckets.
            let n = 2000 + customer;
            smaller
                .push(&Smaller {
                    customer: *customer,
                    at: 1,
                    n,
                })
                .await
                .unwrap();
            items.push((1, n));
            items.sort();
            let ns: Vec<i64> = items.iter().map(|(_, n)| *n).collect();
            check_pages!(smaller, *customer, &ns);
            contiguous(&db, *customer).await;
        }
        let over = db
            .collection::<Document>("trades")
            .count_documents(doc! {"count": {"$gt": 8}})
            .await
            .unwrap();
        assert_eq!(over, 0);
        assert!(stored(&Smaller::plan(&db).await.unwrap()).is_empty());
        assert_eq!(smaller.rebucket_all().await.unwrap().keys, 0);
    })
    .await;
}

/// `order` declared over buckets filled in arrival order: pages read them
/// as stored until `rebucket` of the key sorts them across its buckets.
#[tokio::test]
async fn order_declared_then_rebucketed() {
    let (db, _) = fresh_db("bucket_order_declared").await;
    bounded(60, async {
        let arrived = Arrived::buckets(&db);
        let mut want = Vec::new();
        for n in 0..23_i64 {
            let at = (n * 7919) % 101;
            arrived.push(&Arrived { customer: 9, at, n }).await.unwrap();
            want.push((at, n));
        }
        assert!(!stored(&InOrder::plan(&db).await.unwrap()).is_empty());
        let in_order = InOrder::buckets(&db);
        assert_eq!(in_order.rebucket(&9_i64).await.unwrap(), 23);
        want.sort();
        let ns: Vec<i64> = want.iter().map(|(_, n)| *n).collect();
        check_pages!(in_order, 9_i64, &ns);
        contiguous(&db, 9).await;
        assert!(stored(&InOrder::plan(&db).await.unwrap()).is_empty());
    })
    .await;
}

/// Filled under `items = "fills"`...
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 5, key = "customer", order = "at", items = "fills")]
struct OldItems {
    customer: i64,
    at: i64,
    n: i64,
}

/// `items` renamed (back to the default, `InOrder`'s): every stored bucket
/// is refused until `rebucket_all().items_from("fills")` moves each key's
/// items to the declared name; pages are then exact, no bucket holds the
/// old name, and a second call moves nothing.
#[tokio::test]
async fn items_renamed_then_rebucketed() {
    let (db, _) = fresh_db("bucket_items_renamed").await;
    bounded(60, async {
        let old = OldItems::buckets(&db);
        let mut want: std::collections::BTreeMap<i64, Vec<(i64, i64)>> = Default::default();
        for (key, count) in [(9_i64, 23_i64), (4, 7), (6, 23)] {
            for n in 0..count {
                let at = (n * 7919) % 101;
                old.push(&OldItems {
                    customer: key,
                    at,
                    n,
                })
                .await
                .unwrap();
                want.entry(key).or_default().push((at, n));
            }
        }
        let new = InOrder::buckets(&db);
        match new.count(&9_i64).await {
            Err(Error::Damaged { field, .. }) => assert_eq!(field, "items"),
            other => panic!("{other:?}"),
        }
        assert!(!stored(&InOrder::plan(&db).await.unwrap()).is_empty());
        // A push under the new name before the move is refused, and
        // writes nothing.
        let raw = db.collection::<Document>("trades");
        let before = raw.find_one(doc! {"customer": 4}).await.unwrap().unwrap();
        match new
            .push(&InOrder {
                customer: 4,
                at: 1000,
                n: 100,
            })
            .await
        {
            Err(Error::Damaged { id, field, .. }) => {
                assert_eq!(*id, before.get("_id").unwrap().clone());
                assert_eq!(field, "items");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            raw.find_one(doc! {"customer": 4}).await.unwrap().unwrap(),
            before
        );
        // Another service already writes the new name into key 9's first
        // bucket: its item is kept, after the old ones.
        raw.update_one(
            doc! {"_id": {"k": 9_i64, "s": 0_i64}},
            doc! {"$push": {"items": {"at": 200_i64, "n": 23_i64}}, "$inc": {"count": 1}},
        )
        .await
        .unwrap();
        want.get_mut(&9).unwrap().push((200, 23));

        // A name that is not where items were: refused, nothing moved.
        for bad in ["items", "count", "customer", "fills.x", "$fills", ""] {
            match new.rebucket_all().items_from(bad).await {
                Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, "items_from"),
                other => panic!("{bad}: {other:?}"),
            }
            match new.rebucket(&9_i64).items_from(bad).await {
                Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, "items_from"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Key 6, over `max_items`, moves bucket by bucket.
        let items = new
            .rebucket(&6_i64)
            .items_from("fills")
            .max_items(10)
            .await
            .unwrap();
        assert_eq!(items, 23);
        let moved = new.rebucket_all().items_from("fills").await.unwrap();
        assert_eq!((moved.keys, moved.items), (2, 31));
        for (key, mut items) in want {
            items.sort();
            let ns: Vec<i64> = items.iter().map(|(_, n)| *n).collect();
            check_pages!(new, key, &ns);
            contiguous(&db, key).await;
        }
        let left = db
            .collection::<Document>("trades")
            .count_documents(doc! {"fills": {"$exists": true}})
            .await
            .unwrap();
        assert_eq!(left, 0);
        assert!(stored(&InOrder::plan(&db).await.unwrap()).is_empty());
        assert_eq!(
            new.rebucket_all().items_from("fills").await.unwrap().keys,
            0
        );
        new.push(&InOrder {
            customer: 4,
            at: 50,
            n: 99,
        })
        .await
        .unwrap();
        assert_eq!(new.count(&4_i64).await.unwrap(), 8);
    })
    .await;
}

/// A key of more items than one move takes (`max_items`), after `size`
/// was lowered, is moved bucket by bucket: each bucket over the new limit
/// split in its own transaction, between its neighbours, while another
/// service pushes to the key. Pages are then exact in both directions,
/// positions contiguous, no bucket over the limit, and a second call
/// writes nothing. `rebucket_all` does the same for such a key.
#[tokio::test]
async fn a_key_over_max_items_moves_bucket_by_bucket() {
    let (db, _) = fresh_db("bucket_key_in_steps").await;
    bounded(60, async {
        let before = Before::buckets(&db);
        for (key, count) in [(7_i64, 35_i64), (5, 12), (3, 47)] {
            for n in 0..count {
                before
                    .push(&Before {
                        customer: key,
                        at: n,
                        n,
                    })
                    .await
                    .unwrap();
            }
        }
        // Every bucket the steps write meets the new declaration's
        // invariants, checked by the server.
        mongo_patterns_testkit::strict_validators(&db, Smaller::declared(&db)).await;
        let (client, _) =
            mongo_patterns_testkit::client(&mongo_patterns_testkit::server_uri()).await;
        let other = Smaller::buckets(&client.database(db.name()));
        let pushing = tokio::spawn(async move {
            let mut kept = Vec::new();
            for n in 100..120_i64 {
                match other
                    .push(&Smaller {
                        customer: 7,
                        at: n,
                        n,
                    })
                    .await
                {
                    Ok(()) => kept.push(n),
                    // It read a bucket not yet split: nothing stored.
                    Err(Error::Damaged { .. }) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            kept
        });
        let smaller = Smaller::buckets(&db);
        let items = smaller.rebucket(&7_i64).max_items(20).await.unwrap();
        let kept = pushing.await.unwrap();
        eprintln!("pushes kept: {} of 20", kept.len());
        assert!((35..=55).contains(&items), "{items}");
        let want: Vec<i64> = (0..35).chain(kept.iter().copied()).collect();
        check_pages!(smaller, 7_i64, &want);
        contiguous(&db, 7).await;
        let buckets = buckets_of(&db, 7).await;
        for b in &buckets {
            let count = b.get_i64("count").unwrap();
            assert!(count <= 8, "over the limit: {b:?}");
        }
        // Split between their neighbours: seqs no longer whole numbers.
        assert!(buckets
            .iter()
            .any(|b| b.get_document("_id").unwrap().get_f64("s").is_ok()));
        assert_eq!(
            smaller.rebucket(&7_i64).max_items(20).await.unwrap(),
            want.len() as u64
        );
        assert_eq!(buckets_of(&db, 7).await, buckets, "nothing written again");

        let moved = smaller.rebucket_all().max_items(20).await.unwrap();
        assert_eq!((moved.keys, moved.items), (2, 59), "{moved:?}");
        assert!(moved.too_large.is_empty(), "{moved:?}");
        check_pages!(smaller, 5_i64, &(0..12).collect());
        check_pages!(smaller, 3_i64, &(0..47).collect());
        contiguous(&db, 3).await;
        assert_eq!(smaller.rebucket_all().max_items(20).await.unwrap().keys, 0);
    })
    .await;
}

/// A key of more items than one move takes whose buckets must be sorted
/// across (`order` declared over buckets filled in arrival order) is
/// refused before anything is written, naming it and its items;
/// `rebucket_all` moves the others and names it, and moves it once the
/// limit is raised.
#[tokio::test]
async fn a_key_over_max_items_to_sort_is_refused_and_left_as_it_was() {
    let (db, _) = fresh_db("bucket_key_too_large").await;
    bounded(60, async {
        let arrived = Arrived::buckets(&db);
        let mut want = std::collections::BTreeMap::<i64, Vec<(i64, i64)>>::new();
        for (key, count) in [(7_i64, 35_i64), (5, 12)] {
            for n in 0..count {
                let at = (n * 7919) % 101;
                arrived.push(&Arrived { customer: key, at, n }).await.unwrap();
                want.entry(key).or_default().push((at, n));
            }
        }
        let ns = |key: i64| {
            let mut items = want[&key].clone();
            items.sort();
            items.iter().map(|(_, n)| *n).collect::<Vec<i64>>()
        };
        let stored_7 = buckets_of(&db, 7).await;
        let in_order = InOrder::buckets(&db);
        match in_order.rebucket(&7_i64).max_items(20).await {
            Err(Error::KeyTooLarge { key, items, limit, .. }) => {
                assert_eq!((*key, items, limit), (Bson::Int64(7), 35, 20));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(buckets_of(&db, 7).await, stored_7, "nothing of the key written");

        let moved = in_order.rebucket_all().max_items(20).await.unwrap();
        assert_eq!((moved.keys, moved.items), (1, 12), "{moved:?}");
        assert!(
            matches!(&moved.too_large[..], [Error::KeyTooLarge { key, items: 35, .. }] if **key == Bson::Int64(7)),
            "{moved:?}"
        );
        check_pages!(in_order, 5_i64, &ns(5));
        assert_eq!(buckets_of(&db, 7).await, stored_7);
        // With the limit raised, it moves.
        let moved = in_order.rebucket_all().max_items(35).await.unwrap();
        assert_eq!((moved.keys, moved.items, moved.too_large.len()), (1, 35, 0));
        check_pages!(in_order, 7_i64, &ns(7));
    })
    .await;
}

/// Two services run `rebucket_all` at once, each with a client of its
/// own (nothing in memory shared), while a third pushes to a key being
/// moved: every key ends moved once and whole (pages exact against the
/// oracle in both directions, positions contiguous), every push that
/// returned `Ok` is kept, and a third run moves nothing.
#[tokio::test]
async fn two_services_rebucket_at_once() {
    let (db, _) = fresh_db("bucket_rebucket_services").await;
    bounded(120, async {
        let before = Before::buckets(&db);
        let mut want: std::collections::BTreeMap<i64, Vec<(i64, i64)>> = Default::default();
        for customer in 1..=6_i64 {
            for n in 0..(20 + customer * 3) {
                let at = (n * 37 + customer) % 113;
                before.push(&Before { customer, at, n }).await.unwrap();
                want.entry(customer).or_default().push((at, n));
            }
        }
        let uri = mongo_patterns_testkit::server_uri();
        let service = |uri: String, name: String| async move {
            let (client, _) = mongo_patterns_testkit::client(&uri).await;
            Smaller::buckets(&client.database(&name))
        };
        let (a, b, c) = (
            service(uri.clone(), db.name().to_owned()).await,
            service(uri.clone(), db.name().to_owned()).await,
            service(uri.clone(), db.name().to_owned()).await,
        );
        let pushing = tokio::spawn(async move {
            let mut kept = Vec::new();
            for n in 1000..1040_i64 {
                let at = 500 + n;
                match c.push(&Smaller { customer: 4, at, n }).await {
                    Ok(()) => kept.push((at, n)),
                    // Before the key moved, its open bucket was over the
                    // new limit.
                    Err(Error::Damaged { .. }) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            kept
        });
        let (ra, rb) = tokio::join!(a.rebucket_all(), b.rebucket_all());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let kept = pushing.await.unwrap();
        eprintln!("pushes kept: {} of 40; moved {ra:?} and {rb:?}", kept.len());
        assert!(!kept.is_empty());
        want.get_mut(&4).unwrap().extend(kept);
        // Each key once; key 4 maybe twice, when pushes changed it
        // between the two services' moves.
        assert!((6..=7).contains(&(ra.keys + rb.keys)), "{ra:?} {rb:?}");
        assert!(ra.too_large.is_empty() && rb.too_large.is_empty());
        let smaller = Smaller::buckets(&db);
        // Pushes refused before their key moved were never stored; the
        // last ones, after it moved, are.
        for (key, mut items) in want {
            items.sort();
            let ns: Vec<i64> = items.iter().map(|(_, n)| *n).collect();
            check_pages!(smaller, key, &ns);
            contiguous(&db, key).await;
        }
        assert_eq!(smaller.rebucket_all().await.unwrap().keys, 0);
        // A key already laid out is read, not written: its buckets, write
        // ids included, stay as they were.
        let was = buckets_of(&db, 2).await;
        assert_eq!(smaller.rebucket(&2).await.unwrap(), 26);
        assert_eq!(buckets_of(&db, 2).await, was);
    })
    .await;
}
