//! The shard key repository inside an application: its writes in a
//! caller's transaction, a race there handed back for the caller's
//! `and_run2` to retry, options reaching the commands, a collection per
//! tenant, and the streams. Every invariant is checked with the raw driver.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::stream::BoxStream;
use futures::TryStreamExt;
use mongo_patterns::action::Options;
use mongo_patterns::bson::{Bson, DateTime};
use mongo_patterns::mongodb::options::{
    ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::TimeRange;
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

/// A hashed key, for `find_by_hashed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "sessions")]
#[shard_key(hashed = "user")]
struct Login {
    #[serde(rename = "_id")]
    id: i64,
    user: String,
}

const OCT: i64 = 1_635_132_899; // 2021-10-25T03:34:59Z
const NOV: i64 = OCT + 10 * 86_400; // 2021-11-04

fn at(s: &str) -> DateTime {
    DateTime::parse_rfc3339_str(s).unwrap()
}

fn log(id: i64, kind: &str, ts: i64, msg: &str) -> Log {
    Log {
        id,
        kind: kind.to_owned(),
        ts,
        msg: msg.to_owned(),
    }
}

fn october() -> TimeRange {
    TimeRange::between(at("2021-10-01T00:00:00Z"), at("2021-11-01T00:00:00Z"))
}

/// A read's whole stream.
async fn all<'a, T: Send + 'a>(
    read: impl IntoFuture<Output = mongo_patterns::Result<BoxStream<'a, mongo_patterns::Result<T>>>>,
) -> mongo_patterns::Result<Vec<T>> {
    read.await?.try_collect().await
}

/// Every stored document of `coll`, by `_id`, with the raw driver.
async fn raw_all(db: &Database, coll: &str) -> Vec<Document> {
    bounded(
        30,
        db.collection::<Document>(coll)
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .into_future(),
    )
    .await
    .unwrap()
    .try_collect()
    .await
    .unwrap()
}

fn month_of(d: &Document) -> DateTime {
    *d.get_datetime("month").unwrap()
}

/// Inside a caller's transaction: `insert`, `upsert` that inserts, `upsert`
/// under an unchanged key, `upsert` that moves the document to another
/// month, `replace`, `update` and `delete`. Aborted: nothing of it is
/// stored, and the deleted document is still there. Committed: all of it
/// is. Every command runs in the transaction.
#[tokio::test]
async fn writes_join_the_callers_transaction() {
    let (db, commands) = fresh_db("shard_app_txn").await;
    db.create_collection("logs").await.unwrap();
    let repo = Log::sharded(&db);
    // Stored before the transaction: 1 (to re-write in place), 2 (to
    // move), 5 (to delete).
    bounded(
        30,
        repo.insert_many(&[
            log(1, "app", OCT, "one"),
            log(2, "app", OCT, "two"),
            log(5, "app", OCT, "five"),
        ])
        .into_future(),
    )
    .await
    .unwrap();
    let before = raw_all(&db, "logs").await;
    let client = db.client().clone();

    for commit in [false, true] {
        let mut s = client.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        commands.take();
        // A write concern set on the action belongs to the transaction
        // there: not sent (the driver would refuse it), and no error.
        let majority = WriteConcern::majority();
        bounded(
            30,
            repo.insert(&log(3, "web", OCT, "three"))
                .write_concern(majority.clone())
                .session(&mut s)
                .into_future(),
        )
        .await
        .unwrap();
        let inserted = bounded(
            30,
            repo.upsert(&log(4, "web", NOV, "four"))
                .session(&mut s)
                .into_future(),
        )
        .await
        .unwrap();
        assert!(inserted, "4 is new: inserted");
        let inserted = bounded(
            30,
            repo.upsert(&log(1, "app", OCT, "one, edited"))
                .write_concern(majority.clone())
                .session(&mut s)
                .into_future(),
        )
        .await
        .unwrap();
        assert!(!inserted, "1 under its own key: replaced");
        let inserted = bounded(
            30,
            repo.upsert(&log(2, "app", NOV, "two, moved"))
                .session(&mut s)
                .into_future(),
        )
        .await
        .unwrap();
        assert!(!inserted, "2 moved to November: replaced, not doubled");
        assert!(bounded(
            30,
            repo.replace(&log(3, "admin", OCT, "three, replaced"))
                .session(&mut s)
                .into_future()
        )
        .await
        .unwrap());
        let n = bounded(
            30,
            repo.update(
                at("2021-11-02T00:00:00Z"),
                "web",
                doc! {"_id": 4},
                doc! {"$set": {"msg": "four, updated"}},
            )
            .session(&mut s)
            .into_future(),
        )
        .await
        .unwrap();
        assert_eq!(n, 1);
        let n = bounded(
            30,
            repo.delete(at("2021-10-25T00:00:00Z"), "app", doc! {"_id": 5})
                .write_concern(majority.clone())
                .session(&mut s)
                .into_future(),
        )
        .await
        .unwrap();
        assert_eq!(n, 1);
        // The transaction's reads see its own writes; a read concern on
        // the action is not sent there either.
        let seen: Vec<i64> = bounded(
            30,
            all(repo
                .scatter(doc! {})
                .read_concern(ReadConcern::majority())
                .session(&mut s)),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.id)
        .collect();
        assert_eq!(seen, [1, 2, 3, 4]);
        let sent = commands.take();
        assert!(sent.len() >= 11, "{sent:?}");
        assert!(sent.iter().any(|(n, _)| n == "delete"), "{sent:?}");
        for (name, cmd) in &sent {
            assert!(cmd.contains_key("lsid"), "{name} outside the session");
            assert_eq!(
                cmd.get_bool("autocommit").ok(),
                Some(false),
                "{name} outside the transaction: {cmd}"
            );
            assert!(!cmd.contains_key("writeConcern"), "{name}: {cmd}");
        }
        let outside = raw_all(&db, "logs").await;
        assert_eq!(outside, before, "nothing visible before the commit");
        if commit {
            bounded(30, s.commit_transaction().into_future())
                .await
                .unwrap();
        } else {
            bounded(30, s.abort_transaction().into_future())
                .await
                .unwrap();
            assert_eq!(
                raw_all(&db, "logs").await,
                before,
                "aborted: nothing, and 5 is still there"
            );
        }
    }
    let stored = raw_all(&db, "logs").await;
    let msgs: Vec<(i64, &str, DateTime)> = stored
        .iter()
        .map(|d| {
            (
                d.get_i64("_id").unwrap(),
                d.get_str("msg").unwrap(),
                month_of(d),
            )
        })
        .collect();
    let (oct, nov) = (at("2021-10-01T00:00:00Z"), at("2021-11-01T00:00:00Z"));
    assert_eq!(
        msgs,
        [
            (1, "one, edited", oct),
            (2, "two, moved", nov),
            (3, "three, replaced", oct),
            (4, "four, updated", nov),
        ]
    );
}

/// A race inside a caller's transaction: after the transaction's first
/// read, another client stores log 7 under October; the transaction's
/// upsert of 7 under November looked it up in its snapshot (absent), and
/// its insert collides. The error carries `TransientTransactionError`, and
/// the repository did not retry on its own.
#[tokio::test]
async fn race_in_callers_transaction_is_transient() {
    let (db, commands) = fresh_db("shard_app_race").await;
    db.create_collection("logs").await.unwrap();
    let repo = Log::sharded(&db);
    let raw = db.collection::<Document>("logs");
    let client = db.client().clone();
    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    // The transaction's snapshot starts at its first read.
    let seen = bounded(30, all(repo.scatter(doc! {}).session(&mut s)))
        .await
        .unwrap();
    assert!(seen.is_empty());
    bounded(
        30,
        raw.insert_one(repo.to_document(&log(7, "app", OCT, "theirs")).unwrap())
            .into_future(),
    )
    .await
    .unwrap();
    commands.take();
    let err = bounded(
        30,
        repo.upsert(&log(7, "app", NOV, "ours"))
            .session(&mut s)
            .into_future(),
    )
    .await
    .unwrap_err();
    let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
    println!(
        "race in a transaction: {err:?}; code {:?}; sent {sent:?}",
        err.code()
    );
    assert!(err.is_transient(), "{err:?}");
    // The miss, the lookup, the insert: no round repeated.
    assert!(sent.len() <= 3, "{sent:?}");
    let _ = bounded(30, s.abort_transaction().into_future()).await;
    let stored = raw_all(&db, "logs").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].get_str("msg").unwrap(), "theirs");
}

