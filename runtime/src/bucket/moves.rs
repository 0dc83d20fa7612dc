//! Writes that move items' positions, each one transaction.
//!
//! A late item put into an earlier bucket, a split, a removal: each changes
//! the `count` of one bucket and so the `start` of every bucket after it.
//! Each is a [`Move`], whose writes run in one transaction: the caller's,
//! when the call runs in one, else one of the call's own, run through the
//! driver's convenient API (a write conflict with another writer of the
//! key reruns it after a backoff, an unknown commit result retries the
//! commit, 120 s in all) as a task the caller cannot cut. Nothing else
//! coordinates them: no lease, no marks, nothing in memory. Every reader
//! sees a move whole or not at all, and two moves of one key, or a move
//! and a push into a bucket it writes, conflict on the server, which
//! reruns one of them.
//!
//! Why one transaction and nothing else: a write that touches several
//! documents outside a transaction, beside transactions on the same
//! documents, can wait for ever. A server whose multi-document write
//! keeps what it has written until it ends (the test server does) holds
//! one bucket while it waits for another that a transaction holds, and
//! that transaction's next write waits for the first: neither ends. So
//! every write of this module that changes more than one bucket is in a
//! transaction, every other write changes one document, and no
//! transaction of the module's own waits for anything in memory while it
//! is open (its commands go back to back).
//!
//! A push opening the next bucket does so without a transaction: it closes
//! the last bucket (a write naming the `count` and `start` it read) and
//! inserts the next one with the `start` that follows. A move that ran
//! between the two would leave that `start` behind it, so every move ends
//! with [`tail`](Buckets::tail): a last bucket that is closed gets its
//! successor in the move's transaction (the opener's insert then fails on
//! its `_id`, and it reads again), and an empty last bucket gets the
//! `start` its predecessor implies. Any push that changed those buckets
//! after the move's snapshot makes the move conflict, and it is rerun.
//!
//! A move sees the key's buckets through a [`Txn`]: the stored format, the
//! collection, and the transaction's session and options, nothing of the
//! repository above it. A deployment without transactions (a standalone
//! server) refuses a move: [`Error::NoTransactions`]. Pushes in order, pages, totals,
//! streams and `replace` need none.

use futures::future::BoxFuture;
use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::{ClientSession, Collection, Database};

use super::shape::{raw_int, seq_of, Fill, Head, Shape, LEN, NEXT};
use super::{Bucketed, Buckets};
use crate::action::{Call, Options};
use crate::error::{Error, Result};
use crate::util::id_of;

/// A write that moves positions: its reads and writes, in one transaction.
pub(super) trait Move: Send + Sync + 'static {
    type Out: Send + 'static;
    /// The call, as errors name it.
    const OPERATION: &'static str;
    /// Its reads and writes, through `t`.
    fn run<'a>(&'a self, t: Txn<'a>) -> BoxFuture<'a, Result<Self::Out>>;
}

/// A move's view of a collection's buckets inside its transaction: every
/// command goes in `s`, with the options `o` (write and read concern left
/// to the transaction), every read to the primary.
pub(super) struct Txn<'a> {
    pub(super) shape: &'a Shape,
    db: &'a Database,
    coll: &'a Collection<Document>,
    raw: &'a Collection<RawDocumentBuf>,
    o: &'a Options,
    s: &'a mut ClientSession,
    /// A rerun of a transaction of the move's own: an earlier run may
    /// have committed though its commit failed (its reply lost, on a
    /// server that then lost its record of it).
    pub(super) again: bool,
}

