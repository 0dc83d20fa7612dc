//! The shard key repository against a real MongoDB-wire server (which does
//! not shard: routing is checked on the commands sent, and `ensure_sharded`
//! must say so).

use futures::TryStreamExt;
use mongo_patterns::bson::{Bson, DateTime};
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::TimeRange;
use mongo_patterns::Error;
use mongo_patterns_testkit::client;

/// A fresh database ([`mongo_patterns_testkit::fresh_db`]), with the shard
/// keys this suite's models declare given to the routing checker, which
/// `MP_ROUTING=strict` turns on for every test (see `scripts/test`).
/// In CI's mongos job (`MP_SHARD_PATTERN_COLLECTIONS=1`) the collections
/// they declare a shard key for are sharded on it through `ensure` first
/// ([`mongo_patterns_testkit::shard_declared`]).
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    let (db, commands) = mongo_patterns_testkit::fresh_db(test).await;
    let declared: Vec<_> = Log::declared(&db)
        .into_iter()
        .chain(Event::declared(&db))
        .chain(Session::declared(&db))
        .collect();
    mongo_patterns_testkit::routing::declare(declared.clone());
    mongo_patterns_testkit::shard_declared(&db, &commands, declared).await;
    (db, commands)
}

/// An application log, `ts` in epoch seconds; `month` is derived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: ObjectId,
    uuid: String,
    #[serde(rename = "type")]
    kind: String,
    level: String,
    ts: i64,
    msg: String,
}

/// A `DateTime` timestamp, weekly, the derived field read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "events")]
#[shard_key(coarse = "week", from = "at", search = "tenantId")]
struct Event {
    #[serde(rename = "_id")]
    id: i64,
    tenant_id: String,
    at: DateTime,
    #[serde(default)]
    week: Option<DateTime>,
}

/// A hashed key, chosen explicitly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "sessions")]
#[shard_key(hashed = "_id")]
struct Session {
    #[serde(rename = "_id")]
    id: String,
    user: String,
}

const SAMPLE_TS: i64 = 1_635_132_899; // 2021-10-25T03:34:59Z