/// The same race under the caller's `and_run2`, with `?` on the
/// repository's actions: the first attempt loses, the driver runs the
/// closure again, and the second attempt moves 8 to November and commits.
#[tokio::test]
async fn and_run2_retries_a_lost_race_and_commits() {
    let (db, _) = fresh_db("shard_app_run2").await;
    db.create_collection("logs").await.unwrap();
    let repo = Log::sharded(&db);
    let raw = db.collection::<Document>("logs");
    let client = db.client().clone();
    let mut s = client.start_session().await.unwrap();
    let attempts = AtomicUsize::new(0);
    let first_error = std::sync::Mutex::new(None::<String>);
    let run = s.start_transaction().and_run2(async |s| {
        let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let seen = all(repo.scatter(doc! {"_id": 8}).session(s)).await?;
        if attempt == 1 {
            assert!(seen.is_empty());
            raw.insert_one(repo.to_document(&log(8, "app", OCT, "theirs"))?)
                .await?;
        }
        let r = repo.upsert(&log(8, "app", NOV, "ours")).session(s).await;
        if let Err(e) = &r {
            *first_error.lock().unwrap() = Some(format!("{e:?}"));
        }
        r?;
        repo.insert(&log(9, "web", NOV, "also ours"))
            .session(s)
            .await?;
        Ok(())
    });
    bounded(60, run).await.unwrap();
    println!(
        "and_run2: {} attempts; the first failed with {:?}",
        attempts.load(Ordering::SeqCst),
        first_error.lock().unwrap()
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    let stored = raw_all(&db, "logs").await;
    let got: Vec<(i64, &str, DateTime)> = stored
        .iter()
        .map(|d| {
            (
                d.get_i64("_id").unwrap(),
                d.get_str("msg").unwrap(),
                month_of(d),
            )
        })
        .collect();
    let nov = at("2021-11-01T00:00:00Z");
    assert_eq!(got, [(8, "ours", nov), (9, "also ours", nov)]);
}

/// Every command the repository sends carries the options that apply:
/// the write concern on every write (`insert`, `update`, `createIndexes`,
/// and `enableSharding`, which goes through `run_command`), `comment` on
/// all, `maxTimeMS` where the command takes it; read concern and read
/// preference on reads. Repository defaults apply under the action's own.
#[tokio::test]
async fn options_reach_every_command() {
    let (db, commands) = fresh_db("shard_app_options").await;
    // On a sharded cluster (CI's mongos job) `ensure_sharded` shards, with
    // a `shardCollection` after `enableSharding`; elsewhere the server
    // refuses `enableSharding`.
    let sharded_cluster = mongo_patterns_testkit::is_mongos(db.client()).await;
    let repo = Log::sharded(&db);
    let ms = std::time::Duration::from_millis(4_000);
    let wc = WriteConcern::majority();
    commands.take();
    bounded(
        30,
        repo.insert(&log(1, "app", OCT, "a"))
            .write_concern(wc.clone())
            .comment("c")
            .max_time(ms)
            .into_future(),
    )
    .await
    .unwrap();
    bounded(
        30,
        repo.insert_many(&[log(2, "app", OCT, "b"), log(3, "web", OCT, "c")])
            .write_concern(wc.clone())
            .comment("c")
            .into_future(),
    )
    .await
    .unwrap();
    // A move: update (miss), find (lookup), update.
    assert!(bounded(
        30,
        repo.replace(&log(1, "app", NOV, "a, moved"))
            .write_concern(wc.clone())
            .comment("c")
            .max_time(ms)
            .into_future()
    )
    .await
    .unwrap());
    // An insert: update (miss), find (lookup), update (upsert).
    assert!(bounded(
        30,
        repo.upsert(&log(4, "app", OCT, "d"))
            .write_concern(wc.clone())
            .comment("c")
            .max_time(ms)
            .into_future()
    )
    .await
    .unwrap());
    // A miss by `_id`: update, find.
    let err = bounded(
        30,
        repo.update(
            at("2021-10-02T00:00:00Z"),
            "app",
            doc! {"_id": 1},
            doc! {"$set": {"x": 1}},
        )
        .write_concern(wc.clone())
        .comment("c")
        .max_time(ms)
        .into_future(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::ShardKeyMismatch { .. }), "{err:?}");
    let sharding = bounded(
        30,
        repo.ensure_sharded()
            .write_concern(wc.clone())
            .comment("c")
            .max_time(ms)
            .into_future(),
    )
    .await;
    if sharded_cluster {
        sharding.unwrap();
    } else {
        let err = sharding.unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotSharded {
                    command: "enableSharding",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    let sent = commands.take();
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec![
        "insert",
        "insert",
        "update",
        "find",
        "update",
        "update",
        "find",
        "update",
        "update",
        "find",
        "createIndexes",
        "enableSharding",
    ];
    if sharded_cluster {
        want.push("shardCollection");
    }
    assert_eq!(names, want);
    let admin = ["createIndexes", "enableSharding", "shardCollection"];
    for (name, cmd) in &sent {
        assert_eq!(cmd.get("comment"), Some(&Bson::from("c")), "{name}: {cmd}");
        let writes = [
            "insert",
            "update",
            "createIndexes",
            "enableSharding",
            "shardCollection",
        ];
        if writes.contains(&name.as_str()) {
            assert_eq!(
                cmd.get_document("writeConcern").ok(),
                Some(&doc! {"w": "majority"}),
                "{name}: {cmd}"
            );
        } else {
            assert!(!cmd.contains_key("writeConcern"), "{name}: {cmd}");
        }
    }
    // `maxTimeMS` where the driver gives the command one: the lookups, the
    // index and the admin commands (not `insert` and `update`, which take
    // none in the driver).
    for (name, cmd) in sent
        .iter()
        .filter(|(n, _)| n == "find" || admin.contains(&n.as_str()))
    {
        assert_eq!(
            cmd.get_i64("maxTimeMS")
                .ok()
                .or(cmd.get_i32("maxTimeMS").ok().map(i64::from)),
            Some(4_000),
            "{name}: {cmd}"
        );
    }

    // Reads: read concern, read preference, comment and maxTimeMS on the
    // `find` of `find`, `scatter`, `find_by_hashed` and `audit`, and on
    // `analyze`'s `aggregate`; a read preference set on a read never
    // reaches the lookup of a write (it decides the write: primary).
    let pref = SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
        options: Default::default(),
    });
    let logins = Login::sharded(&db);
    commands.take();
    let got = bounded(
        30,
        all(repo
            .find("app", october(), doc! {})
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms)),
    )
    .await
    .unwrap();
    assert_eq!(got.len(), 2);
    bounded(
        30,
        all(repo
            .scatter(doc! {})
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms)),
    )
    .await
    .unwrap();
    bounded(
        30,
        all(logins
            .find_by_hashed("ann")
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms)),
    )
    .await
    .unwrap();
    bounded(
        30,
        repo.audit(10)
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms)
            .into_future(),
    )
    .await
    .unwrap();
    bounded(
        30,
        repo.analyze(&["type"], 10)
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms)
            .into_future(),
    )
    .await
    .unwrap();
    let sent = commands.take();
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["find", "find", "find", "find", "aggregate"]);
    for (name, cmd) in &sent {
        assert_eq!(
            cmd.get_document("$readPreference").ok(),
            Some(&doc! {"mode": "secondaryPreferred"}),
            "{name}: {cmd}"
        );
        assert_eq!(
            cmd.get_document("readConcern").ok(),
            Some(&doc! {"level": "majority"}),
            "{name}: {cmd}"
        );
        assert_eq!(cmd.get("comment"), Some(&Bson::from("r")), "{name}: {cmd}");
        assert!(cmd.contains_key("maxTimeMS"), "{name}: {cmd}");
    }

    // Repository defaults, under the action's own: a read preference among
    // them reaches reads but not a write's lookup; a comment set on the
    // action wins.
    let tuned = repo.clone().with_options(
        Options::new()
            .write_concern(WriteConcern::majority())
            .selection_criteria(pref.clone())
            .comment("default"),
    );
    commands.take();
    bounded(30, tuned.upsert(&log(5, "web", OCT, "e")).into_future())
        .await
        .unwrap();
    bounded(30, all(tuned.scatter(doc! {}).comment("mine")))
        .await
        .unwrap();
    let sent = commands.take();
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["update", "find", "update", "find"]);
    for (name, cmd) in &sent[..3] {
        assert_eq!(cmd.get("comment"), Some(&Bson::from("default")), "{name}");
        // (The driver sends `primaryPreferred` on every command to a
        // directly connected server; the point is that ours is not sent.)
        assert_ne!(
            cmd.get_document("$readPreference").ok(),
            Some(&doc! {"mode": "secondaryPreferred"}),
            "{name}: {cmd}"
        );
    }
    assert_eq!(
        sent[0].1.get_document("writeConcern").ok(),
        Some(&doc! {"w": "majority"})
    );
    assert_eq!(
        sent[2].1.get_document("writeConcern").ok(),
        Some(&doc! {"w": "majority"})
    );
    assert_eq!(sent[3].1.get("comment"), Some(&Bson::from("mine")));
    assert_eq!(
        sent[3].1.get_document("$readPreference").ok(),
        Some(&doc! {"mode": "secondaryPreferred"})
    );
}

