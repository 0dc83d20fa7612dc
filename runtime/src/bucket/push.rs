//! One push: appending to a key's last bucket, or opening the next.
//!
//! A push to a model without `order` first tries [`ahead`](super::ahead),
//! one command. What follows is the general path. A push changes only the
//! key's last bucket, with one update whose filter says the bucket is
//! still open, sound, has room and (with `order`) does not hold the item's
//! value too high; when it matches nothing, a point read says why (full,
//! closed, gone, or this very write applied already) and the push goes on
//! from there ([`Step`]). Only an insert opens the next bucket, after a
//! write that closes the last one naming the `start` it read (and, without
//! `order`, its `count`; with `order` it returns the count it closed at:
//! see [`close`](Buckets::close)), so two writers racing to open it meet
//! on its unique `_id`, and a write that moved positions meanwhile is
//! seen. An item below the last
//! bucket's floor, or one the last bucket has no room for that belongs
//! in it, is late: [`late`](super::late), one transaction.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Bson, Document};

use super::late::Late;
use super::moves::raced;
use super::shape::{below, Fill, Head, Pushed};
use super::{Bucketed, Buckets};
use crate::action::Call;
use crate::error::{Error, Result};
use crate::retry::Retry;

/// What a push does next, given the key's last bucket as just read.
#[derive(Debug, PartialEq)]
enum Step {
    /// Append to that bucket (with `order`, inserted sorted).
    Append,
    /// Insert it sorted into that bucket, full but open and not past
    /// twice `size`: the item belongs there, below its last value.
    InLast,
    /// Into an earlier bucket, or through a split: a late item.
    Late,
    /// Open the next bucket with it (or the key's first).
    Open,
}

/// How a push ended a round.
enum Round {
    /// Stored, in the bucket with this `seq`.
    Stored(i64),
    /// Not stored; `true` when it lost a race (a pause is due before the
    /// next round).
    Again(bool),
}

impl<T: Bucketed> Buckets<T> {
    /// One push's commands, its own: the first update or insert inline,
    /// the rest boxed.
    pub(super) async fn push_one(&self, p: &Pushed, cx: &mut Call<'_>) -> Result<()> {
        let fill = self.remembered_fill(&p.slot);
        let known = fill.map(|(seq, _)| seq);
        let ahead = self.ahead(cx);
        // Without `order`, past the bucket's first item: one update, which
        // costs the server less than the one-command push's
        // `findAndModify`; that one takes what the update did not (a full
        // bucket, or others reached the half meanwhile).
        let past = fill.filter(|&(seq, count)| ahead && self.past_first(seq, count));
        if let Some(seq) = known.filter(|_| ahead && past.is_none()) {
            // A bucket's first push, or its count not known: boxed, as
            // the update is the one most pushes take.
            return Box::pin(self.push_windowed(p, seq, cx)).await;
        }
        // The general path's first write, when it can guess it: an update
        // of the key's open bucket as remembered (the whole push, most of
        // the time), or for a key not seen yet the insert of its first
        // bucket (the whole push for a new key). Not that guess inside the
        // caller's transaction, which a failed insert would abort.
        let first = match known {
            Some(seq) => self.append_to(p, seq, past.is_some(), cx).await,
            None if !cx.txn => Box::pin(self.open_first(p, cx)).await,
            None => Ok(false),
        };
        match (first, past) {
            (Ok(true), Some((seq, count))) => {
                self.remember_fill(&p.slot, seq, count + 1);
                Ok(())
            }
            (Ok(true), None) => Ok(()),
            (Ok(false), Some((seq, _))) => Box::pin(self.push_windowed(p, seq, cx)).await,
            (Ok(false), None) => Box::pin(self.push_general(p, None, cx)).await,
            (Err(e), past) => match Box::pin(self.after_failed(p, e, cx)).await? {
                Some(seq) => {
                    self.remember(&p.slot, seq);
                    Ok(())
                }
                // Not stored: sent again, under the same write id.
                None => match past {
                    Some((seq, _)) => Box::pin(self.push_windowed(p, seq, cx)).await,
                    None => Box::pin(self.push_general(p, None, cx)).await,
                },
            },
        }
    }

