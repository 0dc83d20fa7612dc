//! Keyset pagination under hostile tokens, mixed-type data and untrusted
//! filters, against a real MongoDB-wire server. Every expectation is checked
//! against the server's own `find().sort()` through the raw driver.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_patterns::bson::spec::BinarySubtype;
use mongo_patterns::bson::{self, Binary, Bson, Decimal128, Timestamp};
use mongo_patterns::keyset::{KeysetSpec, MAX_TOKEN_DEPTH, MAX_TOKEN_LEN};
use mongo_patterns::prelude::*;
use mongo_patterns::{CursorError, Error};
use mongo_patterns_testkit::forge::{b64_decode, b64_encode, fnv1a64};
use mongo_patterns_testkit::Explain;

/// The test kit's time bound, for actions as well as futures.
async fn bounded<F: IntoFuture>(secs: u64, f: F) -> F::Output {
    mongo_patterns_testkit::bounded(secs, f.into_future()).await
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "readings")]
#[keyset(sort = "v")]
struct Reading {
    #[serde(rename = "_id")]
    id: i64,
    v: f64,
}

/// Another model on the same collection, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "readings")]
#[keyset(sort = "v", order = "desc")]
struct ReadingDesc {
    #[serde(rename = "_id")]
    id: i64,
    v: f64,
}

/// Every model's declarations: the fault suites set their validators at
/// `strict` (`testkit::strict_validators`), so that nothing these faults
/// make the repositories write, retry or repair may break the pattern's
/// invariants.
fn declared(db: &Database) -> Vec<mongo_patterns::ensure::Declared> {
    [Reading::declared(db), ReadingDesc::declared(db)].concat()
}

/// A fresh database with [`declared`]'s validators at `strict`. A test
/// that stores a broken document on purpose takes the test kit's own
/// `fresh_db`.
async fn fresh_db(test: &str) -> (Database, mongo_patterns_testkit::Commands) {
    mongo_patterns_testkit::fresh_db_strict(test, declared).await
}

/// Any value in the sort key, to page mixed-type data as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Loose {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(default)]
    v: Option<Bson>,
}

fn loose(db: &Database, coll: &str, page: u32, descending: bool) -> Keyset<Loose> {
    Keyset::new(
        db,
        coll,
        KeysetSpec {
            sort: &["v"],
            descending,
            page_size: page,
        },
    )
}

/// What a stream yields until it ends or fails.
async fn drain<T>(
    s: impl futures::Stream<Item = mongo_patterns::Result<T>> + Unpin,
) -> (Vec<T>, Option<Error>) {
    let mut s = s.take(100_000);
    let mut items = Vec::new();
    while let Some(r) = bounded(60, s.next()).await {
        match r {
            Ok(v) => items.push(v),
            Err(e) => return (items, Some(e)),
        }
    }
    (items, None)
}

