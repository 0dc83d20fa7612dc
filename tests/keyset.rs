//! Keyset pagination against a real MongoDB-wire server.

use std::collections::HashSet;
use std::future::IntoFuture;

use futures::{StreamExt, TryStreamExt};
use mongo_patterns::bson::{oid::ObjectId, Bson};
use mongo_patterns::keyset::{created_between, created_since};
use mongo_patterns::prelude::*;
use mongo_patterns::{CursorError, Error};
use mongo_patterns_testkit::{assert_small_futures, client, future_size};

/// A fresh database ([`mongo_patterns_testkit::fresh_db`]), with the shard
/// keys this suite's models declare given to the routing checker, which
/// `MP_ROUTING=strict` turns on for every test (see `scripts/test`).
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    let (db, commands) = mongo_patterns_testkit::fresh_db(test).await;
    mongo_patterns_testkit::routing::declare(Visit::declared(&db));
    (db, commands)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "score")]
struct Visit {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    score: Option<i32>,
    visitor_id: String,
}

/// A page's and a count's futures fit a small allocation (`SMALL_FUTURE`):
/// a larger one would cost the operation after it more than the generated
/// code may (see the client-cost tables in `benches/*-results.md`). Nothing is sent.
#[tokio::test]
async fn operation_futures_fit_a_small_allocation() {
    let client = mongo_patterns::mongodb::Client::with_uri_str(
        "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=1",
    )
    .await
    .unwrap();
    let db = client.database("sizes");
    let q = Visit::keyset(&db).page_size(10);
    let sizes = [
        ("page", future_size(&*q.page().into_future())),
        ("count", future_size(&*q.count().into_future())),
    ];
    assert_small_futures(&sizes);
}

const N: i64 = 10_000;

/// 10k visits whose ids are shuffled against their insertion order, with
/// 41 distinct scores, and some scores null or missing.
async fn seed(db: &Database) -> Vec<(Option<i32>, i64)> {
    let coll = Visit::collection(db);
    let mut ids: Vec<i64> = (0..N).collect();
    // A fixed permutation: ids are not in insertion order.
    ids.sort_by_key(|i| (i * 7919) % N);
    let visits: Vec<Visit> = ids
        .iter()
        .map(|&id| Visit {
            id,
            score: (id % 43 < 40).then_some((id % 41) as i32),
            visitor_id: format!("v{}", id % 100),
        })
        .collect();
    // Missing, not null: `skip_serializing_if` writes no `score` at all
    // for `None` (ids ≡ 42 mod 43, the ids ≡ 85 mod 86 among them, which an
    // `updateMany` used to unset again: a write to every shard on a
    // sharded cluster, which changed nothing).
    for chunk in visits.chunks(2_000) {
        coll.insert_many(chunk).await.unwrap();
    }
    let mut order: Vec<(Option<i32>, i64)> = visits.iter().map(|v| (v.score, v.id)).collect();
    order.sort(); // None first: MongoDB's ascending order.
    order
}

fn key(v: &Visit) -> (Option<i32>, i64) {
    (v.score, v.id)
}

async fn forward(q: Keyset<Visit>) -> (Vec<Page<Visit>>, Vec<(Option<i32>, i64)>) {
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    let mut page = q.clone().page().await.unwrap();
    loop {
        assert!(seen.len() <= N as usize, "paging does not end");
        seen.extend(page.items.iter().map(key));
        let next = page.next.clone();
        pages.push(page);
        match next {
            Some(t) => page = q.clone().after(&t).page().await.unwrap(),
            None => break,
        }
    }
    (pages, seen)
}

#[tokio::test]
async fn forward_and_backward_paging_see_every_item_once_in_order() {
    let (db, commands) = fresh_db("keyset_fwd").await;
    let expected = seed(&db).await;
    let q = Visit::keyset(&db).page_size(97);

    commands.take();
    let (pages, seen) = forward(q.clone()).await;
    assert_eq!(seen, expected, "ascending pages, in order, each item once");
    assert_eq!(pages.len(), (N as usize).div_ceil(97));
    assert!(pages[..pages.len() - 1].iter().all(|p| p.items.len() == 97));
    assert!(pages[0].prev.is_none() && pages.last().unwrap().next.is_none());
    // One `find` per page, nothing else: no count, no getMore.
    let sent = commands.take();
    assert_eq!(sent.len(), pages.len());
    assert!(sent.iter().all(|(name, _)| name == "find"), "{sent:?}");

    // Backward from the last page along `prev` tokens.
    let mut back = Vec::new();
    let mut page = pages.last().unwrap().clone();
    loop {
        assert!(back.len() <= pages.len(), "backward paging does not end");
        back.push(page.items.iter().map(key).collect::<Vec<_>>());
        match page.prev.clone() {
            Some(t) => page = q.clone().before(&t).page().await.unwrap(),
            None => break,
        }
    }
    back.reverse();
    assert_eq!(back.concat(), expected, "backward paging");
    assert_eq!(back.len(), pages.len());
}