    /// The one-command push from bucket `seq`, then the general path.
    async fn push_windowed(&self, p: &Pushed, seq: i64, cx: &mut Call<'_>) -> Result<()> {
        let (landed, looked) = self.push_hinted(p, seq, cx).await?;
        if let Some(seq) = landed {
            self.remember(&p.slot, seq);
            return Ok(());
        }
        Box::pin(self.push_general(p, Some(looked), cx)).await
    }

    /// The key's first bucket, opened with the item: whether it was (not:
    /// the key has buckets).
    async fn open_first(&self, p: &Pushed, cx: &mut Call<'_>) -> Result<bool> {
        let items = [(p.doc.clone(), p.len)];
        match self
            .open_next(&p.key, &Head::default(), &items, p.op, cx)
            .await
        {
            Ok(Some(seq)) => {
                self.remember_fill(&p.slot, seq, 1);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) if e.is_duplicate_key() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One update appending the pushed item to bucket `seq` of its key, if
    /// that bucket is open, sound and has room: whether it did.
    /// With `past`, only past the bucket's first item
    /// ([`past_first_action`](Buckets::past_first_action)).
    async fn append_to(&self, p: &Pushed, seq: i64, past: bool, cx: &mut Call<'_>) -> Result<bool> {
        let update = match past {
            true => self.past_first_action(p, seq, cx),
            false => self.append_action(p, seq, cx),
        };
        let r = crate::action::run!(update, cx.session.as_deref_mut())?;
        Ok(r.matched_count == 1)
    }

    /// The update of [`Buckets::append_to`], built apart so that nothing of
    /// it but the driver's action stays in the push's future.
    fn append_action(&self, p: &Pushed, seq: i64, cx: &Call<'_>) -> mongodb::action::Update<'_> {
        let v = self.shape.order_of(&p.doc);
        let filter = self.shape.open(&p.key, seq, 1, p.len, p.op, v.as_ref());
        let update: mongodb::options::UpdateModifications = match &v {
            Some(v) => self.shape.insert_sorted(&p.doc, v, p.len, p.op).into(),
            None => self.shape.append(vec![p.doc.clone()], p.len, p.op).into(),
        };
        self.coll
            .update_one(filter, update)
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>())
    }

    /// One update by `filter` in `cx`: whether it matched.
    async fn update_in_cx(
        &self,
        filter: Document,
        update: mongodb::options::UpdateModifications,
        cx: &mut Call<'_>,
    ) -> Result<bool> {
        let update = self
            .coll
            .update_one(filter, update)
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
        let r = crate::action::run!(update, cx.session.as_deref_mut())?;
        Ok(r.matched_count == 1)
    }

    /// The rest of a push, after the one-command push (which last looked
    /// at bucket `tried`) or the first update found no room, or for a key
    /// this repository has not seen: rounds of a read and a write until
    /// the item is stored.
    async fn push_general(&self, p: &Pushed, tried: Option<i64>, cx: &mut Call<'_>) -> Result<()> {
        let mut retry = Retry::new("push");
        let mut ahead_tried = tried;
        // Whether a write of this push failed and was found not stored:
        // sent again once, under the same write id.
        let mut resent = false;
        for round in 1.. {
            let head = match self.where_to(p, round, cx).await? {
                Ok(seq) => {
                    self.remember(&p.slot, seq);
                    return Ok(());
                }
                Err(head) => head,
            };
            let done = match self.step(p, &head) {
                Step::Append => self
                    .append_to(p, head.seq, false, cx)
                    .await
                    .map(|ok| match ok {
                        true => Round::Stored(head.seq),
                        false => Round::Again(true),
                    }),
                Step::InLast => self.insert_in_last(p, &head, cx).await,
                Step::Late => self.push_late(p, cx).await,
                Step::Open => self.open_or_ahead(p, &head, &mut ahead_tried, cx).await,
            };
            match done {
                Ok(Round::Stored(seq)) => {
                    self.remember(&p.slot, seq);
                    return Ok(());
                }
                Ok(Round::Again(lost)) => self.lost(round, lost, &mut retry, cx).await?,
                // Another writer opened the bucket first: read again.
                Err(e) if e.is_duplicate_key() && !cx.txn => {}
                // In the caller's transaction, which the failed insert
                // aborted: the caller runs it again.
                Err(e) if e.is_duplicate_key() => return Err(raced(e)),
                Err(e) if resent => return Err(e),
                // A failover's error: found stored, or sent again.
                Err(e) => {
                    if let Some(seq) = Box::pin(self.after_failed(p, e, cx)).await? {
                        self.remember(&p.slot, seq);
                        return Ok(());
                    }
                    resent = true;
                }
            }
        }
        unreachable!("rounds are counted without end")
    }

    /// A round that stored nothing: outside a transaction, a lost race
    /// pauses (within the retry's bound); inside the caller's transaction,
    /// the bucket keeps changing under its snapshot (another writer's),
    /// so after a few rounds the caller runs it again.
    async fn lost(&self, round: usize, lost: bool, retry: &mut Retry, cx: &Call<'_>) -> Result<()> {
        if cx.txn {
            if round >= 3 {
                return Err(raced(Error::Contended {
                    operation: "push",
                    attempts: round,
                }));
            }
            return Ok(());
        }
        if lost {
            retry.pause().await?;
        }
        Ok(())
    }

    /// Where the push stands: `Ok(seq)` if this very write is stored
    /// already (the driver retried it after a lost reply), else the key's
    /// last bucket. The remembered bucket is read by `_id` for the first
    /// rounds, and taken for the last while it is open (only the last
    /// bucket is: a push opening the next closes it first, but for a full
    /// one without `order`, whose successor the one-command push finds);
    /// then the newest, by the index.
    async fn where_to(
        &self,
        p: &Pushed,
        round: usize,
        cx: &mut Call<'_>,
    ) -> Result<std::result::Result<i64, Head>> {
        let known = self.remembered(&p.slot).filter(|_| round <= 2);
        // A full bucket without `order` is not closed by a seal: others may
        // have opened (and filled) the buckets after it since this handle
        // saw it. Taken for the last, it would have this push open a
        // bucket that exists: outside a transaction a lost race, read
        // again; inside one, an abort the caller's rerun would meet again
        // for as long as the handle remembers it (another instance's
        // pushes move the key on without this handle seeing them).
        let unordered = self.shape.spec.order.is_none();
        let size = self.shape.size();
        let at = match known {
            Some(seq) => Box::pin(self.bucket(&p.key, seq, Some(p.op), cx))
                .await?
                .filter(|h| h.mine || !(h.sealed || (unordered && h.count >= size))),
            None => None,
        };
        let head = match at {
            Some(h) => h,
            None => Box::pin(self.head(&p.key, Some(p.op), cx)).await?,
        };
        if head.mine {
            return Ok(Ok(head.seq));
        }
        if head.exists && !cx.txn {
            // A hint only: where the next push looks first, even if this
            // one is cut short (not from a transaction's snapshot).
            self.remember_fill(&p.slot, head.seq, head.count);
        }
        Ok(Err(head))
    }

    /// What the item does with the key's last bucket `head`: see [`Step`].
    fn step(&self, p: &Pushed, head: &Head) -> Step {
        if !head.exists {
            return Step::Open;
        }
        let v = self.shape.order_of(&p.doc);
        let late = |bound: Option<&Bson>| v.as_ref().is_some_and(|v| below(v, bound));
        // An empty last bucket without a floor (a removal emptied it) says
        // nothing of the values before it: the late path finds the bucket
        // that covers the item among those with items.
        let unbounded = v.is_some() && head.count == 0 && head.lo.is_none();
        if late(head.lo.as_ref()) || unbounded {
            return Step::Late;
        }
        if !head.sealed && self.shape.fits(head, [p.len]) == 1 {
            return Step::Append;
        }
        if late(head.hi.as_ref()) {
            if !head.sealed && head.count < self.shape.cap() {
                return Step::InLast;
            }
            return Step::Late;
        }
        Step::Open
    }

    /// One update inserting the item sorted into `head`, the key's last
    /// bucket, full but open: its floor not above the item, under twice
    /// `size`. A writer opening the next bucket closes this one first by a
    /// write naming its `count`, so the two cannot both land.
    async fn insert_in_last(&self, p: &Pushed, head: &Head, cx: &mut Call<'_>) -> Result<Round> {
        let Some(v) = self.shape.order_of(&p.doc) else {
            return Ok(Round::Again(true));
        };
        let mut filter = self.shape.open(&p.key, head.seq, 1, p.len, p.op, Some(&v));
        filter.insert("count", mongodb::bson::doc! {"$lte": self.shape.cap() - 1});
        let update = self.shape.insert_sorted(&p.doc, &v, p.len, p.op).into();
        Ok(match self.update_in_cx(filter, update, cx).await? {
            true => Round::Stored(head.seq),
            false => Round::Again(true),
        })
    }

    /// A late item: [`Late`], one transaction (the caller's, or its own).
    async fn push_late(&self, p: &Pushed, cx: &mut Call<'_>) -> Result<Round> {
        let v = self.shape.order_of(&p.doc).unwrap_or(Bson::Null);
        let late = Late {
            key: p.key.clone(),
            item: p.doc.clone(),
            v,
            len: p.len,
            op: p.op,
        };
        Ok(match self.moved(late, cx).await? {
            Some(seq) => Round::Stored(seq),
            // The key's items went meanwhile: in order now.
            None => Round::Again(false),
        })
    }

    /// The item can go in no bucket that exists: without `order`, the
    /// bucket opened ahead may take it (once per bucket); else it opens
    /// the next bucket.
    async fn open_or_ahead(
        &self,
        p: &Pushed,
        head: &Head,
        tried: &mut Option<i64>,
        cx: &mut Call<'_>,
    ) -> Result<Round> {
        let full = head.exists && !head.sealed && head.count >= self.shape.size();
        if full && self.ahead(cx) && *tried != Some(head.seq) {
            *tried = Some(head.seq);
            // Filled by pushes that opened the next bucket ahead: land in
            // that one rather than open it again.
            if let Some(seq) = Box::pin(self.push_ahead(p, head.seq, cx)).await? {
                return Ok(Round::Stored(seq));
            }
        }
        let items = vec![(p.doc.clone(), p.len)];
        Ok(
            match Box::pin(self.open_next(&p.key, head, &items, p.op, cx)).await? {
                Some(seq) => Round::Stored(seq),
                // The head changed since it was read: a race lost.
                None => Round::Again(true),
            },
        )
    }

    /// Opens the bucket after `head` with `items` (one item, or items in
    /// order) in it: closes `head` first if it is still as read, then
    /// inserts the next bucket, which fails with a duplicate key when
    /// another writer opened it first (the caller then reads again).
    /// `None` when `head` changed since it was read.
    pub(super) async fn open_next(
        &self,
        key: &Bson,
        head: &Head,
        items: &[(Document, i64)],
        op: ObjectId,
        cx: &mut Call<'_>,
    ) -> Result<Option<i64>> {
        let closed;
        let head = match head.exists && !head.sealed {
            true => match self.close(head, items.first().map(|(d, _)| d), cx).await? {
                Some(h) => {
                    closed = h;
                    &closed
                }
                None => return Ok(None),
            },
            false => head,
        };
        let (seq, start) = match head.exists {
            true => (head.seq + 1, head.total()),
            false => (0, 0),
        };
        if head.exists && self.shape.spec.order.is_none() {
            // An empty bucket opened ahead after it takes the items, if its
            // `start` follows from the head as read (a write that moved
            // positions since re-based it, and this reads again).
            let adopt = self.shape.adopt(key, seq, start, items, op);
            if self.update_in_cx(adopt.0, adopt.1.into(), cx).await? {
                return Ok(Some(seq));
            }
        }
        let fill = Fill {
            // Nothing before it is above the head's last value (the head is
            // closed now): items from there on belong here.
            floor: head.hi.clone(),
            ..Fill::of(items, op)
        };
        let bucket = self.shape.new_bucket(key, Bson::Int64(seq), start, fill);
        let insert = self
            .coll
            .insert_one(bucket)
            .with_options(cx.opts.driver::<mongodb::options::InsertOneOptions>());
        crate::action::run!(insert, cx.session.as_deref_mut())?;
        if head.exists && (items.len() as i64) < self.shape.size() && self.ahead(cx) {
            // The bucket after it, opened ahead as a one-command push would
            // have (the item is stored: this only keeps the next pushes at
            // one command).
            let next = start + self.shape.size();
            let _ = self.open_ahead(key, seq + 1, next, cx).await;
        }
        Ok(Some(seq))
    }

    /// Closes `head`, the key's last bucket as read, before the next
    /// bucket opens after it with `first` (and what follows it): `head` as
    /// closed, or `None` when it was not closed (or not for `first`), a
    /// race lost. Without `order`, see
    /// [`seal_if_unchanged`](Buckets::seal_if_unchanged). With `order`,
    /// a full bucket still takes late items inserted below its last value
    /// until it is closed, and pushes from other processes insert them all
    /// the time at a rollover: a close that named the `count` it read lost
    /// to them round after round, each after a longer pause. So the close
    /// names only the `start` (a move that ran since changed it) and
    /// returns the `count`, `bytes` and last item the bucket closed with,
    /// in one `findAndModify`; the next bucket follows them. When its last
    /// value is then above `first`, `first` is late: `None`, and the next
    /// round reads the bucket closed.
    pub(super) async fn close(
        &self,
        head: &Head,
        first: Option<&Document>,
        cx: &mut Call<'_>,
    ) -> Result<Option<Head>> {
        let Some(order) = self.shape.spec.order else {
            return Ok(self
                .seal_if_unchanged(head, cx)
                .await?
                .then(|| head.clone()));
        };
        let mut filter = self.shape.unchanged(head);
        filter.remove("count");
        let items = self.shape.spec.items;
        let projection = mongodb::bson::doc! {
            "start": 1, "count": 1, "bytes": 1, super::shape::FLOOR: 1,
            items: {"$slice": -1},
        };
        let close = self
            .coll
            .find_one_and_update(filter, super::shape::Shape::seal())
            .with_options(
                cx.opts
                    .driver::<mongodb::options::FindOneAndUpdateOptions>(),
            )
            .return_document(mongodb::options::ReturnDocument::After)
            .projection(projection);
        let Some(d) = crate::action::run!(close, cx.session.as_deref_mut())? else {
            return Ok(None);
        };
        let last = d
            .get_array(items)
            .ok()
            .and_then(|a| a.last())
            .and_then(Bson::as_document)
            .map(|i| i.get(order).cloned().unwrap_or(Bson::Null));
        // Integers as every read of a bucket takes them (`raw_int`).
        let raw = crate::compat::raw_document(&d).ok();
        let int = |f: &str| raw.as_ref().and_then(|r| super::shape::raw_int(r, f).ok());
        let (Some(start), Some(count)) = (int("start"), int("count")) else {
            return Ok(None);
        };
        let closed = Head {
            start,
            count,
            bytes: int("bytes").unwrap_or(head.bytes),
            hi: last.or_else(|| d.get(super::shape::FLOOR).cloned()),
            sealed: true,
            ..head.clone()
        };
        let v = first.and_then(|d| self.shape.order_of(d));
        if v.is_some_and(|v| super::shape::below(&v, closed.hi.as_ref())) {
            return Ok(None);
        }
        Ok(Some(closed))
    }

    /// Closes `head` if it is still as read (its `count` and `start`), and
    /// says whether it is closed now. A move that ran since changed one of
    /// them; a late item inserted into it changed its count. Without
    /// `order` a full bucket needs no closing: it takes no more pushes,
    /// and a move reads it as closed (see [`tail`](Buckets::tail)).
    pub(super) async fn seal_if_unchanged(&self, head: &Head, cx: &mut Call<'_>) -> Result<bool> {
        let short = head.count < self.shape.size();
        if !short && self.shape.spec.order.is_none() {
            return Ok(true);
        }
        // A bucket opened ahead after it assumed it would fill: it follows
        // the count it closes at instead, set first, while no push can
        // reach it.
        let key = super::shape::key_in(&head.id);
        let ahead = short
            && self.shape.spec.order.is_none()
            && self.fix_ahead(&key, head.seq, head.total(), cx).await?;
        let sealed = self
            .update_in_cx(
                self.shape.unchanged(head),
                super::shape::Shape::seal().into(),
                cx,
            )
            .await?;
        if !sealed && ahead {
            // Not closed after all (a push changed it): back to `size`.
            let size = self.shape.size();
            self.fix_ahead(&key, head.seq, head.start + size, cx)
                .await?;
        }
        Ok(sealed)
    }
}
