//! Pushes: appending to a key's newest bucket, or opening the next.
//!
//! A push to a model without `order` first tries [`ahead`](super::ahead),
//! one command. What follows is the general path. A push in order changes
//! only the key's last bucket, with one update whose filter says the bucket
//! is still open, sound and has room; when it matches nothing, a point read
//! says why (full, closed, gone, or this very write applied already) and the
//! push goes on from there. Only an insert opens the next bucket, so two
//! writers racing to open it meet on its unique `_id`. A late item (below
//! what the last bucket holds) goes to [`near`](super::near) when it
//! belongs in the last bucket or the one before, else to
//! [`late`](super::late). A push without a session or options of its
//! own goes through its key's queue first ([`group`](super::group)).

use super::cx::outside_transaction;
use crate::action::Call;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document};

use super::cx::{contended, raced, Pushed};
use super::near::Near;
use super::stored::{order_cmp, Head, FLOOR, OPS, STALE};
use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::retry::Retry;

impl<T: Bucketed> Buckets<T> {
    /// One push's commands, its own: the first inline, the rest boxed.
    pub(super) async fn push_one(&self, p: &Pushed, cx: &mut Call<'_>) -> Result<()> {
        let known = self.remembered(&p.slot);
        if let Some(seq) = known.filter(|_| self.ahead(cx)) {
            let (landed, looked) = self.push_hinted(p, seq, cx).await?;
            if let Some(seq) = landed {
                self.remember(&p.slot, seq);
                return Ok(());
            }
            return Box::pin(self.push_general(p, Some(looked), None, cx)).await;
        }
        // The general path's first update, when the key's open bucket is
        // known: the whole push, most of the time.
        let first = match known {
            Some(seq) => Some((seq, self.append_to(p, seq, cx).await)),
            None => None,
        };
        if let Some((_, Ok(true))) = first {
            // The bucket it remembered: nothing to learn (and another push
            // may have remembered a newer one since).
            return Ok(());
        }
        Box::pin(self.push_general(p, None, first, cx)).await
    }

    /// One update appending the pushed item to bucket `seq` of its key, if
    /// that bucket is open, sound and has room: whether it did.
    async fn append_to(&self, p: &Pushed, seq: i64, cx: &mut Call<'_>) -> Result<bool> {
        let (key, doc, len, op) = (&p.key, &p.doc, p.len, p.op);
        let v = self.order_of(doc);
        let filter = self.open_filter(key, seq, 1, len, op, v.as_ref());
        let update = match &v {
            Some(v) => {
                mongodb::options::UpdateModifications::from(self.insert_sorted(doc, v, len, op))
            }
            None => self.append(vec![doc.clone()], len, op).into(),
        };
        let update = self
            .coll
            .update_one(filter, update)
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
        crate::action::run!(update, cx.session.as_deref_mut())
            .map(|r| r.matched_count == 1)
            .map_err(Error::from)
    }

