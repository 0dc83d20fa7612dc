//! The patterns' invariants enforced by the server: `ensure` sets each
//! collection's `$jsonSchema` validator, at the level `#[model(validate)]`
//! names; another writer's document that breaks one is refused (code 121,
//! DocumentValidationFailure), while every write of the repositories
//! themselves passes under `strict`; `plan` shows what differs;
//! `validate_existing` counts and names what was stored before; a
//! validator of the collection's own is left alone.
//!
//! The other writer is a client of its own with raw documents, as another
//! service's driver (or the shell) would send them, and another service in
//! Python (`tests/py/other_service.py`, pymongo), with its own driver's
//! encodings; it also reads back what the repositories stored.

use mongo_patterns::bucket::PageRequest;
use mongo_patterns::ensure::{Conflict, SCHEMA_TITLE};
use mongo_patterns::mongodb::bson::Bson;
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::TimeRange;
use mongo_patterns_testkit::{bounded, fresh_db, server_uri};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades", validate = "strict")]
#[bucket(size = 4, key = "customer", order = "at")]
struct Trade {
    customer: i64,
    at: i64,
}

/// The same collection at the default level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 4, key = "customer", order = "at")]
struct TradeModerate {
    customer: i64,
    at: i64,
}

/// The same collection, logged and not refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades", validate = "warn")]
#[bucket(size = 4, key = "customer", order = "at")]
struct TradeWarn {
    customer: i64,
    at: i64,
}

/// The same collection, no validator declared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades", validate = "off")]
#[bucket(size = 4, key = "customer", order = "at")]
struct TradeOff {
    customer: i64,
    at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "players", validate = "strict")]
#[rank_histogram(board = "examId", score = "score")]
struct Player {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "players_d", validate = "strict")]
#[rank_histogram(board = "examId", score = "score", layout = "documents")]
struct PlayerDocs {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "logs", validate = "strict")]
#[shard_key(coarse = "month", from = "ts", search = "kind")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    kind: String,
    ts: i64,
}

/// A client of its own: nothing shared with the repositories'.
async fn other_writer(db: &Database) -> Database {
    let client = Client::with_uri_str(server_uri()).await.unwrap();
    client.database(db.name())
}

/// The server's refusal of a document its validator rejects: a write
/// error with code 121 (DocumentValidationFailure).
fn validation_failed(e: &mongo_patterns::mongodb::error::Error) -> bool {
    use mongo_patterns::mongodb::error::{ErrorKind, WriteFailure};
    matches!(&*e.kind, ErrorKind::Write(WriteFailure::WriteError(w)) if w.code == 121)
}

/// Inserts `d` into `coll` and expects the server's refusal.
async fn refused(db: &Database, coll: &str, d: Document) {
    let err = db
        .collection::<Document>(coll)
        .insert_one(d.clone())
        .await
        .expect_err(&format!("{coll}: {d} was stored"));
    assert!(
        validation_failed(&err),
        "{coll}: {d} refused otherwise: {err}"
    );
}

