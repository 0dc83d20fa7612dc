//! The hand-written baselines: what a user of the driver would write for
//! the same job, command for command.
//!
//! They repeat what the runtime sends on purpose, and share none of its
//! code: a baseline built on the runtime's helpers could not show what
//! those helpers cost. When the runtime's commands change, the checks in
//! [`crate::pages`] and [`crate::generated`] say so, and these are updated
//! by hand.

use futures::TryStreamExt;
use mongo_patterns::bson::{self, Bson, RawBson, RawBsonRef, RawDocumentBuf};
use mongo_patterns::bucket::MAX_BUCKET_BYTES;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::BoxResult;
use mongo_patterns_testkit::bsonc;

use crate::{Item, Sliced, Trade, SIZE};

/// Turns a page reply (sliced buckets) into trades.
pub(crate) type Decoder = fn(&[RawDocumentBuf], i64) -> BoxResult<Vec<Trade>>;

/// The aggregation the repository sends for items `[from, from + n)`
/// (written out as by hand; checked against `page_pipeline`). A bucket
/// with an order field holds at most twice `size` items between splits,
/// so only buckets starting in `(from - 2·size, from + n)` can overlap;
/// the bookkeeping fields (`mp_len`, `mp_type`) let the
/// runtime report a damaged bucket.
pub(crate) fn range_pipeline(key: i64, from: i64, n: i64) -> Vec<Document> {
    let cap = 2 * SIZE;
    vec![
        doc! {"$match": {
            "customerId": key,
            "$or": [
                {"start": {"$gt": from - cap, "$lt": from + n}},
                {"start": {"$not": {"$type": "number"}}},
            ],
        }},
        doc! {"$sort": {"start": 1, "_id": 1}},
        doc! {"$project": {
            "start": 1,
            "count": 1,
            "mp_len": {"$cond": [{"$isArray": ["$items"]}, {"$size": "$items"}, Bson::Null]},
            "mp_type": {"$type": "$items"},
            "items": {"$cond": [
                {"$and": [{"$isArray": ["$items"]}, {"$isNumber": "$start"}]},
                {"$slice": [
                    "$items",
                    {"$max": [0, {"$subtract": [from, "$start"]}]},
                    {"$subtract": [from + n, {"$max": [from, "$start"]}]},
                ]},
                Bson::Null,
            ]},
        }},
    ]
}

/// The hand-written push: the filter and pipeline update `Buckets::push`
/// sends to a known open bucket of a bucket with an order field. The filter
/// refuses a damaged bucket (the array's length is `count`, within twice
/// `size`, `start` a number) and a bucket whose lowest date is above the
/// trade's; the update inserts the trade in date order and records the
/// write's id (`mp_ops`, the last 64 kept), so that a retried write is not
/// applied twice.
pub(crate) async fn push_by_hand(
    coll: &Collection<Document>,
    t: &Trade,
    seq: i64,
) -> BoxResult<()> {
    let item = bsonc::to_document(&Item {
        kind: t.kind.clone(),
        ticker: t.ticker.clone(),
        qty: t.qty,
        date: t.date,
    })?;
    let len = bsonc::to_vec(&item)?.len() as i64 + 8;
    let op = ObjectId::new();
    let items = || doc! {"$cond": [{"$isArray": ["$items"]}, "$items", []]};
    let sound = doc! {"$and": [
        {"$isArray": ["$items"]},
        {"$eq": [{"$size": items()}, "$count"]},
        {"$lte": ["$count", 2 * SIZE]},
        {"$isNumber": "$start"},
    ]};
    // The bucket's floor when it has one, else its first item's date.
    let lowest = doc! {"$ifNull": ["$mp_floor", {"$let": {
        "vars": {"mp_e": {"$arrayElemAt": [items(), 0]}},
        "in": {"$ifNull": ["$$mp_e.date", "$mp_floor"]},
    }}]};
    let filter = doc! {
        "_id": {"k": t.customer_id, "s": seq},
        "mp_ops": {"$ne": op},
        "customerId": t.customer_id,
        "sealed": Bson::Null,
        "count": {"$lte": SIZE - 1},
        "bytes": {"$lte": MAX_BUCKET_BYTES - len},
        "$expr": {"$and": [sound, {"$lte": [lowest, {"$literal": t.date}]}]},
    };
    let update = vec![
        doc! {"$set": {
            "items": {"$concatArrays": [
                {"$filter": {"input": "$items", "cond": {"$lte": ["$$this.date", {"$literal": t.date}]}}},
                [{"$literal": &item}],
                {"$filter": {"input": "$items", "cond": {"$gt": ["$$this.date", {"$literal": t.date}]}}},
            ]},
            "count": {"$add": ["$count", 1]},
            "bytes": {"$add": [{"$ifNull": ["$bytes", 0]}, len]},
        }},
        doc! {"$set": {"mp_ops": {"$slice": [
            {"$concatArrays": [{"$cond": [{"$isArray": ["$mp_ops"]}, "$mp_ops", []]}, [op]]},
            -64,
        ]}}},
    ];
    let r = coll.update_one(filter, update).await?;
    if r.matched_count != 1 {
        return Err("hand-written push matched no open bucket".into());
    }
    Ok(())
}