impl<T: Bucketed> Buckets<T> {
    /// Runs `m` in the caller's transaction (when `cx` has one open), or in
    /// one of its own, as a task that a caller who stops waiting does not
    /// cut: see the module docs.
    pub(super) async fn moved<M: Move>(&self, m: M, cx: &mut Call<'_>) -> Result<M::Out> {
        if cx.txn {
            let Some(s) = cx.session.as_deref_mut() else {
                return Err(Error::invalid("session", "a transaction without a session"));
            };
            return m.run(self.txn(&cx.opts, s, false)).await;
        }
        let o = (*cx.opts).clone();
        let this = self.clone();
        // Boxed: held by value until it is spawned, the move's whole future
        // would sit in the call's.
        let moved: BoxFuture<'static, Result<M::Out>> = Box::pin(async move {
            let client = this.db.client();
            let mut s = client.start_session().causal_consistency(false).await?;
            let inside = o.clone().in_transaction();
            let context = (&this, &m, &inside, 0);
            crate::transaction::run(&mut s, &o, M::OPERATION, context, |s, (b, m, o, runs)| {
                *runs += 1;
                m.run(b.txn(o, s, *runs > 1))
            })
            .await
        });
        crate::task::uncut(moved, M::OPERATION).await
    }

    fn txn<'a>(&'a self, o: &'a Options, s: &'a mut ClientSession, again: bool) -> Txn<'a> {
        Txn {
            shape: &self.shape,
            db: &self.db,
            coll: &self.coll,
            raw: &self.raw,
            o,
            s,
            again,
        }
    }
}

