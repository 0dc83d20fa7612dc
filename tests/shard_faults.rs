//! The shard key repository under faults: millisecond range bounds, a
//! shard key that changed under an upsert or a replace, and documents that
//! another client wrote (missing or mistyped key fields). Every invariant is
//! checked with the raw driver.

use futures::stream::BoxStream;
use mongo_patterns::bson::{Bson, DateTime};
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::TimeRange;
use mongo_patterns::Error;
use mongo_patterns_testkit::bounded;
use std::future::IntoFuture;

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

/// A `DateTime` timestamp, daily.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "events")]
#[shard_key(coarse = "day", from = "at", search = "tenant")]
struct Event {
    #[serde(rename = "_id")]
    id: i64,
    tenant: String,
    at: DateTime,
}

/// A hashed key on a field that is not `_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "sessions")]
#[shard_key(hashed = "user")]
struct Session {
    #[serde(rename = "_id")]
    id: i64,
    user: String,
}

/// Every model's declarations: the fault suites set their validators at
/// `strict` (`testkit::strict_validators`), so that nothing these faults
/// make the repositories write, retry or repair may break the pattern's
/// invariants.
fn declared(db: &Database) -> Vec<mongo_patterns::ensure::Declared> {
    [
        Log::declared(db),
        Event::declared(db),
        Session::declared(db),
    ]
    .concat()
}

/// A fresh database with [`declared`]'s validators at `strict`. A test
/// that stores a broken document on purpose takes the test kit's own
/// `fresh_db`.
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    mongo_patterns_testkit::fresh_db_strict(test, declared).await
}

fn at(s: &str) -> DateTime {
    DateTime::parse_rfc3339_str(s).unwrap()
}

fn log(id: i64, kind: &str, ts: i64) -> Log {
    Log {
        id,
        kind: kind.to_owned(),
        ts,
        msg: format!("log {id}"),
    }
}

/// A read's whole stream.
async fn all<'a, T: Send + 'a>(
    read: impl std::future::IntoFuture<
        Output = mongo_patterns::Result<BoxStream<'a, mongo_patterns::Result<T>>>,
    >,
) -> mongo_patterns::Result<Vec<T>> {
    use futures::TryStreamExt;
    read.await?.try_collect().await
}

