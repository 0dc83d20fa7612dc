//! The optional features `chrono`, `time` and `uuid` against a real
//! MongoDB-wire server: `chrono::DateTime<Utc>`, `time::OffsetDateTime` and
//! `uuid::Uuid` fields as bucket keys, `order` fields, keyset sort keys and
//! shard key `from` fields, each stored through bson's serde helper as the
//! BSON date or UUID its role compares; and the server-side migrations on
//! such fields as another service stored them (`adopt_from` into buckets
//! keyed by a UUID or a date, `fill_coarse` from a chrono or time field). scripts/test runs this file with
//! `--features chrono,time,uuid` (and again on bson 3).
#![cfg(all(feature = "chrono", feature = "time", feature = "uuid"))]

use chrono::Utc;
use futures::TryStreamExt;
use mongo_patterns::bson::spec::BinarySubtype;
use mongo_patterns::bson::{Bson, DateTime};
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::TimeRange;
use mongo_patterns_testkit::fresh_db;
use time::OffsetDateTime;
use uuid::Uuid;

/// bson's serde helpers under one name for both bson versions.
#[cfg(not(feature = "bson-3"))]
mod h {
    pub use mongo_patterns::bson::serde_helpers::{
        chrono_datetime_as_bson_datetime as chrono_date,
        time_0_3_offsetdatetime_as_bson_datetime as time_date, uuid_1_as_binary as uuid_binary,
    };
}
#[cfg(feature = "bson-3")]
mod h {
    pub use mongo_patterns::bson::serde_helpers::datetime::{
        FromChrono04DateTime as chrono_date, FromTime03OffsetDateTime as time_date,
    };
    pub use mongo_patterns::bson::serde_helpers::uuid_1::AsBinary as uuid_binary;
}

/// 2024-03-01T00:00:00Z plus `ms`, in each crate's type.
const BASE_MS: i64 = 1_709_251_200_000;
fn chrono_at(ms: i64) -> chrono::DateTime<Utc> {
    chrono::DateTime::from_timestamp_millis(BASE_MS + ms).unwrap()
}
fn time_at(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(BASE_MS + ms) * 1_000_000).unwrap()
}
fn bson_at(ms: i64) -> DateTime {
    DateTime::from_millis(BASE_MS + ms)
}
const MINUTE: i64 = 60_000;
const DAY: i64 = 86_400_000;

