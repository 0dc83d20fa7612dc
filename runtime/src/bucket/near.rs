//! Late items near the end of a key, placed without the lease.
//!
//! Many tasks pushing to one key, each item dated when its push is called,
//! land slightly out of order: a push whose date was taken a moment before
//! another's can arrive after it. Inside the key's open bucket that costs
//! nothing (the update inserts the item sorted). At a rollover it did: an
//! item below the last value of a bucket that had just filled, or below the
//! bucket another task had just opened, was late, and took the lease, the
//! marks and a recount of positions (about ten round trips, and every other
//! push meeting the marks waited for them). At 64 tasks one push in six or
//! more was such an item, and a push cost 13 round trips on average.
//!
//! Such an item belongs in one of the key's last two buckets, and those
//! are cheap to write:
//!
//! - In the **last** bucket (its value not below the bucket's floor, see
//!   [`FLOOR`](FLOOR)): no position after it moves, so one
//!   update inserts it sorted, even when the bucket is full (it may hold
//!   up to twice `size`, as late items always could). What makes this
//!   safe against the writer opening the next bucket: with `order`, that
//!   writer first closes the last bucket (`sealed`) by a write whose filter
//!   names the `count` and `start` it read, and takes the next bucket's
//!   `start` from them; this update's filter requires the bucket not
//!   closed. Either the update lands first (the close then fails and the
//!   opener reads again) or the close does (the update matches nothing).
//! - In the bucket **before** it (the one just closed): the last bucket's
//!   `start` moves by one. Both writes go in one transaction (the caller's,
//!   when the push runs in one; otherwise one of the push's own), so
//!   nothing sees one without the other, and a cut or a crash leaves
//!   neither. The filters name what was read (the earlier bucket's `count`,
//!   the last one's `start`, both unmarked, the last one not closed), so a
//!   concurrent writer is either seen by them or collides with them as a
//!   write conflict: a push that has closed the last bucket to open the
//!   next has written it, and a write under the lease has marked both.
//!
//! Anything further back (below the floor of the bucket before the last),
//! a bucket that would have to split, a last bucket closed (by bytes, a
//! removal, a split), a bucket no longer as read, or a deployment without
//! transactions goes the lease's way, as before ([`late`](super::late));
//! inside a caller's transaction, a bucket no longer as read is a race
//! handed back as transient, and anything further back is refused. The
//! items that reach this module at all are few once pushes of one process
//! queue per key ([`group`](super::group)). Cost: the
//! update into the last bucket is one round trip; the transaction is a
//! read of the last two buckets, two updates and the commit. Inside a
//! caller's transaction the same writes join it, so the README's trading
//! example runs under concurrency; a race they lose aborts the caller's
//! transaction with `TransientTransactionError`, which `and_run2` runs
//! again.

use crate::action::Call;
use std::sync::atomic::Ordering;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};

use super::cx::{contended, raced, Pushed};
use super::stored::{order_cmp, Head, MOVING, OPS, STALE};
use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::error::{Error, Result};

/// What became of a late item offered to [`Buckets::push_near`].
pub(super) enum Near {
    /// Stored, in the bucket with this `seq`, the key's last (the one to
    /// remember).
    Landed(i64),
    /// A concurrent write changed what was read: read again.
    Again,
    /// Not near the end (or nothing here can place it): the lease's way.
    Far,
}

