//! `fill_coarse` against a real MongoDB-wire server: the derived coarse
//! field written on documents another writer stored without it (the raw
//! driver, as another service would), resumed after a cut, repeated
//! without writing, raced by other writers, and rewritten after the
//! `granularity` changed. Every check reads the documents back with the
//! raw driver and compares each coarse field with its timestamp's period.

use std::collections::{BTreeMap, BTreeSet};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use mongo_patterns::bson::{Bson, DateTime};
use mongo_patterns::prelude::*;
use mongo_patterns::progress::Progress;
use mongo_patterns::shard_key::{truncate, Granularity, TimeRange};
use mongo_patterns::Error;
use mongo_patterns_testkit::{bounded, fresh_db};

/// An application log, `ts` in epoch seconds; `month` is derived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
    msg: String,
}

/// Events, `period` the month of `at`...
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "events")]
#[shard_key(
    coarse = "period",
    granularity = "month",
    from = "at",
    search = "tenant"
)]
struct Monthly {
    #[serde(rename = "_id")]
    id: i64,
    tenant: String,
    at: DateTime,
}

/// ...and the same collection after the attribute became `day`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "events")]
#[shard_key(coarse = "period", granularity = "day", from = "at", search = "tenant")]
struct Daily {
    #[serde(rename = "_id")]
    id: i64,
    tenant: String,
    at: DateTime,
}

const START: i64 = 1_609_459_200; // 2021-01-01
const SPAN: i64 = 2 * 365 * 86_400;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn kind(i: i64) -> &'static str {
    if i % 5 == 0 {
        "web"
    } else {
        "app"
    }
}

/// `n` logs as another service stores them: no `month`, `ts` an Int64 of
/// seconds over two years, in random order of `_id`.
async fn legacy_logs(db: &Database, n: i64, seed: u64) -> BTreeMap<i64, i64> {
    let mut rng = Rng(seed);
    let mut truth = BTreeMap::new();
    let docs: Vec<Document> = (0..n)
        .map(|i| {
            let ts = START + (rng.next() % SPAN as u64) as i64;
            truth.insert(i, ts);
            doc! {"_id": i, "type": kind(i), "ts": ts, "msg": format!("event {i}")}
        })
        .collect();
    for chunk in docs.chunks(5_000) {
        db.collection::<Document>("logs")
            .insert_many(chunk.to_vec())
            .await
            .unwrap();
    }
    truth
}

/// The period `ts` (seconds) is in, as `granularity` rounds it.
fn month_of(ts: i64) -> DateTime {
    truncate(DateTime::from_millis(ts * 1000), Granularity::Month)
}

/// Every document of `logs` read with the raw driver: `_id` → (`ts` as
/// stored, `month` as stored).
async fn raw_logs(db: &Database) -> BTreeMap<i64, (Option<Bson>, Option<Bson>)> {
    db.collection::<Document>("logs")
        .find(doc! {})
        .await
        .unwrap()
        .map_ok(|d| {
            (
                d.get_i64("_id").unwrap(),
                (d.get("ts").cloned(), d.get("month").cloned()),
            )
        })
        .try_collect()
        .await
        .unwrap()
}

/// Whether a stored log's `month` is its `ts`'s month (`ts` an integer
/// or a date).
fn consistent(ts: &Option<Bson>, month: &Option<Bson>) -> bool {
    let want = match ts {
        Some(Bson::Int64(s)) => month_of(*s),
        Some(Bson::Int32(s)) => month_of(i64::from(*s)),
        Some(Bson::DateTime(t)) => truncate(*t, Granularity::Month),
        _ => return false,
    };
    month == &Some(Bson::DateTime(want))
}

fn damaged_ids(errors: &[Error]) -> BTreeSet<i64> {
    errors
        .iter()
        .map(|e| match e {
            Error::Damaged { id, .. } => match **id {
                Bson::Int64(i) => i,
                Bson::Int32(i) => i64::from(i),
                ref other => panic!("unexpected id {other}"),
            },
            other => panic!("not Damaged: {other}"),
        })
        .collect()
}