async fn raw(db: &Database, coll: &str) -> Vec<Document> {
    db.collection::<Document>(coll)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

fn is_uuid(b: &Bson) -> bool {
    matches!(b, Bson::Binary(bin) if bin.subtype == BinarySubtype::Uuid)
}

/// A chrono day as the bucket key, a time instant as `order`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "readings")]
#[bucket(size = 3, key = "day", order = "at")]
struct Reading {
    #[serde(with = "h::chrono_date")]
    day: chrono::DateTime<Utc>,
    #[serde(with = "h::time_date")]
    at: OffsetDateTime,
    value: i32,
}

#[tokio::test]
async fn chrono_bucket_key_and_time_order() {
    let (db, _) = fresh_db("foreign_chrono_key").await;
    let repo = Reading::buckets(&db);
    repo.ensure().await.unwrap();
    let (day, other) = (chrono_at(0), chrono_at(DAY));
    let reading = |day, minute: i64| Reading {
        day,
        at: time_at(minute * MINUTE),
        value: minute as i32,
    };
    // Seven in order, then one late against the last bucket and one late
    // against the bucket before it.
    for m in [0, 10, 20, 30, 40, 50, 60, 55, 25] {
        repo.push(&reading(day, m)).await.unwrap();
    }
    for m in [5, 15] {
        repo.push(&reading(other, m)).await.unwrap();
    }

    let page = repo
        .page(&day, PageRequest::page(1).page_size(20))
        .await
        .unwrap();
    let minutes: Vec<i32> = page.items.iter().map(|r| r.value).collect();
    assert_eq!(minutes, [0, 10, 20, 25, 30, 40, 50, 55, 60]);
    assert!(page.items.iter().all(|r| r.day == day));
    assert_eq!(repo.count(&day).await.unwrap(), 9);
    assert_eq!(repo.count(&other).await.unwrap(), 2);
    let newest = repo
        .page(&day, PageRequest::page(1).page_size(2).newest_first())
        .await
        .unwrap();
    assert_eq!(newest.items, [reading(day, 60), reading(day, 55)]);

    // Stored as BSON dates: the key on each bucket, `at` on each item.
    for b in raw(&db, "readings").await {
        assert!(
            matches!(b.get("day"), Some(Bson::DateTime(d)) if [bson_at(0), bson_at(DAY)].contains(d)),
            "{b}"
        );
        for item in b.get_array("items").unwrap() {
            let item = item.as_document().unwrap();
            assert!(matches!(item.get("at"), Some(Bson::DateTime(_))), "{b}");
        }
    }
}

/// A UUID as the bucket key, a chrono instant as `order`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "pings")]
#[bucket(size = 2, key = "device", order = "at")]
struct Ping {
    #[serde(with = "h::uuid_binary")]
    device: Uuid,
    #[serde(with = "h::chrono_date")]
    at: chrono::DateTime<Utc>,
    n: i32,
}

#[tokio::test]
async fn uuid_bucket_key_and_chrono_order() {
    let (db, _) = fresh_db("foreign_uuid_key").await;
    let repo = Ping::buckets(&db);
    repo.ensure().await.unwrap();
    let (a, b) = (Uuid::from_u128(0xA), Uuid::from_u128(0xB));
    let pings = |device, n: i32| -> Vec<Ping> {
        (0..n)
            .map(|i| Ping {
                device,
                at: chrono_at(i64::from(i) * MINUTE),
                n: i,
            })
            .collect()
    };
    repo.push_many(&pings(a, 5)).await.unwrap();
    repo.push_many(&pings(b, 3)).await.unwrap();
    repo.push(&Ping {
        device: a,
        at: chrono_at(90 * MINUTE),
        n: 90,
    })
    .await
    .unwrap();

    let page = repo
        .page(&a, PageRequest::page(2).page_size(2))
        .await
        .unwrap();
    assert_eq!(page.items, pings(a, 4)[2..]);
    assert!(page.has_more);
    assert_eq!(repo.count(&a).await.unwrap(), 6);
    let all: Vec<Ping> = repo.stream(&b).try_collect().await.unwrap();
    assert_eq!(all, pings(b, 3));

    let buckets = raw(&db, "pings").await;
    assert_eq!(buckets.len(), 5);
    assert!(buckets.iter().all(|d| is_uuid(d.get("device").unwrap())));
}

/// Keyset pages sorted by each of the three types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "logins")]
#[keyset(sort = "at", order = "desc", page_size = 3)]
struct Login {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(with = "h::chrono_date")]
    at: chrono::DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "visits")]
#[keyset(sort = "started", page_size = 3)]
struct Visit {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(with = "h::time_date")]
    started: OffsetDateTime,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "devices")]
#[keyset(sort = "token", page_size = 3)]
struct Device {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(with = "h::uuid_binary")]
    token: Uuid,
}

/// Every item of a keyset query, page after page by token.
macro_rules! walk {
    ($q:expr) => {{
        let q = $q;
        let mut page = q.clone().page().await.unwrap();
        let mut all = Vec::new();
        loop {
            assert!(page.items.len() <= 3);
            all.extend(page.items.clone());
            match page.next {
                Some(t) => page = q.clone().after(&t).page().await.unwrap(),
                None => break all,
            }
        }
    }};
}

#[tokio::test]
async fn keyset_sort_keys() {
    let (db, _) = fresh_db("foreign_keyset").await;
    // Ids against the order of the sort key, and ties on it.
    let logins: Vec<Login> = (0..10)
        .map(|i| Login {
            id: i,
            at: chrono_at((i * 7 % 4) * MINUTE),
        })
        .collect();
    Login::collection(&db).insert_many(&logins).await.unwrap();
    let got: Vec<Login> = walk!(Login::keyset(&db));
    assert_eq!(got.len(), 10);
    assert!(got.windows(2).all(|w| w[0].at >= w[1].at), "{got:?}");
    let mut ids: Vec<i64> = got.iter().map(|l| l.id).collect();
    ids.sort();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());

    let visits: Vec<Visit> = (0..8)
        .map(|i| Visit {
            id: i,
            started: time_at((7 - i) * MINUTE),
        })
        .collect();
    Visit::collection(&db).insert_many(&visits).await.unwrap();
    let got: Vec<Visit> = walk!(Visit::keyset(&db));
    let mut want = visits.clone();
    want.sort_by_key(|v| v.started);
    assert_eq!(got, want);

    let devices: Vec<Device> = (0..8)
        .map(|i| Device {
            id: i,
            token: Uuid::from_u128((u128::from((i as u32 * 5) % 8) << 120) | 1),
        })
        .collect();
    Device::collection(&db).insert_many(&devices).await.unwrap();
    let got: Vec<Device> = walk!(Device::keyset(&db));
    let mut want = devices.clone();
    want.sort_by_key(|d| d.token);
    assert_eq!(got, want);
    assert!(raw(&db, "devices")
        .await
        .iter()
        .all(|d| is_uuid(d.get("token").unwrap())));
}