    /// The rest of a push: from the start for a key this repository has
    /// not seen, or after the one-command push (which last looked at
    /// bucket `tried`) or the `first` update found no room.
    async fn push_general(
        &self,
        p: &Pushed,
        mut tried: Option<i64>,
        mut first: Option<(i64, Result<bool>)>,
        cx: &mut Call<'_>,
    ) -> Result<()> {
        let (key, doc, len, slot, op) = (&p.key, &p.doc, p.len, &p.slot, p.op);
        let v = self.order_of(doc);
        let mut hops = 0;
        let mut retry = Retry::new("push");
        // Whether the next write can fail only by a race: it goes to a
        // bucket just read with room, or just opened by another writer.
        // Then a failure pauses; one against a bucket this handle had
        // wrongly remembered as open (a rollover, most of the time) does
        // not.
        let mut contested = false;
        loop {
            // A key not seen yet starts by creating its first bucket: for a
            // new key that is the whole push. Writes to a bucket that exists
            // are updates whose filter refuses a damaged bucket; an upsert
            // cannot carry that filter, so none is sent.
            let sent = first.take();
            let mut known = match &sent {
                Some((seq, _)) => Some(*seq),
                None => self.remembered(slot),
            };
            if known.is_none() && cx.txn {
                // In a caller's transaction a failed insert aborts it: an
                // unseen key is read first rather than guessed new.
                let head = Box::pin(self.head(key, None, cx)).await?;
                if head.exists {
                    self.remember(slot, head.seq);
                    known = Some(head.seq);
                }
            }
            let seq = known.unwrap_or(0);
            let result = match (sent, known) {
                (Some((_, result)), _) => result,
                (None, None) => {
                    Box::pin(self.open_next(key, &Head::default(), vec![doc.clone()], len, op, cx))
                        .await
                        .map(|s| s.is_some())
                }
                (None, Some(seq)) => self.append_to(p, seq, cx).await,
            };
            match result {
                Ok(true) => {
                    self.remember(slot, seq);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) if e.is_duplicate_key() && cx.txn => return Err(raced(e)),
                Err(e) if e.is_duplicate_key() => {}
                Err(e) => return Err(e),
            }
            if cx.txn && hops >= 3 {
                // The bucket keeps changing under the transaction's
                // snapshot: another writer's; the caller runs it again (a
                // few hops only: a caller's transaction must not wait out
                // the retry's bound, and pausing in it reads the same
                // snapshot again).
                return Err(raced(contended("push", hops)));
            }
            if std::mem::take(&mut contested) && !cx.txn {
                // A race lost: the write matched nothing, or its insert met
                // another writer's bucket.
                retry.pause().await?;
            }
            // Full, closed, or not there, late, or this very write applied
            // already (a retry by the driver found its id). A point read
            // says which; after a few hops forward, ask for the newest
            // bucket instead.
            hops += 1;
            // Whether `head` is the key's newest bucket, read by the index.
            let mut newest = known.is_none();
            let head = if known.is_none() {
                // The key has buckets this handle had not seen: go to its
                // newest, by the index.
                let head = Box::pin(self.head(key, Some(op), cx)).await?;
                if head.mine {
                    self.remember(slot, head.seq);
                    return Ok(());
                }
                head
            } else {
                let at = Box::pin(self.bucket(key, seq, Some(op), cx)).await?;
                if at.as_ref().is_some_and(|h| h.mine) {
                    self.remember(slot, seq);
                    return Ok(());
                }
                match at {
                    Some(h) if hops <= 2 => h,
                    _ => {
                        newest = true;
                        Box::pin(self.head(key, None, cx)).await?
                    }
                }
            };
            if head.exists && !cx.txn {
                // A hint only: where the next push looks first, even if this
                // one is cut short (not from a transaction's snapshot).
                self.remember(slot, head.seq);
            }
            let late = |bound: &Option<Bson>| {
                v.as_ref()
                    .is_some_and(|v| order_cmp(Some(v), bound.as_ref()) == std::cmp::Ordering::Less)
            };
            // An empty last bucket without a floor (a removal emptied it)
            // says nothing of the values before it: the late path finds the
            // bucket that covers the item among those with items.
            let unbounded = v.is_some() && head.exists && head.count == 0 && head.hi.is_none();
            if head.exists
                && !head.sealed
                && !unbounded
                && !late(&head.lo)
                && self.fits(&head, &[(Document::new(), len)]) == 1
            {
                // The bucket has room (another writer opened it, or this
                // repository had not seen the key): append to it.
                self.remember(slot, head.seq);
                contested = true;
                continue;
            }
            if head.exists && (late(&head.hi) || unbounded) {
                // Below what the last bucket holds: it goes into the bucket
                // that covers it (an item in order never lands behind it).
                // Another writer's copy of this push may have landed first.
                // Near the end (racing pushes dated a moment apart), one of
                // the last two buckets takes it without the lease.
                if let (Some(v), false) = (v.as_ref(), unbounded) {
                    match Box::pin(self.push_near(p, v, &head, cx)).await? {
                        Near::Landed(seq) => {
                            self.remember(slot, seq);
                            return Ok(());
                        }
                        Near::Again => {
                            // A concurrent write changed what it read.
                            if !cx.txn {
                                retry.pause().await?;
                            }
                            continue;
                        }
                        Near::Far => {}
                    }
                }
                outside_transaction(cx, "a late push")?;
                let scoped = self.scoped(&cx.opts);
                return Box::pin(scoped.push_late(key, doc.clone(), len, op)).await;
            }
            let full = head.exists && !head.sealed && head.count >= i64::from(self.spec.size);
            if full && !head.stale && self.ahead(cx) && tried != Some(head.seq) {
                tried = Some(head.seq);
                // Filled by pushes that opened the next bucket ahead at
                // half: land in that one rather than open it again.
                if let Some(seq) = Box::pin(self.push_ahead(p, head.seq, cx)).await? {
                    self.remember(slot, seq);
                    return Ok(());
                }
            }
            match Box::pin(self.open_next(key, &head, vec![doc.clone()], len, op, cx)).await {
                Ok(Some(seq)) => {
                    self.remember(slot, seq);
                    return Ok(());
                }
                Ok(None) => {
                    // The head changed since it was read: a race lost.
                    if !cx.txn {
                        retry.pause().await?;
                    }
                }
                Err(e) if e.is_duplicate_key() && cx.txn => return Err(raced(e)),
                Err(e) if e.is_duplicate_key() => {
                    // Another writer opened it first: append to theirs at
                    // once. After the key's newest bucket, that one was
                    // just opened, so failing there too is a race lost;
                    // after a bucket this handle remembered, it may be
                    // behind by several.
                    self.remember(slot, head.seq + 1);
                    contested = newest;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// An item's `order` value (null when it has none), if the model has
    /// `order`.
    pub(super) fn order_of(&self, doc: &Document) -> Option<Bson> {
        self.spec
            .order
            .map(|o| doc.get(o).cloned().unwrap_or(Bson::Null))
    }

    /// Bucket `seq` of `key`, if it is open and has room for `n` more items
    /// of `len` bytes. With `v`, only if its lowest item is not above `v`: a
    /// lower value is late, and belongs in an earlier bucket.
    fn open_filter(
        &self,
        key: &Bson,
        seq: i64,
        n: i64,
        len: i64,
        op: ObjectId,
        v: Option<&Bson>,
    ) -> Document {
        let expr = match v {
            Some(v) => doc! {"$and": [self.sound(), {"$lte": [self.lo_expr(), {"$literal": v}]}]},
            None => self.sound(),
        };
        doc! {
            "_id": {"k": key.clone(), "s": seq},
            OPS: {"$ne": op},
            self.spec.key: key.clone(),
            "sealed": Bson::Null,
            "count": {"$lte": i64::from(self.spec.size) - n},
            "bytes": {"$lte": MAX_BUCKET_BYTES - len},
            "$expr": expr,
        }
    }

    /// Opens the bucket after `head` with `items` (one item, or items in
    /// order) in it: an insert, which fails with a duplicate key when
    /// another writer opened it first (then the caller retries, and appends
    /// to that one).
    async fn open_next(
        &self,
        key: &Bson,
        head: &Head,
        items: Vec<Document>,
        len: i64,
        op: ObjectId,
        cx: &mut Call<'_>,
    ) -> Result<Option<i64>> {
        if head.exists && !head.sealed && !self.seal_if_unchanged(head, cx).await? {
            // It changed since it was read: the caller reads it again.
            return Ok(None);
        }
        // The new bucket's `start` comes from the head's: never from one a
        // write that moves positions left stale.
        let fresh;
        let head = if head.stale {
            outside_transaction(cx, "repairing positions a removal left")?;
            let scoped = self.scoped(&cx.opts);
            let (scoped, cx) = (&scoped, &mut *cx);
            fresh = scoped
                .leased(key, |_| async move {
                    scoped.finish_moves(key).await?;
                    scoped.reindex_now(key, None).await?;
                    self.bucket(key, head.seq, None, cx).await
                })
                .await?
                .unwrap_or_else(|| head.clone());
            &fresh
        } else {
            head
        };
        if let (Some(first), true) = (items.first(), head.exists) {
            let v = self.order_of(first);
            if v.is_some() && order_cmp(v.as_ref(), head.hi.as_ref()) == std::cmp::Ordering::Less {
                // A split or a late item changed it: decide again.
                return Ok(None);
            }
        }
        let (seq, start) = if head.exists {
            (head.seq + 1, head.total())
        } else {
            (0, 0)
        };
        if head.exists && self.spec.order.is_none() {
            // Opened here: an empty one opened ahead gives way.
            self.drop_ahead(key, head.seq, cx).await?;
        }
        let count = items.len() as i64;
        let mut bucket = self.new_bucket(key, seq, start);
        bucket.insert("count", count);
        bucket.insert("bytes", len);
        bucket.insert(self.spec.items, items);
        bucket.insert(OPS, vec![op]);
        if let (true, Some(hi)) = (self.spec.order.is_some(), head.hi.as_ref()) {
            // Nothing before it is above the head's last value (the head is
            // closed now): items from there on belong here.
            bucket.insert(FLOOR, hi.clone());
        }
        if head.stale {
            // Opened from a marked bucket: marked too, until the write that
            // marked them has recomputed `start`.
            bucket.insert(STALE, true);
        }
        let insert = self
            .coll
            .insert_one(bucket)
            .with_options(cx.opts.driver::<mongodb::options::InsertOneOptions>());
        crate::action::run!(insert, cx.session.as_deref_mut())?;
        if head.exists && count < i64::from(self.spec.size) && self.ahead(cx) {
            // The bucket after it, opened ahead as a one-command push would
            // have (the item is stored: this only keeps the next pushes at
            // one command).
            let next = start + i64::from(self.spec.size);
            let _ = self.open_ahead(key, seq + 1, next, head.stale, cx).await;
        }
        Ok(Some(seq))
    }

    /// Seals `head` if it is still as read (count and mark), and says
    /// whether it is closed now; a full bucket needs no seal.
    pub(super) async fn seal_if_unchanged(&self, head: &Head, cx: &mut Call<'_>) -> Result<bool> {
        // With `order`, a full bucket is closed too, by a write naming the
        // `start` and `count` read: a late item may still land in the last
        // bucket, full or not, or shift its `start` (see [`near`](super::near)),
        // until this write closes it; the next bucket's `start` is taken
        // from what it names.
        if head.count < i64::from(self.spec.size) || self.spec.order.is_some() {
            // A bucket opened ahead after it assumed it would fill: it
            // follows the count it closes at instead, set first, while no
            // push can reach it.
            let key = head.id.as_document().and_then(|id| id.get("k")).cloned();
            let ahead = match key.as_ref().filter(|_| self.spec.order.is_none()) {
                Some(k) => self.fix_ahead(k, head.seq, head.total(), cx).await?,
                None => false,
            };
            let stale = if head.stale {
                Bson::Boolean(true)
            } else {
                Bson::Document(doc! {"$ne": true})
            };
            let update = self
                .coll
                .update_one(
                    doc! {
                        self.spec.key: Self::key_in(&head.id),
                        "_id": head.id.clone(),
                        "count": head.count,
                        "start": head.start,
                        "sealed": Bson::Null,
                        STALE: stale,
                        "$expr": self.sound(),
                    },
                    doc! {"$set": {"sealed": true}},
                )
                .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
            let r = crate::action::run!(update, cx.session.as_deref_mut())?;
            if let (0, true, Some(k)) = (r.matched_count, ahead, key.as_ref()) {
                // Not closed after all (a push changed it): back to `size`.
                let size = i64::from(self.spec.size);
                self.fix_ahead(k, head.seq, head.start + size, cx).await?;
            }
            return Ok(r.matched_count == 1);
        }
        Ok(true)
    }
}