/// The server's own order of `coll` sorted by `v` then `_id`, as `_id`s.
async fn server_order(db: &Database, coll: &str, descending: bool) -> Vec<i64> {
    let dir = if descending { -1 } else { 1 };
    let docs: Vec<Document> = bounded(60, async {
        db.collection::<Document>(coll)
            .find(doc! {})
            .sort(doc! {"v": dir, "_id": dir})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    docs.iter().map(|d| d.get_i64("_id").unwrap()).collect()
}

/// A well-formed token of this crate's layout (version 2) with a valid
/// checksum around `values`: what a forger can build without a key.
fn forge(fingerprint: u64, values: Vec<Bson>) -> String {
    forge_doc(
        fingerprint,
        &mongo_patterns_testkit::bsonc::to_vec(&doc! {"v": values}).unwrap(),
    )
}

fn forge_doc(fingerprint: u64, doc: &[u8]) -> String {
    let mut out = vec![2u8, 0];
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(doc);
    let sum = fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    b64_encode(&out)
}

fn nest(depth: usize) -> Bson {
    let mut v = Bson::Int32(1);
    for _ in 0..depth {
        v = Bson::Document(doc! {"a": v});
    }
    v
}

/// A token whose value is nested 150 deep once overflowed the stack inside
/// the BSON decoder and aborted the process; a 10 MB token parsed into a
/// 20 MB filter. Both are refused before decoding, cheaply.
#[tokio::test]
async fn hostile_tokens_are_refused_before_decoding() {
    let deep = forge(0, vec![nest(150)]);
    assert!(deep.len() < MAX_TOKEN_LEN, "{} chars", deep.len());
    match deep.parse::<PageToken>() {
        Err(Error::InvalidCursor(CursorError::TooDeep { .. })) => {}
        other => panic!("150 deep gave {other:?}"),
    }
    match forge(0, vec![nest(MAX_TOKEN_DEPTH + 1)]).parse::<PageToken>() {
        Err(Error::InvalidCursor(CursorError::TooDeep { .. })) => {}
        other => panic!("{} deep gave {other:?}", MAX_TOKEN_DEPTH + 1),
    }
    assert!(forge(0, vec![nest(MAX_TOKEN_DEPTH)])
        .parse::<PageToken>()
        .is_ok());

    // 10 MB of valid base64 (a real 10 MB token would be the same to us).
    let huge = "A".repeat(10 << 20);
    let t = Instant::now();
    for _ in 0..100 {
        match huge.parse::<PageToken>() {
            Err(Error::InvalidCursor(CursorError::TooLong { len, .. })) => {
                assert_eq!(len, 10 << 20)
            }
            other => panic!("10 MB gave {other:?}"),
        }
    }
    let each = t.elapsed() / 100;
    assert!(each < Duration::from_millis(1), "{each:?} per refusal");
    // Through serde too, as a web framework would hand it over.
    let json = format!("\"{huge}\"");
    let t = Instant::now();
    assert!(testkit_json::from_str::<PageToken>(&json).is_err());
    assert!(
        t.elapsed() < Duration::from_millis(5),
        "{:?} via serde",
        t.elapsed()
    );
    println!(
        "150-deep token ({} chars): TooDeep; 10 MB token: TooLong in {each:?} ({:?} via serde)",
        deep.len(),
        t.elapsed()
    );
}

/// serde_json is not a dependency; a minimal string deserializer stands in
/// for a framework's.
mod testkit_json {
    use serde::de::{self, Deserialize, Deserializer, Visitor};

    pub struct Str<'a>(&'a str);

    #[derive(Debug)]
    pub struct E(String);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    impl std::error::Error for E {}
    impl de::Error for E {
        fn custom<T: std::fmt::Display>(msg: T) -> Self {
            E(msg.to_string())
        }
    }

    impl<'de> Deserializer<'de> for Str<'de> {
        type Error = E;
        fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, E> {
            let s = self.0;
            v.visit_borrowed_str(&s[1.min(s.len())..s.len().saturating_sub(1).max(1.min(s.len()))])
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 u8 u16 u32 u64 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map struct enum identifier ignored_any
        }
    }

    pub fn from_str<'a, T: Deserialize<'a>>(s: &'a str) -> Result<T, E> {
        T::deserialize(Str(s))
    }
}

/// `numbers + nans` readings; the NaNs spread among the ids, so they are
/// neither first nor last by `_id`.
async fn seed_readings(db: &Database, nans: i64, numbers: i64) {
    let total = nans + numbers;
    let docs: Vec<Document> = (0..total)
        .map(|id| {
            let nan = nans > 0 && id % (total / nans) == 7 && id / (total / nans) < nans;
            let v = if nan {
                f64::NAN
            } else {
                (id * 37 % 101) as f64 - 50.0
            };
            doc! {"_id": id, "v": v}
        })
        .collect();
    db.collection::<Document>("readings")
        .insert_many(docs)
        .await
        .unwrap();
}