async fn find_all(repo: &Sharded<Log>, kind: &str) -> BTreeSet<i64> {
    let range = TimeRange::between(
        DateTime::from_millis(START * 1000),
        DateTime::from_millis((START + SPAN) * 1000),
    );
    repo.find(kind, range, doc! {})
        .await
        .unwrap()
        .map_ok(|l| l.id)
        .try_collect()
        .await
        .unwrap()
}

/// Documents without `month`, `ts` as the model stores it, filled; a
/// `ts` stored as a date is filled too; a string, a double and a missing
/// `ts` cannot be, and are named.
#[tokio::test]
async fn fills_documents_another_writer_stored() {
    legacy_filled(false).await;
}

/// The same, one guarded statement a document, as on a server without
/// `$dateTrunc`.
#[tokio::test]
async fn fills_documents_another_writer_stored_one_statement_a_document() {
    legacy_filled(true).await;
}

async fn legacy_filled(per_document: bool) {
    let (db, _) = fresh_db("shard_fill_legacy").await;
    bounded(120, async {
        const N: i64 = 2_500;
        let truth = legacy_logs(&db, N, 7).await;
        let raw = db.collection::<Document>("logs");
        raw.insert_many([
            doc! {"_id": N, "type": "app", "ts": "yesterday", "msg": "a string"},
            doc! {"_id": N + 1, "type": "app", "msg": "no ts"},
            doc! {"_id": N + 2, "type": "app", "ts": 1.6e9, "msg": "a double"},
            doc! {"_id": N + 3, "type": "app", "ts": DateTime::from_millis(1_635_132_899_000), "msg": "a date"},
            doc! {"_id": N + 4, "type": "app", "ts": 1_635_132_899_i32, "msg": "an int32"},
        ])
        .await
        .unwrap();
        let repo = Log::sharded(&db);
        assert_eq!(repo.audit(100_000).await.unwrap().damaged.len() as i64, N + 5);
        assert!(find_all(&repo, "app").await.is_empty(), "invisible before");

        let mut fill = repo.fill_coarse().max_damaged(2);
        if per_document {
            fill = fill.per_document();
        }
        let fill = fill.await.unwrap();
        assert_eq!(fill.scanned as i64, N + 5);
        assert_eq!(fill.filled as i64, N + 2, "{fill:?}");
        assert_eq!((fill.migrated, fill.corrected, fill.skipped), (0, 0, 0));
        assert_eq!(fill.already_right, 0);
        assert_eq!(fill.unfillable, 3);
        assert_eq!(damaged_ids(&fill.damaged), BTreeSet::from([N, N + 1]), "up to max");
        match &fill.damaged[0] {
            Error::Damaged { field, .. } => assert_eq!(field, "ts"),
            other => panic!("{other}"),
        }

        let stored = raw_logs(&db).await;
        for (id, (ts, month)) in &stored {
            let id = *id;
            if (N..N + 3).contains(&id) {
                assert_eq!(month, &None, "{id}: nothing to derive from");
            } else {
                assert!(consistent(ts, month), "{id}: {ts:?} {month:?}");
            }
        }
        // An independent spot check: 2021-10-25 is in October.
        assert_eq!(
            stored[&(N + 3)].1,
            Some(Bson::DateTime(DateTime::parse_rfc3339_str("2021-10-01T00:00:00Z").unwrap()))
        );

        let audit = repo.audit(100_000).await.unwrap();
        assert_eq!(audit.scanned as i64, N + 5);
        assert_eq!(damaged_ids(&audit.damaged), BTreeSet::from([N, N + 1, N + 2]));

        let want: BTreeSet<i64> = truth.keys().copied().filter(|&i| kind(i) == "app").collect();
        let mut got = find_all(&repo, "app").await;
        // The int32 `ts` too; the date one is filled (the audit reads a
        // date as a timestamp) but a range in seconds does not match it.
        assert!(got.remove(&(N + 4)), "{:?}", got.range(N..).collect::<Vec<_>>());
        assert_eq!(got, want, "find sees every filled document");
    })
    .await;
}