fn at(s: &str) -> DateTime {
    DateTime::parse_rfc3339_str(s).unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `n` logs over 24 months from 2021-01-01, in ts order, types 80/15/5.
fn logs(n: usize, seed: u64) -> Vec<Log> {
    let mut rng = Rng(seed);
    let start = 1_609_459_200_i64; // 2021-01-01
    let span = 2 * 365 * 86_400_i64;
    (0..n)
        .map(|i| {
            let r = rng.next() % 100;
            let kind = if r < 80 {
                "app"
            } else if r < 95 {
                "web"
            } else {
                "admin"
            };
            // In insertion order, always: `ObjectId::new()`'s counter
            // starts at random and wraps at 2^24, which reordered the
            // analyser's "insertion order" in one CI run in many.
            let mut id = [0_u8; 12];
            id[..4].copy_from_slice(&1_700_000_000_u32.to_be_bytes());
            id[8..].copy_from_slice(&(i as u32).to_be_bytes());
            Log {
                id: ObjectId::from_bytes(id),
                uuid: format!("{:016x}{:016x}", rng.next(), rng.next()),
                kind: kind.to_owned(),
                level: if r.is_multiple_of(2) { "high" } else { "low" }.to_owned(),
                ts: start + span * i as i64 / n as i64,
                msg: format!("event {i}"),
            }
        })
        .collect()
}

#[tokio::test]
async fn derived_field_filled_on_every_write() {
    let (db, commands) = fresh_db("shard_derived").await;
    let repo = Log::sharded(&db);
    let log = Log {
        id: ObjectId::new(),
        uuid: "4df16cf0-2699-410f-a07e-ca0bc3d3e153".into(),
        kind: "app".into(),
        level: "high".into(),
        ts: SAMPLE_TS,
        msg: "Database crash".into(),
    };
    repo.insert(&log).await.unwrap();
    let raw = db
        .collection::<Document>("logs")
        .find_one(doc! {"_id": log.id})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        raw.get_datetime("month").unwrap(),
        &at("2021-10-01T00:00:00Z")
    );

    // An upsert filters on the full shard key and the `_id`, and fills the
    // field again (the log moved to November): the miss looks up the
    // stored key and replaces the document under it.
    let mut moved = log.clone();
    moved.ts = SAMPLE_TS + 10 * 86_400;
    commands.take();
    assert!(
        repo.replace(&moved).await.unwrap(),
        "the key changed: moved"
    );
    assert!(!repo.upsert(&log).await.unwrap(), "it exists: replaced");
    let sent = commands.take();
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["update", "find", "update", "update", "find", "update"]
    );
    for (_, cmd) in sent.iter().filter(|(n, _)| n == "update") {
        let q = cmd.get_array("updates").unwrap()[0]
            .as_document()
            .unwrap()
            .get_document("q")
            .unwrap()
            .clone();
        let keys: Vec<&str> = q.keys().map(String::as_str).collect();
        assert_eq!(keys, ["_id", "month", "type"], "{q}");
    }
    assert_eq!(
        Log::collection(&db)
            .find_one(doc! {})
            .await
            .unwrap()
            .unwrap(),
        log,
        "reads back as written"
    );

    // insert_many, and a DateTime timestamp read back through its slot.
    let events = Event::sharded(&db);
    events
        .insert_many(&[
            Event {
                id: 1,
                tenant_id: "t1".into(),
                at: at("2024-02-29T23:59:59Z"),
                week: None,
            },
            Event {
                id: 2,
                tenant_id: "t1".into(),
                at: at("2024-03-04T00:00:00Z"),
                week: None,
            },
        ])
        .await
        .unwrap();
    let weeks: Vec<Option<DateTime>> = Event::collection(&db)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .map_ok(|e| e.week)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        weeks,
        [
            Some(at("2024-02-26T00:00:00Z")),
            Some(at("2024-03-04T00:00:00Z"))
        ]
    );
}

#[tokio::test]
async fn targeted_queries_carry_the_key_prefix() {
    let (db, commands) = fresh_db("shard_targeted").await;
    let repo = Log::sharded(&db);
    let all = logs(3_000, 7);
    repo.insert_many(&all).await.unwrap();

    // "Type app, October 2022": the month and the type, then the exact ts.
    let range = TimeRange::between(at("2022-10-01T00:00:00Z"), at("2022-11-01T00:00:00Z"));
    commands.take();
    let got: Vec<Log> = repo
        .find("app", range, doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let sent: Vec<_> = commands
        .take()
        .into_iter()
        .filter(|(name, _)| name != "getMore")
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "find");
    let filter = sent[0].1.get_document("filter").unwrap();
    assert_eq!(
        filter.get_document("month").unwrap(),
        &doc! {"$gte": at("2022-10-01T00:00:00Z"), "$lte": at("2022-10-01T00:00:00Z")}
    );
    assert_eq!(filter.get_str("type").ok(), Some("app"));
    let (lo, hi) = (1_664_582_400, 1_667_260_800);
    let want: Vec<&Log> = all
        .iter()
        .filter(|l| l.kind == "app" && l.ts >= lo && l.ts < hi)
        .collect();
    assert!(!want.is_empty());
    assert_eq!(got.len(), want.len());
    assert!(got
        .iter()
        .all(|l| l.kind == "app" && l.ts >= lo && l.ts < hi));

    // A range across months names each month it spans, as one range.
    let f = repo
        .targeted_filter(
            "web",
            TimeRange::between(at("2022-10-15T00:00:00Z"), at("2022-12-02T00:00:00Z")),
        )
        .unwrap();
    assert_eq!(
        f.get_document("month").unwrap(),
        &doc! {"$gte": at("2022-10-01T00:00:00Z"), "$lte": at("2022-12-01T00:00:00Z")}
    );
    assert!(matches!(
        repo.targeted_filter(
            "web",
            TimeRange::between(at("2022-10-15T00:00:00Z"), at("2022-10-15T00:00:00Z"))
        ),
        Err(Error::InvalidArgument { .. })
    ));

    // Anything else is a scatter, by name.
    let errors: Vec<Log> = repo
        .scatter(doc! {"msg": "event 5"})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(errors.len(), 1);

    // Updates name the key's values and cannot change them.
    let n = repo
        .update(
            at("2022-10-20T00:00:00Z"),
            "app",
            doc! {"ts": {"$gte": lo, "$lt": hi}},
            doc! {"$set": {"level": "reviewed"}},
        )
        .await
        .unwrap();
    assert_eq!(n, want.len() as u64);
    let err = repo
        .update(
            at("2022-10-20T00:00:00Z"),
            "app",
            doc! {},
            doc! {"$set": {"type": "web"}},
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { name: "update", .. }),
        "{err:?}"
    );

    // A hashed key routes by its value.
    let sessions = Session::sharded(&db);
    sessions
        .insert(&Session {
            id: "s1".into(),
            user: "u".into(),
        })
        .await
        .unwrap();
    let found: Vec<Session> = sessions
        .find_by_hashed("s1")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(sessions.shard_spec(), doc! {"_id": "hashed"});
}

