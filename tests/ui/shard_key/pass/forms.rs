use futures::stream::BoxStream;
use futures::TryStreamExt;
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::{shard_spec, Coarse, Derived, Granularity, ShardSpec, TimeRepr};

// A log's key: `month` derived from `ts` (epoch seconds), its granularity
// taken from its name; `search` by the name serde stores the field under.
#[derive(Serialize, Deserialize, Model)]
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

// A `DateTime` timestamp, an explicit granularity, and the derived field read
// back into `week`; `from` by its stored name, `search` by its Rust name.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[shard_key(
    coarse = "week",
    from = "occurredAt",
    granularity = "week",
    search = "tenant_id"
)]
struct Event {
    #[serde(rename = "_id")]
    id: i64,
    tenant_id: String,
    occurred_at: DateTime,
    #[serde(default)]
    week: Option<DateTime>,
}

// A coarse field whose name is not a granularity says how it rounds; `u32`
// epoch seconds. Every model has an `_id` (here by its own name): `upsert`
// and `replace` find a document by it.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(
    coarse = "hour_start",
    from = "at",
    granularity = "hour",
    search = "sensor"
)]
struct Reading {
    _id: ObjectId,
    sensor: u64,
    at: u32,
    value: f64,
}

// A hashed key, chosen explicitly: an ObjectId `_id` is fine hashed.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "_id")]
struct Session {
    #[serde(rename = "_id")]
    id: ObjectId,
    user: String,
}