impl Txn<'_> {
    /// The `seq` of the bucket of `key` that holds write `op`, if any (its
    /// integer part: a late item often lands in a bucket a split placed
    /// between two others, whose `seq` is a double; read as none, the
    /// move that already stored it ran again for ever, its insert
    /// refused by the write id it finds there).
    pub(super) async fn holding(&mut self, key: &Bson, op: ObjectId) -> Result<Option<i64>> {
        let filter = self.shape.holding(key, op);
        let found = self.find(filter, 1, 1, doc! {"_id": 1}).await?;
        Ok(found.first().and_then(|d| seq_of(d)).map(|(seq, _)| seq))
    }

    /// The buckets `filter` matches, in `_id` order (`dir` 1) or reverse
    /// (-1), at most `limit` (0: all), as `project`ed.
    pub(super) async fn find(
        &mut self,
        filter: Document,
        dir: i32,
        limit: i64,
        project: Document,
    ) -> Result<Vec<RawDocumentBuf>> {
        let find = self
            .raw
            .find(filter)
            .with_options(self.o.deciding::<mongodb::options::FindOptions>())
            .sort(doc! {"_id": dir})
            .limit(limit)
            .projection(project);
        let mut cursor = find.session(&mut *self.s).await?;
        Ok(cursor.stream(&mut *self.s).try_collect().await?)
    }

    /// The buckets `filter` matches in `_id` order, read while their
    /// `count`s add up to at most `max_items`: `Err(n)` when they pass it,
    /// `n` the items of all of them (a second, projected read), and
    /// memory never holds more than one bucket past the limit.
    pub(super) async fn find_at_most(
        &mut self,
        filter: Document,
        max_items: u64,
    ) -> Result<std::result::Result<Vec<RawDocumentBuf>, u64>> {
        let count = |b: &RawDocumentBuf| raw_int(b, "count").map_or(0, |n| n.max(0) as u64);
        let find = self
            .raw
            .find(filter.clone())
            .with_options(self.o.deciding::<mongodb::options::FindOptions>())
            .sort(doc! {"_id": 1});
        let mut cursor = find.session(&mut *self.s).await?;
        let (mut out, mut items) = (Vec::new(), 0u64);
        while let Some(b) = cursor.next(&mut *self.s).await.transpose()? {
            items += count(&b);
            if items > max_items {
                // Left open: the server closes it with the transaction.
                let all = self.find(filter, 1, 0, doc! {"count": 1}).await?;
                return Ok(Err(all.iter().map(count).sum()));
            }
            out.push(b);
        }
        Ok(Ok(out))
    }

    /// The first bucket `filter` matches in `_id` order (`dir` 1) or
    /// reverse (-1).
    pub(super) async fn head(&mut self, filter: Document, dir: i32) -> Result<Option<Head>> {
        let project = self.shape.head_projection(None);
        let found = self.find(filter, dir, 1, project).await?;
        found.first().map(|d| self.shape.head_of(d)).transpose()
    }

    /// The key's last two buckets, the last first.
    pub(super) async fn last_two(&mut self, key: &Bson) -> Result<(Option<Head>, Option<Head>)> {
        let project = self.shape.head_projection(None);
        let docs = self.find(self.shape.of_key(key), -1, 2, project).await?;
        let mut heads = docs.iter().map(|d| self.shape.head_of(d));
        let last = heads.next().transpose()?;
        let prev = heads.next().transpose()?;
        Ok((last, prev))
    }

    /// The bucket just before (`dir` -1) or after (1) `id`.
    pub(super) async fn neighbour(
        &mut self,
        key: &Bson,
        id: &Bson,
        dir: i32,
    ) -> Result<Option<Head>> {
        let mut f = self.shape.of_key(key);
        let op = if dir < 0 { "$lt" } else { "$gt" };
        f.insert("$and", vec![Bson::Document(doc! {"_id": {op: id.clone()}})]);
        self.head(f, dir).await
    }

    /// The documents `pipeline` returns.
    pub(super) async fn aggregate(
        &mut self,
        pipeline: Vec<Document>,
    ) -> Result<Vec<RawDocumentBuf>> {
        let agg = self
            .raw
            .aggregate(pipeline)
            .with_options(self.o.deciding::<mongodb::options::AggregateOptions>())
            .with_type::<RawDocumentBuf>();
        let mut cursor = agg.session(&mut *self.s).await?;
        Ok(cursor.stream(&mut *self.s).try_collect().await?)
    }

    /// One update by `filter`, which must match: a bucket not as the
    /// transaction read it is a race, rerun.
    pub(super) async fn write_one(
        &mut self,
        filter: Document,
        update: impl Into<mongodb::options::UpdateModifications>,
    ) -> Result<()> {
        let update = self
            .coll
            .update_one(filter, update)
            .with_options(self.o.driver::<mongodb::options::UpdateOptions>());
        one(update.session(&mut *self.s).await?.matched_count)
    }

    /// Removes the bucket `filter` names, which must match (as
    /// [`write_one`](Self::write_one)'s).
    pub(super) async fn delete_one(&mut self, filter: Document) -> Result<()> {
        let delete = self
            .coll
            .delete_one(filter)
            .with_options(self.o.driver::<mongodb::options::DeleteOptions>());
        one(delete.session(&mut *self.s).await?.deleted_count)
    }

    /// Removes every bucket `filter` matches.
    pub(super) async fn delete_all(&mut self, filter: Document) -> Result<u64> {
        let delete = self
            .coll
            .delete_many(filter)
            .with_options(self.o.driver::<mongodb::options::DeleteOptions>());
        Ok(delete.session(&mut *self.s).await?.deleted_count)
    }

    /// New buckets, in one ordered insert. An `_id` taken by a writer
    /// since the transaction's snapshot is a race, rerun.
    pub(super) async fn insert_all(&mut self, buckets: Vec<Document>) -> Result<()> {
        if buckets.is_empty() {
            return Ok(());
        }
        let insert = self
            .coll
            .insert_many(buckets)
            .with_options(self.o.driver::<mongodb::options::InsertManyOptions>())
            .ordered(true);
        match insert.session(&mut *self.s).await.map_err(Error::from) {
            Ok(_) => Ok(()),
            Err(e) if e.is_duplicate_key() => Err(raced(e)),
            Err(e) => Err(e),
        }
    }

    /// Moves the `start` of every bucket of `key` after `id` by `by`.
    pub(super) async fn shift(&mut self, key: &Bson, id: &Bson, by: i64) -> Result<()> {
        if by == 0 {
            return Ok(());
        }
        let shift = self
            .coll
            .update_many(self.shape.after(key, id), doc! {"$inc": {"start": by}})
            .with_options(self.o.driver::<mongodb::options::UpdateOptions>());
        shift.session(&mut *self.s).await?;
        Ok(())
    }

    /// A new bucket. Its `_id` taken by a writer since the transaction's
    /// snapshot is a race, rerun.
    pub(super) async fn insert(&mut self, bucket: Document) -> Result<()> {
        let insert = self
            .coll
            .insert_one(bucket)
            .with_options(self.o.driver::<mongodb::options::InsertOneOptions>());
        match insert.session(&mut *self.s).await.map_err(Error::from) {
            Ok(_) => Ok(()),
            Err(e) if e.is_duplicate_key() => Err(raced(e)),
            Err(e) => Err(e),
        }
    }

    /// What every move ends with (see the module docs), given the key's
    /// last two buckets as the move left them: a closed last bucket gets
    /// an empty successor, and an empty last bucket the `start` its
    /// predecessor implies (its total once closed; `size` after its
    /// `start` while it is open, for a bucket opened ahead). The key's last
    /// bucket's `seq` after it.
    pub(super) async fn tail(
        &mut self,
        key: &Bson,
        (last, prev): (Option<Head>, Option<Head>),
    ) -> Result<Option<i64>> {
        let Some(last) = last else { return Ok(None) };
        let size = self.shape.size();
        // Closed: sealed, or (without `order`) full, which a push opening
        // the next bucket ahead reads as closed.
        let unordered = self.shape.spec.order.is_none();
        if last.sealed || (unordered && last.count >= size) {
            let seq = last.seq + 1;
            let next = Fill {
                floor: last.hi.clone(),
                ahead: unordered,
                ..Fill::default()
            };
            let bucket = self
                .shape
                .new_bucket(key, Bson::Int64(seq), last.total(), next);
            self.insert(bucket).await?;
            return Ok(Some(seq));
        }
        if let (0, Some(prev)) = (last.count, prev) {
            let closed = prev.sealed || prev.count >= size;
            let start = match closed || !last.next {
                true => prev.total(),
                false => prev.start + size,
            };
            if start != last.start {
                let set = doc! {"$set": {"start": start}};
                self.write_one(self.shape.by_id(&last.id), set).await?;
            }
        }
        Ok(Some(last.seq))
    }

    /// [`Txn::tail`] from the key's last two buckets as read now.
    pub(super) async fn read_tail(&mut self, key: &Bson) -> Result<Option<i64>> {
        let last_two = self.last_two(key).await?;
        self.tail(key, last_two).await
    }
}