/// `w: 0` reaches every write: the driver (3.x) refuses an unacknowledged
/// write concern on every operation it builds, before sending anything, so
/// each write action fails with the driver's own error and nothing is
/// stored. Had the repository dropped the option, the write would succeed.
#[tokio::test]
async fn unacknowledged_write_concern_reaches_the_driver() {
    let (db, commands) = fresh_db("shard_app_w0").await;
    let repo = Log::sharded(&db);
    bounded(30, repo.insert(&log(1, "app", OCT, "a")).into_future())
        .await
        .unwrap();
    let w0 = || WriteConcern::nodes(0);
    let refused = |r: mongo_patterns::Result<()>, what: &str| match r {
        Err(e) => {
            let driver = e.mongo().unwrap_or_else(|| panic!("{what}: {e:?}"));
            assert!(
                matches!(&*driver.kind, mongo_patterns::mongodb::error::ErrorKind::InvalidArgument { message, .. }
                    if message.contains("Unacknowledged")),
                "{what}: {driver:?}"
            );
        }
        Ok(()) => panic!("{what}: w: 0 was dropped"),
    };
    commands.take();
    refused(
        bounded(
            30,
            repo.insert(&log(2, "app", OCT, "b"))
                .write_concern(w0())
                .into_future(),
        )
        .await,
        "insert",
    );
    refused(
        bounded(
            30,
            repo.insert_many(&[log(3, "app", OCT, "c")])
                .write_concern(w0())
                .into_future(),
        )
        .await,
        "insert_many",
    );
    refused(
        bounded(
            30,
            repo.upsert(&log(1, "app", NOV, "moved"))
                .write_concern(w0())
                .into_future(),
        )
        .await
        .map(|_| ()),
        "upsert",
    );
    refused(
        bounded(
            30,
            repo.replace(&log(1, "app", OCT, "x"))
                .write_concern(w0())
                .into_future(),
        )
        .await
        .map(|_| ()),
        "replace",
    );
    refused(
        bounded(
            30,
            repo.update(
                at("2021-10-02T00:00:00Z"),
                "app",
                doc! {},
                doc! {"$set": {"x": 1}},
            )
            .write_concern(w0())
            .into_future(),
        )
        .await
        .map(|_| ()),
        "update",
    );
    refused(
        bounded(30, repo.ensure_sharded().write_concern(w0()).into_future()).await,
        "ensure_sharded",
    );
    // A repository default of w: 0 as well.
    let tuned = repo
        .clone()
        .with_options(Options::new().write_concern(w0()));
    refused(
        bounded(30, tuned.insert(&log(4, "app", OCT, "d")).into_future()).await,
        "insert, default",
    );
    assert_eq!(commands.take_count(), 0, "nothing sent");
    let stored = raw_all(&db, "logs").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].get_str("msg").unwrap(), "a");
    let indexes = bounded(
        30,
        db.collection::<Document>("logs")
            .list_index_names()
            .into_future(),
    )
    .await
    .unwrap();
    assert_eq!(indexes, ["_id_"]);
}