// Each lint's opt-out. A timestamp alone, not derived, without a search field.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "ts", allow(coarse_not_derived, missing_search, monotonic))]
struct Tick {
    _id: ObjectId,
    ts: DateTime,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
enum Level {
    Low,
    High,
}

// A fieldless enum alone (the const size check), and a bool alone.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "level", allow(low_cardinality))]
struct Alert {
    _id: ObjectId,
    level: Level,
}

#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "active", allow(low_cardinality))]
struct Flag {
    _id: ObjectId,
    active: bool,
}

// A stored coarse field the caller keeps coarse.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", search = "type", allow(coarse_not_derived))]
struct Invoice {
    _id: ObjectId,
    #[serde(rename = "type")]
    kind: String,
    month: DateTime,
}

// A derived coarse field alone.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "day", from = "ts", allow(missing_search))]
struct Audit {
    _id: ObjectId,
    ts: i64,
}

// A sequence alone.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "seq", allow(monotonic))]
struct Entry {
    _id: ObjectId,
    seq: u64,
}

// The search type is the field's type: `find` and `update` take a `&str`
// for a `String` field.
fn search_of_log(s: <Log as ShardKeyed>::Search) -> String {
    s
}

#[allow(dead_code)]
async fn use_it(
    db: Database,
    client: Client,
    log: Log,
    event: Event,
) -> mongo_patterns::Result<()> {
    let logs: Sharded<Log> = Log::sharded(&db);
    let _: BoxStream<'_, mongo_patterns::Result<Log>> =
        logs.find("app", TimeRange::last_days(30), doc! {}).await?;
    let _: bool = logs.upsert(&log).await?;
    let _: u64 = logs
        .update(
            DateTime::now(),
            "app",
            doc! {"level": "high"},
            doc! {"$set": {"msg": "x"}},
        )
        .await?;
    let _: Vec<Log> = logs
        .scatter(doc! {"level": "high"})
        .await?
        .try_collect()
        .await?;
    logs.ensure_sharded().await?;
    let _ = client;
    let _ = logs.analyze(&["month", "type"], 10_000).await?;
    let events = Event::sharded(&db);
    let _: Vec<Event> = events
        .find(&String::from("t1"), TimeRange::last_days(7), doc! {})
        .await?
        .try_collect()
        .await?;
    events.insert(&event).await?;
    let _: Vec<Reading> = Reading::sharded(&db)
        .find(&7u64, TimeRange::last_days(1), doc! {})
        .await?
        .try_collect()
        .await?;
    let _: Vec<Session> = Session::sharded(&db)
        .find_by_hashed(&ObjectId::new())
        .await?
        .try_collect()
        .await?;
    let _: Vec<Alert> = Alert::sharded(&db)
        .scatter(doc! {})
        .await?
        .try_collect()
        .await?;
    Ok(())
}

// A web handler's future must be `Send`.
#[allow(dead_code)]
fn send<F: std::future::Future + Send>(_: F) {}

#[allow(dead_code)]
fn futures_are_send(db: Database, client: Client, log: Log, event: Event) {
    send(use_it(db, client, log, event));
}

fn main() {
    assert_eq!(
        Log::SHARD,
        ShardSpec::Ranged {
            coarse: Some(Coarse {
                field: "month",
                derived: Some(Derived {
                    from: "ts",
                    repr: TimeRepr::EpochSeconds,
                    granularity: Granularity::Month,
                }),
            }),
            search: Some("type"),
        }
    );
    assert_eq!(shard_spec(&Log::SHARD), doc! {"month": 1, "type": 1});
    assert_eq!(Log::COLLECTION, "logs");

    let spec = <Event as ShardKeyed>::SHARD;
    assert_eq!(spec.coarse(), Some("week"));
    let derived = spec.derived().unwrap();
    assert_eq!(derived.from, "occurredAt");
    assert_eq!(derived.repr, TimeRepr::DateTime);
    assert_eq!(derived.granularity, Granularity::Week);
    assert_eq!(spec.search(), Some("tenantId"));
    assert_eq!(shard_spec(&spec), doc! {"week": 1, "tenantId": 1});

    let spec = <Reading as ShardKeyed>::SHARD;
    let derived = spec.derived().unwrap();
    assert_eq!(
        (spec.coarse(), spec.search()),
        (Some("hour_start"), Some("sensor"))
    );
    assert_eq!((derived.from, derived.repr), ("at", TimeRepr::EpochSeconds));
    assert_eq!(derived.granularity, Granularity::Hour);

    let spec = <Session as ShardKeyed>::SHARD;
    assert_eq!((spec.coarse(), spec.derived(), spec.search()), (None, None, None));
    assert_eq!(spec.hashed(), Some("_id"));
    assert_eq!(shard_spec(&spec), doc! {"_id": "hashed"});

    // The opt-outs: the key as written, nothing derived.
    let spec = <Tick as ShardKeyed>::SHARD;
    assert_eq!(
        (spec.coarse(), spec.derived(), spec.search()),
        (Some("ts"), None, None)
    );
    assert_eq!(shard_spec(&spec), doc! {"ts": 1});
    assert_eq!(shard_spec(&Alert::SHARD), doc! {"level": 1});
    assert_eq!(shard_spec(&Flag::SHARD), doc! {"active": 1});
    let spec = <Invoice as ShardKeyed>::SHARD;
    assert_eq!((spec.coarse(), spec.derived()), (Some("month"), None));
    assert_eq!(shard_spec(&spec), doc! {"month": 1, "type": 1});
    let derived = Audit::SHARD.derived().unwrap();
    assert_eq!(
        (derived.from, derived.granularity),
        ("ts", Granularity::Day)
    );
    assert_eq!(shard_spec(&Audit::SHARD), doc! {"day": 1});
    assert_eq!(shard_spec(&Entry::SHARD), doc! {"seq": 1});

    assert_eq!(search_of_log("app".to_owned()), "app");

    let log = Log {
        id: ObjectId::new(),
        uuid: String::new(),
        kind: "app".to_owned(),
        level: "high".to_owned(),
        ts: 1_635_132_899,
        msg: String::new(),
    };
    let _ = (log.id, &log.uuid, &log.kind, &log.level, log.ts, &log.msg);
    let e = Event {
        id: 1,
        tenant_id: String::new(),
        occurred_at: DateTime::now(),
        week: None,
    };
    let _ = (e.id, &e.tenant_id, e.occurred_at, e.week);
    let r = Reading {
        _id: ObjectId::new(),
        sensor: 1,
        at: 0,
        value: 0.0,
    };
    let _ = (r.sensor, r.at, r.value);
    let s = Session {
        id: ObjectId::new(),
        user: String::new(),
    };
    let _ = (s.id, &s.user);
    let _ = Tick {
        _id: ObjectId::new(),
        ts: DateTime::now(),
    }
    .ts;
    let _ = Alert {
        _id: ObjectId::new(),
        level: Level::Low,
    }
    .level;
    let _ = Level::High;
    let _ = Flag {
        _id: ObjectId::new(),
        active: true,
    }
    .active;
    let i = Invoice {
        _id: ObjectId::new(),
        kind: String::new(),
        month: DateTime::now(),
    };
    let _ = (&i.kind, i.month);
    let _ = Audit {
        _id: ObjectId::new(),
        ts: 0,
    }
    .ts;
    let _ = Entry {
        _id: ObjectId::new(),
        seq: 0,
    }
    .seq;
}