async fn raw_all(db: &Database, coll: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    db.collection::<Document>(coll)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// A range that starts within a second excludes that second's earlier
/// logs: the bound on `ts` (epoch seconds) rounds the start up, not down.
#[tokio::test]
async fn range_bounds_are_exact_to_the_millisecond() {
    let (db, _) = fresh_db("shard_faults_range").await;
    let repo = Log::sharded(&db);
    let midnight = at("2024-03-01T00:00:00Z").timestamp_millis() / 1000;
    // 23:59:58, 23:59:59, 00:00:00, 00:00:01.
    let logs: Vec<Log> = (0..4).map(|i| log(i, "app", midnight - 2 + i)).collect();
    bounded(30, repo.insert_many(&logs).into_future())
        .await
        .unwrap();

    let ms = |s: &str| at(s).timestamp_millis();
    let cases = [
        // [23:59:59.500, 00:00:00.500): only 00:00:00.
        (
            "2024-02-29T23:59:59.500Z",
            "2024-03-01T00:00:00.500Z",
            vec![2],
        ),
        // [23:59:59.000, 00:00:00.001): 23:59:59 and 00:00:00.
        (
            "2024-02-29T23:59:59Z",
            "2024-03-01T00:00:00.001Z",
            vec![1, 2],
        ),
        // [23:59:58.001, 23:59:59.000): nothing.
        ("2024-02-29T23:59:58.001Z", "2024-02-29T23:59:59Z", vec![]),
        // [23:59:58.999, 00:00:01.000): 23:59:59 and 00:00:00.
        (
            "2024-02-29T23:59:58.999Z",
            "2024-03-01T00:00:01Z",
            vec![1, 2],
        ),
    ];
    for (start, end, want) in cases {
        let range = TimeRange::between(at(start), at(end));
        let mut got: Vec<i64> = bounded(30, all(repo.find("app", range, doc! {})))
            .await
            .unwrap()
            .iter()
            .map(|l| l.id)
            .collect();
        got.sort();
        // The same answer by hand, with the raw driver: ts * 1000 in range.
        let by_hand: Vec<i64> = raw_all(&db, "logs")
            .await
            .iter()
            .filter(|d| {
                let t = d.get_i64("ts").unwrap() * 1000;
                t >= ms(start) && t < ms(end)
            })
            .map(|d| d.get_i64("_id").unwrap())
            .collect();
        assert_eq!(by_hand, want, "[{start}, {end})");
        assert_eq!(got, want, "[{start}, {end})");
    }

    // `last_days` starts at a millisecond of now: the log one second before
    // it (rounded down to its second) is not in the range.
    let range = loop {
        let r = TimeRange::last_days(1);
        if r.start.timestamp_millis() % 1000 != 0 {
            break r;
        }
    };
    let before = range.start.timestamp_millis().div_euclid(1000);
    bounded(30, repo.insert(&log(10, "web", before)).into_future())
        .await
        .unwrap();
    bounded(30, repo.insert(&log(11, "web", before + 1)).into_future())
        .await
        .unwrap();
    let got: Vec<i64> = bounded(30, all(repo.find("web", range, doc! {})))
        .await
        .unwrap()
        .iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(got, [11], "range starts at {:?}", range.start);
}

/// An upsert or a replace after the timestamp moved to another month: the
/// document moves to its new key, once, and no second document with the
/// same `_id` appears.
#[tokio::test]
async fn key_change_moves_the_document() {
    let (db, commands) = fresh_db("shard_faults_move").await;
    let repo = Log::sharded(&db);
    let oct = at("2021-10-25T03:34:59Z").timestamp_millis() / 1000;
    let nov = oct + 10 * 86_400;
    bounded(30, repo.insert(&log(1, "app", oct)).into_future())
        .await
        .unwrap();

    // The timestamp moved to November: an upsert replaces the document.
    let mut moved = log(1, "app", nov);
    moved.msg = "moved".into();
    let inserted = bounded(30, repo.upsert(&moved).into_future()).await;
    assert!(matches!(inserted, Ok(false)), "{inserted:?}");
    let stored = raw_all(&db, "logs").await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].get_str("msg").ok(), Some("moved"));
    assert_eq!(
        stored[0].get_datetime("month").unwrap(),
        &at("2021-11-01T00:00:00Z")
    );

    // Its type changed too, then back to October: a replace moves it.
    let mut back = log(1, "web", oct);
    back.msg = "back".into();
    commands.take();
    assert!(matches!(
        bounded(30, repo.replace(&back).into_future()).await,
        Ok(true)
    ));
    let sent: Vec<(String, Document)> = commands.take();
    let stored = raw_all(&db, "logs").await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        (
            stored[0].get_str("type").ok(),
            stored[0].get_str("msg").ok()
        ),
        (Some("web"), Some("back"))
    );
    assert_eq!(
        stored[0].get_datetime("month").unwrap(),
        &at("2021-10-01T00:00:00Z")
    );
    // Each write carries the full shard key in its filter: the miss on the
    // new key, the lookup by `_id`, the write on the stored key.
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["update", "find", "update"], "{sent:?}");
    for (_, cmd) in sent.iter().filter(|(n, _)| n == "update") {
        let q = cmd.get_array("updates").unwrap()[0]
            .as_document()
            .unwrap()
            .get_document("q")
            .unwrap();
        let keys: Vec<&str> = q.keys().map(String::as_str).collect();
        assert_eq!(keys, ["_id", "month", "type"], "{q}");
    }
    assert_eq!(
        sent[2].1.get_array("updates").unwrap()[0]
            .as_document()
            .unwrap()
            .get_document("q")
            .unwrap()
            .get_datetime("month")
            .unwrap(),
        &at("2021-11-01T00:00:00Z"),
        "the second write names the stored key"
    );

    // A replace of an `_id` that does not exist is still Ok(false), and
    // writes nothing; an upsert of it inserts.
    assert!(matches!(
        bounded(30, repo.replace(&log(2, "app", oct)).into_future()).await,
        Ok(false)
    ));
    assert_eq!(raw_all(&db, "logs").await.len(), 1);
    assert!(matches!(
        bounded(30, repo.upsert(&log(2, "app", oct)).into_future()).await,
        Ok(true)
    ));
    assert_eq!(raw_all(&db, "logs").await.len(), 2);

    // A hashed key on another field moves the same way.
    let sessions = Session::sharded(&db);
    let s = Session {
        id: 1,
        user: "ann".into(),
    };
    bounded(30, sessions.insert(&s).into_future())
        .await
        .unwrap();
    let s2 = Session {
        id: 1,
        user: "bob".into(),
    };
    assert!(matches!(
        bounded(30, sessions.upsert(&s2).into_future()).await,
        Ok(false)
    ));
    let stored = raw_all(&db, "sessions").await;
    assert_eq!(stored, [doc! {"_id": 1_i64, "user": "bob"}]);

    // A key that is the `_id` cannot change: one command each way.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
    #[model(collection = "tokens")]
    #[shard_key(hashed = "_id")]
    struct Token {
        #[serde(rename = "_id")]
        id: String,
        user: String,
    }
    let tokens = Token::sharded(&db);
    let t = Token {
        id: "t1".into(),
        user: "ann".into(),
    };
    commands.take();
    assert!(matches!(
        bounded(30, tokens.replace(&t).into_future()).await,
        Ok(false)
    ));
    assert!(matches!(
        bounded(30, tokens.upsert(&t).into_future()).await,
        Ok(true)
    ));
    assert!(matches!(
        bounded(30, tokens.upsert(&t).into_future()).await,
        Ok(false)
    ));
    assert!(matches!(
        bounded(30, tokens.replace(&t).into_future()).await,
        Ok(true)
    ));
    assert_eq!(commands.take().len(), 4);
    assert_eq!(raw_all(&db, "tokens").await.len(), 1);
}