/// Shard keys whose coarse month derives from a chrono and a time field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "orders")]
#[shard_key(coarse = "month", from = "at", search = "tenant")]
struct Order {
    #[serde(rename = "_id")]
    id: i64,
    tenant: String,
    #[serde(with = "h::chrono_date")]
    at: chrono::DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "shipments")]
#[shard_key(coarse = "month", from = "at", search = "tenant")]
struct Shipment {
    #[serde(rename = "_id")]
    id: i64,
    tenant: String,
    #[serde(with = "h::time_date")]
    at: OffsetDateTime,
}

// The same field without the helper (chrono would write a string) no
// longer compiles: the derive refuses it at its type (see the UI tests
// `keyset/foreign_without_helper` and `bucket/foreign_without_helper`).

/// Orders (chrono) and shipments (time) on 2024-03-31 23:59 and
/// 2024-04-01 00:00.
fn across_a_month() -> ([Order; 3], [Shipment; 2]) {
    let (last, first) = (31 * DAY - MINUTE, 31 * DAY);
    let orders = [(1, "t1", last), (2, "t1", first), (3, "t2", first)].map(|(id, t, ms)| Order {
        id,
        tenant: t.into(),
        at: chrono_at(ms),
    });
    let shipments = [(1, "t1", last), (2, "t1", first)].map(|(id, t, ms)| Shipment {
        id,
        tenant: t.into(),
        at: time_at(ms),
    });
    (orders, shipments)
}

/// The `month` of each document of `coll` as stored, in `_id` order.
async fn months(db: &Database, coll: &str) -> Vec<Bson> {
    raw(db, coll)
        .await
        .iter()
        .map(|d| d.get("month").cloned().unwrap_or(Bson::Null))
        .collect()
}