#[tokio::test]
async fn descending_paging_puts_nulls_last() {
    let (db, _) = fresh_db("keyset_desc").await;
    let mut expected = seed(&db).await;
    expected.reverse();
    let (_, seen) = forward(Visit::keyset(&db).descending().page_size(250)).await;
    assert_eq!(seen, expected);
    // The first page's `prev` leads nowhere; a page's `prev` gives back the page before.
    let (pages, _) = forward(Visit::keyset(&db).descending().page_size(1000)).await;
    let back = Visit::keyset(&db)
        .descending()
        .page_size(1000)
        .before(pages[5].prev.as_ref().unwrap())
        .page()
        .await
        .unwrap();
    assert_eq!(back.items, pages[4].items);
    assert_eq!(
        back.next.as_ref().map(ToString::to_string),
        pages[4].next.as_ref().map(ToString::to_string)
    );
}

#[tokio::test]
async fn resuming_from_any_token_continues_exactly() {
    let (db, _) = fresh_db("keyset_resume").await;
    let expected = seed(&db).await;
    let (pages, _) = forward(Visit::keyset(&db).page_size(333)).await;
    let mut offset = 0;
    for page in &pages {
        offset += page.items.len();
        let Some(token) = &page.next else { continue };
        // Through its string form, as a client would hand it back.
        let token: PageToken = token.to_string().parse().unwrap();
        let rest: Vec<_> = Visit::keyset(&db)
            .page_size(1000)
            .after(&token)
            .stream()
            .take(N as usize + 1)
            .map_ok(|v| key(&v))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(rest, expected[offset..], "resume after item {offset}");
    }
}

#[tokio::test]
async fn filters_and_streams_scan_whole_collections() {
    let (db, commands) = fresh_db("keyset_stream").await;
    let expected = seed(&db).await;
    commands.take();
    let all: Vec<Visit> = Visit::keyset(&db)
        .page_size(1000)
        .stream()
        .take(N as usize + 1)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.iter().map(key).collect::<Vec<_>>(), expected);
    assert_eq!(commands.take_count(), 10, "one find per page of 1000");

    let mine: Vec<Visit> = Visit::keyset(&db)
        .filter(doc! {"visitorId": "v7"})
        .page_size(9)
        .stream()
        .take(N as usize + 1)
        .try_collect()
        .await
        .unwrap();
    let want: Vec<_> = expected
        .iter()
        .filter(|(_, id)| id % 100 == 7)
        .copied()
        .collect();
    assert_eq!(mine.iter().map(key).collect::<Vec<_>>(), want);
    let q = Visit::keyset(&db).filter(doc! {"visitorId": "v7"});
    assert_eq!(q.count().await.unwrap(), want.len() as u64);

    // By `_id` alone, whatever the model declares.
    let ids: Vec<i64> = Visit::keyset(&db)
        .by_id()
        .page_size(4999)
        .stream()
        .take(N as usize + 1)
        .map_ok(|v| v.id)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(ids, (0..N).collect::<Vec<_>>());
}