/// Documents another client wrote without the coarse field, or with a
/// coarse field that is not its timestamp's month: writes refuse them with
/// `Damaged`, naming the `_id`, and leave them as they are.
#[tokio::test]
async fn damaged_keys_are_refused_by_writes() {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("shard_faults_damaged").await;
    let repo = Log::sharded(&db);
    let raw = db.collection::<Document>("logs");
    let oct = at("2021-10-25T03:34:59Z").timestamp_millis() / 1000;
    let damaged = [
        // No coarse field at all.
        doc! {"_id": 1_i64, "type": "app", "ts": oct, "msg": "no month"},
        // A coarse field that is not a date.
        doc! {"_id": 2_i64, "type": "app", "ts": oct, "month": "2021-10", "msg": "string month"},
        // A coarse field that is not the month of `ts`.
        doc! {"_id": 3_i64, "type": "app", "ts": oct, "month": at("2021-09-01T00:00:00Z"), "msg": "wrong month"},
        // No search field.
        doc! {"_id": 4_i64, "ts": oct, "month": at("2021-10-01T00:00:00Z"), "msg": "no type"},
    ];
    raw.insert_many(damaged.clone()).await.unwrap();
    for d in &damaged {
        let id = d.get_i64("_id").unwrap();
        let item = log(id, "app", oct);
        for (op, r) in [
            (
                "replace",
                bounded(30, repo.replace(&item).into_future())
                    .await
                    .map(|_| ()),
            ),
            (
                "upsert",
                bounded(30, repo.upsert(&item).into_future())
                    .await
                    .map(|_| ()),
            ),
            (
                "update",
                bounded(
                    30,
                    repo.update(
                        DateTime::from_millis(oct * 1000),
                        "app",
                        doc! {"_id": id},
                        doc! {"$set": {"msg": "updated"}},
                    )
                    .into_future(),
                )
                .await
                .map(|_| ()),
            ),
            (
                "delete",
                bounded(
                    30,
                    repo.delete(DateTime::from_millis(oct * 1000), "app", doc! {"_id": id})
                        .into_future(),
                )
                .await
                .map(|_| ()),
            ),
        ] {
            match r {
                Err(Error::Damaged {
                    collection,
                    id: got,
                    field,
                    ..
                }) => {
                    assert_eq!(collection, "logs");
                    assert_eq!(*got, Bson::Int64(id), "{op} {d}");
                    let want = if id == 4 { "type" } else { "month" };
                    assert_eq!(field, want, "{op} {d}");
                }
                other => panic!("{op} of {d}: {other:?}"),
            }
        }
    }
    // Nothing was written: every damaged document is as it was, and no
    // second document appeared.
    assert_eq!(raw_all(&db, "logs").await, damaged);

    // `update` or `delete` naming an `_id` stored under another key: a
    // typed error naming it, not Ok(0).
    bounded(30, repo.insert(&log(5, "web", oct)).into_future())
        .await
        .unwrap();
    let r = bounded(
        30,
        repo.update(
            DateTime::from_millis(oct * 1000),
            "app",
            doc! {"_id": 5_i64},
            doc! {"$set": {"msg": "updated"}},
        )
        .into_future(),
    )
    .await;
    match r {
        Err(Error::ShardKeyMismatch { id, stored, .. }) => {
            assert_eq!(*id, Bson::Int64(5));
            assert_eq!(stored.get_str("type").ok(), Some("web"));
        }
        other => panic!("{other:?}"),
    }
    let five = raw.find_one(doc! {"_id": 5_i64}).await.unwrap().unwrap();
    assert_eq!(five.get_str("msg").ok(), Some("log 5"));
    // Under its own key, the update is made.
    let n = bounded(
        30,
        repo.update(
            DateTime::from_millis(oct * 1000),
            "web",
            doc! {"_id": 5_i64},
            doc! {"$set": {"msg": "updated"}},
        )
        .into_future(),
    )
    .await
    .unwrap();
    assert_eq!(n, 1);
    let r = bounded(
        30,
        repo.delete(
            DateTime::from_millis(oct * 1000),
            "app",
            doc! {"_id": 5_i64},
        )
        .into_future(),
    )
    .await;
    match r {
        Err(Error::ShardKeyMismatch { id, stored, .. }) => {
            assert_eq!(*id, Bson::Int64(5));
            assert_eq!(stored.get_str("type").ok(), Some("web"));
        }
        other => panic!("{other:?}"),
    }
    let five = raw.find_one(doc! {"_id": 5_i64}).await.unwrap();
    assert!(five.is_some(), "a mismatch deletes nothing");
    // Under its own key, the delete is made.
    let n = bounded(
        30,
        repo.delete(
            DateTime::from_millis(oct * 1000),
            "web",
            doc! {"_id": 5_i64},
        )
        .into_future(),
    )
    .await
    .unwrap();
    assert_eq!(n, 1);
    assert_eq!(raw.find_one(doc! {"_id": 5_i64}).await.unwrap(), None);
}