#[tokio::test]
async fn shard_key_time_sources() {
    let (db, _) = fresh_db("foreign_shard").await;
    let (march, april) = (bson_at(0), bson_at(31 * DAY));
    let (orders, shipments) = across_a_month();
    Order::sharded(&db).insert_many(&orders).await.unwrap();
    Shipment::sharded(&db)
        .insert_many(&shipments)
        .await
        .unwrap();
    for coll in ["orders", "shipments"] {
        let months = months(&db, coll).await;
        assert_eq!(
            months[..2],
            [Bson::DateTime(march), Bson::DateTime(april)],
            "{coll}"
        );
    }

    let april_range = TimeRange::between(april, bson_at(61 * DAY));
    let got: Vec<Order> = Order::sharded(&db)
        .find("t1", april_range, doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(got, orders[1..2]);
    let got: Vec<Shipment> = Shipment::sharded(&db)
        .find("t1", april_range, doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(got, shipments[1..]);
}

/// Every document of `coll` without the write ids (`mp_ops`), which
/// differ by writer.
async fn raw_without_ops(db: &Database, coll: &str) -> Vec<Document> {
    let mut docs = raw(db, coll).await;
    for d in &mut docs {
        d.remove("mp_ops");
    }
    docs
}

/// `items` as another service stores them, with the raw driver (no
/// derived field, no bucket).
async fn write_raw<T: Serialize>(db: &Database, coll: &str, items: &[T]) {
    let docs: Vec<Document> = items
        .iter()
        .map(|t| mongo_patterns_testkit::bsonc::to_document(t).unwrap())
        .collect();
    db.collection::<Document>(coll)
        .insert_many(docs)
        .await
        .unwrap();
}

/// A flat collection of pings (a UUID key, a chrono `order` with ties and
/// out of order) and of readings (a chrono key, a time `order`), written by
/// the raw driver, adopted server-side: the buckets are the documents
/// `push_many` writes from the same items, the reads follow `order`, and
/// the key and order fields stay a BSON UUID and dates.
#[tokio::test]
async fn adopted_from_flat_with_foreign_keys() {
    let (db, _) = fresh_db("foreign_adopt").await;
    let devices = [
        Uuid::from_u128(0xB << 120),
        Uuid::from_u128(0xA),
        Uuid::nil(),
    ];
    let mut pings = Vec::new();
    for n in 0..9 {
        for (d, device) in devices.iter().enumerate() {
            let minute = i64::from((n * 5 + d as i32) % 6);
            pings.push(Ping {
                device: *device,
                at: chrono_at(minute * MINUTE),
                n,
            });
        }
    }
    let days = [chrono_at(DAY), chrono_at(0)];
    let readings: Vec<Reading> = (0..8)
        .flat_map(|m| {
            days.map(|day| Reading {
                day,
                at: time_at(i64::from((m * 3) % 5) * MINUTE),
                value: m,
            })
        })
        .collect();
    write_raw(&db, "pings_flat", &pings).await;
    write_raw(&db, "readings_flat", &readings).await;

    // Batches of 4 items: a key of 9 goes alone, cut across batches.
    let adopted = Ping::buckets(&db)
        .adopt_from("pings_flat")
        .batch_items(4)
        .await
        .unwrap();
    assert_eq!(adopted, pings.len() as u64);
    assert_eq!(
        Reading::buckets(&db)
            .adopt_from("readings_flat")
            .await
            .unwrap(),
        readings.len() as u64
    );

    let pushed = Ping::buckets(&db).with_collection("pings_pushed");
    let pushed_readings = Reading::buckets(&db).with_collection("readings_pushed");
    for device in devices {
        let mine: Vec<Ping> = pings
            .iter()
            .filter(|p| p.device == device)
            .cloned()
            .collect();
        pushed.push_many(&mine).await.unwrap();
        let mut want = mine;
        want.sort_by_key(|p| (p.at, p.n));
        let got: Vec<Ping> = Ping::buckets(&db)
            .stream(&device)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(got, want, "device {device}");
    }
    for day in days {
        let mine: Vec<Reading> = readings.iter().filter(|r| r.day == day).cloned().collect();
        pushed_readings.push_many(&mine).await.unwrap();
        let mut want = mine;
        want.sort_by_key(|r| (r.at, r.value));
        let page = Reading::buckets(&db)
            .page(&day, PageRequest::page(1).page_size(20).newest_first())
            .await
            .unwrap();
        want.reverse();
        assert_eq!(page.items, want, "day {day}");
    }
    assert_eq!(
        raw_without_ops(&db, "pings").await,
        raw_without_ops(&db, "pings_pushed").await
    );
    assert_eq!(
        raw_without_ops(&db, "readings").await,
        raw_without_ops(&db, "readings_pushed").await
    );
    let buckets = raw(&db, "pings").await;
    assert_eq!(buckets.len(), 3 * 5);
    for b in &buckets {
        assert!(is_uuid(b.get("device").unwrap()), "{b}");
        for item in b.get_array("items").unwrap() {
            let at = item.as_document().unwrap().get("at");
            assert!(matches!(at, Some(Bson::DateTime(_))), "{b}");
        }
    }
    assert!(raw(&db, "readings")
        .await
        .iter()
        .all(|b| matches!(b.get("day"), Some(Bson::DateTime(_)))));
}

/// Orders and shipments another service wrote without the coarse month:
/// `fill_coarse` derives it on the server from the chrono and time fields
/// as stored (BSON dates), the month boundary included, and `find` by the
/// key's prefix sees them.
#[tokio::test]
async fn coarse_filled_from_foreign_time_fields() {
    let (db, _) = fresh_db("foreign_fill").await;
    let (orders, shipments) = across_a_month();
    write_raw(&db, "orders", &orders).await;
    write_raw(&db, "shipments", &shipments).await;
    assert!(raw(&db, "orders")
        .await
        .iter()
        .all(|d| !d.contains_key("month")));

    let filled = Order::sharded(&db).fill_coarse().await.unwrap();
    assert_eq!((filled.filled, filled.damaged.len()), (3, 0), "{filled:?}");
    let filled = Shipment::sharded(&db).fill_coarse().await.unwrap();
    assert_eq!((filled.filled, filled.damaged.len()), (2, 0), "{filled:?}");
    let (march, april) = (bson_at(0), bson_at(31 * DAY));
    for (coll, want) in [
        ("orders", vec![march, april, april]),
        ("shipments", vec![march, april]),
    ] {
        let want: Vec<Bson> = want.into_iter().map(Bson::DateTime).collect();
        assert_eq!(months(&db, coll).await, want, "{coll}");
    }
    let april_range = TimeRange::between(april, bson_at(61 * DAY));
    let got: Vec<Order> = Order::sharded(&db)
        .find("t1", april_range, doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(got, orders[1..2]);
    assert_eq!(
        Order::sharded(&db).fill_coarse().await.unwrap().written(),
        0
    );
}