impl<T: Bucketed> Buckets<T> {
    /// Places the late item `p` (its order value `v`) in the key's last
    /// bucket or the one before, as the module docs say; `head` is the
    /// key's newest bucket as just read.
    pub(super) async fn push_near(
        &self,
        p: &Pushed,
        v: &Bson,
        head: &Head,
        cx: &mut Call<'_>,
    ) -> Result<Near> {
        if head.stale {
            return Ok(Near::Far);
        }
        let below = |b: &Head| order_cmp(Some(v), b.lo.as_ref()) == std::cmp::Ordering::Less;
        if !below(head) {
            if head.sealed {
                // Closed: by a removal, by bytes, by a split, or by the
                // push opening the next bucket. The lease's way finds where
                // the item goes.
                return Ok(Near::Far);
            }
            if self.insert_in_last(p, v, head, cx).await? {
                return Ok(Near::Landed(head.seq));
            }
            // Changed since it was read (or at twice `size`, splitting,
            // marked): in a caller's transaction a race to run again,
            // else the lease's way.
            if cx.txn {
                return Err(raced(contended("push", 1)));
            }
            return Ok(Near::Far);
        }
        if self.no_transactions.load(Ordering::Relaxed)
            || cx.opts.unacknowledged(self.coll.write_concern())
        {
            return Ok(Near::Far);
        }
        // The last two buckets, as they are now.
        let (last, prev) = match self.last_two(&p.key, cx).await? {
            (Some(last), Some(prev)) => (last, prev),
            _ => return Ok(Near::Far),
        };
        if last.stale || prev.stale || last.sealed {
            return Ok(Near::Far);
        }
        if !below(&last) {
            // Another push changed the last bucket: read again.
            return Ok(Near::Again);
        }
        if below(&prev) || prev.count + 1 > self.cap() || prev.bytes + p.len > MAX_BUCKET_BYTES {
            return Ok(Near::Far);
        }
        let (shift_filter, shift_update) = self.shift_last(&last, v);
        let (prev_filter, prev_update) = self.insert_in_prev(p, v, &prev);
        if cx.txn {
            // The caller's transaction: both writes join it.
            let Some(s) = cx.session.as_deref_mut() else {
                return Ok(Near::Far);
            };
            // In `_id` order, as the push's own transaction (see there).
            let insert = self.coll.update_one(prev_filter, prev_update);
            let first = insert.session(&mut *s).await?;
            let second = if first.matched_count == 1 {
                let shift = self.coll.update_one(shift_filter, shift_update);
                shift.session(&mut *s).await?.matched_count
            } else {
                0
            };
            if second == 1 {
                return Ok(Near::Landed(last.seq));
            }
            // A race: abort, so that a caller who ignored the error
            // cannot commit half of it; `and_run2` runs it again.
            let _ = s.abort_transaction().await;
            return Err(raced(contended("push", 1)));
        }
        // A transaction of the push's own runs as a task of its own: a
        // caller that stops waiting must not cut it after its first write
        // reached the server, which would leave the transaction open with
        // the last bucket locked (the driver does not abort a transaction
        // whose first reply it has not seen) and every push of the key
        // waiting for the server's transaction lifetime to run out.
        let mut to = mongodb::options::TransactionOptions::default();
        to.write_concern = cx
            .opts
            .write_concern
            .clone()
            .or_else(|| self.coll.write_concern().cloned());
        to.selection_criteria = Some(crate::util::primary());
        let (client, coll) = (self.db.client().clone(), self.coll.clone());
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let mut s = client.start_session().await?;
            s.start_transaction().with_options(to).await?;
            let done: Result<bool> = async {
                // In `_id` order (the earlier bucket first), the order in
                // which the lease's many-bucket writes (marks, recounts)
                // take them: a server that makes a write wait for another
                // rather than fail at once (a conflict) cannot then hold
                // each waiting for the other. In the other order one in 10
                // to 15 runs of `cancelled_late_pushes…` stalled until the
                // transaction's lifetime ran out.
                let insert = coll.update_one(prev_filter, prev_update);
                if insert.session(&mut s).await?.matched_count != 1 {
                    return Ok(false);
                }
                let shift = coll.update_one(shift_filter, shift_update);
                if shift.session(&mut s).await?.matched_count != 1 {
                    return Ok(false);
                }
                s.commit_transaction().await?;
                Ok(true)
            }
            .await;
            if !matches!(done, Ok(true)) {
                let _ = s.abort_transaction().await;
            }
            done
        }));
        let done = match task.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::invalid(
                "runtime",
                "the runtime shut down while a late push ran; it may have been stored",
            )),
        };
        match done {
            Ok(true) => Ok(Near::Landed(last.seq)),
            // A bucket not as read: the lease's way, which decides from
            // what it reads under the lease.
            Ok(false) => Ok(Near::Far),
            Err(e) => {
                if refused(&e) {
                    crate::action::learnt(
                        &self.no_transactions,
                        "no_transactions",
                        self.coll.name(),
                        "the deployment refused a transaction (a standalone): late items near the end take the key's lease",
                    );
                    return Ok(Near::Far);
                }
                if e.is_transient() {
                    return Ok(Near::Again);
                }
                if matches!(
                    e.mongo().map(crate::error::code::outcome),
                    Some(crate::error::code::Outcome::Unknown)
                ) {
                    // The commit's reply was lost: the write id says.
                    return match self.landed(&p.key, p.op, cx).await {
                        Ok(Some(_)) => Ok(Near::Landed(last.seq)),
                        Ok(None) => Ok(Near::Again),
                        Err(_) => Err(crate::action::unknown_outcome("push", e, false)),
                    };
                }
                Err(e)
            }
        }
    }

    /// One update inserting the item sorted into `head`, the key's last
    /// bucket, if it is still open to it: not closed, not marked, not
    /// splitting, sound, with room under twice `size`, and its floor not
    /// above the item.
    async fn insert_in_last(
        &self,
        p: &Pushed,
        v: &Bson,
        head: &Head,
        cx: &mut Call<'_>,
    ) -> Result<bool> {
        let mut filter = self.late_filter(p, v, &head.id);
        filter.insert("sealed", Bson::Null);
        filter.insert("count", doc! {"$lte": self.cap() - 1});
        let update = self
            .coll
            .update_one(filter, self.insert_sorted(&p.doc, v, p.len, p.op))
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
        let r = crate::action::run!(update, cx.session.as_deref_mut())?;
        Ok(r.matched_count == 1)
    }

    /// The update inserting the item sorted into `prev`, the bucket before
    /// the last, if it is as read: filter and update.
    fn insert_in_prev(&self, p: &Pushed, v: &Bson, prev: &Head) -> (Document, Vec<Document>) {
        let mut filter = self.late_filter(p, v, &prev.id);
        filter.insert("count", doc! {"$lte": self.cap() - 1});
        (filter, self.insert_sorted(&p.doc, v, p.len, p.op))
    }

    /// The update moving `last`'s `start` by one for an item placed before
    /// it, if it is still open, unmarked and above `v`: filter and update.
    fn shift_last(&self, last: &Head, v: &Bson) -> (Document, Document) {
        let filter = doc! {
            self.spec.key: Self::key_in(&last.id),
            "_id": last.id.clone(),
            "sealed": Bson::Null,
            STALE: {"$ne": true},
            "$expr": {"$gt": [self.lo_expr(), {"$literal": v}]},
        };
        (filter, doc! {"$inc": {"start": 1_i64}})
    }

    /// What both writes require of their bucket: this one, unmarked, not
    /// splitting, without this write already, room for its bytes, sound,
    /// and a floor (or first item) not above `v`.
    fn late_filter(&self, p: &Pushed, v: &Bson, id: &Bson) -> Document {
        doc! {
            self.spec.key: p.key.clone(),
            "_id": id.clone(),
            OPS: {"$ne": p.op},
            STALE: {"$ne": true},
            MOVING: {"$exists": false},
            "bytes": {"$lte": MAX_BUCKET_BYTES - p.len},
            "$expr": {"$and": [self.sound(), {"$lte": [self.lo_expr(), {"$literal": v}]}]},
        }
    }

    /// The key's last bucket and the one before it, read on the primary
    /// (in the caller's transaction, when there is one).
    async fn last_two(
        &self,
        key: &Bson,
        cx: &mut Call<'_>,
    ) -> Result<(Option<Head>, Option<Head>)> {
        let find = self
            .raw
            .find(self.of_key(key))
            .sort(doc! {"_id": -1})
            .limit(2)
            .projection(self.head_projection(None));
        let docs: Vec<RawDocumentBuf> = match cx.session.as_deref_mut() {
            Some(s) => {
                let mut cursor = find.session(&mut *s).await?;
                cursor.stream(s).try_collect().await?
            }
            None => find.await?.try_collect().await?,
        };
        let mut heads = docs.iter().map(|d| self.head_of(d));
        let last = heads.next().transpose()?;
        let prev = heads.next().transpose()?;
        Ok((last, prev))
    }
}

/// A deployment that has no transactions (a standalone server) refused one.
fn refused(e: &Error) -> bool {
    match e {
        Error::Database(m) => {
            crate::error::code::server_codes(m).contains(&crate::error::code::ILLEGAL_OPERATION)
        }
        _ => false,
    }
}
