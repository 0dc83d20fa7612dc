//! Late items, with `order`: an item below the floor of the key's last
//! bucket (dated before an item already stored in it), or one that the
//! last bucket cannot take, goes into the bucket that covers its value,
//! and every later bucket's `start` moves by one: a [`Move`], one
//! transaction (see [`moves`](super::moves)).
//!
//! The covering bucket is the last one whose floor (or first item) is not
//! above the value, or the first bucket when the value is below them all.
//! Near the end (items dated a moment apart by racing tasks or
//! processes, the usual case) it is the last bucket or the one before,
//! which the move reads anyway; further back, one indexed read finds it.
//! It is inserted sorted there (equal values keep their arrival order). A
//! bucket may grow to twice `size` with late items; past that, or past
//! the byte limit, it is split in the same transaction: the first bucket
//! gives its lower half to a new bucket before it (so that a backfill,
//! items ever earlier, always has room), any other gives its upper half
//! to the next bucket when that has room, else to a new bucket between
//! the two (a fractional `seq`, so that no `_id` is rewritten).
//!
//! Cost, on top of the push's failed update and its read of the last
//! bucket: the last two buckets, the insert, the `start` of the buckets
//! after it (one `update`), the commit (4 round trips; a split adds 2 to
//! 4). Inside a caller's transaction the same commands join it, so any
//! late item does, however far back: a race it loses is a write conflict,
//! `TransientTransactionError`, which the caller's `and_run2` runs again.

use futures::future::BoxFuture;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document};

use super::moves::{Move, Txn};
use super::shape::{below, between, item_len, order_cmp, with_op, Fill, Head, FLOOR, OPS};
use super::MAX_BUCKET_BYTES;
use crate::error::{Error, Result};

/// A late push: the item as stored, its order value, its size and its
/// write id.
pub(super) struct Late {
    pub(super) key: Bson,
    pub(super) item: Document,
    pub(super) v: Bson,
    pub(super) len: i64,
    pub(super) op: ObjectId,
}

impl Move for Late {
    /// The key's last bucket after the move (to remember), or `None` when
    /// the key holds no item for it to follow: the push then goes in
    /// order.
    type Out = Option<i64>;
    const OPERATION: &'static str = "push";

    fn run<'a>(&'a self, t: Txn<'a>) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(self.place(t))
    }
}

/// How many splits one late item may need: one makes room, the second
/// only when the first left the item's half over the byte limit.
const SPLITS: usize = 2;

impl Late {
    async fn place(&self, mut t: Txn<'_>) -> Result<Option<i64>> {
        if t.again {
            // A run before may have committed it (its commit's reply
            // lost, on a server that then lost its record of it): then it
            // stays where it is. Not found where a split since moved it
            // to a bucket whose write ids do not name it.
            if let Some(seq) = t.holding(&self.key, self.op).await? {
                return Ok(Some(seq));
            }
        }
        let mut splits = 0;
        loop {
            let (Some(last), prev) = t.last_two(&self.key).await? else {
                return Ok(None);
            };
            let Some(c) = self.covering(&mut t, &last, prev.as_ref()).await? else {
                return Ok(None);
            };
            if c.count + 1 > t.shape.cap() || c.bytes + self.len > MAX_BUCKET_BYTES {
                if splits == SPLITS {
                    return Err(Error::DocumentTooLarge {
                        bytes: Some(self.len as usize),
                        source: None,
                    });
                }
                splits += 1;
                split(&mut t, &self.key, &c).await?;
                continue;
            }
            let mut filter = t.shape.by_id(&c.id);
            filter.extend(doc! {
                "count": c.count,
                OPS: {"$ne": self.op},
                "$expr": t.shape.sound(),
            });
            let insert = t
                .shape
                .insert_sorted(&self.item, &self.v, self.len, self.op);
            t.write_one(filter, insert).await?;
            let after = if c.id == last.id {
                (self.grown(last), prev)
            } else {
                t.shift(&self.key, &c.id, 1).await?;
                let prev = prev.map(|p| match p.id == c.id {
                    true => Head {
                        count: p.count + 1,
                        ..p
                    },
                    false => Head {
                        start: p.start + 1,
                        ..p
                    },
                });
                let last = Head {
                    start: last.start + 1,
                    ..last
                };
                (last, prev)
            };
            return t.tail(&self.key, (Some(after.0), after.1)).await;
        }
    }

    /// `last` with the item in it.
    fn grown(&self, last: Head) -> Head {
        let hi = match order_cmp(Some(&self.v), last.hi.as_ref()) {
            std::cmp::Ordering::Greater => Some(self.v.clone()),
            _ => last.hi.clone(),
        };
        Head {
            count: last.count + 1,
            hi,
            ..last
        }
    }

    /// The bucket that covers the item's value: of the last two buckets,
    /// the later one whose floor (or first item) is not above it; else, by
    /// one indexed read, the last such bucket of the key, or its first
    /// bucket with items when the value is below them all. `None` when the
    /// key holds no items.
    async fn covering(
        &self,
        t: &mut Txn<'_>,
        last: &Head,
        prev: Option<&Head>,
    ) -> Result<Option<Head>> {
        // An empty bucket without a floor (a removal emptied it) says
        // nothing of the values before it.
        let takes = |b: &Head| (b.count > 0 || b.lo.is_some()) && !below(&self.v, b.lo.as_ref());
        if let Some(b) = std::iter::once(last).chain(prev).find(|b| takes(b)) {
            return Ok(Some(b.clone()));
        }
        if let Some(c) = t.head(t.shape.covering(&self.key, &self.v), -1).await? {
            return Ok(Some(c));
        }
        let mut any = t.shape.of_key(&self.key);
        any.insert("count", doc! {"$gt": 0});
        t.head(any, 1).await
    }
}

