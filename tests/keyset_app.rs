//! Keyset pagination inside an application: options reach the commands,
//! a caller's session and transaction are used, collections are chosen at
//! run time, and a deep page uses the declared index.

use std::future::IntoFuture;
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::action::Options;
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::options::{
    Collation, CollationStrength, Hint, IndexOptions, ReadConcern, ReadPreference,
    SelectionCriteria,
};
use mongo_patterns::mongodb::IndexModel;
use mongo_patterns::prelude::*;
use mongo_patterns::{CursorError, Error};
use mongo_patterns_testkit::{fresh_db, Commands, Explain};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "visits")]
#[keyset(sort = "score", page_size = 10)]
struct Visit {
    #[serde(rename = "_id")]
    id: i64,
    score: i32,
    tenant: String,
}

/// The name `declared()` gives the `{score, _id}` index.
const INDEX: &str = "mp_keyset_score";

async fn bounded<F: IntoFuture>(secs: u64, f: F) -> F::Output {
    mongo_patterns_testkit::bounded(secs, f.into_future()).await
}

fn visits(ids: std::ops::Range<i64>, tenant: &str) -> Vec<Visit> {
    ids.map(|id| Visit {
        id,
        score: ((id * 7) % 13) as i32,
        tenant: tenant.to_owned(),
    })
    .collect()
}

/// Inserts `docs` into `coll` with the raw driver.
async fn insert(db: &Database, coll: &str, docs: &[Visit]) {
    bounded(30, db.collection::<Visit>(coll).insert_many(docs))
        .await
        .unwrap();
}

/// Creates what `q` declares, with the raw driver.
async fn create_declared(db: &Database, q: &Keyset<Visit>) {
    for d in q.declared() {
        let coll = db.collection::<Document>(&d.collection);
        for index in d.indexes {
            bounded(30, coll.create_index(index)).await.unwrap();
        }
    }
}

fn en() -> Collation {
    Collation::builder()
        .locale("en")
        .strength(CollationStrength::Secondary)
        .build()
}

fn num(b: Option<&Bson>) -> Option<i64> {
    match b? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(f) => Some(*f as i64),
        _ => None,
    }
}

/// The `find`/`aggregate` commands sent since the last take, with `comment`.
fn reads(commands: &Commands, comment: &str) -> Vec<(String, Document)> {
    commands
        .take()
        .into_iter()
        .filter(|(name, cmd)| {
            (name == "find" || name == "aggregate") && cmd.get_str("comment").ok() == Some(comment)
        })
        .collect()
}

/// Each of `hint`, `collation`, `comment`, `maxTimeMS`, `readConcern` and
/// `$readPreference` is in `cmd`, as set.
fn assert_options(name: &str, cmd: &Document, max_ms: i64) {
    assert_eq!(cmd.get_str("hint").ok(), Some(INDEX), "{name}: {cmd}");
    let collation = cmd
        .get_document("collation")
        .unwrap_or_else(|_| panic!("{cmd}"));
    assert_eq!(collation.get_str("locale").ok(), Some("en"), "{cmd}");
    assert_eq!(num(collation.get("strength")), Some(2), "{cmd}");
    assert_eq!(num(cmd.get("maxTimeMS")), Some(max_ms), "{name}: {cmd}");
    let rc = cmd
        .get_document("readConcern")
        .unwrap_or_else(|_| panic!("{cmd}"));
    assert_eq!(rc.get_str("level").ok(), Some("majority"), "{cmd}");
    let rp = cmd
        .get_document("$readPreference")
        .unwrap_or_else(|_| panic!("{name}: no $readPreference in {cmd}"));
    assert_eq!(rp.get_str("mode").ok(), Some("secondaryPreferred"), "{cmd}");
}