/// A fill cut after its first batch leaves that batch written; run again
/// it writes the rest; a third run writes nothing (no `update` sent).
#[tokio::test]
async fn cut_then_resumed_then_idempotent() {
    let (db, commands) = fresh_db("shard_fill_resume").await;
    bounded(120, async {
        const N: i64 = 5_000;
        legacy_logs(&db, N, 11).await;
        let repo = Log::sharded(&db);

        let heard = Arc::new(tokio::sync::Notify::new());
        let notify = heard.clone();
        let fill = repo
            .fill_coarse()
            .batch_size(500)
            .on_progress(move |_| notify.notify_one())
            .into_future();
        tokio::select! {
            biased;
            _ = heard.notified() => {}
            done = fill => panic!("finished before the cut: {done:?}"),
        }
        let raw = db.collection::<Document>("logs");
        let written = raw
            .count_documents(doc! {"month": {"$exists": true}})
            .await
            .unwrap();
        assert!(
            (500..N as u64).contains(&written),
            "cut part way: {written}"
        );

        let second = repo.fill_coarse().batch_size(500).await.unwrap();
        assert_eq!(second.already_right, written);
        assert_eq!(second.filled, N as u64 - written);
        assert!(raw_logs(&db).await.values().all(|(t, m)| consistent(t, m)));

        commands.take();
        let third = repo.fill_coarse().batch_size(500).await.unwrap();
        assert_eq!(third.written(), 0);
        assert_eq!(third.already_right, N as u64);
        let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
        assert!(!sent.iter().any(|n| n == "update"), "{sent:?}");
        assert!(repo.audit(10).await.unwrap().damaged.is_empty());
    })
    .await;
}

/// While the fill runs, another service replaces documents with a new
/// `ts` (a month later) and without `month`, and the library inserts new
/// logs: the fill never writes a month that is not the document's `ts`'s
/// month as stored, and a second run leaves everything consistent.
#[tokio::test]
async fn concurrent_writers_never_get_a_stale_month() {
    raced(false).await;
}

/// The same, one statement a document: the guard on the timestamp as
/// read skips the documents changed meanwhile.
#[tokio::test]
async fn concurrent_writers_never_get_a_stale_month_one_statement_a_document() {
    raced(true).await;
}

