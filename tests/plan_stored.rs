//! `plan` against stored data: an attribute changed over documents the old
//! declaration wrote (a bucket `size` lowered, its `items` renamed, a rank
//! histogram's `layout` or `precision` changed) is a `Conflict::Stored`
//! that counts them and names the first by `_id`, and says what the
//! repository does with them. The `_id`s are the ones the repository's own
//! calls then refuse or miss; `ensure` does not look.

use mongo_patterns::mongodb::bson::Bson;
use mongo_patterns::prelude::*;
use mongo_patterns::Error;
use mongo_patterns_testkit::{bounded, fresh_db, stored_conflicts};

/// The declaration the buckets were written under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 10, key = "customer")]
struct Trade {
    customer: i64,
    n: i64,
}

/// `size` lowered to 4 over buckets of 10.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 4, key = "customer")]
struct Smaller {
    customer: i64,
    n: i64,
}

/// `items` renamed over stored buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "trades")]
#[bucket(size = 10, key = "customer", items = "trades")]
struct Renamed {
    customer: i64,
    n: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "scores")]
#[rank_histogram(precision = 0.5)]
struct Half {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// `precision` changed from 0.5 to 1 on the same histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "scores")]
#[rank_histogram(precision = 1.0)]
struct Whole {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

/// `layout` changed from array to documents on the same histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "scores")]
#[rank_histogram(precision = 0.5, layout = "documents", histogram = "scores_ranks")]
struct HalfDocs {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

#[tokio::test]
async fn a_lowered_size_or_renamed_items_are_found_by_id() {
    let (db, _) = fresh_db("plan_stored_bucket").await;
    bounded(60, async {
        let trades = Trade::buckets(&db);
        for n in 0..35 {
            trades.push(&Trade { customer: 7, n }).await.unwrap();
        }
        for n in 0..3 {
            trades.push(&Trade { customer: 8, n }).await.unwrap();
        }
        let plan = Trade::plan(&db).await.unwrap();
        assert!(stored_conflicts(&plan.conflicts).is_empty(), "{plan}");

        // Buckets of 10, 10, 10 and 5 for 7 hold more than 4; 8's 3 fit.
        let plan = Smaller::plan(&db).await.unwrap();
        let found = stored_conflicts(&plan.conflicts);
        assert_eq!(found.len(), 1, "{plan}");
        let (collection, count, ids) = &found[0];
        assert_eq!((collection.as_str(), *count), ("trades", 4), "{plan}");
        assert_eq!(ids.len(), 4);
        assert!(!plan.is_up_to_date());
        let text = plan.to_string();
        assert!(
            text.contains("holds 4 buckets this declaration refuses") && text.contains("Damaged"),
            "{text}"
        );
        // What the plan names is what the repository refuses.
        match Smaller::buckets(&db).count(&7).await {
            Err(Error::Damaged { id, field, .. }) => {
                assert!(ids.contains(&id), "{id} not in {ids:?}");
                assert_eq!(field, "count");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(Smaller::buckets(&db).count(&8).await.unwrap(), 3);

        // Under `items = "trades"` every stored bucket lacks its array
        // (7's four and the one opened ahead, and 8's).
        let all = db
            .collection::<Document>("trades")
            .count_documents(doc! {})
            .await
            .unwrap();
        let plan = Renamed::plan(&db).await.unwrap();
        let found = stored_conflicts(&plan.conflicts);
        assert_eq!(found.len(), 1, "{plan}");
        assert_eq!(found[0].1, all, "{plan}");
        assert!(matches!(
            Renamed::buckets(&db).count(&8).await,
            Err(Error::Damaged { field, .. }) if field == "trades"
        ));

        // `ensure` does not read the stored documents.
        let done = Smaller::ensure(&db).await.unwrap();
        assert!(stored_conflicts(&done.conflicts).is_empty(), "{done}");
    })
    .await;
}

#[tokio::test]
async fn a_changed_precision_or_layout_is_found_and_rebuild_all_migrates() {
    let (db, _) = fresh_db("plan_stored_rank").await;
    bounded(60, async {
        let half = Half::ranks(&db);
        for (i, score) in [70.0, 70.5, 71.0, 88.5, 90.0].into_iter().enumerate() {
            let exam_id = if i % 2 == 0 { "math" } else { "art" };
            half.insert(&Half {
                student: format!("s{i}"),
                exam_id: exam_id.into(),
                score,
            })
            .await
            .unwrap();
        }
        let plan = Half::plan(&db).await.unwrap();
        assert!(stored_conflicts(&plan.conflicts).is_empty(), "{plan}");
        assert_eq!(
            Half::ranks(&db).histogram_collection().name(),
            HalfDocs::ranks(&db).histogram_collection().name()
        );

        // 70.5 and 88.5 (on "art") are between two steps of 1: the one
        // array document of "art".
        let plan = Whole::plan(&db).await.unwrap();
        let found = stored_conflicts(&plan.conflicts);
        assert_eq!(found.len(), 1, "{plan}");
        assert_eq!(found[0].1, 1);
        assert_eq!(found[0].2, vec![Bson::String("art".into())]);
        assert!(plan.to_string().contains("rebuild_all"), "{plan}");
        Whole::ranks(&db).rebuild_all().await.unwrap();
        let plan = Whole::plan(&db).await.unwrap();
        assert!(stored_conflicts(&plan.conflicts).is_empty(), "{plan}");

        // The documents layout over the array layout's two boards.
        let plan = HalfDocs::plan(&db).await.unwrap();
        let found = stored_conflicts(&plan.conflicts);
        assert_eq!(found.len(), 1, "{plan}");
        assert_eq!(found[0].1, 2, "{plan}");
        let docs = HalfDocs::ranks(&db);
        docs.rebuild_all().await.unwrap();
        assert_eq!(docs.rank("math", 70.0).await.unwrap().total, 3);
        // The migration's last step: the old layout's documents go.
        db.collection::<Document>(docs.histogram_collection().name())
            .delete_many(doc! {"scores": {"$exists": true}})
            .await
            .unwrap();
        let plan = HalfDocs::plan(&db).await.unwrap();
        assert!(stored_conflicts(&plan.conflicts).is_empty(), "{plan}");
        assert_eq!(docs.rank("art", 70.5).await.unwrap().total, 2);
    })
    .await;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "initTime", page_size = 3)]
struct Visit {
    #[serde(rename = "_id")]
    id: i64,
    init_time: i64,
    visitor: i64,
}

/// The keyset's `sort` changed over the same documents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "visitor", order = "desc", page_size = 3)]
struct VisitByVisitor {
    #[serde(rename = "_id")]
    id: i64,
    init_time: i64,
    visitor: i64,
}

/// A keyset's `sort` and `order` changed: pages follow the new order
/// exactly (an oracle sorts the documents), a token from the old one is
/// refused as foreign, and `plan` names the old index, no longer declared
/// and left in place, beside the new one to create.
#[tokio::test]
async fn a_changed_keyset_sort_pages_in_the_new_order_and_names_the_old_index() {
    use futures::TryStreamExt;
    use mongo_patterns::ensure::Note;
    use mongo_patterns::{CursorError, Error};
    let (db, _) = fresh_db("plan_stored_keyset").await;
    bounded(60, async {
        Visit::ensure(&db).await.unwrap();
        let all: Vec<Visit> = (0..20)
            .map(|id| Visit {
                id,
                init_time: 1_000 - id * 7 % 13,
                visitor: id * 5 % 7,
            })
            .collect();
        Visit::collection(&db).insert_many(&all).await.unwrap();
        let old = Visit::keyset(&db).page().await.unwrap();
        let token = old.next.clone().unwrap();

        let plan = VisitByVisitor::plan(&db).await.unwrap();
        assert!(
            plan.create_indexes
                .iter()
                .any(|i| i.name == "mp_keyset_visitor"),
            "{plan}"
        );
        assert!(
            plan.notes.iter().any(
                |n| matches!(n, Note::UndeclaredIndex { name, .. } if name == "mp_keyset_initTime")
            ),
            "{plan}"
        );
        VisitByVisitor::ensure(&db).await.unwrap();

        let got: Vec<i64> = VisitByVisitor::keyset(&db)
            .stream()
            .map_ok(|v| v.id)
            .try_collect()
            .await
            .unwrap();
        let mut want: Vec<(i64, i64)> = all.iter().map(|v| (v.visitor, v.id)).collect();
        want.sort();
        want.reverse();
        assert_eq!(got, want.into_iter().map(|(_, id)| id).collect::<Vec<_>>());
        assert!(matches!(
            VisitByVisitor::keyset(&db).after(&token).page().await,
            Err(Error::InvalidCursor(CursorError::Foreign))
        ));
    })
    .await;
}

/// Buckets filled in arrival order...
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals")]
#[bucket(size = 10, key = "customer")]
struct Arrival {
    customer: i64,
    at: i64,
}

/// ... then `order` declared over them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals")]
#[bucket(size = 10, key = "customer", order = "at")]
struct Ordered {
    customer: i64,
    at: i64,
}

#[tokio::test]
async fn order_declared_over_arrival_order_is_found() {
    let (db, _) = fresh_db("plan_stored_order").await;
    bounded(60, async {
        let arrivals = Arrival::buckets(&db);
        // Customer 1 in order; customer 2 out of order in its second
        // bucket only.
        for at in 0..15 {
            arrivals.push(&Arrival { customer: 1, at }).await.unwrap();
        }
        for at in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 11, 12] {
            arrivals.push(&Arrival { customer: 2, at }).await.unwrap();
        }
        assert!(stored_conflicts(&Arrival::plan(&db).await.unwrap().conflicts).is_empty());
        let plan = Ordered::plan(&db).await.unwrap();
        let found = stored_conflicts(&plan.conflicts);
        assert_eq!(found.len(), 1, "{plan}");
        assert_eq!(found[0].1, 1, "{plan}");
        assert_eq!(
            found[0].2,
            vec![Bson::Document(doc! {"k": 2_i64, "s": 1_i64})]
        );
        assert!(plan.to_string().contains("not in `at`"), "{plan}");
    })
    .await;
}
