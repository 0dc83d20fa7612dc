//! The newest-first page's one aggregation: the newest bucket, the page's
//! positions computed from its total, and the buckets that hold them
//! looked up by `_id`.

use mongodb::bson::{doc, Bson, Document, RawDocument};

use super::super::shape::{raw_int, LEN, NEXT, TYPE};
use super::super::{Bucketed, Buckets};
use crate::error::Result;

/// A newest-first page's positions `[from, end)`, as the server computed
/// them from the newest bucket, the `_id`s of the buckets that hold them
/// if the buckets between are full, and those buckets.
pub(super) const P_FROM: &str = "mp_from";
pub(super) const P_END: &str = "mp_end";
pub(super) const IDS: &str = "mp_ids";
pub(super) const PAGE: &str = "mp_page";

/// True when field `f` holds a number within what a double holds exactly.
fn int(f: &str) -> Document {
    doc! {"$and": [
        {"$in": [{"$type": f}, ["int", "long", "double"]]},
        {"$gt": [f, -9.0e15]},
        {"$lt": [f, 9.0e15]},
    ]}
}

/// True when field `f` (a number) has no fraction.
fn integral(f: &str) -> Document {
    doc! {"$eq": [f, {"$trunc": [f]}]}
}

impl<T: Bucketed> Buckets<T> {
    /// The newest bucket's projection, with the page's positions
    /// `[from, end)` computed from its total; null positions from a bucket
    /// whose `start` and `count` are not integers (the page is then an
    /// error, which the client reports from the head: the server must not
    /// fail first).
    fn newest_head(&self, skip: i64, per: i64) -> Document {
        let sound = doc! {"$cond": [
            {"$and": [int("$start"), int("$count")]},
            {"$and": [integral("$start"), integral("$count")]},
            false,
        ]};
        let total = doc! {"$add": ["$start", "$count"]};
        let mut head = self.shape.head_projection(None);
        head.insert(
            P_END,
            doc! {"$cond": [&sound, {"$subtract": [&total, skip]}, Bson::Null]},
        );
        head.insert(
            P_FROM,
            doc! {"$cond": [
                &sound,
                {"$max": [0_i64, {"$subtract": [&total, skip + per]}]},
                Bson::Null,
            ]},
        );
        head
    }

    /// A newest-first page in one aggregation: the key's newest bucket (as
    /// [`head`](Self::head) reads it), the page's positions `[from, end)`
    /// computed from its total, and by `_id` the buckets that hold them if
    /// every bucket from there to the newest is full, sliced on the server.
    /// Each lookup is a point read of the `_id` index, on every server
    /// version. The caller checks that the buckets found cover the page.
    pub(super) fn newest_pipeline(&self, key: &Bson, skip: i64, per: i64) -> Vec<Document> {
        let size = i64::from(self.shape.spec.size);
        let head = self.newest_head(skip, per);
        let (from, end) = (format!("${P_FROM}"), format!("${P_END}"));
        // The bucket that holds position `p` when every bucket from it to
        // the newest holds `size` items.
        let seq_of = |p: Bson| {
            doc! {"$cond": [
                {"$gte": [&p, "$start"]},
                "$_id.s",
                {"$subtract": ["$_id.s", {"$ceil": {"$divide": [{"$subtract": ["$start", &p]}, size]}}]},
            ]}
        };
        let lo = seq_of(Bson::String(from.clone()));
        let hi = seq_of(Bson::Document(doc! {"$subtract": [&end, 1]}));
        // A page spans at most this many full buckets.
        let most = (per + size - 1) / size + 1;
        let n = doc! {"$min": [most, {"$max": [0, {"$add": [1, {"$subtract": [&hi, &lo]}]}]}]};
        let ids = doc! {"$cond": [
            {"$and": [
                {"$ne": [&from, Bson::Null]},
                {"$lt": [&from, &end]},
                int("$_id.s"),
                integral("$_id.s"),
            ]},
            {"$map": {
                "input": {"$range": [0, {"$toInt": n}]},
                "in": {"k": "$_id.k", "s": {"$toLong": {"$add": [&lo, "$$this"]}}},
            }},
            [],
        ]};
        let path = |f: &str| format!("{PAGE}.{f}");
        let page = |f: &str| format!("${}", path(f));
        let items = page(self.shape.spec.items);
        let start = page("start");
        let overlaps = doc! {"$and": [
            {"$isArray": [&items]},
            {"$isNumber": &start},
            {"$lt": [&start, &end]},
            {"$gt": [{"$add": [&start, {"$size": &items}]}, &from]},
        ]};
        let mut keep: Document = head.keys().map(|k| (k.clone(), Bson::Int32(1))).collect();
        for f in ["_id", "start", "count", LEN, TYPE, self.shape.spec.items] {
            keep.insert(path(f), 1);
        }
        let mut newest = self.shape.of_key(key);
        newest.insert(NEXT, doc! {"$ne": true});
        vec![
            doc! {"$match": newest},
            doc! {"$sort": {"_id": -1}},
            doc! {"$limit": 1},
            doc! {"$project": head},
            doc! {"$set": {IDS: ids}},
            // The key's equality keeps the lookup on the key's shard.
            doc! {"$lookup": {
                "from": self.raw.name(),
                "localField": IDS,
                "foreignField": "_id",
                "pipeline": [{"$match": {self.shape.spec.key: key.clone()}}],
                "as": PAGE,
            }},
            doc! {"$unwind": {"path": format!("${PAGE}"), "preserveNullAndEmptyArrays": true}},
            doc! {"$sort": {path("start"): 1}},
            doc! {"$set": {
                path(LEN): {"$cond": [{"$isArray": [&items]}, {"$size": &items}, Bson::Null]},
                path(TYPE): {"$type": &items},
                path(self.shape.spec.items): {"$cond": [
                    &overlaps,
                    {"$slice": [
                        &items,
                        {"$max": [0, {"$subtract": [&from, &start]}]},
                        {"$subtract": [&end, {"$max": [&from, &start]}]},
                    ]},
                    {"$cond": [{"$isArray": [&items]}, [], &items]},
                ]},
            }},
            doc! {"$project": keep},
        ]
    }

    /// Whether `buckets`, in order of `start`, hold every position of
    /// `[from, end)` between them, with no gap and no overlap. A damaged
    /// bucket among them is an error that names it.
    pub(super) fn covers(&self, buckets: &[&RawDocument], from: i64, end: i64) -> Result<bool> {
        let mut at = None;
        for b in buckets {
            let (start, count) = self.shape.check(b, raw_int(b, LEN).ok())?;
            if start >= end || start + count <= from {
                continue;
            }
            match at {
                None if start <= from => {}
                Some(next) if next == start => {}
                _ => return Ok(false),
            }
            at = Some(start + count);
        }
        Ok(at.is_some_and(|a| a >= end))
    }
}