/// The collection's options as `listCollections` shows them.
async fn options(db: &Database, coll: &str) -> Document {
    let reply = db
        .run_command(doc! {"listCollections": 1, "filter": {"name": coll}})
        .await
        .unwrap();
    let batch = reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    batch[0]
        .as_document()
        .unwrap()
        .get_document("options")
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn the_server_refuses_what_breaks_an_invariant_and_takes_every_write_of_ours() {
    let (db, _) = fresh_db("validation_enforced").await;
    bounded(120, async {
        for done in [
            Trade::ensure(&db).await.unwrap(),
            Player::ensure(&db).await.unwrap(),
            PlayerDocs::ensure(&db).await.unwrap(),
            Log::ensure(&db).await.unwrap(),
        ] {
            assert!(!done.validators_set.is_empty(), "{done}");
            assert!(done.conflicts.is_empty(), "{done}");
        }
        let o = options(&db, "trades").await;
        assert_eq!(o.get_str("validationLevel").ok(), Some("strict"), "{o}");
        assert_eq!(o.get_str("validationAction").ok(), Some("error"), "{o}");
        let schema = o
            .get_document("validator")
            .unwrap()
            .get_document("$jsonSchema")
            .unwrap();
        assert_eq!(schema.get_str("title").ok(), Some(SCHEMA_TITLE));
        // A second run sets nothing.
        assert!(Trade::ensure(&db).await.unwrap().created_nothing());

        // Our own writes: pushes in order, late ones, rollovers, a delete;
        // a histogram in both layouts; shard key inserts.
        let trades = Trade::buckets(&db);
        for at in [10, 20, 30, 40, 50, 60, 5, 15, 70, 1, 80, 90, 25] {
            trades.push(&Trade { customer: 7, at }).await.unwrap();
        }
        assert_eq!(trades.delete(&7, doc! {"at": 25}).await.unwrap(), 1);
        let page = trades
            .page(&7, PageRequest::page(1).page_size(100))
            .await
            .unwrap();
        let ats: Vec<i64> = page.items.iter().map(|t| t.at).collect();
        assert_eq!(ats, vec![1, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90]);
        let ranks = Player::ranks(&db);
        let docs = PlayerDocs::ranks(&db);
        for id in 0..6 {
            let (exam_id, score) = ("math".to_owned(), id * 10);
            ranks.insert(&Player { id, exam_id: exam_id.clone(), score }).await.unwrap();
            docs.insert(&PlayerDocs { id, exam_id, score }).await.unwrap();
        }
        ranks.update_score(doc! {"_id": 1}, 95).await.unwrap();
        docs.update_score(doc! {"_id": 1}, 95).await.unwrap();
        ranks.delete(doc! {"_id": 2}).await.unwrap();
        docs.delete(doc! {"_id": 2}).await.unwrap();
        assert_eq!(ranks.rank("math", 95).await.unwrap().rank, 1);
        assert_eq!(docs.rank("math", 95).await.unwrap().rank, 1);
        let logs = Log::sharded(&db);
        for id in 0..5 {
            logs.insert(&Log { id, kind: "auth".into(), ts: 1_700_000_000 + id * 86_400 * 20 })
                .await
                .unwrap();
        }
        let all = TimeRange::between(
            DateTime::from_millis(1_690_000_000_000),
            DateTime::from_millis(1_800_000_000_000),
        );
        let found: Vec<Log> = futures::TryStreamExt::try_collect(
            logs.find("auth", all, doc! {}).await.unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(found.len(), 5);

        // Another writer, each invariant broken once.
        let other = other_writer(&db).await;
        let items = |n: usize| -> Vec<Bson> {
            (0..n).map(|i| Bson::Document(doc! {"at": i as i64})).collect()
        };
        let bucket = |id: Bson, start: i64, count: i64, n: usize| {
            doc! {"_id": id, "customer": 9_i64, "start": start, "count": count, "bytes": 0_i64, "items": items(n)}
        };
        let good_id = || Bson::Document(doc! {"k": 9_i64, "s": 0_i64});
        // A string `_id`, the hand-written trap.
        refused(&other, "trades", bucket(Bson::String("9_1700000000".into()), 0, 1, 1)).await;
        refused(&other, "trades", bucket(Bson::Document(doc! {"k": 9_i64}), 0, 1, 1)).await;
        refused(&other, "trades", bucket(good_id(), 0, -1, 0)).await;
        // The limit is twice `size` with `order` (late items).
        refused(&other, "trades", bucket(good_id(), 0, 9, 9)).await;
        refused(&other, "trades", bucket(good_id(), 0, 2, 9)).await;
        refused(&other, "trades", bucket(good_id(), -1, 1, 1)).await;
        refused(&other, "trades", doc! {"_id": good_id(), "customer": 9_i64, "start": 0, "count": 1}).await;
        // What passes is what the repository could have written.
        other
            .collection::<Document>("trades")
            .insert_one(bucket(good_id(), 0, 1, 1))
            .await
            .unwrap();

        let hist = ranks.histogram_collection().name().to_owned();
        refused(&other, &hist, doc! {"_id": "art", "scores": [{"score": 1, "count": -1}]}).await;
        refused(&other, &hist, doc! {"_id": "art", "scores": [{"score": 1, "count": "one"}]}).await;
        refused(&other, &hist, doc! {"_id": "art"}).await;
        let hist_d = docs.histogram_collection().name().to_owned();
        refused(&other, &hist_d, doc! {"_id": {"b": "art", "s": 1}, "count": -1}).await;
        refused(&other, &hist_d, doc! {"_id": "art:1", "count": 1}).await;
        refused(&other, &hist_d, doc! {"_id": {"b": "art", "s": 1}, "count": 1.5}).await;

        refused(&other, "logs", doc! {"_id": 100, "kind": "auth", "ts": 1_700_000_000}).await;
        refused(&other, "logs", doc! {"_id": 101, "kind": "auth", "ts": 1_700_000_000, "month": "2023-11"}).await;
    })
    .await;
}

#[tokio::test]
async fn plan_levels_and_what_was_stored_before() {
    let (db, _) = fresh_db("validation_levels").await;
    bounded(120, async {
        let other = other_writer(&db).await;
        let raw = other.collection::<Document>("trades");
        // Stored before any validator: two buckets that break it.
        raw.insert_many([
            doc! {"_id": "7_1", "customer": 7_i64, "start": 0, "count": 1, "bytes": 0, "items": [{"at": 1}]},
            doc! {"_id": {"k": 8_i64, "s": 0}, "customer": 8_i64, "start": 0, "count": -3, "bytes": 0, "items": []},
            doc! {"_id": {"k": 9_i64, "s": 0}, "customer": 9_i64, "start": 0, "count": 1, "bytes": 0, "items": [{"at": 1}]},
        ])
        .await
        .unwrap();
        let invalid = TradeModerate::validate_existing(&db).await.unwrap();
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        assert_eq!(invalid[0].collection, "trades");
        assert_eq!(invalid[0].count, 2);
        assert!(invalid[0].ids.contains(&Bson::String("7_1".into())));
        // `off` declares no schema: nothing to check.
        assert!(TradeOff::validate_existing(&db).await.unwrap().is_empty());

        let plan = TradeModerate::plan(&db).await.unwrap();
        assert_eq!(plan.validators.len(), 1, "{plan}");
        assert_eq!(plan.validators[0].level, "moderate");
        assert!(plan.validators[0].replaces.is_none());
        assert!(plan.to_string().contains("set the validator of `trades`"), "{plan}");
        let done = TradeModerate::ensure(&db).await.unwrap();
        assert_eq!(done.validators_set, vec!["trades".to_owned()], "{done}");
        assert!(TradeModerate::plan(&db).await.unwrap().validators.is_empty());

        // Moderate: a document that broke it before can still be mended
        // (updated); a new one cannot be stored.
        raw.update_one(doc! {"_id": {"k": 8_i64, "s": 0}}, doc! {"$set": {"note": 1}})
            .await
            .unwrap();
        refused(&other, "trades", doc! {"_id": "9_2", "customer": 9_i64, "start": 0, "count": 1, "items": []}).await;

        // Strict: the level changes by `collMod`, and the same update is
        // refused.
        let plan = Trade::plan(&db).await.unwrap();
        assert_eq!(plan.validators.len(), 1, "{plan}");
        assert!(plan.validators[0].replaces.is_some());
        Trade::ensure(&db).await.unwrap();
        assert_eq!(options(&db, "trades").await.get_str("validationLevel").ok(), Some("strict"));
        let err = raw
            .update_one(doc! {"_id": {"k": 8_i64, "s": 0}}, doc! {"$set": {"note": 2}})
            .await
            .unwrap_err();
        assert!(validation_failed(&err), "{err}");

        // Warn: stored, and logged by the server.
        TradeWarn::ensure(&db).await.unwrap();
        assert_eq!(options(&db, "trades").await.get_str("validationAction").ok(), Some("warn"));
        raw.insert_one(doc! {"_id": "9_3", "customer": 9_i64}).await.unwrap();

        // The repository's own declarations keep the model's level.
        assert!(TradeOff::buckets(&db).declared().iter().all(|d| d.schemas.is_empty()));
        assert!(Trade::buckets(&db)
            .declared()
            .iter()
            .all(|d| d.validation == mongo_patterns::ensure::Validation::Strict));
        // Off: nothing declared, nothing dropped.
        let plan = TradeOff::plan(&db).await.unwrap();
        assert!(plan.validators.is_empty(), "{plan}");
        TradeOff::ensure(&db).await.unwrap();
        assert!(options(&db, "trades").await.contains_key("validator"));
    })
    .await;
}

#[tokio::test]
async fn a_validator_of_the_collections_own_is_left_alone() {
    let (db, _) = fresh_db("validation_theirs").await;
    bounded(60, async {
        let theirs = doc! {"customer": {"$type": "long"}};
        db.create_collection("trades").validator(theirs.clone()).await.unwrap();
        let plan = Trade::plan(&db).await.unwrap();
        assert!(plan.validators.is_empty(), "{plan}");
        assert!(
            plan.conflicts
                .iter()
                .any(|c| matches!(c, Conflict::Validator { collection, found } if collection == "trades" && *found == theirs)),
            "{plan}"
        );
        let done = Trade::ensure(&db).await.unwrap();
        assert!(done.validators_set.is_empty(), "{done}");
        assert_eq!(
            options(&db, "trades").await.get_document("validator").ok(),
            Some(&theirs)
        );
    })
    .await;
}

/// An integer stored as text: a field serialized by a helper.
mod as_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The struct's own fields, as serde stores them (renamed, optional,
/// arrays): a keyset model's sort key and every typed field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits", validate = "strict")]
#[keyset(sort = "initTime")]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    init_time: i64,
    visitor: Option<String>,
    tags: Vec<String>,
    /// Serialized by a helper: left open.
    #[serde(with = "as_text")]
    code: i64,
}

#[tokio::test]
async fn the_structs_fields_keep_their_types() {
    let (db, _) = fresh_db("validation_fields").await;
    bounded(60, async {
        Visit::ensure(&db).await.unwrap();
        Trade::ensure(&db).await.unwrap();
        Player::ensure(&db).await.unwrap();
        let visits = Visit::collection(&db);
        visits
            .insert_one(Visit { id: ObjectId::new(), init_time: 5, visitor: None, tags: vec!["a".into()], code: 7 })
            .await
            .unwrap();
        let other = other_writer(&db).await;
        // Mixed types in a sort key are what break keyset order.
        refused(&other, "visits", doc! {"initTime": "yesterday"}).await;
        refused(&other, "visits", doc! {"initTime": 1.5}).await;
        refused(&other, "visits", doc! {"visitor": 7}).await;
        refused(&other, "visits", doc! {"tags": "a"}).await;
        refused(&other, "visits", doc! {"tags": ["a", 1]}).await;
        // What the model reads passes: an int for an i64, null for an
        // Option, a field left out, the helper's field anything.
        for ok in [
            doc! {"initTime": 5_i32, "visitor": Bson::Null, "tags": [], "code": 1},
            doc! {"initTime": 6_i64},
        ] {
            other.collection::<Document>("visits").insert_one(ok).await.unwrap();
        }
        // A bucket's items hold the struct's fields (the key at the top).
        let item = |at: Bson| doc! {"_id": {"k": 3_i64, "s": 0_i64}, "customer": 3_i64, "start": 0, "count": 1, "items": [{"at": at}]};
        refused(&other, "trades", item(Bson::String("noon".into()))).await;
        refused(
            &other,
            "trades",
            doc! {"_id": {"k": "3", "s": 0_i64}, "customer": "3", "start": 0, "count": 0, "items": []},
        )
        .await;
        other.collection::<Document>("trades").insert_one(item(Bson::Int64(12))).await.unwrap();
        // Players: the board and the score.
        refused(&other, "players", doc! {"_id": 1_i64, "examId": "math", "score": "ninety"}).await;
        refused(&other, "players", doc! {"_id": 2_i64, "examId": 7, "score": 90}).await;
    })
    .await;
}

/// Runs `tests/py/other_service.py` (pymongo) with `args`, bounded, and
/// returns what it printed. `scripts/test` installs pymongo when missing.
fn python(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/other_service.py");
    let out = std::process::Command::new("timeout")
        .args(["120", "python3", script])
        .args(args)
        .output()
        .expect("python3 runs (scripts/test installs pymongo)");
    assert!(
        out.status.success(),
        "other_service.py {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_python_service_is_refused_what_breaks_an_invariant() {
    let (db, _) = fresh_db("validation_pymongo").await;
    bounded(180, async {
        Trade::ensure(&db).await.unwrap();
        Player::ensure(&db).await.unwrap();
        PlayerDocs::ensure(&db).await.unwrap();
        Log::ensure(&db).await.unwrap();
        Visit::ensure(&db).await.unwrap();
        Payment::ensure(&db).await.unwrap();
        let ranks = Player::ranks(&db);
        assert_eq!(ranks.histogram_collection().name(), "players_ranks");
        assert_eq!(PlayerDocs::ranks(&db).histogram_collection().name(), "players_d_ranks");
        // What the script's updates aim at: a bucket of customer 7 and the
        // board "math".
        let trades = Trade::buckets(&db);
        for at in [30, 10, 20] {
            trades.push(&Trade { customer: 7, at }).await.unwrap();
        }
        ranks.insert(&Player { id: 1, exam_id: "math".into(), score: 90 }).await.unwrap();

        let uri = server_uri();
        let printed = python(&["write", &uri, db.name()]);
        let mut cases = 0;
        for line in printed.lines() {
            let r: serde_json::Value = serde_json::from_str(line).unwrap();
            let (case, coll) = (&r["case"], &r["coll"]);
            if r["expect"] == "refused" {
                assert_eq!(r["stored"], false, "{coll}: {case} was stored");
                assert_eq!(r["code"], 121, "{coll}: {case} refused otherwise: {r}");
            } else {
                assert_eq!(r["stored"], true, "{coll}: {case} was refused: {r}");
            }
            cases += 1;
        }
        assert!(cases >= 33, "{printed}");

        // What it stored, the repositories read; what they stored, it
        // reads alike. Its payment, in each tagging, as serde reads it.
        let paid = db
            .collection::<Payment>("payments")
            .find_one(doc! {"_id": 200})
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            paid,
            Payment {
                id: 200,
                method: Method::Card { last4: "1".into(), expiry: 2712 },
                fee: Fee::Waived,
                hold: None,
                refs: vec![Ref::Id(1), Ref::Code("c".into()), Ref::Nothing],
                channel: Channel::Web,
            }
        );
        let page = trades.page(&9, PageRequest::page(1).page_size(10)).await.unwrap();
        assert_eq!(page.items.iter().map(|t| t.at).collect::<Vec<_>>(), vec![3, 4]);
        // A player stored past the repository is counted once its board
        // is rebuilt.
        ranks.rebuild("history").await.unwrap();
        assert_eq!(ranks.rank("history", 70).await.unwrap().rank, 1);
        assert_eq!(ranks.rank("math", 90).await.unwrap().total, 1);
        let read: serde_json::Value =
            serde_json::from_str(&python(&["read", &uri, db.name(), "trades"])).unwrap();
        let seven = read
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["_id"]["k"] == serde_json::json!({"$numberLong": "7"}))
            .unwrap_or_else(|| panic!("{read}"));
        let ats: Vec<&serde_json::Value> =
            seven["items"].as_array().unwrap().iter().map(|i| &i["at"]).collect();
        assert_eq!(
            serde_json::json!(ats),
            serde_json::json!([{"$numberLong": "10"}, {"$numberLong": "20"}, {"$numberLong": "30"}]),
            "{seven}"
        );
        assert_eq!(seven["count"], serde_json::json!({"$numberLong": "3"}), "{seven}");
    })
    .await;
}