/// A mistyped field: reads give `UnexpectedDocument` naming the `_id`, on
/// every read path.
#[tokio::test]
async fn mistyped_documents_are_named_on_reads() {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("shard_faults_mistyped").await;
    let events = Event::sharded(&db);
    let day = at("2024-03-01T12:00:00Z");
    for id in 0..5 {
        bounded(
            30,
            events
                .insert(&Event {
                    id,
                    tenant: "t1".into(),
                    at: day,
                })
                .into_future(),
        )
        .await
        .unwrap();
    }
    // Another client writes `tenant` as a number in one of them.
    let raw = db.collection::<Document>("events");
    raw.update_one(doc! {"_id": 3_i64}, doc! {"$set": {"tenant": 5}})
        .await
        .unwrap();
    let unexpected = |r: mongo_patterns::Result<Vec<Event>>, what: &str| match r {
        Err(Error::UnexpectedDocument { collection, id, .. }) => {
            assert_eq!(collection, "events", "{what}");
            assert_eq!(*id, Bson::Int64(3), "{what}");
        }
        other => panic!("{what}: {other:?}"),
    };
    unexpected(bounded(30, all(events.scatter(doc! {}))).await, "scatter");
    unexpected(
        bounded(30, all(events.scatter(doc! {"_id": {"$gte": 3_i64}}))).await,
        "scatter from 3",
    );

    let sessions = Session::sharded(&db);
    let raw = db.collection::<Document>("sessions");
    raw.insert_many([
        doc! {"_id": 1_i64, "user": "ann"},
        doc! {"_id": Bson::String("two".into()), "user": "ann"},
    ])
    .await
    .unwrap();
    match bounded(30, all(sessions.find_by_hashed("ann"))).await {
        Err(Error::UnexpectedDocument { id, .. }) => assert_eq!(*id, Bson::from("two")),
        other => panic!("find_by_hashed: {other:?}"),
    }

    // A targeted query that meets a mistyped document: the log's `msg` is
    // a number.
    let logs = Log::sharded(&db);
    let oct = at("2021-10-25T03:34:59Z").timestamp_millis() / 1000;
    bounded(30, logs.insert(&log(1, "app", oct)).into_future())
        .await
        .unwrap();
    db.collection::<Document>("logs")
        .update_one(doc! {"_id": 1_i64}, doc! {"$set": {"msg": 42}})
        .await
        .unwrap();
    let range = TimeRange::between(at("2021-10-01T00:00:00Z"), at("2021-11-01T00:00:00Z"));
    match bounded(30, all(logs.find("app", range, doc! {}))).await {
        Err(Error::UnexpectedDocument { id, .. }) => assert_eq!(*id, Bson::Int64(1)),
        other => panic!("find: {other:?}"),
    }
}