/// NaN sorts below every number in MongoDB, but `$gt: NaN` matches nothing
/// and `$lt: x` never matches NaN: ascending with page size 1, the scan once
/// ended after the NaNs (204 of 207 readings never seen), and descending
/// never returned them.
#[tokio::test]
async fn nan_sort_keys_are_paged_in_server_order() {
    let (db, _) = fresh_db("keyset_nan").await;
    seed_readings(&db, 3, 204).await;
    let raw = db.collection::<Document>("readings");
    assert_eq!(raw.count_documents(doc! {"v": f64::NAN}).await.unwrap(), 3);
    for descending in [false, true] {
        let want = server_order(&db, "readings", descending).await;
        assert_eq!(want.len(), 207);
        for page in [1, 2, 5, 1000] {
            let mut q = Reading::keyset(&db).page_size(page);
            if descending {
                q = q.descending();
            }
            let (items, err) = drain(q.stream()).await;
            assert!(err.is_none(), "{err:?}");
            let got: Vec<i64> = items.iter().map(|r| r.id).collect();
            println!(
                "NaN readings, {} page {page}: {} of 207 seen",
                if descending { "desc" } else { "asc" },
                got.len()
            );
            assert_eq!(got, want, "descending {descending}, page size {page}");
        }
    }
}

/// Strings stored in an `f64` sort key: ascending pages up to the number of
/// numeric documents once skipped them silently; now every page size and
/// both directions fail with the same `UnexpectedDocument`, naming the
/// first string's `_id` in the server's order, after exactly the items
/// before it.
#[tokio::test]
async fn strings_in_a_float_key_fail_alike_on_every_page_size() {
    // Stores what the validators refuse, on purpose: none set.
    let (db, _) = mongo_patterns_testkit::fresh_db("keyset_strings").await;
    let raw = db.collection::<Document>("readings");
    let mut docs: Vec<Document> = (0..200_i64)
        .map(|id| doc! {"_id": id, "v": (id * 13 % 97) as f64})
        .collect();
    for id in [17_i64, 99, 150] {
        docs[id as usize] = doc! {"_id": id, "v": format!("n/a {id}")};
    }
    raw.insert_many(docs).await.unwrap();
    for descending in [false, true] {
        let order = server_order(&db, "readings", descending).await;
        let first_string = order
            .iter()
            .position(|id| [17, 99, 150].contains(id))
            .unwrap();
        for page in [1, 2, 5, 100, 197, 1000] {
            let mut q = Reading::keyset(&db).page_size(page);
            if descending {
                q = q.descending();
            }
            let (items, err) = drain(q.stream()).await;
            match err {
                Some(Error::UnexpectedDocument { id, .. }) => {
                    assert_eq!(*id, Bson::Int64(order[first_string]))
                }
                other => panic!("descending {descending}, page {page}: {other:?}"),
            }
            // A page fails whole: the items yielded are whole pages before it.
            let seen: Vec<i64> = items.iter().map(|r| r.id).collect();
            assert_eq!(seen, order[..seen.len()], "in order, none skipped");
            assert!(seen.len() <= first_string);
            assert_eq!(
                seen.len(),
                first_string / page as usize * page as usize,
                "page {page}"
            );
        }
    }
}