/// One history, two views: pushes in `at` order (late items make a bucket
/// up to twice `size`) and in arrival order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "history")]
#[bucket(size = 4, key = "customer", order = "at")]
struct Ordered {
    customer: i64,
    at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "history")]
#[bucket(size = 4, key = "customer")]
struct Arrived {
    customer: i64,
    at: i64,
}

/// The next version of `Ordered`: the same model, its `size` raised.
mod next {
    use mongo_patterns::prelude::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
    #[model(collection = "history")]
    #[bucket(size = 6, key = "customer", order = "at")]
    pub struct Ordered {
        pub customer: i64,
        pub at: i64,
    }
}

/// The names of the parts of `coll`'s validator.
async fn parts(db: &Database, coll: &str) -> Vec<String> {
    let o = options(db, coll).await;
    let any = o
        .get_document("validator")
        .and_then(|v| v.get_document("$jsonSchema"))
        .and_then(|s| s.get_array("anyOf"))
        .unwrap_or_else(|e| panic!("{e}: {o}"));
    any.iter()
        .map(|p| {
            p.as_document()
                .unwrap()
                .get_str("title")
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn two_models_on_one_collection_keep_each_its_part() {
    let (db, _) = fresh_db("validation_two_models").await;
    bounded(120, async {
        // Each model's own `ensure`, one after the other: the second
        // replaced the first's validator before, and ordered pushes that
        // filled a bucket past `size` with late items were refused.
        Ordered::buckets(&db).ensure().await.unwrap();
        Arrived::buckets(&db).ensure().await.unwrap();
        assert_eq!(parts(&db, "history").await, ["Arrived", "Ordered"]);
        let ordered = Ordered::buckets(&db);
        for at in [10, 20, 30, 40, 50, 1, 2, 3, 4] {
            ordered.push(&Ordered { customer: 1, at }).await.unwrap();
        }
        let arrived = Arrived::buckets(&db);
        for at in 0..9 {
            arrived.push(&Arrived { customer: 2, at }).await.unwrap();
        }
        let page = ordered.page(&1, PageRequest::page(1).page_size(20)).await.unwrap();
        let ats: Vec<i64> = page.items.iter().map(|t| t.at).collect();
        assert_eq!(ats, [1, 2, 3, 4, 10, 20, 30, 40, 50]);
        // A bucket past the limit of both is still refused.
        let other = other_writer(&db).await;
        let items: Vec<Bson> = (0..9).map(|i| Bson::Document(doc! {"at": i as i64})).collect();
        refused(
            &other,
            "history",
            doc! {"_id": {"k": 3_i64, "s": 0_i64}, "customer": 3_i64, "start": 0, "count": 9, "items": items},
        )
        .await;
        // Nothing left to set, for either, in either order.
        assert!(Ordered::plan(&db).await.unwrap().validators.is_empty());
        assert!(Arrived::plan(&db).await.unwrap().validators.is_empty());
        assert!(Ordered::ensure(&db).await.unwrap().validators_set.is_empty());

        // The next version of one model replaces its part, keeps the other.
        let plan = next::Ordered::plan(&db).await.unwrap();
        assert_eq!(plan.validators.len(), 1, "{plan}");
        assert_eq!(plan.validators[0].kept, ["Arrived"], "{plan}");
        assert!(plan.to_string().contains("keeping the parts of Arrived"), "{plan}");
        next::Ordered::ensure(&db).await.unwrap();
        assert_eq!(parts(&db, "history").await, ["Arrived", "Ordered"]);
        assert!(next::Ordered::plan(&db).await.unwrap().validators.is_empty());
    })
    .await;
}

#[tokio::test]
async fn two_services_ensuring_two_models_at_once() {
    bounded(180, async {
        for round in 0..8 {
            let (db, _) = fresh_db(&format!("validation_race_{round}")).await;
            // Another service: a client of its own.
            let theirs = other_writer(&db).await;
            let exists = round % 2 == 1;
            if exists {
                db.create_collection("history").await.unwrap();
            }
            let (a, b) = tokio::join!(Ordered::ensure(&db), Arrived::ensure(&theirs));
            a.unwrap();
            b.unwrap();
            let both = ["Arrived", "Ordered"];
            if !exists {
                // Two `create`s: the one that lost merges its part in.
                assert_eq!(parts(&db, "history").await, both, "round {round}");
                continue;
            }
            // Two `collMod`s on a collection that exists: each registers
            // its part first, and the last to land is set again from the
            // registry if the other registered meanwhile.
            assert_eq!(parts(&db, "history").await, both, "round {round}");
            assert!(Ordered::plan(&db).await.unwrap().validators.is_empty());
            assert!(Arrived::plan(&db).await.unwrap().validators.is_empty());
        }
    })
    .await;
}

/// Two models' `ensure`s on one existing collection, where the first
/// one's `collMod` (built from the validator it read) lands after the
/// second's whole `ensure`: the server holds it 1.5 s (`failCommand`'s
/// `blockConnection`, as a slow primary would). Before the registry of
/// parts, the late `collMod` wrote over the other model's part, and both
/// calls returned `Ok` (its read-back found its own part).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_collmod_keeps_the_part_set_meanwhile() {
    use mongo_patterns::mongodb::event::command::CommandEvent;
    use mongo_patterns::mongodb::event::EventHandler;
    use mongo_patterns::mongodb::options::ClientOptions;
    use mongo_patterns_testkit::{client, FaultServer};
    let server = FaultServer::start("validation_late_collmod").await;
    let name = server.db_name("validation_late_collmod");
    // The slow service's client says when its `collMod` is sent.
    let sent = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut opts = ClientOptions::parse(server.uri()).await.unwrap();
    let notify = sent.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if matches!(&ev, CommandEvent::Started(e) if e.command_name == "collMod") {
            notify.notify_one();
        }
    }));
    let slow = Client::with_options(opts).unwrap().database(&name);
    let (c, _) = client(server.uri()).await;
    let fast = c.database(&name);
    bounded(60, async {
        fast.create_collection("history").await.unwrap();
        let block =
            doc! {"failCommands": ["collMod"], "blockConnection": true, "blockTimeMS": 1500};
        server.fail(&c, Some(1), block).await;
        let late = tokio::spawn(async move { Ordered::ensure(&slow).await });
        sent.notified().await;
        Arrived::ensure(&fast).await.unwrap();
        late.await.unwrap().unwrap();
        assert_eq!(parts(&fast, "history").await, ["Arrived", "Ordered"]);
        assert!(Arrived::plan(&fast).await.unwrap().validators.is_empty());
        assert!(Ordered::plan(&fast).await.unwrap().validators.is_empty());
    })
    .await;
    server.off(&c).await;
}