/// [`Buckets::reindex`]: every bucket's `start` recomputed from the counts
/// before it. Refuses a key with a damaged bucket: positions summed from a
/// damaged count would be wrong for every later bucket. Its outcome: the
/// key's items, the sum of the counts.
pub(super) struct Reindex {
    pub(super) key: Bson,
}

impl Move for Reindex {
    type Out = u64;
    const OPERATION: &'static str = "reindex";

    fn run<'a>(&'a self, t: Txn<'a>) -> BoxFuture<'a, Result<u64>> {
        Box::pin(self.recount(t))
    }
}

impl Reindex {
    async fn recount(&self, mut t: Txn<'_>) -> Result<u64> {
        let project = doc! {
            "start": 1, "count": 1, NEXT: 1,
            LEN: t.shape.len_expr(),
            "mp_type": {"$type": t.shape.items_path()},
        };
        let buckets = t.find(t.shape.of_key(&self.key), 1, 0, project).await?;
        // Every bucket checked before anything is written.
        let mut updates = Vec::new();
        let mut at = 0_i64;
        for d in &buckets {
            let (_, count) = t.shape.check(d, raw_int(d, LEN).ok())?;
            // An empty bucket opened ahead follows the sum like any other:
            // the tail below gives it the `start` it needs.
            if raw_int(d, "start") != Ok(at) {
                let q = t.shape.by_id(&id_of(d));
                updates.push(doc! {"q": q, "u": {"$set": {"start": at}}});
            }
            at += count;
        }
        // One command for every bucket whose position moved.
        for chunk in updates.chunks(1_000) {
            let mut cmd = doc! {"update": t.coll.name(), "updates": chunk.to_vec()};
            if let Some(c) = &t.o.comment {
                cmd.insert("comment", c.clone());
            }
            let reply = t.db.run_command(cmd).session(&mut *t.s).await?;
            crate::action::command_write_errors(&reply)?;
        }
        t.read_tail(&self.key).await?;
        Ok(at as u64)
    }
}

/// A race lost inside a transaction, labelled `TransientTransactionError`
/// so that the transaction's runner (the caller's `and_run2`, or a move's
/// own) runs it again.
/// A write of a move that had to find its bucket as the transaction read
/// it: `n` documents it wrote, not one, is a race, rerun.
fn one(n: u64) -> Result<()> {
    match n {
        1 => Ok(()),
        _ => Err(raced(Error::Contended {
            operation: "move",
            attempts: 1,
        })),
    }
}

pub(super) fn raced(e: Error) -> Error {
    match e {
        Error::Database(e) | Error::Raced(e) => crate::action::raced_in_transaction(e),
        other => {
            crate::action::raced_in_transaction(mongodb::error::Error::custom(other.to_string()))
        }
    }
}