/// A document without the coarse field cannot be found by a targeted
/// query (its key is not in any range); `audit` reports it, by `_id`.
#[tokio::test]
async fn audit_reports_documents_a_targeted_query_cannot_see() {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("shard_faults_audit").await;
    let repo = Log::sharded(&db);
    let oct = at("2021-10-25T03:34:59Z").timestamp_millis() / 1000;
    for id in 0..20 {
        bounded(30, repo.insert(&log(id, "app", oct + id)).into_future())
            .await
            .unwrap();
    }
    let raw = db.collection::<Document>("logs");
    raw.insert_many([
        doc! {"_id": 100_i64, "type": "app", "ts": oct, "msg": "no month"},
        doc! {"_id": 101_i64, "type": "app", "ts": oct, "month": at("2020-01-01T00:00:00Z"), "msg": "wrong month"},
        doc! {"_id": 102_i64, "type": "app", "ts": "noon", "month": at("2021-10-01T00:00:00Z"), "msg": "string ts"},
    ])
    .await
    .unwrap();
    let range = TimeRange::between(at("2021-10-01T00:00:00Z"), at("2021-11-01T00:00:00Z"));
    // What a targeted query sees: the 20 good logs only.
    assert_eq!(
        bounded(30, all(repo.find("app", range, doc! {})))
            .await
            .unwrap()
            .len(),
        20
    );
    let audit = bounded(30, repo.audit(100).into_future()).await.unwrap();
    assert_eq!(audit.scanned, 23);
    let ids: Vec<Bson> = audit
        .damaged
        .iter()
        .map(|e| match e {
            Error::Damaged { id, .. } => (**id).clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, [Bson::Int64(100), Bson::Int64(101), Bson::Int64(102)]);
    let audit = bounded(30, repo.audit(1).into_future()).await.unwrap();
    assert_eq!((audit.damaged.len(), audit.scanned), (1, 23));
}

/// Upserts and replaces that move a document between months, cut at every
/// point by a timeout: each `_id` is stored once, whole (one of the
/// versions written), its coarse field its timestamp's month; the next
/// uncut call completes.
#[tokio::test]
async fn cancelled_moves_leave_one_whole_document() {
    let (db, _) = fresh_db("shard_faults_cancel").await;
    let repo = Log::sharded(&db);
    let raw = db.collection::<Document>("logs");
    let oct = at("2021-10-25T03:34:59Z").timestamp_millis() / 1000;
    let months = [oct, oct + 10 * 86_400, oct + 40 * 86_400];
    let ids = 4_i64;
    // How long an uncut move takes here: the cuts spread over 0–1.5 times it.
    let mut took = Vec::new();
    for i in 0..5 {
        let t = std::time::Instant::now();
        bounded(
            30,
            repo.upsert(&log(99, "app", months[i % 3])).into_future(),
        )
        .await
        .unwrap();
        took.push(t.elapsed());
    }
    raw.delete_one(doc! {"_id": 99_i64}).await.unwrap();
    took.sort();
    let typical = took[0];
    let (mut cut, mut done, mut scale) = (0, 0, typical);
    for round in 0..200_u64 {
        let id = (round % ids as u64) as i64;
        let mut item = log(
            id,
            ["app", "web"][(round / 7 % 2) as usize],
            months[(round % 3) as usize],
        );
        item.msg = format!("round {round}");
        // Cut before, between or after the commands: `scale` follows the
        // machine's speed, so that about half the calls are cut.
        let delay = scale.mul_f64((round * 7919 % 20) as f64 / 13.0);
        let call = async {
            if round % 2 == 0 {
                repo.upsert(&item).await.map(|_| ())
            } else {
                repo.replace(&item).await.map(|_| ())
            }
        };
        match mongo_patterns_testkit::cut_after(delay, call).await {
            Some(r) => {
                r.unwrap();
                done += 1;
                scale = scale.mul_f64(0.9);
            }
            None => {
                cut += 1;
                scale = scale.mul_f64(1.1);
            }
        }
        let stored: Vec<Document> = {
            use futures::TryStreamExt;
            raw.find(doc! {"_id": id})
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap()
        };
        assert!(stored.len() <= 1, "round {round}: {stored:?}");
        for d in &stored {
            let ts = d.get_i64("ts").unwrap();
            let month = mongo_patterns::shard_key::truncate(
                DateTime::from_millis(ts * 1000),
                mongo_patterns::shard_key::Granularity::Month,
            );
            assert_eq!(d.get_datetime("month").unwrap(), &month, "{d}");
            let r: u64 = d.get_str("msg").unwrap()[6..].parse().unwrap();
            assert!(r <= round && r % ids as u64 == id as u64, "{d}");
        }
    }
    assert!(
        cut >= 10 && done >= 10,
        "cut {cut}, done {done}, typical {typical:?}"
    );
    // Uncut calls complete whatever a cut one left.
    for id in 0..ids {
        let mut item = log(id, "admin", months[0]);
        item.msg = "final".into();
        bounded(30, repo.upsert(&item).into_future()).await.unwrap();
        assert!(bounded(30, repo.replace(&item).into_future())
            .await
            .unwrap());
    }
    let all = raw_all(&db, "logs").await;
    assert_eq!(all.len(), ids as usize, "{all:?}");
    assert!(
        all.iter()
            .all(|d| d.get_str("msg").ok() == Some("final")
                && d.get_str("type").ok() == Some("admin"))
    );
    eprintln!("cut {cut} of 200 calls, {done} completed; an uncut move took {typical:?}");
}

/// A server killed (`kill -9`) while upserts move documents between months
/// and search values: a move is one write (the miss and the lookup before
/// it write nothing), so after the restart every `_id` is stored once and
/// whole, at the last version acknowledged or the one in flight, with its
/// coarse field its timestamp's month; the same calls then complete.
#[tokio::test]
async fn crash_during_moves_leaves_one_whole_document() {
    use mongo_patterns_testkit::{client, OwnServer, ServerOptions};
    let server = OwnServer::start(ServerOptions {
        sync_on_commit: true,
        ..ServerOptions::default()
    });
    let (client, _) = client(server.uri()).await;
    let db = client.database("crash");
    mongo_patterns_testkit::strict_validators(&db, declared(&db)).await;
    let repo = Log::sharded(&db);
    let oct = at("2021-10-25T03:34:59Z").timestamp_millis() / 1000;
    let months = [oct, oct + 10 * 86_400, oct + 40 * 86_400];
    let ids = 20_i64;
    let version = move |id: i64, round: i64| {
        let mut l = log(
            id,
            ["app", "web"][(round % 2) as usize],
            months[(round % 3) as usize] + id,
        );
        l.msg = format!("round {round}");
        l
    };
    let first: Vec<Log> = (0..ids).map(|id| version(id, 0)).collect();
    bounded(30, repo.insert_many(&first).into_future())
        .await
        .unwrap();
    // Rounds acknowledged per `_id`, written by the mover.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(vec![0_i64; ids as usize]));
    let mover = {
        let (repo, acked) = (repo.clone(), acked.clone());
        tokio::spawn(async move {
            for round in 1.. {
                for id in 0..ids {
                    if repo.upsert(&version(id, round)).await.is_err() {
                        return round;
                    }
                    acked.lock().unwrap()[id as usize] = round;
                }
            }
            unreachable!()
        })
    };
    // Kill once every `_id` has moved twice, mid-round.
    bounded(60, async {
        while acked.lock().unwrap().iter().any(|r| *r < 2) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(37)).await;
    server.kill();
    let rounds = bounded(60, mover).await.unwrap();
    server.restart();
    let acked = acked.lock().unwrap().clone();
    assert!(rounds >= 3, "the mover ran {rounds} rounds before the kill");
    let stored = bounded(30, raw_all(&db, "logs")).await;
    let got: Vec<i64> = stored.iter().map(|d| d.get_i64("_id").unwrap()).collect();
    assert_eq!(got, (0..ids).collect::<Vec<_>>(), "each `_id` once");
    let mut in_flight = 0;
    for d in &stored {
        let id = d.get_i64("_id").unwrap();
        let round: i64 = d.get_str("msg").unwrap()[6..].parse().unwrap();
        let want = acked[id as usize];
        assert!(
            round == want || round == want + 1,
            "{id}: round {round}, acknowledged {want}"
        );
        in_flight += i64::from(round == want + 1);
        let whole = repo.to_document(&version(id, round)).unwrap();
        assert_eq!(d, &whole, "{id}: one whole version");
    }
    println!(
        "crash after {rounds} rounds of {ids} moves: {} ids stored once each, {in_flight} at the version in flight",
        stored.len()
    );
    // The next calls complete the moves.
    for id in 0..ids {
        bounded(30, repo.upsert(&version(id, 1_000)).into_future())
            .await
            .unwrap();
    }
    let stored = bounded(30, raw_all(&db, "logs")).await;
    assert_eq!(stored.len(), ids as usize);
    assert!(stored
        .iter()
        .all(|d| d.get_str("msg").ok() == Some("round 1000")));
}