/// Two tenants, one collection each, from one model: no write, read,
/// move, audit or index of one reaches the other.
#[tokio::test]
async fn tenants_in_their_own_collections() {
    let (db, commands) = fresh_db("shard_app_tenants").await;
    let a = Log::sharded(&db).with_collection("logs_a");
    let b = Log::sharded(&db).with_collection("logs_b");
    assert_eq!(a.collection().name(), "logs_a");
    bounded(
        30,
        a.insert_many(&[log(1, "app", OCT, "a1"), log(2, "app", OCT, "a2")])
            .into_future(),
    )
    .await
    .unwrap();
    bounded(30, b.insert(&log(1, "app", OCT, "b1")).into_future())
        .await
        .unwrap();
    // The same `_id` in b: a's upsert moves a's document only.
    assert!(
        !bounded(30, a.upsert(&log(1, "app", NOV, "a1, moved")).into_future())
            .await
            .unwrap()
    );
    assert!(
        bounded(30, b.upsert(&log(2, "web", OCT, "b2")).into_future())
            .await
            .unwrap()
    );
    let ids = |v: Vec<Log>| v.into_iter().map(|l| (l.id, l.msg)).collect::<Vec<_>>();
    let in_a = ids(bounded(30, all(a.find("app", october(), doc! {})))
        .await
        .unwrap());
    let in_b = ids(bounded(30, all(b.find("app", october(), doc! {})))
        .await
        .unwrap());
    assert_eq!(in_a, [(2, "a2".to_owned())]);
    assert_eq!(in_b, [(1, "b1".to_owned())]);
    let raw_a: Vec<String> = raw_all(&db, "logs_a")
        .await
        .iter()
        .map(|d| d.get_str("msg").unwrap().to_owned())
        .collect();
    let raw_b: Vec<String> = raw_all(&db, "logs_b")
        .await
        .iter()
        .map(|d| d.get_str("msg").unwrap().to_owned())
        .collect();
    assert_eq!(raw_a, ["a1, moved", "a2"]);
    assert_eq!(raw_b, ["b1", "b2"]);
    assert!(
        raw_all(&db, "logs").await.is_empty(),
        "the default is unused"
    );

    // Damage in b is named in b, and a's audit does not see it.
    db.collection::<Document>("logs_b")
        .update_one(doc! {"_id": 1}, doc! {"$unset": {"month": ""}})
        .await
        .unwrap();
    let audit_a = bounded(30, a.audit(10).into_future()).await.unwrap();
    let audit_b = bounded(30, b.audit(10).into_future()).await.unwrap();
    assert_eq!((audit_a.scanned, audit_a.damaged.len()), (2, 0));
    assert_eq!((audit_b.scanned, audit_b.damaged.len()), (2, 1));
    assert!(
        matches!(&audit_b.damaged[0], Error::Damaged { collection, .. } if collection == "logs_b"),
        "{:?}",
        audit_b.damaged
    );

    // What each declares and shards is its own collection.
    assert_eq!(a.declared()[0].collection, "logs_a");
    assert_eq!(
        b.shard_commands()[2],
        doc! {"shardCollection": format!("{}.logs_b", db.name()), "key": {"month": 1, "type": 1}}
    );
    assert!(a.mongosh_script().contains("getCollection(\"logs_a\")"));
    let (probe, _) = mongo_patterns_testkit::client(&mongo_patterns_testkit::server_uri()).await;
    let sharded_cluster = mongo_patterns_testkit::is_mongos(&probe).await;
    commands.take();
    let done = bounded(30, a.ensure_sharded().into_future()).await;
    if sharded_cluster {
        // A sharded cluster (CI's mongos job): it shards.
        done.unwrap();
    } else {
        let err = done.unwrap_err();
        assert!(matches!(err, Error::NotSharded { .. }), "{err:?}");
    }
    let sent = commands.take();
    assert_eq!(sent[0].1.get_str("createIndexes").ok(), Some("logs_a"));
    let idx = |c: &str| {
        let c = db.collection::<Document>(c);
        async move { c.list_index_names().await.unwrap() }
    };
    assert!(idx("logs_a")
        .await
        .contains(&"mp_shard_month_type".to_owned()));
    assert!(!idx("logs_b")
        .await
        .contains(&"mp_shard_month_type".to_owned()));
}