/// The hand-written page: the same aggregation, typed.
pub(crate) async fn page_by_hand(
    coll: &Collection<Sliced>,
    key: i64,
    page: u32,
    per: u32,
) -> BoxResult<Vec<Trade>> {
    let per = i64::from(per);
    let from = (i64::from(page) - 1) * per;
    let want = per + 1;
    let mut cursor = coll
        .aggregate(range_pipeline(key, from, want))
        .with_type::<Sliced>()
        .await?;
    let mut out = Vec::with_capacity(want as usize);
    while let Some(b) = cursor.try_next().await? {
        for it in b.items {
            if out.len() as i64 >= want {
                break;
            }
            out.push(Trade {
                customer_id: key,
                kind: it.kind,
                ticker: it.ticker,
                qty: it.qty,
                date: it.date,
            });
        }
    }
    out.truncate(per as usize);
    Ok(out)
}

/// The hand-written page with the runtime's decoding (`items_of`): raw
/// buckets, each item copied, the key appended, `from_slice`, at most
/// `per + 1` items.
pub(crate) async fn page_by_hand_raw(
    coll: &Collection<RawDocumentBuf>,
    key: i64,
    page: u32,
    per: u32,
) -> BoxResult<Vec<Trade>> {
    let per = i64::from(per);
    let from = (i64::from(page) - 1) * per;
    let want = per + 1;
    let mut cursor = coll
        .aggregate(range_pipeline(key, from, want))
        .with_type::<RawDocumentBuf>()
        .await?;
    let key_raw = RawBson::try_from(Bson::Int64(key))?;
    let mut out = Vec::with_capacity(want as usize);
    while let Some(b) = cursor.try_next().await? {
        for el in items_array(&b)? {
            if out.len() as i64 >= want {
                break;
            }
            let RawBsonRef::Document(d) = el? else {
                return Err("an item is not a document".into());
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())?;
            bsonc::append(&mut item, "customerId", key_raw.clone());
            out.push(bsonc::from_slice(item.as_bytes())?);
        }
    }
    out.truncate(per as usize);
    Ok(out)
}

pub(crate) fn items_array(bucket: &RawDocumentBuf) -> BoxResult<&bson::RawArray> {
    match bucket.get("items")? {
        Some(RawBsonRef::Array(a)) => Ok(a),
        _ => Err("a bucket without items".into()),
    }
}

/// What `Buckets::items_of` does per item.
pub(crate) fn decode_like_runtime(buckets: &[RawDocumentBuf], key: i64) -> BoxResult<Vec<Trade>> {
    let key_raw = RawBson::try_from(Bson::Int64(key))?;
    let mut out = Vec::new();
    for b in buckets {
        for el in items_array(b)? {
            let RawBsonRef::Document(d) = el? else {
                return Err("an item is not a document".into());
            };
            let mut item = RawDocumentBuf::from_bytes(d.as_bytes().to_vec())?;
            bsonc::append(&mut item, "customerId", key_raw.clone());
            out.push(bsonc::from_slice(item.as_bytes())?);
        }
    }
    Ok(out)
}

pub(crate) fn decode_typed(buckets: &[RawDocumentBuf], key: i64) -> BoxResult<Vec<Trade>> {
    let mut out = Vec::new();
    for b in buckets {
        let s: Sliced = bsonc::from_slice(b.as_bytes())?;
        out.extend(s.items.into_iter().map(|it| Trade {
            customer_id: key,
            kind: it.kind,
            ticker: it.ticker,
            qty: it.qty,
            date: it.date,
        }));
    }
    Ok(out)
}

/// The fix: encode the key element once, and splice it onto each item's
/// bytes in one reused buffer (no per-item allocation, no re-validation).
pub(crate) fn decode_spliced(buckets: &[RawDocumentBuf], key: i64) -> BoxResult<Vec<Trade>> {
    let mut key_doc = RawDocumentBuf::new();
    bsonc::append(&mut key_doc, "customerId", key);
    let kb = key_doc.as_bytes();
    let key_elem = &kb[4..kb.len() - 1];
    let mut buf = Vec::with_capacity(256);
    let mut out = Vec::new();
    for b in buckets {
        for el in items_array(b)? {
            let RawBsonRef::Document(d) = el? else {
                return Err("an item is not a document".into());
            };
            let db = d.as_bytes();
            buf.clear();
            buf.extend_from_slice(&[0; 4]);
            buf.extend_from_slice(&db[4..db.len() - 1]);
            buf.extend_from_slice(key_elem);
            buf.push(0);
            let len = (buf.len() as i32).to_le_bytes();
            buf[..4].copy_from_slice(&len);
            out.push(bsonc::from_slice(&buf)?);
        }
    }
    Ok(out)
}