/// `hint`, `collation`, `comment`, `maxTimeMS`, read concern and read
/// preference reach the `find` of `page`, the `aggregate` of `count` and
/// every `find` of `stream` and `pages`, from the action's setters or from
/// the query's defaults (`with_options`, `hint`, `collation`); the action's
/// comment wins over the default's.
#[tokio::test]
async fn options_reach_page_count_and_stream_commands() {
    let (db, commands) = fresh_db("keyset_app_options").await;
    insert(&db, "visits", &visits(0..35, "a")).await;
    create_declared(&db, &Visit::keyset(&db).collation(en())).await;
    let secondary = || SelectionCriteria::from(ReadPreference::secondary_preferred(None));
    commands.take();

    // page: every option from the action's setters.
    let q = Visit::keyset(&db);
    let page = bounded(
        30,
        q.page()
            .hint(Hint::Name(INDEX.into()))
            .collation(en())
            .comment("kp-page")
            .max_time(Duration::from_millis(4_000))
            .read_concern(ReadConcern::majority())
            .selection_criteria(secondary()),
    )
    .await
    .unwrap();
    assert_eq!(page.items.len(), 10);
    let sent = reads(&commands, "kp-page");
    assert_eq!(sent.len(), 1, "one find");
    assert_eq!(sent[0].0, "find");
    assert_options("page", &sent[0].1, 4_000);

    // count: the same, through `aggregate`.
    let n = bounded(
        30,
        q.count()
            .hint(Hint::Name(INDEX.into()))
            .collation(en())
            .comment("kp-count")
            .max_time(Duration::from_millis(4_001))
            .read_concern(ReadConcern::majority())
            .selection_criteria(secondary()),
    )
    .await
    .unwrap();
    assert_eq!(n, 35);
    let sent = reads(&commands, "kp-count");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "aggregate");
    assert_options("count", &sent[0].1, 4_001);

    // stream: defaults on the query, hint and collation on the builder;
    // four pages of 10 (the last one short), each its own find.
    let defaults = Options::new()
        .comment("kp-default")
        .max_time(Duration::from_millis(4_002))
        .read_concern(ReadConcern::majority())
        .selection_criteria(secondary());
    let streamed: Vec<Visit> = bounded(
        30,
        Visit::keyset(&db)
            .with_options(defaults.clone())
            .hint(Hint::Name(INDEX.into()))
            .collation(en())
            .stream()
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(streamed.len(), 35);
    let sent = reads(&commands, "kp-default");
    assert_eq!(sent.len(), 4, "{sent:?}");
    for (name, cmd) in &sent {
        assert_eq!(name, "find");
        assert_options("stream", cmd, 4_002);
    }

    // pages: the stream's own setters over the query's defaults.
    let pages: Vec<Page<Visit>> = bounded(
        30,
        Visit::keyset(&db)
            .with_options(defaults)
            .pages()
            .hint(Hint::Name(INDEX.into()))
            .collation(en())
            .comment("kp-pages")
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(pages.len(), 4);
    let sent = reads(&commands, "kp-pages");
    assert_eq!(sent.len(), 4, "the action's comment wins");
    for (_, cmd) in &sent {
        assert_options("pages", cmd, 4_002);
    }

    // The hint is obeyed, not only sent: an index that does not exist is
    // the server's error.
    let r = bounded(30, q.page().hint(Hint::Name("no_such_index".into()))).await;
    let code = r.as_ref().err().and_then(|e| e.code());
    println!("hint to a missing index: {r:?}");
    assert_eq!(code, Some(2), "BadValue: {r:?}");

    // A collation changes the order, so a token read with one is another
    // query's without it; nothing is sent.
    let token = pages[0].next.clone().unwrap();
    commands.take();
    let r = bounded(30, Visit::keyset(&db).after(&token).page()).await;
    assert!(
        matches!(r, Err(Error::InvalidCursor(CursorError::Foreign))),
        "{r:?}"
    );
    let ok = bounded(30, Visit::keyset(&db).collation(en()).after(&token).page())
        .await
        .unwrap();
    assert_eq!(ok.items, pages[1].items);
    assert_eq!(commands.take().len(), 1);
}

/// Inside a caller's transaction, `page`, `count` and `stream` read in it:
/// they see its uncommitted insert, which reads outside it do not; a read
/// concern set on the action is left to the transaction. After the abort,
/// the raw driver finds nothing of it.
#[tokio::test]
async fn reads_in_a_callers_transaction_see_its_own_writes() {
    let (db, commands) = fresh_db("keyset_app_txn").await;
    insert(&db, "visits", &visits(0..5, "a")).await;
    let client = db.client().clone();
    let mut s = bounded(30, client.start_session()).await.unwrap();
    bounded(30, s.start_transaction()).await.unwrap();
    let mine = Visit {
        id: 100,
        score: -1,
        tenant: "a".into(),
    };
    bounded(
        30,
        db.collection::<Visit>("visits")
            .insert_one(&mine)
            .session(&mut s),
    )
    .await
    .unwrap();
    commands.take();

    let q = Visit::keyset(&db);
    let outside = bounded(30, q.page()).await.unwrap();
    assert_eq!(outside.items.len(), 5);
    assert!(!outside.items.contains(&mine));

    let inside = bounded(
        30,
        q.page()
            .read_concern(ReadConcern::majority())
            .comment("kp-txn")
            .session(&mut s),
    )
    .await
    .unwrap();
    assert_eq!(inside.items.len(), 6);
    assert_eq!(inside.items[0], mine, "score -1 sorts first");
    let sent = commands.take();
    let find = sent
        .iter()
        .find(|(n, c)| n == "find" && c.get_str("comment").ok() == Some("kp-txn"))
        .unwrap_or_else(|| panic!("{sent:?}"));
    assert!(find.1.contains_key("lsid") && find.1.contains_key("txnNumber"));
    assert!(
        !find.1.contains_key("readConcern"),
        "the transaction's own: {}",
        find.1
    );

    let n = bounded(30, q.count().session(&mut s)).await.unwrap();
    assert_eq!(n, 6);
    let streamed: Vec<Visit> = bounded(
        30,
        Visit::keyset(&db)
            .page_size(2)
            .stream()
            .session(&mut s)
            .read_concern(ReadConcern::majority())
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(streamed.len(), 6);
    assert!(streamed.contains(&mine));

    bounded(30, s.abort_transaction()).await.unwrap();
    let raw = db.collection::<Document>("visits");
    assert_eq!(bounded(30, raw.count_documents(doc! {})).await.unwrap(), 5);
    assert_eq!(
        bounded(30, raw.count_documents(doc! {"_id": 100}))
            .await
            .unwrap(),
        0
    );
    // The session works on after the transaction, outside any.
    let after = bounded(30, q.page().session(&mut s)).await.unwrap();
    assert_eq!(after.items.len(), 5);
}

/// Two tenants' collections, one model: each query reads its own
/// collection only, counts only its own, names it in `collection()` and
/// `declared()`, and a token from tenant A's collection is `Foreign` on
/// tenant B's, refused before anything is sent.
#[tokio::test]
async fn tenants_collections_do_not_cross_talk() {
    let (db, commands) = fresh_db("keyset_app_tenants").await;
    insert(&db, "visits_a", &visits(0..25, "a")).await;
    insert(&db, "visits_b", &visits(1_000..1_012, "b")).await;
    let a = Visit::keyset(&db).with_collection("visits_a");
    let b = Visit::keyset(&db).with_collection("visits_b");
    assert_eq!(a.collection().name(), "visits_a");
    assert_eq!(b.declared()[0].collection, "visits_b");

    let all_a: Vec<Visit> = bounded(30, a.clone().stream().try_collect::<Vec<_>>())
        .await
        .unwrap();
    let all_b: Vec<Visit> = bounded(30, b.clone().stream().try_collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(all_a.len(), 25);
    assert!(all_a.iter().all(|v| v.tenant == "a"));
    assert_eq!(all_b.len(), 12);
    assert!(all_b.iter().all(|v| v.tenant == "b"));
    assert_eq!(bounded(30, a.count()).await.unwrap(), 25);
    assert_eq!(bounded(30, b.count()).await.unwrap(), 12);
    // The compile-time name stays the default, and is empty here.
    assert_eq!(bounded(30, Visit::keyset(&db).count()).await.unwrap(), 0);

    let first_a = bounded(30, a.page()).await.unwrap();
    let token = first_a.next.unwrap();
    commands.take();
    let r = bounded(30, b.clone().after(&token).page()).await;
    assert!(
        matches!(r, Err(Error::InvalidCursor(CursorError::Foreign))),
        "{r:?}"
    );
    assert_eq!(commands.take_count(), 0, "refused before anything is sent");
    let second_a = bounded(30, a.clone().after(&token).page()).await.unwrap();
    assert_eq!(second_a.items.len(), 10);
    assert!(second_a.items.iter().all(|v| v.tenant == "a"));

    // Raw check: nothing moved between the collections.
    for (coll, tenant, n) in [("visits_a", "a", 25), ("visits_b", "b", 12)] {
        let raw = db.collection::<Document>(coll);
        assert_eq!(
            bounded(30, raw.count_documents(doc! {"tenant": tenant}))
                .await
                .unwrap(),
            n
        );
        assert_eq!(bounded(30, raw.count_documents(doc! {})).await.unwrap(), n);
    }
}

/// With the index `declared()` names created, a page of 50 at depth 1,500
/// (of 2,000; each score held by two visits) is one `IXSCAN` on that
/// index, in index order (no `SORT`), examining about a page of keys.
#[tokio::test]
async fn deep_page_uses_the_declared_index() {
    let (db, _) = fresh_db("keyset_app_index").await;
    let docs: Vec<Visit> = (0..2_000)
        .map(|id| Visit {
            id,
            score: ((id * 7_919) % 1_000) as i32,
            tenant: "a".into(),
        })
        .collect();
    insert(&db, "visits", &docs).await;
    let q = Visit::keyset(&db).page_size(50);
    create_declared(&db, &q).await;
    let indexes = bounded(30, db.collection::<Document>("visits").list_index_names())
        .await
        .unwrap();
    assert!(indexes.contains(&INDEX.to_owned()), "{indexes:?}");

    // Depth 1,500: the token after the 1,500th item.
    let skip = bounded(30, q.clone().page_size(1_500).page())
        .await
        .unwrap();
    let deep = q.clone().after(skip.next.as_ref().unwrap());
    let page = bounded(30, deep.page()).await.unwrap();
    assert_eq!(page.items.len(), 50);

    let (filter, sort, limit) = deep.command().unwrap();
    let explain = bounded(
        30,
        db.run_command(doc! {
            "explain": {"find": "visits", "filter": filter, "sort": sort, "limit": limit},
            "verbosity": "executionStats",
        }),
    )
    .await
    .unwrap();
    let e = Explain::of(&explain);
    let plan = e.stage_names();
    let keys = e.keys_examined.unwrap_or_else(|| panic!("{explain}"));
    let docs = e.docs_examined.unwrap_or_else(|| panic!("{explain}"));
    println!("depth 1500, page of 50: plan {plan:?}, keys examined {keys}, docs examined {docs}");
    // One scan of the index per shard that holds the collection.
    assert_eq!(
        e.index_scans(),
        vec![INDEX; e.shards.max(1)],
        "winning plan: {explain}"
    );
    assert!(
        !plan.iter().any(|s| s == "SORT"),
        "in index order: {plan:?}"
    );
    assert!(keys <= 60, "a seek, not a scan: {keys} keys examined");
    assert!(docs <= 60, "{docs} documents examined");
}

/// The index `name` on `coll`, as `listIndexes` shows it.
async fn listed_index(db: &Database, coll: &str, name: &str) -> Option<Document> {
    let reply = bounded(30, db.run_command(doc! {"listIndexes": coll}))
        .await
        .unwrap();
    let batch = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|_| panic!("{reply}"));
    batch
        .iter()
        .filter_map(Bson::as_document)
        .find(|ix| ix.get_str("name").ok() == Some(name))
        .cloned()
}

/// A collated query's index carries the collation: `ensure` creates it
/// with it and `plan` then finds it up to date; an index on the same keys
/// with the simple collation does not serve it (under the declared name a
/// conflict, under another name not taken for it), nor does a collated
/// index serve the same query without a collation.
#[tokio::test]
async fn ensure_gives_the_keyset_index_the_querys_collation() {
    use mongo_patterns::ensure::{Conflict, PlanAction};

    let (db, _) = fresh_db("keyset_app_collation").await;
    let q = Visit::keyset(&db).collation(en());
    let done = bounded(30, q.ensure()).await.unwrap();
    assert_eq!(done.indexes_created.len(), 1, "{done}");
    let ix = listed_index(&db, "visits", INDEX).await.unwrap();
    let collation = ix
        .get_document("collation")
        .unwrap_or_else(|_| panic!("created without the collation: {ix}"));
    assert_eq!(collation.get_str("locale").ok(), Some("en"), "{ix}");
    assert_eq!(num(collation.get("strength")), Some(2), "{ix}");
    let plan = bounded(30, PlanAction::new(&db, q.declared()))
        .await
        .unwrap();
    assert!(plan.is_up_to_date() && plan.notes.is_empty(), "{plan}");
    let again = bounded(30, q.ensure()).await.unwrap();
    assert!(again.created_nothing(), "{again}");
    // The same keys without a collation: the collated index does not serve.
    let plan = bounded(30, PlanAction::new(&db, Visit::keyset(&db).declared()))
        .await
        .unwrap();
    assert!(
        matches!(&plan.conflicts[..], [Conflict::Index { declared, .. }] if declared.name == INDEX),
        "{plan}"
    );

    // A simple-collation index under the declared name: a conflict.
    let (db, _) = fresh_db("keyset_app_collation_simple").await;
    create_declared(&db, &Visit::keyset(&db)).await;
    let q = Visit::keyset(&db).collation(en());
    let plan = bounded(30, PlanAction::new(&db, q.declared()))
        .await
        .unwrap();
    assert!(!plan.is_up_to_date(), "{plan}");
    assert!(
        matches!(&plan.conflicts[..], [Conflict::Index { found, .. }] if !found.contains_key("collation")),
        "{plan}"
    );

    // Under another name: not taken for the declared one, which is created.
    let (db, _) = fresh_db("keyset_app_collation_other").await;
    let theirs = IndexModel::builder()
        .keys(doc! {"score": 1, "_id": 1})
        .options(IndexOptions::builder().name("by_score".to_owned()).build())
        .build();
    bounded(30, db.collection::<Document>("visits").create_index(theirs))
        .await
        .unwrap();
    let q = Visit::keyset(&db).collation(en());
    let plan = bounded(30, PlanAction::new(&db, q.declared()))
        .await
        .unwrap();
    assert!(plan.notes.is_empty(), "{plan}");
    assert_eq!(plan.create_indexes.len(), 1, "{plan}");
    let done = bounded(30, q.ensure()).await.unwrap();
    assert_eq!(done.indexes_created.len(), 1, "{done}");
    let ix = listed_index(&db, "visits", INDEX).await.unwrap();
    assert_eq!(
        ix.get_document("collation")
            .ok()
            .and_then(|c| c.get_str("locale").ok()),
        Some("en"),
        "{ix}"
    );
}
