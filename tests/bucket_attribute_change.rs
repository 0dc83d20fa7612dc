//! A bucket model's `size` raised with data already stored: the buckets
//! written under the old size keep working. Pushes go on (late ones into
//! the old buckets too), `count` and every page (both directions, every
//! page size) stay exact against an oracle, a delete moves the positions
//! right, and the stored buckets hold contiguous positions (read with the
//! raw driver). (Lowering `size` below what stored buckets hold is not
//! supported yet: those buckets read as `Damaged`.)

use futures::TryStreamExt;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, fresh_db};

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

/// Positions as stored: each bucket's `start` follows the counts before
/// it, and `count` is its items' length.
async fn contiguous(db: &Database, key: i64) {
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