#[tokio::test]
async fn validate_existing_counts_the_other_models_part() {
    let (db, _) = fresh_db("validation_existing_two").await;
    bounded(60, async {
        Ordered::ensure(&db).await.unwrap();
        Arrived::ensure(&db).await.unwrap();
        // Late items fill an ordered bucket past `size` (4): the arrival
        // model alone would refuse it; the validator, with both parts,
        // takes it.
        let ordered = Ordered::buckets(&db);
        for at in [10, 20, 30, 40, 1, 2] {
            ordered.push(&Ordered { customer: 1, at }).await.unwrap();
        }
        assert!(Arrived::validate_existing(&db).await.unwrap().is_empty());
        assert!(Ordered::validate_existing(&db).await.unwrap().is_empty());
    })
    .await;
}

/// Kept in arrival order (a push is a `findAndModify`), no validator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals_v", validate = "off")]
#[bucket(size = 4, key = "customer")]
struct ArrivalOff {
    customer: i64,
    at: i64,
}

/// The same collection under `strict`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals_v", validate = "strict")]
#[bucket(size = 4, key = "customer")]
struct ArrivalStrict {
    customer: i64,
    at: i64,
}

/// A write of the library's own that the validator refuses (a bucket
/// stored before the validator, with an item another writer broke) is
/// `Error::FailedValidation`, naming the bucket by its `_id` and the rule
/// by its field; nothing is stored, and the driver's error (code 121)
/// comes back whole.
#[tokio::test]
async fn a_write_the_validator_refuses_is_a_typed_error_naming_the_document() {
    use mongo_patterns::mongodb::error::{ErrorKind, WriteFailure};
    let (db, _) = fresh_db("validation_refused_write").await;
    bounded(60, async {
        TradeOff::ensure(&db).await.unwrap();
        let before = TradeOff::buckets(&db);
        for at in [1, 2] {
            before.push(&TradeOff { customer: 5, at }).await.unwrap();
        }
        let other = other_writer(&db).await;
        let raw = other.collection::<Document>("trades");
        let stored = raw
            .find_one(doc! {"customer": 5_i64})
            .await
            .unwrap()
            .unwrap();
        let id = stored.get("_id").unwrap().clone();
        raw.update_one(doc! {"_id": &id}, doc! {"$set": {"items.0.at": "one"}})
            .await
            .unwrap();
        Trade::ensure(&db).await.unwrap();

        let e = Trade::buckets(&db)
            .push(&Trade { customer: 5, at: 3 })
            .await
            .expect_err("a push into a bucket that breaks the schema was stored");
        let Error::FailedValidation {
            id: Some(failing),
            details: Some(_),
            ..
        } = &e
        else {
            panic!("not a typed refusal naming the bucket: {e:?}");
        };
        assert_eq!(**failing, id, "{e}");
        assert_eq!(e.code(), Some(121), "{e}");
        assert!(!e.is_retryable(), "{e}");
        let text = e.to_string();
        assert!(text.contains(&format!("to document {id}")), "{text}");
        // The item's index is in the document the update would leave:
        // the late push sorts the string after the numbers.
        assert!(
            text.contains(".at`: type did not match (found string)"),
            "{text}"
        );
        // Back to the driver's error, as `?` in `and_run2` needs it.
        let driver = mongo_patterns::mongodb::error::Error::from(e);
        assert!(
            matches!(&*driver.kind, ErrorKind::Write(WriteFailure::WriteError(w)) if w.code == 121),
            "{driver}"
        );
        // Nothing of the push was stored.
        let after = raw.find_one(doc! {"_id": &id}).await.unwrap().unwrap();
        assert_eq!(after.get_array("items").unwrap().len(), 2, "{after}");
        assert_eq!(stored.get("count"), after.get("count"), "{after}");

        // Pushes from many tasks of one process go in one update: its
        // refusal is each push's own, not an unknown outcome. The bucket
        // breaks after the repository saw it whole, where the batch's
        // filter does not look: a double where the schema says integer.
        let trades = Trade::buckets(&db);
        trades.push(&Trade { customer: 8, at: 1 }).await.unwrap();
        let stored = raw
            .find_one(doc! {"customer": 8_i64})
            .await
            .unwrap()
            .unwrap();
        let id = stored.get("_id").unwrap().clone();
        raw.update_one(doc! {"_id": &id}, doc! {"$set": {"items.0.at": 1.5}})
            .bypass_document_validation(true)
            .await
            .unwrap();
        let tasks: Vec<_> = (2..5)
            .map(|at| {
                let trades = trades.clone();
                tokio::spawn(async move { trades.push(&Trade { customer: 8, at }).await })
            })
            .collect();
        for t in tasks {
            let e = t.await.unwrap().expect_err("stored into a broken bucket");
            assert!(
                matches!(&e, Error::FailedValidation { id: Some(f), .. } if **f == id),
                "{e:?}"
            );
        }
        let after = raw.find_one(doc! {"_id": &id}).await.unwrap().unwrap();
        assert_eq!(after.get_array("items").unwrap().len(), 1, "{after}");

        // A push without `order` is a `findAndModify`, refused by the
        // command's own error: the document is named the same.
        ArrivalOff::ensure(&db).await.unwrap();
        for at in [1, 2] {
            let a = ArrivalOff { customer: 6, at };
            ArrivalOff::buckets(&db).push(&a).await.unwrap();
        }
        let raw = other.collection::<Document>("arrivals_v");
        let stored = raw.find_one(doc! {}).await.unwrap().unwrap();
        let id = stored.get("_id").unwrap().clone();
        raw.update_one(doc! {"_id": &id}, doc! {"$set": {"items.1.at": "two"}})
            .await
            .unwrap();
        ArrivalStrict::ensure(&db).await.unwrap();
        let e = ArrivalStrict::buckets(&db)
            .push(&ArrivalStrict { customer: 6, at: 3 })
            .await
            .expect_err("a push into a bucket that breaks the schema was stored");
        let Error::FailedValidation {
            id: Some(failing), ..
        } = &e
        else {
            panic!("not a typed refusal naming the bucket: {e:?}");
        };
        assert_eq!(**failing, id, "{e}");
        assert!(
            e.to_string()
                .contains("`items.1.at`: type did not match (found string)"),
            "{e}"
        );
        let after = raw.find_one(doc! {"_id": &id}).await.unwrap().unwrap();
        assert_eq!(after.get_array("items").unwrap().len(), 2, "{after}");
    })
    .await;
}

