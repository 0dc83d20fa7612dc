//! Pushes that the server places: each goes to the lowest open one of the
//! key's bucket last seen open and the few after it ([`WINDOW`] in all),
//! in one `findAndModify`, and the bucket after the open one is opened
//! ahead of time, empty, as the open one takes its first item.
//!
//! Writers racing at a rollover then land in that next bucket instead of
//! failing on the full one: a push costs one round trip however many
//! writers share the key. The empty bucket ahead carries [`NEXT`]; reads
//! of the key's newest bucket pass over it, and its `start` assumes the
//! open bucket fills to `size`. Whatever closes a bucket early (by bytes,
//! or a removal) first sets that `start` right, and the push that lands
//! first in a bucket opened ahead checks it against the bucket before.
//!
//! Only models kept in insertion order use it, outside a caller's
//! transaction: with `order`, a push's bucket depends on its value. And
//! only where its reply is needed: a push to a bucket this handle knows
//! holds items and has room, other than the one at half of the key's
//! first bucket, is one update ([`Buckets::past_first_action`]), which
//! costs the server less.

use crate::action::Call;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawBsonRef};

use super::moves::Reindex;
use super::shape::{raw_int, Fill, Pushed, MINE, NEXT, OPS};
use super::{Bucketed, Buckets};
use crate::error::{Error, Result};

/// Buckets a push's command names, from the key's open bucket as last
/// seen. With many writers on a key that hint can be a bucket or two
/// behind by the time the command runs: it is read before the push waits
/// (for the runtime, a connection, the server's queue) and moved only by
/// replies, while others fill the bucket and the one opened ahead. Two
/// buckets (the open one and the next) cost 64 tasks on one key 1.23
/// round trips a push; four cost 1.06, for two more point reads.
pub(super) const WINDOW: i64 = 4;

impl<T: Bucketed> Buckets<T> {
    /// Whether pushes in `cx` may take [`Buckets::push_ahead`].
    /// Not with `w: 0`: a push must learn where it landed.
    pub(super) fn ahead(&self, cx: &Call<'_>) -> bool {
        self.shape.spec.order.is_none()
            && !cx.txn
            && !cx.opts.unacknowledged(self.coll.write_concern())
    }

    /// Whether a push to bucket `seq`, known to hold at least `count`
    /// items, can be [`Buckets::past_first_action`]: not its first item,
    /// nor the one at half of the key's first bucket, and room left.
    pub(super) fn past_first(&self, seq: i64, count: i64) -> bool {
        count >= 1 && count < self.shape.size() && !(seq == 0 && count == self.shape.half() - 1)
    }