async fn raced(per_document: bool) {
    let (db, _) = fresh_db("shard_fill_concurrent").await;
    bounded(240, async {
        const N: i64 = 6_000;
        legacy_logs(&db, N, 13).await;
        let repo = Log::sharded(&db);
        let done = Arc::new(AtomicBool::new(false));
        let replaced = Arc::new(AtomicU64::new(0));

        let other = {
            let (raw, done, replaced) = (
                db.collection::<Document>("logs"),
                done.clone(),
                replaced.clone(),
            );
            tokio::spawn(async move {
                let mut rng = Rng(99);
                while !done.load(Ordering::Relaxed) {
                    let id = (rng.next() % N as u64) as i64;
                    let Some(d) = raw.find_one(doc! {"_id": id}).await.unwrap() else {
                        continue;
                    };
                    let ts = d.get_i64("ts").unwrap() + 40 * 86_400;
                    let new = doc! {"_id": id, "type": kind(id), "ts": ts, "msg": "replaced"};
                    raw.replace_one(doc! {"_id": id}, new).await.unwrap();
                    replaced.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let library = {
            let (repo, done) = (repo.clone(), done.clone());
            tokio::spawn(async move {
                let mut id = N;
                while !done.load(Ordering::Relaxed) {
                    let log = Log {
                        id,
                        kind: kind(id).to_owned(),
                        ts: START + id * 1_000,
                        msg: "new".into(),
                    };
                    repo.insert(&log).await.unwrap();
                    id += 1;
                }
                id - N
            })
        };
        let mut fill = repo.fill_coarse().batch_size(200);
        if per_document {
            fill = fill.per_document();
        }
        let fill = fill.await.unwrap();
        eprintln!("{fill:?}");
        done.store(true, Ordering::Relaxed);
        other.await.unwrap();
        let inserted = library.await.unwrap();
        let replaced = replaced.load(Ordering::Relaxed);
        assert!(
            replaced > 0 && inserted > 0,
            "raced: {replaced} replaced, {inserted} inserted"
        );

        // Every month stored is right for the `ts` stored beside it: a
        // document the other service replaced after the fill wrote it has
        // none again, never a stale one.
        let stored = raw_logs(&db).await;
        assert_eq!(stored.len() as i64, N + inserted as i64);
        let missing = stored
            .values()
            .filter(|(ts, month)| {
                assert!(
                    month.is_none() || consistent(ts, month),
                    "stale: {ts:?} {month:?}"
                );
                month.is_none()
            })
            .count() as u64;
        assert!(
            missing <= replaced,
            "{missing} missing after {replaced} replacements, {fill:?}"
        );

        let again = repo.fill_coarse().await.unwrap();
        assert_eq!(again.filled, missing);
        assert!(raw_logs(&db).await.values().all(|(t, m)| consistent(t, m)));
        assert!(repo.audit(10).await.unwrap().damaged.is_empty());
    })
    .await;
}

/// `granularity` changed from month to day: the new model's audit reports
/// the events stored under the old one, its fill rewrites them (and fills
/// those stored without the field, counted apart), and its `find` is then
/// exact against the events kept in memory.
#[tokio::test]
async fn granularity_change_is_migrated() {
    let (db, _) = fresh_db("shard_fill_granularity").await;
    bounded(120, async {
        let mut rng = Rng(17);
        let events: Vec<Monthly> = (0..3_000)
            .map(|i| Monthly {
                id: i,
                tenant: format!("t{}", i % 3),
                at: DateTime::from_millis(START * 1000 + (rng.next() % (SPAN as u64 * 1000)) as i64),
            })
            .collect();
        Monthly::sharded(&db).insert_many(&events).await.unwrap();
        // On the first of a month the month is the day: nothing to do.
        let day_of = |t: DateTime| truncate(t, Granularity::Day);
        let month_of = |t: DateTime| truncate(t, Granularity::Month);
        let other = events.iter().filter(|e| day_of(e.at) != month_of(e.at)).count();
        assert!(other > 2_500);
        let raw = db.collection::<Document>("events");
        let legacy: Vec<Document> = (3_000..3_050)
            .map(|i| doc! {"_id": i, "tenant": "t0", "at": DateTime::from_millis(START * 1000 + i * 3_600_000)})
            .collect();
        raw.insert_many(legacy).await.unwrap();

        let daily = Daily::sharded(&db);
        let audit = daily.audit(100_000).await.unwrap();
        assert_eq!(audit.damaged.len(), other + 50);
        let said = audit.damaged.iter().filter(|e| e.to_string().contains("another granularity")).count();
        assert_eq!(said, other, "{}", audit.damaged[0]);

        // `plan` counts the same documents (one aggregation), and says
        // what fills them; after the fill, none.
        let stored = |plan: &mongo_patterns::ensure::Plan| -> Vec<u64> {
            plan.conflicts
                .iter()
                .filter_map(|c| match c {
                    mongo_patterns::ensure::Conflict::Stored { count, .. } => Some(*count),
                    _ => None,
                })
                .collect()
        };
        let plan = Daily::plan(&db).await.unwrap();
        assert_eq!(stored(&plan), vec![(other + 50) as u64], "{plan}");
        assert!(plan.to_string().contains("fill_coarse()"), "{plan}");
        assert_eq!(stored(&Monthly::plan(&db).await.unwrap()), vec![50]);

        let fill = daily.fill_coarse().await.unwrap();
        assert_eq!(fill.migrated as usize, other, "{fill:?}");
        assert_eq!(fill.filled, 50);
        assert_eq!(fill.already_right as usize, 3_000 - other);
        assert_eq!((fill.corrected, fill.unfillable, fill.skipped), (0, 0, 0));
        assert!(daily.audit(10).await.unwrap().damaged.is_empty());
        assert!(stored(&Daily::plan(&db).await.unwrap()).is_empty());

        let mut all: Vec<(i64, String, DateTime)> = events.iter().map(|e| (e.id, e.tenant.clone(), e.at)).collect();
        all.extend((3_000..3_050).map(|i| (i, "t0".to_owned(), DateTime::from_millis(START * 1000 + i * 3_600_000))));
        for (a, b) in [(0, 40), (100, 101), (200, 365), (400, 730)] {
            let range = TimeRange::between(
                DateTime::from_millis((START + a * 86_400) * 1000 + 12_345),
                DateTime::from_millis((START + b * 86_400) * 1000 + 6_789),
            );
            for tenant in ["t0", "t1", "t2"] {
                let got: BTreeSet<i64> = daily
                    .find(tenant, range, doc! {})
                    .await
                    .unwrap()
                    .map_ok(|e| e.id)
                    .try_collect()
                    .await
                    .unwrap();
                let want: BTreeSet<i64> = all
                    .iter()
                    .filter(|(_, t, at)| t == tenant && *at >= range.start && *at < range.end)
                    .map(|(i, _, _)| *i)
                    .collect();
                assert_eq!(got, want, "{tenant} days {a}..{b}");
            }
        }
    })
    .await;
}

/// `on_progress` hears after each batch: documents read, strictly
/// increasing, of the collection's count, ending at it.
#[tokio::test]
async fn progress_is_monotone_and_ends_complete() {
    let (db, _) = fresh_db("shard_fill_progress").await;
    bounded(120, async {
        const N: i64 = 2_345;
        legacy_logs(&db, N, 19).await;
        let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
        let heard = seen.clone();
        let fill = Log::sharded(&db)
            .fill_coarse()
            .batch_size(500)
            .on_progress(move |p| heard.lock().unwrap().push(p))
            .await
            .unwrap();
        assert_eq!(fill.filled as i64, N);
        let seen = seen.lock().unwrap().clone();
        let done: Vec<u64> = seen.iter().map(|p| p.done).collect();
        assert_eq!(done, [500, 1_000, 1_500, 2_000, 2_345]);
        assert!(seen.iter().all(|p| p.of == N as u64));
        assert!(seen.windows(2).all(|w| w[0].elapsed <= w[1].elapsed));
        assert!(seen.last().unwrap().rate() > 0.0);
    })
    .await;
}

macro_rules! timed {
    ($($name:ident, $g:tt, $t:ty;)*) => {$(
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
        #[model(collection = "times")]
        #[shard_key(coarse = "period", granularity = $g, from = "at", search = "k")]
        struct $name {
            #[serde(rename = "_id")]
            id: i64,
            k: String,
            at: $t,
        }
    )*};
}

timed! {
    HourDate, "hour", DateTime;
    DayDate, "day", DateTime;
    WeekDate, "week", DateTime;
    MonthDate, "month", DateTime;
    QuarterDate, "quarter", DateTime;
    YearDate, "year", DateTime;
    HourSecs, "hour", i64;
    DaySecs, "day", i64;
    WeekSecs, "week", i64;
    MonthSecs, "month", i64;
    QuarterSecs, "quarter", i64;
    YearSecs, "year", i64;
}

/// Times around every boundary the granularities have (hours, midnights,
/// Sunday to Monday, month, quarter and year ends, 29 February, before
/// 1970), random ones from 1900 to 2100, and two outside the years 1 to
/// 9999 (written from the value computed in the library).
fn times() -> Vec<i64> {
    let mut ms = Vec::new();
    for edge in [
        "1969-12-31T23:59:59.999Z",
        "1970-01-01T00:00:00Z",
        "1900-03-01T00:00:00Z",
        "2000-02-29T23:59:59.999Z",
        "2021-10-24T23:59:59.999Z", // a Sunday
        "2021-10-25T00:00:00Z",     // a Monday
        "2021-12-31T23:59:59.999Z",
        "2022-01-01T00:00:00Z",
        "2024-03-31T23:59:59.999Z",
        "2024-04-01T00:00:00.001Z",
        "1960-06-30T12:30:00Z",
    ] {
        ms.push(
            DateTime::parse_rfc3339_str(edge)
                .unwrap()
                .timestamp_millis(),
        );
    }
    let mut rng = Rng(29);
    let (from, to) = (-2_208_988_800_000_i64, 4_102_444_800_000_i64); // 1900..2100
    ms.extend((0..300).map(|_| from + (rng.next() % (to - from) as u64) as i64));
    ms.push(300_000_000_000_000); // about the year 11,476
    ms.push(-70_000_000_000_000); // about 248 BC
    ms
}

/// Stored without `period`, filled by `T`, then read back raw: each
/// `period` is `truncate(at)` at `g`.
async fn agrees<T: ShardKeyed>(db: &Database, g: Granularity, secs: bool, per_document: bool) {
    let name = format!("times_{g:?}_{secs}_{per_document}");
    let raw = db.collection::<Document>(&name);
    let times = times();
    let docs: Vec<Document> = times
        .iter()
        .enumerate()
        .map(|(i, &ms)| match secs {
            true => doc! {"_id": i as i64, "k": "a", "at": ms.div_euclid(1_000)},
            false => doc! {"_id": i as i64, "k": "a", "at": DateTime::from_millis(ms)},
        })
        .collect();
    raw.insert_many(docs).await.unwrap();
    let repo = Sharded::<T>::new(db).with_collection(&name);
    let mut fill = repo.fill_coarse().batch_size(100);
    if per_document {
        fill = fill.per_document();
    }
    let fill = fill.await.unwrap();
    assert_eq!(fill.filled as usize, times.len(), "{name}: {fill:?}");
    let stored: Vec<Document> = raw
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    for (d, &ms) in stored.iter().zip(&times) {
        let at = match secs {
            true => DateTime::from_millis(ms.div_euclid(1_000) * 1_000),
            false => DateTime::from_millis(ms),
        };
        assert_eq!(
            d.get_datetime("period").unwrap(),
            &truncate(at, g),
            "{name}: {d}"
        );
    }
    assert!(repo.audit(10).await.unwrap().damaged.is_empty(), "{name}");
}

/// The server's `$dateTrunc` and the library's `truncate` agree at every
/// granularity, on dates and on epoch seconds; so does the path without
/// it.
#[tokio::test]
async fn every_granularity_agrees_with_truncate() {
    let (db, _) = fresh_db("shard_fill_granularities").await;
    bounded(120, async {
        for per_document in [false, true] {
            agrees::<HourDate>(&db, Granularity::Hour, false, per_document).await;
            agrees::<DayDate>(&db, Granularity::Day, false, per_document).await;
            agrees::<WeekDate>(&db, Granularity::Week, false, per_document).await;
            agrees::<MonthDate>(&db, Granularity::Month, false, per_document).await;
            agrees::<QuarterDate>(&db, Granularity::Quarter, false, per_document).await;
            agrees::<YearDate>(&db, Granularity::Year, false, per_document).await;
            agrees::<HourSecs>(&db, Granularity::Hour, true, per_document).await;
            agrees::<DaySecs>(&db, Granularity::Day, true, per_document).await;
            agrees::<WeekSecs>(&db, Granularity::Week, true, per_document).await;
            agrees::<MonthSecs>(&db, Granularity::Month, true, per_document).await;
            agrees::<QuarterSecs>(&db, Granularity::Quarter, true, per_document).await;
            agrees::<YearSecs>(&db, Granularity::Year, true, per_document).await;
        }
    })
    .await;
}

/// In a caller's session, and in its transaction: the count, the reads
/// and the writes go through it (aborted, nothing is left; committed,
/// every document is filled), on the batched path and on a sharded
/// collection's (which then opens no transaction of its own).
#[tokio::test]
async fn fills_in_a_session_and_a_transaction() {
    for sharded in [false, true] {
        let (db, commands) = fresh_db(&format!("shard_fill_session_{sharded}")).await;
        bounded(120, async {
            const N: i64 = 1_200;
            legacy_logs(&db, N, 31).await;
            let repo = Log::sharded(&db);
            let mut s = db.client().start_session().await.unwrap();

            s.start_transaction().await.unwrap();
            let fill = repo
                .fill_coarse()
                .sharded(sharded)
                .batch_size(500)
                .session(&mut s)
                .await
                .unwrap();
            assert_eq!(fill.filled as i64, N);
            s.abort_transaction().await.unwrap();
            assert_eq!(
                repo.audit(100_000).await.unwrap().damaged.len() as i64,
                N,
                "aborted"
            );

            commands.take();
            s.start_transaction().await.unwrap();
            let fill = repo
                .fill_coarse()
                .sharded(sharded)
                .batch_size(500)
                .session(&mut s)
                .await
                .unwrap();
            assert_eq!(fill.filled as i64, N);
            let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
            assert!(!sent.iter().any(|n| n.ends_with("Transaction")), "{sent:?}");
            s.commit_transaction().await.unwrap();
            assert!(raw_logs(&db).await.values().all(|(t, m)| consistent(t, m)));

            let again = repo
                .fill_coarse()
                .sharded(sharded)
                .session(&mut s)
                .await
                .unwrap();
            assert_eq!((again.written(), again.already_right), (0, N as u64));
        })
        .await;
    }
}

/// On a collection already sharded on `{month: 1, type: 1}`, through a
/// client the routing checker watches (the legacy documents, without
/// `month`, some without `type`, some in another granularity, are
/// written before it looks): the fill's every write names the document's
/// whole shard key, in a transaction, so that nothing is one `mongos`
/// refuses or broadcasts; the default, batched path (filtered by `_id`
/// alone) is refused there. Both leave every document consistent.
#[tokio::test]
async fn on_a_sharded_collection_each_write_names_the_whole_key() {
    use mongo_patterns_testkit::routing::{Routing, ShardKey};
    const N: i64 = 600;
    let key = ShardKey::from_doc(&doc! {"month": 1, "type": 1}).unwrap();
    let mut reports = Vec::new();
    for sharded in [false, true] {
        let (db, _) = fresh_db(&format!("shard_fill_sharded_{sharded}")).await;
        legacy_logs(&db, N, 5).await;
        let raw = db.collection::<Document>("logs");
        // No `type` on some; on others the day, not the month.
        raw.update_many(doc! {"_id": {"$lt": 10_i64}}, doc! {"$unset": {"type": ""}})
            .await
            .unwrap();
        for id in 10..20_i64 {
            let d = raw.find_one(doc! {"_id": id}).await.unwrap().unwrap();
            let ts = d.get_i64("ts").unwrap();
            let day = truncate(DateTime::from_millis(ts * 1000), Granularity::Day);
            raw.update_one(doc! {"_id": id}, doc! {"$set": {"month": day}})
                .await
                .unwrap();
        }
        let routing = Routing::new().key("logs", key.clone());
        let (watched, commands) = mongo_patterns_testkit::client_with(
            &mongo_patterns_testkit::server_uri(),
            Some(routing.clone()),
        )
        .await;
        let repo = Log::sharded(&watched.database(db.name()));
        let fill = bounded(120, repo.fill_coarse().sharded(sharded).batch_size(250))
            .await
            .unwrap();
        assert_eq!(fill.written(), N as u64, "{fill:?}");
        assert!(raw_logs(&db).await.values().all(|(t, m)| consistent(t, m)));
        let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
        let commits = sent.iter().filter(|n| *n == "commitTransaction").count();
        match sharded {
            false => {
                assert_eq!(commits, 0, "{sent:?}");
                let refused = routing.violations();
                assert!(!refused.is_empty(), "the batched path passed the checker");
            }
            true => {
                // Each `update` (a batch of 250's documents of one kind of
                // change) in a transaction of its own.
                let updates = sent.iter().filter(|n| *n == "update").count();
                assert!(updates >= 3, "{sent:?}");
                assert_eq!(commits, updates, "{sent:?}");
                routing.assert_clean();
                assert!(routing.counts().targeted_writes >= N as usize);
            }
        }
        reports.push((fill.filled, fill.migrated));
    }
    assert_eq!(reports[0], reports[1]);
}