/// A delete names the key's values, as an update does: one `delete`
/// (`deleteMany`) whose filter starts with the month and the type, so
/// `mongos` sends it to one shard; it removes what matches within that
/// key value and nothing under another.
#[tokio::test]
async fn delete_stays_within_one_key_value() {
    let (db, commands) = fresh_db("shard_delete").await;
    let repo = Log::sharded(&db);
    let all = logs(1_200, 13);
    repo.insert_many(&all).await.unwrap();
    // October 2022.
    let (lo, hi) = (1_664_582_400, 1_667_260_800);
    let october = |l: &Log| l.ts >= lo && l.ts < hi;
    let count = |kind: &str, in_october: bool| {
        all.iter()
            .filter(|l| l.kind == kind && l.level == "high" && october(l) == in_october)
            .count() as u64
    };
    let want = count("app", true);
    assert!(want > 0 && count("app", false) > 0 && count("web", true) > 0);

    commands.take();
    let n = repo
        .delete(at("2022-10-20T00:00:00Z"), "app", doc! {"level": "high"})
        .await
        .unwrap();
    assert_eq!(n, want);
    let sent = commands.take();
    let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["delete"], "one command, no lookup without an `_id`");
    let statement = sent[0].1.get_array("deletes").unwrap()[0]
        .as_document()
        .unwrap();
    assert!(
        matches!(
            statement.get("limit"),
            Some(Bson::Int32(0) | Bson::Int64(0))
        ),
        "deleteMany: {statement}"
    );
    let q = statement.get_document("q").unwrap();
    let keys: Vec<&str> = q.keys().map(String::as_str).collect();
    assert_eq!(keys, ["month", "type", "level"], "{q}");
    assert_eq!(
        q.get_datetime("month").unwrap(),
        &at("2022-10-01T00:00:00Z")
    );
    assert_eq!(q.get_str("type").ok(), Some("app"));

    // Gone: October's high app logs. Left: the same filter under other
    // months and under another type, and everything else.
    let raw = db.collection::<Document>("logs");
    let stored = |f: Document| {
        let raw = raw.clone();
        async move { raw.count_documents(f).await.unwrap() }
    };
    let oct = at("2022-10-01T00:00:00Z");
    assert_eq!(
        stored(doc! {"month": oct, "type": "app", "level": "high"}).await,
        0
    );
    assert_eq!(
        stored(doc! {"month": {"$ne": oct}, "type": "app", "level": "high"}).await,
        count("app", false)
    );
    assert_eq!(
        stored(doc! {"month": oct, "type": "web", "level": "high"}).await,
        count("web", true)
    );
    assert_eq!(stored(doc! {}).await, all.len() as u64 - want);

    // Again: nothing left to delete.
    let n = repo
        .delete(at("2022-10-01T00:00:00Z"), "app", doc! {"level": "high"})
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn ensure_sharded_says_not_sharded() {
    let (db, _) = fresh_db("shard_ensure").await;
    let (client, _) = client(&mongo_patterns_testkit::server_uri()).await;
    let db = client.database(db.name());
    let repo = Log::sharded(&db);
    if mongo_patterns_testkit::is_mongos(&client).await {
        // A sharded cluster (CI's mongos job): the collection is sharded.
        repo.ensure_sharded().await.unwrap();
        let config = client
            .database("config")
            .collection::<Document>("collections")
            .find_one(doc! {"_id": format!("{}.logs", db.name())})
            .await
            .unwrap()
            .expect("config.collections names the sharded collection");
        assert_eq!(
            config.get_document("key").unwrap(),
            &doc! {"month": 1, "type": 1}
        );
    } else {
        let err = repo.ensure_sharded().await.unwrap_err();
        assert!(matches!(err, Error::NotSharded { .. }), "{err:?}");
    }
    // The index was made first: it serves targeted queries unsharded too.
    let names = db
        .collection::<Document>("logs")
        .list_index_names()
        .await
        .unwrap();
    assert!(
        names.contains(&"mp_shard_month_type".to_owned()),
        "{names:?}"
    );

    let commands = repo.shard_commands();
    assert_eq!(
        commands[2],
        doc! {"shardCollection": format!("{}.logs", db.name()), "key": {"month": 1, "type": 1}}
    );
    assert_eq!(commands[1], doc! {"enableSharding": db.name()});
    let script = repo.mongosh_script();
    assert!(script.contains(&format!(
        "sh.shardCollection(\"{}.logs\", {{ month: 1, type: 1 }});",
        db.name()
    )));
    assert!(
        script.contains("createIndex({ month: 1, type: 1 }, { name: \"mp_shard_month_type\" })")
    );
}