/// The streams give what the collected reads gave: every matching
/// document, as the raw driver finds it with the same filter, across
/// several batches (`getMore`), with and without a session; in a session
/// every `getMore` runs in it.
#[tokio::test]
async fn streams_return_the_same_items() {
    let (db, commands) = fresh_db("shard_app_stream").await;
    let repo = Log::sharded(&db);
    let items: Vec<Log> = (0..600)
        .map(|i| {
            let kind = if i % 5 == 0 { "web" } else { "app" };
            log(i, kind, OCT - 20 * 86_400 + i * 3_600, &format!("log {i}"))
        })
        .collect();
    bounded(30, repo.insert_many(&items).into_future())
        .await
        .unwrap();
    let range = TimeRange::between(at("2021-10-01T00:00:00Z"), at("2021-10-20T00:00:00Z"));
    let filter = repo.targeted_filter("app", range).unwrap();
    let mut by_driver: Vec<Log> = bounded(30, Log::collection(&db).find(filter).into_future())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    by_driver.sort_by_key(|l| l.id);
    let by_hand: Vec<&Log> = items
        .iter()
        .filter(|l| {
            l.kind == "app"
                && l.ts * 1000 >= range.start.timestamp_millis()
                && l.ts * 1000 < range.end.timestamp_millis()
        })
        .collect();
    assert!(
        by_hand.len() > 200,
        "more than one batch: {}",
        by_hand.len()
    );
    assert_eq!(by_driver.iter().collect::<Vec<_>>(), by_hand);

    let mut plain = bounded(30, all(repo.find("app", range, doc! {})))
        .await
        .unwrap();
    plain.sort_by_key(|l| l.id);
    assert_eq!(plain, by_driver);

    let client = db.client().clone();
    let mut s = client.start_session().await.unwrap();
    commands.take();
    let mut in_session = bounded(30, all(repo.find("app", range, doc! {}).session(&mut s)))
        .await
        .unwrap();
    in_session.sort_by_key(|l| l.id);
    assert_eq!(in_session, by_driver);
    let sent = commands.take();
    assert!(sent.iter().any(|(n, _)| n == "getMore"), "one batch only");
    let lsid = sent[0].1.get_document("lsid").unwrap().clone();
    for (name, cmd) in &sent {
        assert_eq!(cmd.get_document("lsid").ok(), Some(&lsid), "{name}");
    }

    // The whole collection by scatter, in order as stored, equals the raw
    // driver's; a stream can stop early, and the session is free again
    // once it is dropped.
    let mut scattered = bounded(30, all(repo.scatter(doc! {}).session(&mut s)))
        .await
        .unwrap();
    scattered.sort_by_key(|l| l.id);
    assert_eq!(scattered, items);
    {
        let mut stream = bounded(30, repo.scatter(doc! {}).session(&mut s).into_future())
            .await
            .unwrap();
        let first = bounded(30, stream.try_next()).await.unwrap();
        assert!(first.is_some());
    }
    let n = bounded(30, all(repo.find("web", range, doc! {}).session(&mut s)))
        .await
        .unwrap()
        .len();
    assert_eq!(
        n,
        items
            .iter()
            .filter(|l| l.kind == "web"
                && l.ts * 1000 >= range.start.timestamp_millis()
                && l.ts * 1000 < range.end.timestamp_millis())
            .count()
    );

    // find_by_hashed, with and without a session.
    let logins = Login::sharded(&db);
    bounded(
        30,
        logins
            .insert_many(&[
                Login {
                    id: 1,
                    user: "ann".into(),
                },
                Login {
                    id: 2,
                    user: "bob".into(),
                },
                Login {
                    id: 3,
                    user: "ann".into(),
                },
            ])
            .into_future(),
    )
    .await
    .unwrap();
    let mut ann = bounded(30, all(logins.find_by_hashed("ann")))
        .await
        .unwrap();
    ann.sort_by_key(|l| l.id);
    let mut ann_s = bounded(30, all(logins.find_by_hashed("ann").session(&mut s)))
        .await
        .unwrap();
    ann_s.sort_by_key(|l| l.id);
    assert_eq!(ann, ann_s);
    assert_eq!(ann.iter().map(|l| l.id).collect::<Vec<_>>(), [1, 3]);
}