/// A side of a trade, stored as serde names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
#[serde(rename_all = "snake_case")]
enum Side {
    Buy,
    Sell,
    #[serde(rename = "short")]
    SellShort,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
#[serde(rename_all = "camelCase")]
struct Fill {
    unit_price: f64,
    qty: i32,
    venue: Option<Venue>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
struct Venue {
    mic: String,
}

/// Holds itself: left open from the second level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
struct Note {
    text: String,
    reply: Option<Box<Note>>,
}

/// Nested types on a model's documents and in a bucket's items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "orders", validate = "strict")]
#[bucket(size = 4, key = "desk", order = "at")]
struct Order {
    desk: i64,
    at: i64,
    side: Side,
    fills: Vec<Fill>,
    note: Option<Note>,
}

/// What a nested type that derives `Schema` stores is checked by the
/// server as its fields are: a nested struct's field types (inside an
/// array, inside an `Option`), an enum's names; a type that holds itself
/// is checked to the first level. The repository's own writes pass.
#[tokio::test]
async fn nested_types_that_derive_schema_are_checked_too() {
    let (db, _) = fresh_db("validation_nested").await;
    bounded(60, async {
        assert_eq!(
            Side::schema(),
            doc! {"enum": ["buy", "sell", "short"]}
        );
        Order::ensure(&db).await.unwrap();
        let orders = Order::buckets(&db);
        let order = |at, side| Order {
            desk: 1,
            at,
            side,
            fills: vec![Fill {
                unit_price: 10.5,
                qty: 3,
                venue: Some(Venue { mic: "XNAS".into() }),
            }],
            note: Some(Note {
                text: "a".into(),
                reply: Some(Box::new(Note { text: "b".into(), reply: None })),
            }),
        };
        for (at, side) in [(1, Side::Buy), (3, Side::Sell), (2, Side::SellShort)] {
            orders.push(&order(at, side)).await.unwrap();
        }
        let page = orders.page(&1, PageRequest::page(1)).await.unwrap();
        assert_eq!(page.items.len(), 3);

        let other = other_writer(&db).await;
        let bucket = |item: Document| {
            doc! {"_id": {"k": 9_i64, "s": 0_i64}, "desk": 9_i64, "start": 0, "count": 1, "items": [item]}
        };
        let good = || {
            doc! {"at": 1_i64, "side": "buy", "fills": [{"unitPrice": 1.0, "qty": 1, "venue": null}],
                  "note": {"text": "x", "reply": {"text": 5}}}
        };
        // As the model stores it (and deeper than its schema goes).
        let stored = other.collection::<Document>("orders");
        stored.insert_one(bucket(good())).await.unwrap();
        stored.delete_one(doc! {"desk": 9_i64}).await.unwrap();
        for (what, field, value) in [
            ("an enum name serde never stores", "side", Bson::String("BUY".into())),
            ("a nested field's type", "fills", mongo_patterns::bson::bson!([{"unitPrice": "ten", "qty": 1}])),
            ("a field of a struct in an Option", "fills", mongo_patterns::bson::bson!([{"qty": 1, "venue": {"mic": 7}}])),
            ("an array's element", "fills", mongo_patterns::bson::bson!(["fill"])),
            ("a nested struct's own field", "note", mongo_patterns::bson::bson!({"text": 5})),
        ] {
            let mut item = good();
            item.insert(field, value);
            let e = stored.insert_one(bucket(item)).await.expect_err(what);
            assert!(validation_failed(&e), "{what}: {e}");
        }
    })
    .await;
}

/// How to pay, in serde's default tagging: a unit variant is its name,
/// any other `{Name: content}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
enum Method {
    Cash,
    Card {
        last4: String,
        #[serde(rename = "exp")]
        expiry: i32,
    },
    Voucher(i64),
    Split(i64, i64),
    Wallet(Venue),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
struct Rate {
    bps: i32,
}

/// Internally tagged, with the fields' and the variants' renames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
#[serde(
    tag = "kind",
    rename_all = "lowercase",
    rename_all_fields = "camelCase"
)]
enum Fee {
    Flat {
        amount_cents: i64,
    },
    Waived,
    Rate(Rate),
    /// Its own rule wins over the enum's `rename_all_fields`.
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    Capped {
        max_cents: i64,
    },
}

/// Adjacently tagged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
#[serde(tag = "t", content = "c")]
enum Hold {
    Released,
    Days(i32),
    Until { at: i64 },
}

/// Untagged: the content alone (`null` for the unit variant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
#[serde(untagged)]
enum Ref {
    Id(i64),
    Code(String),
    Nothing,
}

/// One variant untagged: any string besides `"Web"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
enum Channel {
    Web,
    #[serde(untagged)]
    Other(String),
}

/// Holds itself, through a struct variant and a newtype: checked to the
/// first level, as a struct that holds itself is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Schema)]
enum Expr {
    Lit(i64),
    Neg(Box<Expr>),
    Add { l: Box<Expr>, r: Box<Expr> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "payments", validate = "strict")]
struct Payment {
    #[serde(rename = "_id")]
    id: i64,
    method: Method,
    fee: Fee,
    hold: Option<Hold>,
    refs: Vec<Ref>,
    channel: Channel,
}

/// Enums with data, in each of serde's taggings: every variant as serde
/// stores it passes under `strict`; another writer's value of a shape
/// serde never stores (an unknown name, a field of the wrong type, a
/// missing or extra tag, a tuple of the wrong length) is refused.
#[tokio::test]
async fn enums_with_data_are_checked_in_each_tagging() {
    use futures::TryStreamExt;
    use mongo_patterns::bson::bson;
    let (db, _) = fresh_db("validation_enums").await;
    bounded(60, async {
        assert_eq!(
            Ref::schema(),
            doc! {"anyOf": [
                {"bsonType": ["int", "long"]}, {"bsonType": ["string"]}, {"bsonType": "null"},
            ]}
        );
        // `{Neg: e}`: `e` is an `Expr` whose own `Neg` is left open.
        let expr = Expr::schema();
        let neg = |s: &Document| {
            let any = s.get_array("anyOf").unwrap();
            assert_eq!(any.len(), 3, "{s}");
            let props = any[1].as_document().unwrap().get_document("properties");
            props.unwrap().get_document("Neg").unwrap().clone()
        };
        assert_eq!(neg(&neg(&expr)), doc! {}, "{expr}");
        Payment::ensure(&db).await.unwrap();
        let methods = [
            Method::Cash,
            Method::Card {
                last4: "4242".into(),
                expiry: 2712,
            },
            Method::Voucher(7),
            Method::Split(1, 2),
            Method::Wallet(Venue { mic: "XPAY".into() }),
        ];
        let fees = [
            Fee::Flat { amount_cents: 30 },
            Fee::Waived,
            Fee::Rate(Rate { bps: 25 }),
            Fee::Capped { max_cents: 99 },
        ];
        let holds = [
            None,
            Some(Hold::Released),
            Some(Hold::Days(3)),
            Some(Hold::Until { at: 9 }),
        ];
        let payments: Vec<Payment> = (0..12)
            .map(|i| Payment {
                id: i as i64,
                method: methods[i % 5].clone(),
                fee: fees[i % fees.len()].clone(),
                hold: holds[i % 4].clone(),
                refs: vec![Ref::Id(1), Ref::Code("x".into()), Ref::Nothing],
                channel: match i % 2 {
                    0 => Channel::Web,
                    _ => Channel::Other("app".into()),
                },
            })
            .collect();
        let typed = db.collection::<Payment>("payments");
        typed.insert_many(&payments).await.unwrap();
        let back: Vec<Payment> = typed
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(back, payments);

        let other = other_writer(&db).await;
        let stored = other.collection::<Document>("payments");
        let good = || {
            doc! {"_id": 100_i64, "method": {"Card": {"last4": "1", "exp": 1}},
            "fee": {"kind": "flat", "amountCents": 5_i64}, "hold": {"t": "Days", "c": 2},
            "refs": [3_i64, "c", null], "channel": "kiosk"}
        };
        stored.insert_one(good()).await.unwrap();
        stored.delete_one(doc! {"_id": 100_i64}).await.unwrap();
        for (what, field, value) in [
            ("a unit name serde never stores", "method", bson!("Crypto")),
            (
                "a struct variant's field type",
                "method",
                bson!({"Card": {"last4": 4242, "exp": 1}}),
            ),
            (
                "a second variant beside the first",
                "method",
                bson!({"Cash": null, "Voucher": 1}),
            ),
            (
                "a newtype's content type",
                "method",
                bson!({"Voucher": "seven"}),
            ),
            (
                "a tuple of the wrong length",
                "method",
                bson!({"Split": [1]}),
            ),
            (
                "a nested struct's field in a newtype",
                "method",
                bson!({"Wallet": {"mic": 5}}),
            ),
            (
                "an internal tag serde never stores",
                "fee",
                bson!({"kind": "percent"}),
            ),
            (
                "a field beside the internal tag",
                "fee",
                bson!({"kind": "flat", "amountCents": "5"}),
            ),
            ("no internal tag", "fee", bson!({"amountCents": 5})),
            (
                "a newtype struct's field beside the tag",
                "fee",
                bson!({"kind": "rate", "bps": "x"}),
            ),
            (
                "a field named by the variant's own rule",
                "fee",
                bson!({"kind": "capped", "MAX_CENTS": "x"}),
            ),
            (
                "adjacent content of the wrong type",
                "hold",
                bson!({"t": "Days", "c": "two"}),
            ),
            ("adjacent content missing", "hold", bson!({"t": "Days"})),
            ("no adjacent tag", "hold", bson!({"c": 2})),
            ("an untagged value of no variant", "refs", bson!([1.5])),
            ("an untagged document", "refs", bson!([{}])),
            ("not a string", "channel", bson!(5)),
        ] {
            let mut d = good();
            d.insert(field, value);
            let e = stored.insert_one(d).await.expect_err(what);
            assert!(validation_failed(&e), "{what}: {e}");
        }
    })
    .await;
}