/// Values of every orderable type in one key, with NaNs, nulls and missing
/// fields: `stream()` returns each document exactly once, in the server's
/// own `find().sort()` order, at every page size and in both directions.
#[tokio::test]
async fn mixed_type_keys_are_paged_in_server_order() {
    let (db, _) = fresh_db("keyset_mixed").await;
    let raw = db.collection::<Document>("mixed");
    let dnan: Decimal128 = "NaN".parse().unwrap();
    let dec: Decimal128 = "2.5".parse().unwrap();
    let values: Vec<Option<Bson>> = vec![
        Some(Bson::Double(f64::NAN)),
        Some(Bson::Double(-f64::NAN)),
        Some(Bson::Decimal128(dnan)),
        Some(Bson::Double(f64::NEG_INFINITY)),
        Some(Bson::Double(f64::INFINITY)),
        Some(Bson::Double(0.5)),
        Some(Bson::Int32(2)),
        Some(Bson::Int64(2)),
        Some(Bson::Decimal128(dec)),
        Some(Bson::Int64(-7)),
        Some(Bson::Null),
        None,
        Some(Bson::String(String::new())),
        Some(Bson::String("b".into())),
        Some(Bson::String("a".into())),
        Some(Bson::Document(doc! {})),
        Some(Bson::Document(doc! {"a": 1})),
        Some(Bson::Document(doc! {"a": "x", "b": {"c": 1}})),
        Some(Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![],
        })),
        Some(Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![1, 2],
        })),
        Some(Bson::ObjectId(ObjectId::from_bytes([0; 12]))),
        Some(Bson::ObjectId(ObjectId::new())),
        Some(Bson::Boolean(false)),
        Some(Bson::Boolean(true)),
        Some(Bson::DateTime(DateTime::MIN)),
        Some(Bson::DateTime(DateTime::from_millis(5))),
        Some(Bson::Timestamp(Timestamp {
            time: 0,
            increment: 0,
        })),
        Some(Bson::Timestamp(Timestamp {
            time: 9,
            increment: 1,
        })),
    ];
    // Each value three times, under ids that do not follow value order.
    let mut docs = Vec::new();
    for copy in 0..3_i64 {
        for (i, v) in values.iter().enumerate() {
            let id = (i as i64 * 7 + copy * 31) % 1000 + copy * 1000;
            let mut d = doc! {"_id": id};
            if let Some(v) = v {
                d.insert("v", v.clone());
            }
            docs.push(d);
        }
    }
    raw.insert_many(docs).await.unwrap();
    let n = values.len() * 3;
    for descending in [false, true] {
        let want = server_order(&db, "mixed", descending).await;
        assert_eq!(want.len(), n);
        for page in [1, 2, 5, 1000] {
            let (items, err) = drain(loose(&db, "mixed", page, descending).stream()).await;
            assert!(err.is_none(), "{err:?}");
            let got: Vec<i64> = items.iter().map(|d| d.id).collect();
            assert_eq!(got, want, "descending {descending}, page size {page}");
        }
        // And back again along `prev` tokens, from the last page.
        let pages: Vec<Page<Loose>> = bounded(
            60,
            loose(&db, "mixed", 4, descending)
                .pages()
                .take(1000)
                .try_collect(),
        )
        .await
        .unwrap();
        let mut back = Vec::new();
        let mut page = pages.last().unwrap().clone();
        loop {
            assert!(back.len() <= pages.len());
            back.push(page.items.iter().map(|d| d.id).collect::<Vec<_>>());
            match page.prev.clone() {
                Some(t) => {
                    page = bounded(60, loose(&db, "mixed", 4, descending).before(&t).page())
                        .await
                        .unwrap()
                }
                None => break,
            }
        }
        back.reverse();
        assert_eq!(back.concat(), want, "backward, descending {descending}");
    }
}

/// Values that have no position (an array, a regex, MinKey, MaxKey, code)
/// fail with `UnsupportedValue` naming the document, wherever they sort and
/// on every page size: every returned document's sort values are checked,
/// not only a page's edges.
#[tokio::test]
async fn unorderable_values_fail_on_every_page_size() {
    let (db, _) = fresh_db("keyset_unorderable").await;
    let raw = db.collection::<Document>("odd");
    let bad: Vec<Bson> = vec![
        Bson::Array(vec![Bson::Int32(3), Bson::Int32(4)]),
        mongo_patterns_testkit::bsonc::regex("a", ""),
        Bson::MinKey,
        Bson::MaxKey,
        Bson::JavaScriptCode("x".into()),
        Bson::Array(vec![]),
    ];
    for (k, value) in bad.into_iter().enumerate() {
        raw.delete_many(doc! {}).await.unwrap();
        let mut docs: Vec<Document> = (0..50_i64)
            .map(|id| doc! {"_id": id, "v": (id % 10) as f64})
            .collect();
        docs.push(doc! {"_id": 1000 + k as i64, "v": value.clone()});
        raw.insert_many(docs).await.unwrap();
        for descending in [false, true] {
            for page in [1, 2, 5, 1000] {
                let (items, err) = drain(loose(&db, "odd", page, descending).stream()).await;
                match err {
                    Some(Error::UnsupportedValue { id, field, .. }) => {
                        assert_eq!(*id, Bson::Int64(1000 + k as i64));
                        assert_eq!(field, "v");
                    }
                    other => panic!("{value}: descending {descending}, page {page}: {other:?}"),
                }
                assert!(items.iter().all(|d| d.id < 1000));
            }
        }
    }
}