/// 16 callers' transactions at once, each upserting the same new `_id`
/// under its own key and inserting a log of its own, through `and_run2`
/// with `?`, all at once: whatever each loses (a write conflict, a duplicate key) is
/// transient, every transaction commits, and one document holds the `_id`.
#[tokio::test]
async fn contention_sixteen_transactions_on_one_id() {
    let (db, _) = fresh_db("shard_app_sixteen").await;
    db.create_collection("logs").await.unwrap();
    let repo = Log::sharded(&db);
    let attempts = std::sync::Arc::new(AtomicUsize::new(0));
    let lost = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..16_i64)
        .map(|i| {
            let repo = repo.clone();
            let client = db.client().clone();
            let attempts = attempts.clone();
            let lost = lost.clone();
            async move {
                let mut s = client.start_session().await?;
                let ts = OCT + (i % 4) * 40 * 86_400; // four months
                let kind = ["app", "web"][(i % 2) as usize];
                s.start_transaction()
                    .and_run2(async |s| {
                        attempts.fetch_add(1, Ordering::SeqCst);
                        let mine = log(42, kind, ts, &format!("task {i}"));
                        let r = repo.upsert(&mine).session(s).await;
                        if let Err(e) = &r {
                            lost.lock().unwrap().push((e.code(), e.is_transient()));
                        }
                        r?;
                        repo.insert(&log(100 + i, "app", ts, "own"))
                            .session(s)
                            .await?;
                        Ok(())
                    })
                    .await
            }
        })
        .collect();
    // Concurrent on the server, polled on this task (the driver's
    // `and_run2` closure is not `Send` under `tokio::spawn` yet).
    for r in bounded(60, futures::future::join_all(tasks)).await {
        r.unwrap();
    }
    let stored = raw_all(&db, "logs").await;
    let ids: Vec<i64> = stored.iter().map(|d| d.get_i64("_id").unwrap()).collect();
    let want: Vec<i64> = std::iter::once(42).chain(100..116).collect();
    assert_eq!(ids, want);
    let attempts = attempts.load(Ordering::SeqCst);
    let lost = lost.lock().unwrap().clone();
    let mut codes: Vec<Option<i32>> = lost.iter().map(|(c, _)| *c).collect();
    codes.sort();
    codes.dedup();
    println!(
        "16 transactions: {attempts} attempts, {} upserts lost, codes {codes:?}",
        lost.len()
    );
    assert!(attempts >= 16);
    assert!(lost.iter().all(|(_, transient)| *transient), "{lost:?}");
    // The winner's document is whole: its key is its own timestamp's.
    let winner = &stored[0];
    let ts = winner.get_i64("ts").unwrap();
    assert_eq!(
        month_of(winner),
        mongo_patterns::shard_key::truncate(
            DateTime::from_millis(ts * 1000),
            mongo_patterns::shard_key::Granularity::Month
        )
    );
}