#[tokio::test]
async fn analyser_finds_the_known_bad_keys() {
    let (db, _) = fresh_db("shard_analyze").await;
    let repo = Log::sharded(&db);
    for chunk in logs(20_000, 11).chunks(5_000) {
        repo.insert_many(chunk).await.unwrap();
    }
    let ts = repo.analyze(&["ts"], 2_000).await.unwrap();
    assert_eq!(ts.monotonic(), Some(true), "{ts:#?}");
    assert!(!ts.low_cardinality());
    let uuid = repo.analyze(&["uuid"], 2_000).await.unwrap();
    assert_eq!(uuid.monotonic(), Some(false), "{uuid:#?}");
    assert_eq!(uuid.distinct, uuid.sampled);
    let kind = repo.analyze(&["type"], 2_000).await.unwrap();
    assert!(kind.low_cardinality(), "{kind:#?}");
    assert_eq!(kind.distinct, 3);
    assert_eq!(kind.most_common[0].0, doc! {"type": "app"});
    assert!((0.75..0.85).contains(&kind.most_common[0].2), "{kind:#?}");
    assert!(kind
        .verdict
        .iter()
        .any(|v| v.starts_with("low cardinality")));
    let month_type = repo.analyze(&["month", "type"], 2_000).await.unwrap();
    assert!(
        month_type.distinct > 24 && month_type.distinct <= 72,
        "{month_type:#?}"
    );
    assert!(
        month_type
            .verdict
            .iter()
            .any(|v| v.starts_with("coarse and ascending")),
        "{month_type:#?}"
    );
    assert!(matches!(
        repo.analyze(&[], 10).await.unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    // A null counts as one more value, as in a shard key. (`month` null
    // too: a document without a shard key field is refused by `mongos`
    // before 4.4, which `MP_ROUTING=strict` reports.)
    let raw = db.collection::<Document>("logs");
    raw.insert_one(doc! {"_id": ObjectId::new(), "type": Bson::Null, "month": Bson::Null})
        .await
        .unwrap();
    assert!(repo.analyze(&["type"], 30_000).await.unwrap().distinct == 4);
}