/// A token made by an ascending query was accepted by the same query
/// `.descending()`, and by another model with `order = "desc"` on the same
/// collection: it returned items already shown. The fingerprint now covers
/// the database, the collection, the sort keys and the direction.
#[tokio::test]
async fn tokens_from_another_direction_or_database_are_foreign() {
    let (db, commands) = fresh_db("keyset_foreign").await;
    let (other_db, _) = fresh_db("keyset_foreign_b").await;
    seed_readings(&db, 0, 50).await;
    seed_readings(&other_db, 0, 50).await;
    let first = bounded(60, Reading::keyset(&db).page_size(10).page())
        .await
        .unwrap();
    let token = first.next.unwrap();
    let token: PageToken = token.to_string().parse().unwrap();
    commands.take();
    fn foreign<T>(r: mongo_patterns::Result<Page<T>>) -> bool {
        matches!(r, Err(Error::InvalidCursor(CursorError::Foreign)))
    }
    assert!(foreign(
        bounded(60, Reading::keyset(&db).descending().after(&token).page()).await
    ));
    assert!(foreign(
        bounded(60, ReadingDesc::keyset(&db).after(&token).page()).await
    ));
    assert!(foreign(
        bounded(60, ReadingDesc::keyset(&db).before(&token).page()).await
    ));
    assert!(foreign(
        bounded(60, Reading::keyset(&other_db).after(&token).page()).await
    ));
    assert_eq!(commands.take_count(), 0, "refused before anything is sent");
    // The query's own `prev` tokens still lead back, in its direction.
    let q = ReadingDesc::keyset(&db).page_size(10);
    let p1 = bounded(60, q.clone().page()).await.unwrap();
    let p2 = bounded(60, q.clone().after(p1.next.as_ref().unwrap()).page())
        .await
        .unwrap();
    let back = bounded(60, q.clone().before(p2.prev.as_ref().unwrap()).page())
        .await
        .unwrap();
    assert_eq!(back.items, p1.items);
    assert!(bounded(60, Reading::keyset(&db).after(&token).page())
        .await
        .is_ok());
}