/// Splits bucket `c` in two (see the module docs). No position outside
/// `c` and the bucket that takes half of it changes: the key's total
/// stays.
async fn split(t: &mut Txn<'_>, key: &Bson, c: &Head) -> Result<()> {
    let half = (c.count / 2).max(1) as usize;
    let items = read_items(t, c).await?;
    if t.neighbour(key, &c.id, -1).await?.is_none() {
        // The first bucket: its lower half goes to a new bucket before it.
        let (moved, kept) = items.split_at(half);
        let new = Fill {
            sealed: true,
            ..fill(moved)
        };
        let bucket = t
            .shape
            .new_bucket(key, Bson::Int64(c.seq - 1), c.start, new);
        t.insert(bucket).await?;
        return keep(t, c, kept, c.start + half as i64, true).await;
    }
    let (kept, moved) = items.split_at(half);
    let next = t.neighbour(key, &c.id, 1).await?;
    match &next {
        Some(n) if n.count + moved.len() as i64 <= t.shape.size() => {
            // Into the next bucket, before its own items.
            prepend(t, n, moved).await?;
        }
        _ => {
            let seq = match &next {
                Some(n) => between(&c.raw_seq, &n.raw_seq).ok_or_else(no_room)?,
                None => Bson::Int64(c.seq + 1),
            };
            let new = Fill {
                floor: kept.last().and_then(|d| t.shape.order_of(d)),
                // Only the key's last bucket takes pushes in order.
                sealed: next.is_some(),
                ..fill(moved)
            };
            let bucket = t.shape.new_bucket(key, seq, c.start + half as i64, new);
            t.insert(bucket).await?;
        }
    }
    // No longer the last bucket: closed to pushes in order.
    keep(t, c, kept, c.start, false).await
}

fn no_room() -> Error {
    Error::invalid(
        "order",
        "too many late items split the buckets around one value: no room for another \
         bucket between two neighbours; use a larger `size`",
    )
}

/// `items` as a new bucket holds them, written by a fresh id.
fn fill(items: &[Document]) -> Fill {
    Fill {
        items: items.iter().cloned().map(Bson::Document).collect(),
        bytes: items.iter().map(|d| item_len(d).unwrap_or(0)).sum(),
        op: Some(ObjectId::new()),
        ..Fill::default()
    }
}

/// Bucket `c` rewritten to hold `kept` from `start` on. Its lower half
/// gone (`lower`), its floor no longer bounds what it holds; its upper
/// half gone, it is closed (no longer the last).
async fn keep(t: &mut Txn<'_>, c: &Head, kept: &[Document], start: i64, lower: bool) -> Result<()> {
    let bytes: i64 = kept.iter().map(|d| item_len(d).unwrap_or(0)).sum();
    let mut set = doc! {
        t.shape.spec.items: kept.to_vec(),
        "count": kept.len() as i64,
        "bytes": bytes,
        "start": start,
    };
    let mut update = doc! {};
    if lower {
        update.insert("$unset", doc! {FLOOR: ""});
    } else {
        set.insert("sealed", true);
    }
    update.insert("$set", set);
    let mut filter = t.shape.by_id(&c.id);
    filter.insert("count", c.count);
    t.write_one(filter, update).await
}

/// `items` put before the own items of bucket `n`, whose `start` moves back
/// by as many; its floor goes (they may be below it).
async fn prepend(t: &mut Txn<'_>, n: &Head, items: &[Document]) -> Result<()> {
    let k = items.len() as i64;
    let arr = t.shape.items_path();
    let all = doc! {"$concatArrays": [{"$literal": items.to_vec()}, arr]};
    let bytes = doc! {"$add": [{"$bsonSize": "$$this"}, 8]};
    let update = vec![
        doc! {"$set": {
            t.shape.spec.items: &all,
            "count": {"$add": ["$count", k]},
            "start": {"$subtract": ["$start", k]},
            "bytes": {"$sum": {"$map": {"input": &all, "in": bytes}}},
        }},
        with_op(ObjectId::new()),
        doc! {"$unset": FLOOR},
    ];
    let mut filter = t.shape.by_id(&n.id);
    filter.insert("count", n.count);
    t.write_one(filter, update).await
}

/// The items of bucket `c`, as stored.
async fn read_items(t: &mut Txn<'_>, c: &Head) -> Result<Vec<Document>> {
    let items = t.shape.spec.items;
    let found = t.find(t.shape.by_id(&c.id), 1, 1, doc! {items: 1}).await?;
    let not_array = || t.shape.damaged(c.id.clone(), items, "is not an array");
    let bucket = found.first().ok_or_else(not_array)?;
    let arr = match bucket.get(items) {
        Ok(Some(mongodb::bson::RawBsonRef::Array(a))) => a,
        _ => return Err(not_array()),
    };
    arr.into_iter()
        .map(|v| match v {
            Ok(mongodb::bson::RawBsonRef::Document(d)) => Document::try_from(d)
                .map_err(|e| t.shape.damaged(c.id.clone(), items, e.to_string())),
            other => Err(t.shape.damaged(
                c.id.clone(),
                items,
                format!("holds {other:?}, not a document"),
            )),
        })
        .collect()
}