#[tokio::test]
async fn bad_tokens_and_sizes_are_typed_errors_and_send_nothing() {
    let (db, commands) = fresh_db("keyset_bad").await;
    seed(&db).await;
    let page = Visit::keyset(&db).page_size(10).page().await.unwrap();
    let good = page.next.unwrap().to_string();
    commands.take();

    let mut bad: Vec<String> = vec![
        String::new(),
        "not a token".into(),
        good[..good.len() / 2].into(),
        format!("{good}AA"),
        "eyIkbmUiOjF9".into(), // base64 of {"$ne":1}
    ];
    for i in (0..good.len()).step_by(3) {
        let mut b = good.clone().into_bytes();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        bad.push(String::from_utf8(b).unwrap());
    }
    for s in &bad {
        match s.parse::<PageToken>() {
            Err(Error::InvalidCursor(_)) => {}
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    // A well-formed token from another sort order is foreign.
    let by_id = Visit::keyset(&db)
        .by_id()
        .page_size(10)
        .page()
        .await
        .unwrap();
    commands.take();
    let foreign = by_id.next.unwrap();
    match Visit::keyset(&db).after(&foreign).page().await {
        Err(Error::InvalidCursor(CursorError::Foreign)) => {}
        other => panic!("foreign token gave {other:?}"),
    }
    for n in [0, mongo_patterns::keyset::MAX_PAGE_SIZE + 1] {
        match Visit::keyset(&db).page_size(n).page().await {
            Err(Error::InvalidArgument {
                name: "page_size", ..
            }) => {}
            other => panic!("page_size {n} gave {other:?}"),
        }
    }
    assert_eq!(
        commands.take_count(),
        0,
        "refused before reaching the server"
    );
}

#[tokio::test]
async fn unexpected_documents_are_typed_errors() {
    let (db, _) = fresh_db("keyset_unexpected").await;
    let raw = db.collection::<Document>("visits");
    raw.insert_many([
        doc! {"_id": 1_i64, "score": 1, "visitorId": "a"},
        doc! {"_id": 2_i64, "score": "high", "visitorId": "b"},
    ])
    .await
    .unwrap();
    match Visit::keyset(&db).by_id().page().await {
        Err(Error::UnexpectedDocument { id, .. }) => assert_eq!(*id, Bson::Int64(2)),
        other => panic!("{other:?}"),
    }
    // An array in a sort key has no single position.
    raw.delete_one(doc! {"_id": 2_i64}).await.unwrap();
    raw.insert_one(doc! {"_id": 3_i64, "score": [1, 2], "visitorId": "c"})
        .await
        .unwrap();
    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "visits")]
    #[keyset(sort = "visitorId")]
    struct Loose {
        #[serde(rename = "visitorId")]
        visitor_id: String,
        score: Bson,
    }
    let q = Loose::keyset(&db).page_size(1);
    let first = q.page().await.unwrap();
    let next = first.next.unwrap();
    // Paging by score itself (an array) cannot produce a position.
    let by_score = mongo_patterns::keyset::Keyset::<Loose>::new(
        &db,
        "visits",
        mongo_patterns::keyset::KeysetSpec {
            sort: &["score"],
            descending: true,
            page_size: 1,
        },
    );
    match by_score.page().await {
        Err(Error::UnsupportedValue { field, .. }) => assert_eq!(field, "score"),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.after(&next).page().await.unwrap().items.len(), 1);
}

#[tokio::test]
async fn lost_connections_are_typed_errors() {
    // Nothing listens on a port we just bound and released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (client, _) = client(&format!(
        "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=500&directConnection=true"
    ))
    .await;
    let err = Visit::keyset(&client.database("none"))
        .page()
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test]
async fn object_id_time_ranges_select_exactly_their_seconds() {
    let (db, _) = fresh_db("keyset_time").await;
    let coll = db.collection::<Document>("events");
    let base: u32 = 1_700_000_000;
    let mut docs = Vec::new();
    for s in 0..100u32 {
        for k in 0..3u8 {
            let mut b = [0u8; 12];
            b[..4].copy_from_slice(&(base + s).to_be_bytes());
            b[4..].copy_from_slice(&[k.wrapping_mul(97); 8]);
            docs.push(doc! {"_id": ObjectId::from_bytes(b), "s": s});
        }
    }
    coll.insert_many(&docs).await.unwrap();
    let at = |s: u32| DateTime::from_millis(i64::from(base + s) * 1000);
    let seconds = |filter: Document| {
        let coll = coll.clone();
        async move {
            let found: Vec<Document> = coll
                .find(filter)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            found
                .iter()
                .map(|d| {
                    d.get_i64("s")
                        .map(|v| v as u32)
                        .or_else(|_| d.get_i32("s").map(|v| v as u32))
                        .unwrap()
                })
                .collect::<HashSet<u32>>()
        }
    };
    let got = seconds(created_between(at(10), at(20)).unwrap()).await;
    assert_eq!(got, (10..20).collect());
    let n = coll
        .count_documents(created_between(at(10), at(20)).unwrap())
        .await
        .unwrap();
    assert_eq!(n, 30);
    assert_eq!(
        seconds(created_since(at(95)).unwrap()).await,
        (95..100).collect()
    );
    // Sub-second bounds widen to whole seconds.
    let from = DateTime::from_millis(at(30).timestamp_millis() + 400);
    let to = DateTime::from_millis(at(31).timestamp_millis() + 1);
    assert_eq!(
        seconds(created_between(from, to).unwrap()).await,
        [30, 31].into()
    );
    assert!(matches!(
        created_between(at(2), at(1)),
        Err(Error::InvalidArgument { .. })
    ));
    // Pages of a time range, by `_id`.
    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "events")]
    struct Event {
        s: u32,
    }
    let ids: Vec<u32> = Event::keyset(&db)
        .filter(created_between(at(50), at(60)).unwrap())
        .page_size(7)
        .stream()
        .take(1000)
        .map_ok(|e| e.s)
        .try_collect()
        .await
        .unwrap();
    let mut want: Vec<u32> = (50..60).flat_map(|s| [s; 3]).collect();
    want.sort();
    assert_eq!(ids, want);
}