/// Signed tokens: a forged token, a token replayed against another filter
/// (another tenant) or key, and an unsigned token are all `InvalidCursor`,
/// before anything is sent. Paging with a key sees every item once.
#[tokio::test]
async fn signed_tokens_bind_the_filter_and_refuse_forgeries() {
    let (db, commands) = fresh_db("keyset_signed").await;
    let raw = db.collection::<Document>("readings");
    let docs: Vec<Document> = (0..120_i64)
        .map(|id| doc! {"_id": id, "v": (id % 17) as f64, "tenant": if id % 2 == 0 { "a" } else { "b" }})
        .collect();
    raw.insert_many(docs).await.unwrap();
    let key: &[u8] = b"a signing key of 32 bytes, test";
    let tenant = |t: &str| {
        Reading::keyset(&db)
            .filter(doc! {"tenant": t})
            .signing_key(key)
            .page_size(7)
    };
    // Paging along signed tokens, through their string form.
    let mut seen = Vec::new();
    let mut page = bounded(60, tenant("a").page()).await.unwrap();
    loop {
        seen.extend(page.items.iter().map(|r| r.id));
        let Some(next) = page.next.take() else { break };
        let next: PageToken = next.to_string().parse().unwrap();
        page = bounded(60, tenant("a").after(&next).page()).await.unwrap();
    }
    let mut want: Vec<(u64, i64)> = (0..120_i64)
        .filter(|id| id % 2 == 0)
        .map(|id| (((id % 17) as f64).to_bits(), id))
        .collect();
    want.sort();
    assert_eq!(seen, want.iter().map(|w| w.1).collect::<Vec<_>>());

    let first = bounded(60, tenant("a").page()).await.unwrap();
    let signed = first.next.unwrap();
    let unsigned = bounded(
        60,
        Reading::keyset(&db)
            .filter(doc! {"tenant": "a"})
            .page_size(7)
            .page(),
    )
    .await
    .unwrap()
    .next
    .unwrap();
    commands.take();
    let refused = |r: mongo_patterns::Result<Page<Reading>>, want: CursorError| match r {
        Err(Error::InvalidCursor(e)) => assert_eq!(e, want),
        other => panic!("{other:?}"),
    };
    // Replayed against another tenant's filter, or with another key.
    refused(
        bounded(60, tenant("b").after(&signed).page()).await,
        CursorError::BadSignature,
    );
    refused(
        bounded(
            60,
            Reading::keyset(&db)
                .filter(doc! {"tenant": "a"})
                .signing_key(&b"another key, 32 bytes long too!!"[..])
                .after(&signed)
                .page(),
        )
        .await,
        CursorError::BadSignature,
    );
    // Unsigned, or forged with a valid checksum.
    refused(
        bounded(60, tenant("a").after(&unsigned).page()).await,
        CursorError::BadSignature,
    );
    let mut bytes = b64_decode(&signed.to_string());
    let n = bytes.len();
    bytes[n - 9] ^= 1; // the MAC's last byte
    let sum = fnv1a64(&bytes[..n - 8]);
    bytes[n - 8..].copy_from_slice(&sum.to_le_bytes());
    let forged: PageToken = b64_encode(&bytes).parse().unwrap();
    refused(
        bounded(60, tenant("a").after(&forged).page()).await,
        CursorError::BadSignature,
    );
    // A signed token on a query without a key is another query's.
    refused(
        bounded(
            60,
            Reading::keyset(&db)
                .filter(doc! {"tenant": "a"})
                .after(&signed)
                .page(),
        )
        .await,
        CursorError::Foreign,
    );
    match bounded(60, Reading::keyset(&db).signing_key(&b"short"[..]).page()).await {
        Err(Error::InvalidArgument {
            name: "signing_key",
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(commands.take_count(), 0, "refused before anything is sent");
    assert!(bounded(60, tenant("a").after(&signed).page()).await.is_ok());
}

/// `.filter()` sends server-side JavaScript as given (the filter is trusted
/// code); `.untrusted_filter()` refuses it before anything is sent.
#[tokio::test]
async fn untrusted_filters_refuse_server_side_javascript() {
    let (db, commands) = fresh_db("keyset_untrusted").await;
    seed_readings(&db, 0, 30).await;
    commands.take();
    let mut deep = doc! {"v": 1.0};
    for _ in 0..100 {
        deep = doc! {"$and": [deep]};
    }
    for f in [
        doc! {"$where": "sleep(1000) || true"},
        doc! {"$or": [{"v": 1.0}, {"$where": "true"}]},
        doc! {"$expr": {"$function": {"body": "function() { return true }", "args": [], "lang": "js"}}},
        doc! {"$expr": {"$gt": [{"$accumulator": {"init": "function() {}"}}, 0]}},
        doc! {"v": {"$in": [Bson::JavaScriptCode("1".into())]}},
        doc! {"v": Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope { code: "1".into(), scope: doc! {} })},
        deep,
    ] {
        match Reading::keyset(&db).untrusted_filter(f.clone()) {
            Err(Error::InvalidArgument { name: "filter", .. }) => {}
            other => panic!("{f} gave {other:?}"),
        }
    }
    assert_eq!(commands.take_count(), 0, "refused before anything is sent");
    let ok = Reading::keyset(&db)
        .untrusted_filter(doc! {"v": {"$gte": 0.0}, "_id": {"$in": [1, 2, 3]}})
        .unwrap();
    let (items, err) = drain(ok.stream()).await;
    assert!(err.is_none());
    let want = bounded(
        60,
        db.collection::<Document>("readings")
            .count_documents(doc! {"v": {"$gte": 0.0}, "_id": {"$in": [1, 2, 3]}})
            .into_future(),
    )
    .await
    .unwrap();
    assert_eq!(items.len() as u64, want);
}

/// Oversized sort values would make tokens past the length limit: refused
/// as `UnsupportedValue` on every page size, rather than a token that could
/// not be read back.
#[tokio::test]
async fn oversized_sort_values_fail_on_every_page_size() {
    let (db, _) = fresh_db("keyset_oversized").await;
    let raw = db.collection::<Document>("big");
    let mut docs: Vec<Document> = (0..20_i64)
        .map(|id| doc! {"_id": id, "v": format!("k{id:03}")})
        .collect();
    docs.push(doc! {"_id": 99_i64, "v": format!("k010{}", "x".repeat(3000))});
    raw.insert_many(docs).await.unwrap();
    for descending in [false, true] {
        for page in [1, 2, 5, 1000] {
            let (_, err) = drain(loose(&db, "big", page, descending).stream()).await;
            match err {
                Some(Error::UnsupportedValue { id, .. }) => assert_eq!(*id, Bson::Int64(99)),
                other => panic!("page {page}: {other:?}"),
            }
        }
    }
}

/// Admitting every type bracket must not cost an index scan: a page deep
/// into a collection examines what the bracket-local `$gt`/`$lt` boundary
/// examined (the server's `explain`), for numbers, strings and `_id`, in
/// both directions. By `_id` alone that is about a page of keys (an `$or`
/// of `$gt` and `$type` branches scanned the whole index).
#[tokio::test]
async fn deep_pages_cost_what_bracket_local_boundaries_did() {
    let (db, _) = fresh_db("keyset_seek").await;
    let raw = db.collection::<Document>("seek");
    let docs: Vec<Document> = (0..2000_i64)
        .map(|id| doc! {"_id": id, "n": (id * 7919 % 2000) as f64, "s": format!("s{:05}", id * 7 % 2000)})
        .collect();
    raw.insert_many(docs).await.unwrap();
    for keys in [doc! {"n": 1, "_id": 1}, doc! {"s": 1, "_id": 1}] {
        raw.create_index(
            mongo_patterns::mongodb::IndexModel::builder()
                .keys(keys)
                .build(),
        )
        .await
        .unwrap();
    }
    for (sort, name) in [(&["n"][..], "n"), (&["s"][..], "s"), (&[][..], "_id")] {
        for descending in [false, true] {
            let q = Keyset::<Document>::new(
                &db,
                "seek",
                KeysetSpec {
                    sort,
                    descending,
                    page_size: 50,
                },
            );
            // Far into the scan: page 30 of 40.
            let pages: Vec<Page<Document>> = bounded(60, q.clone().pages().take(30).try_collect())
                .await
                .unwrap();
            let token = pages.last().unwrap().next.clone().unwrap();
            let last = pages.last().unwrap().items.last().unwrap().clone();
            let (filter, sort, limit) = q.after(&token).command().unwrap();
            // The bracket-local boundary this crate sent before, for comparison.
            let (op, id) = (
                if descending { "$lt" } else { "$gt" },
                last.get("_id").unwrap(),
            );
            let local = match sort.keys().next().map(String::as_str) {
                Some("_id") => doc! {"_id": {op: id}},
                Some(k) => {
                    let v = last.get(k).unwrap();
                    doc! {"$or": [{k: {op: v}}, {k: v, "_id": {op: id}}]}
                }
                None => unreachable!(),
            };
            let examined = |filter: Document| {
                let (db, sort) = (db.clone(), sort.clone());
                async move {
                    let e = bounded(60, db.run_command(doc! {
                        "explain": {"find": "seek", "filter": filter, "sort": sort, "limit": limit},
                        "verbosity": "executionStats",
                    }).into_future())
                    .await
                    .unwrap();
                    Explain::of(&e)
                        .keys_examined
                        .unwrap_or_else(|| panic!("no totalKeysExamined in {e}"))
                }
            };
            let (keys, before) = (examined(filter).await, examined(local).await);
            println!("{name} descending {descending}: {keys} keys examined for a page of 50");
            println!("  (the bracket-local `$gt`/`$lt` boundary: {before})");
            assert!(
                keys <= before + 10,
                "{name} descending {descending}: {keys} keys, {before} before"
            );
            if name == "_id" {
                assert!(keys <= 60, "{name} descending {descending}: {keys} keys");
            }
        }
    }
}