    /// The push appended by one `update` to bucket `seq`, if it is open,
    /// has room and already holds items (and is not at half of the key's
    /// first bucket). Most pushes of a bucket are these, and an `update`
    /// costs the server less than the `findAndModify` of
    /// [`Buckets::push_ahead`], which finds the bucket and then writes it
    /// (on the test server, each of the two reads every bucket of the
    /// collection) and, retryable, stores its reply's image on `mongod`.
    pub(super) fn past_first_action(
        &self,
        p: &Pushed,
        seq: i64,
        cx: &Call<'_>,
    ) -> mongodb::action::Update<'_> {
        let filter = self.shape.open_past_first(&p.key, seq, p.len, p.op);
        let update = self.shape.append(vec![p.doc.clone()], p.len, p.op);
        self.coll
            .update_one(filter, update)
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>())
    }

    /// [`Buckets::push_ahead`] from `seq`, the key's open bucket as this
    /// handle last saw it, and once more from the newest bucket if none
    /// was open: where it landed, if it did, and the bucket it last
    /// looked from.
    pub(super) async fn push_hinted(
        &self,
        p: &Pushed,
        seq: i64,
        cx: &mut Call<'_>,
    ) -> Result<(Option<i64>, i64)> {
        if let Some(landed) = self.push_ahead(p, seq, cx).await? {
            return Ok((Some(landed), seq));
        }
        // Boxed, as the follow-ups of `push_ahead`: inline, this rare path
        // would make every push's future too large for a small allocation.
        Box::pin(self.push_from_newest(p, seq, cx)).await
    }

    /// Every bucket of the window from `seq` on was full: other writers
    /// filled them since this handle last looked (many tasks on one key).
    /// The newest bucket says where the open one is now: one read, then
    /// the one command again, after opening the next bucket if that one is
    /// full too.
    async fn push_from_newest(
        &self,
        p: &Pushed,
        seq: i64,
        cx: &mut Call<'_>,
    ) -> Result<(Option<i64>, i64)> {
        let key = &p.key;
        let head = self.head(key, None, cx).await?;
        let size = self.shape.size();
        if !head.exists || head.sealed || (head.seq <= seq && head.count < size) {
            // Not a race: the general path says why (damage, bytes).
            return Ok((None, seq));
        }
        if head.count >= size {
            let _ = self.open_ahead(key, head.seq + 1, head.total(), cx).await;
        }
        let landed = self.push_ahead(p, head.seq, cx).await?;
        Ok((landed, head.seq))
    }

    /// The pushed item appended in one command to the lowest open bucket
    /// of the [`WINDOW`] from `seq` (the key's open bucket as last seen):
    /// that bucket's `seq` if it landed, `None` if nothing took it (none
    /// open, or the lowest is damaged or has no room for its bytes), so
    /// that the caller takes the general path, which says why.
    pub(super) async fn push_ahead(
        &self,
        p: &Pushed,
        seq: i64,
        cx: &mut Call<'_>,
    ) -> Result<Option<i64>> {
        let key = &p.key;
        // A retryable write, as the driver sends its helpers: one failover
        // between its send and its reply, and the driver sends it again
        // with the same transaction number, which the server answers with
        // the first attempt's result without running it twice.
        let action = self.push_ahead_action(p, seq, cx);
        let after = match crate::action::run!(action, cx.session.as_deref_mut()) {
            Ok(after) => after,
            Err(e) => return Box::pin(self.after_failed(p, e.into(), cx)).await,
        };
        let Some(after) = after else {
            return Ok(None);
        };
        let mine = matches!(after.get_bool(MINE), Ok(true));
        let (Ok(seq), Some(start), Some(count)) = (
            after
                .get_document("_id")
                .map_err(drop)
                .and_then(|id| id.get("s").and_then(crate::util::int).ok_or(())),
            after.get("start").and_then(crate::util::int),
            after.get("count").and_then(crate::util::int),
        ) else {
            return Ok(None);
        };
        if !mine {
            return Ok(None);
        }
        // Remembered now: a caller that stops waiting below still leaves
        // the next push one command.
        self.remember_fill(&p.slot, seq, count);
        // What follows only keeps the next pushes at one round trip: the
        // item is stored, so its errors are not the push's.
        // The next bucket is opened as this one takes its first item,
        // before anything else, so that it exists before writers racing now
        // see this one full: 64 tasks fill a bucket of 100 in under two
        // round trips (opened at half, they filled it while the insert
        // ran). A key's first bucket opens its next at half: most keys of
        // a store with many never fill one, and should not pay for it.
        let size = self.shape.size();
        if count == 1 || (seq == 0 && count == self.shape.half()) {
            let _ = Box::pin(self.open_ahead(key, seq + 1, start + size, cx)).await;
        }
        if count == 1 && seq > 0 {
            let _ = Box::pin(self.check_opened_ahead(key, seq, start, cx)).await;
        }
        Ok(Some(seq))
    }

    /// A write of push `p` failed with `e`, after the driver's own retry.
    /// Refused by an election before it ran (nothing stored), `None`: the
    /// caller sends the item again, to the new primary, under the same
    /// write id. Interrupted after it ran, its reply lost, or stored on a
    /// primary that then stepped down: the write id says whether it stays,
    /// read on the primary (`None` if it is not there); where that read
    /// fails too, the outcome is unknown. Inside the caller's transaction
    /// the error is the transaction's: returned as it is.
    pub(super) async fn after_failed(
        &self,
        p: &Pushed,
        e: Error,
        cx: &mut Call<'_>,
    ) -> Result<Option<i64>> {
        use crate::failover::{outcome, Outcome};
        if cx.txn {
            return Err(e);
        }
        match e.mongo().map(outcome) {
            Some(Outcome::NotStored) => Ok(None),
            Some(Outcome::Unknown) => match self.landed(&p.key, p.op, cx).await {
                Ok(found) => Ok(found),
                Err(_) => Err(crate::failover::unknown("push", false, e)),
            },
            _ => Err(e),
        }
    }

    /// The `findAndModify` of [`Buckets::push_ahead`]. Built apart, so
    /// that nothing of it but the driver's action stays in the push's
    /// future.
    fn push_ahead_action(
        &self,
        p: &Pushed,
        seq: i64,
        cx: &Call<'_>,
    ) -> mongodb::action::FindOneAndUpdate<'_, Document> {
        let (key, doc, len, op) = (&p.key, &p.doc, p.len, p.op);
        // The bucket last seen open and those after it: point reads of the
        // `_id` index, whichever is the lowest open one.
        let ids = (seq..seq + WINDOW).map(|s| Bson::Document(doc! {"k": key.clone(), "s": s}));
        // Only a bucket closed as it should be (sealed, or `count` at
        // `size`) is passed over: any other, damaged ones too, is the
        // update's to judge, so that a push never skips a damaged bucket.
        // But not one that holds this write already: a second attempt
        // (the driver's, after a lost reply, on a server that has lost
        // its record of the first) finds it there rather than in the next
        // open bucket, and the update leaves it as it is.
        let size = self.shape.size();
        let query = doc! {
            self.shape.spec.key: key.clone(),
            "_id": {"$in": ids.collect::<Vec<_>>()},
            "$or": [{"$nor": [{"sealed": true}, {"count": size}]}, {OPS: op}],
        };
        self.coll
            .find_one_and_update(query, self.shape.append_if_open(doc, len, op))
            .with_options(
                cx.opts
                    .driver::<mongodb::options::FindOneAndUpdateOptions>(),
            )
            .sort(doc! {"_id": 1})
            .return_document(mongodb::options::ReturnDocument::After)
            .projection(self.shape.mine_projection(op))
    }

    /// Opens bucket `seq` empty, ahead of the pushes that will fill it; one
    /// there already (another writer's) is left as it is.
    pub(super) async fn open_ahead(
        &self,
        key: &Bson,
        seq: i64,
        start: i64,
        cx: &mut Call<'_>,
    ) -> Result<()> {
        let ahead = Fill {
            ahead: true,
            ..Fill::default()
        };
        let bucket = self.shape.new_bucket(key, Bson::Int64(seq), start, ahead);
        let insert = self
            .coll
            .insert_one(bucket)
            .with_options(cx.opts.driver::<mongodb::options::InsertOneOptions>());
        match crate::action::run!(insert, cx.session.as_deref_mut()).map_err(Error::from) {
            Err(e) if !e.is_duplicate_key() => Err(e),
            _ => Ok(()),
        }
    }

    /// Bucket `seq` was opened ahead and has just taken its first item: its
    /// `start` must follow the bucket before, which is closed now. If it
    /// does not (a crash cut short what closed that one early), the key's
    /// positions are recomputed (a [`Reindex`], one transaction).
    async fn check_opened_ahead(
        &self,
        key: &Bson,
        seq: i64,
        start: i64,
        cx: &mut Call<'_>,
    ) -> Result<()> {
        let Some(prev) = self.bucket(key, seq - 1, None, cx).await? else {
            return Ok(());
        };
        let closed = prev.sealed || prev.count >= self.shape.size();
        if closed && prev.total() == start {
            return Ok(());
        }
        self.moved(Reindex { key: key.clone() }, &mut Call::plain())
            .await
            .map(drop)
    }

    /// Before bucket `seq` closes with `count` items, short of `size`: the
    /// bucket opened ahead after it (if any, and still empty) gets the
    /// `start` that follows from that. Returns whether one was set.
    pub(super) async fn fix_ahead(
        &self,
        key: &Bson,
        seq: i64,
        start: i64,
        cx: &mut Call<'_>,
    ) -> Result<bool> {
        let update = self
            .coll
            .update_one(
                doc! {self.shape.spec.key: key.clone(), "_id": {"k": key.clone(), "s": seq + 1}, NEXT: true, "count": 0},
                doc! {"$set": {"start": start}},
            )
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
        let r = crate::action::run!(update, cx.session.as_deref_mut())?;
        Ok(r.matched_count == 1)
    }

    /// Whether write `op` is in one of the key's buckets; its `seq` if so.
    pub(super) async fn landed(
        &self,
        key: &Bson,
        op: ObjectId,
        cx: &mut Call<'_>,
    ) -> Result<Option<i64>> {
        let filter = self.shape.holding(key, op);
        // The primary's own copy, whatever the caller reads with: after a
        // step-down, what the new primary has is what stays (a write only
        // the old one took is rolled back). Its local copy, not its
        // majority-committed one: just after an election the majority
        // commit point can lag behind a write that survived, and a push
        // told "not stored" would be sent again.
        let mut o: mongodb::options::FindOneOptions = cx.opts.deciding();
        o.read_concern = None;
        let find = self
            .raw
            .find_one(filter)
            .with_options(o)
            .projection(doc! {"_id": 1});
        let found = crate::action::run!(find, cx.session.as_deref_mut())?;
        Ok(found.and_then(|d| match d.get("_id") {
            Ok(Some(RawBsonRef::Document(id))) => raw_int(id, "s").ok(),
            _ => None,
        }))
    }
}
