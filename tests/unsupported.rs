//! What each pattern needs from the server: `plan` and `ensure` on a
//! server that has everything, and the typed error a repository used
//! without `ensure` gets when the server refuses an operator (given by the
//! test server's `failCommand` fail point, as a server before the
//! operator's release answers).

use mongo_patterns::bson::{doc, Document};
use mongo_patterns::ensure::{Feature, Note};
use mongo_patterns::prelude::*;
use mongo_patterns::Error;
use mongo_patterns_testkit::{bounded, client, fresh_db, FaultServer};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "uns_ticks")]
#[bucket(size = 3, key = "sym", order = "day", items = "ticks")]
struct Tick {
    sym: String,
    day: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "uns_events")]
#[bucket(size = 3, key = "acct", items = "events")]
struct Event {
    acct: String,
    n: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "uns_scores")]
#[rank_histogram(board = "examId", score = "score", layout = "documents")]
struct Score {
    #[serde(rename = "_id")]
    id: String,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "uns_items")]
struct Item {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 3600000)]
    views: i64,
}

/// The test server (the surrogate: 8.2, a replica set of one; or
/// MONGODB_URI) has every feature the patterns need: `plan` reports
/// nothing unsupported and no feature done without (but `bulkWrite`,
/// which the rank histogram's documents layout prefers, on a server
/// before 8.0: `maxWireVersion` below 25), after asking `hello` and
/// `buildInfo` once; `ensure` prepares it.
#[tokio::test]
async fn a_server_with_everything_passes() {
    bounded(60, async {
        let (db, commands) = fresh_db("uns_everything").await;
        let bulk_write = mongo_patterns_testkit::takes_bulk_write(
            db.client(),
            "a_server_with_everything_passes",
        )
        .await;
        let all = || {
            let mut d = Tick::declared(&db);
            d.extend(Event::declared(&db));
            d.extend(Score::declared(&db));
            d.extend(Item::declared(&db));
            d
        };
        commands.take();
        let plan = mongo_patterns::ensure::PlanAction::new(&db, all())
            .await
            .unwrap();
        assert!(plan.unsupported.is_empty(), "{plan}");
        let without: Vec<(&str, Feature)> = plan
            .notes
            .iter()
            .filter_map(|n| match n {
                Note::WithoutFeature {
                    collection,
                    feature,
                    ..
                } => Some((collection.as_str(), *feature)),
                _ => None,
            })
            .collect();
        if bulk_write {
            assert!(without.is_empty(), "{plan}");
        } else {
            assert_eq!(without, [(Score::COLLECTION, Feature::BulkWrite)], "{plan}");
        }
        let sent: Vec<String> = commands.take().into_iter().map(|(n, _)| n).collect();
        for once in ["hello", "buildInfo"] {
            assert_eq!(sent.iter().filter(|n| *n == once).count(), 1, "{sent:?}");
        }
        let done = mongo_patterns::ensure::EnsureAction::new(&db, all())
            .await
            .unwrap();
        assert!(done.conflicts.is_empty(), "{done}");
        let plan = mongo_patterns::ensure::PlanAction::new(&db, all())
            .await
            .unwrap();
        assert!(plan.is_up_to_date(), "{plan}");
    })
    .await;
}

fn unsupported(r: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::Unsupported { .. }))
}

/// A server that refuses every aggregation as an unknown stage (40324) or
/// operator (168), as one before `$setWindowFields`' release refuses a
/// removal's: the removal and the page reads fail with
/// `Error::Unsupported`, keeping the server's code, rather than an opaque
/// error. The removal's first aggregation (its read of the buckets) is
/// refused, so nothing is removed; once the server runs it, pages and the
/// removal are right.
#[tokio::test]
async fn a_refused_operator_is_a_typed_error() {
    let server = FaultServer::start("a_refused_operator_is_a_typed_error").await;
    bounded(120, async {
        let (c, _) = client(server.uri()).await;
        for code in [40324, 168] {
            let db = c.database(&server.db_name(&format!("uns_{code}")));
            let events = Event::buckets(&db);
            for n in 0..7 {
                events
                    .push(&Event {
                        acct: "a".into(),
                        n,
                    })
                    .await
                    .unwrap();
            }
            server
                .fail(
                    &c,
                    None,
                    doc! {"failCommands": ["aggregate"], "errorCode": code},
                )
                .await;
            let removed = events.delete("a", doc! {"n": {"$lt": 2}}).await;
            assert!(unsupported(&removed), "{code}: {removed:?}");
            let e = removed.unwrap_err();
            assert_eq!(e.code(), Some(code), "{e}");
            println!("{code}: {e}");
            let page = events.page("a", PageRequest::page(1).page_size(3)).await;
            assert!(unsupported(&page), "{code}: {page:?}");
            server.off(&c).await;

            let page = events
                .page("a", PageRequest::page(1).page_size(3))
                .await
                .unwrap();
            let ns: Vec<u32> = page.items.iter().map(|e| e.n).collect();
            assert_eq!(ns, [0, 1, 2], "{code}: nothing removed");
            assert_eq!(events.count("a").await.unwrap(), 7);
            let raw = db.collection::<Document>("uns_events");
            assert!(raw
                .find_one(doc! {"mp_stale": true})
                .await
                .unwrap()
                .is_none());
            assert_eq!(events.delete("a", doc! {"n": {"$lt": 2}}).await.unwrap(), 2);
            let page = events
                .page("a", PageRequest::page(1).page_size(3))
                .await
                .unwrap();
            let ns: Vec<u32> = page.items.iter().map(|e| e.n).collect();
            assert_eq!(ns, [2, 3, 4], "{code}");
        }
    })
    .await;
}
