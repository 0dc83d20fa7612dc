//! Pushes to one key from many tasks of one process, sent together.
//!
//! Tasks that push to the same key through clones of one repository, with
//! no session and no options of their own, queue their items per key: the
//! push that finds no queue sends its item at once (one round trip, as
//! before), and while that command is out the others wait; when it
//! returns, everything that queued meanwhile goes in one update, sorted
//! by `order` (with one; else in the order queued), and so on until the
//! queue is empty. A task's push returns when the command that carried
//! its item has.
//!
//! Why, rather than one command per push racing at the server: items
//! dated when their push is called arrive out of order when many tasks
//! push at once, and at a rollover those that fall below the bucket just
//! filled or just opened are late, which costs a lease and a recount of
//! positions while every other push on the key waits (64 tasks: 13 round
//! trips a push, a third of the pushes of one). Sent from one queue, the
//! items reach the server in the order their pushes were called, give or
//! take the instant between taking a date and queueing (a batch is sorted,
//! so only an item queued after a batch with a later date went out is
//! late, and [`near`](super::near) places it without the lease). A batch
//! also costs one command for many pushes: at 64 tasks a push costs well
//! under one round trip, and the key takes more pushes per second than
//! from one task. Pushes from other processes still race as before; the
//! stored format and every filter are the same.
//!
//! Without `order` the one-command push ([`ahead`](super::ahead)) already
//! kept most pushes at one round trip, but 64 tasks on one key cost 1.07
//! to 1.23: every task's first push to a key the repository had not seen
//! lost the race to open its first bucket and read it (three or four
//! round trips each), and a push whose window of buckets was full went the
//! general path (a read, maybe an insert that lost). Queued, one push
//! opens the bucket and the rest follow in batches.
//!
//! What each push keeps: its item goes in exactly once, in a command of
//! the repository's own that a caller who stops waiting does not cut (the
//! queue runs as a task, as a late push does); a push returns `Ok` only
//! once its item is stored. A batch that fits the open bucket and is not
//! below it is one update carrying one write id (a retry by the driver
//! finds it); anything else (a rollover, a full bucket, a late item, a
//! fault) is sent item by item through the one-push path, so each push
//! gets its own outcome.
//! Not grouped: pushes in a session (a caller's transaction keeps its own
//! commands), with options of their own, or unacknowledged.

use crate::action::Call;
use std::collections::HashMap;

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document};
use tokio::sync::oneshot;

use super::cx::Pushed;
use super::stored::{item_len, order_cmp, Head, NEXT, OPS};
use super::{Bucketed, Buckets, MAX_BUCKET_BYTES};
use crate::action::Effective;
use crate::error::{Error, Result};
use crate::util::key_bytes;

/// A queued push: its item, and where its outcome goes.
#[derive(Debug)]
pub(super) struct Waiting {
    p: Box<Pushed>,
    done: oneshot::Sender<Result<()>>,
}

/// What became of a batch offered to one bucket.
enum Appended {
    Yes,
    /// Not stored; the bucket as read since, when it was (boxed: the rare
    /// case, and inline it would make every outcome hundreds of bytes).
    No(Option<Box<Head>>),
}

/// Each key's queue while a batch of it is out (a key with no entry has
/// none: the next push sends at once).
pub(super) type Queues = std::sync::Mutex<HashMap<Vec<u8>, Vec<Waiting>>>;

/// Takes the key's queue out of [`Queues`] if the task sending it ends
/// before emptying it (a panic, the runtime shutting down): the pushes
/// queued are told, not left waiting. Disarmed when the task takes the
/// empty queue out itself, so that it cannot take out the queue of a task
/// started after it.
struct Running<'a> {
    queues: &'a Queues,
    slot: &'a [u8],
    armed: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Poisoned or not: nothing here leaves the map half changed.
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        q.remove(self.slot);
    }
}

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::push`], in `cx`: the first command inline, the rest
    /// (reads, rollovers, retries) boxed when it runs: inline, it would
    /// make every push's future too large for a small allocation.
    pub(super) async fn push_in(&self, item: &T, cx: &mut Call<'_>) -> Result<()> {
        let key = self.key_bson(item.bucket_key())?;
        let doc = self.item_doc(item)?;
        // Boxed: a push's future holds it across every `.await`.
        let p = Box::new(Pushed {
            len: item_len(&doc)?,
            slot: key_bytes(&key),
            key,
            doc,
            // One id for every attempt: once one is applied, no other can be.
            op: ObjectId::new(),
        });
        if self.groups(cx) {
            return Box::pin(self.push_grouped(p)).await;
        }
        self.push_one(&p, cx).await
    }

    /// Whether the push `p` in `cx` goes through the key's queue.
    pub(super) fn groups(&self, cx: &Call<'_>) -> bool {
        cx.session.is_none()
            && !cx.txn
            && *cx.opts == *self.defaults
            && !cx.opts.unacknowledged(self.coll.write_concern())
    }

    /// Queues `p` on its key, starting the task that sends the key's queue
    /// if none runs, and waits for the outcome.
    pub(super) async fn push_grouped(&self, p: Box<Pushed>) -> Result<()> {
        let (done, outcome) = oneshot::channel();
        let slot = p.slot.clone();
        let first = {
            let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            match q.get_mut(&slot) {
                Some(waiting) => {
                    waiting.push(Waiting { p, done });
                    None
                }
                None => {
                    q.insert(slot.clone(), Vec::new());
                    Some(Waiting { p, done })
                }
            }
        };
        if let Some(first) = first {
            let this = self.clone();
            // In the span of the push that started the queue: the batches'
            // retries show there.
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                this.send_queue(slot, first).await
            }));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(Error::invalid(
                "runtime",
                "the runtime shut down while a push ran; it may have been stored",
            ))
        })
    }

    /// Sends `first`, then what queued on its key meanwhile, batch after
    /// batch, until the queue is empty.
    async fn send_queue(&self, slot: Vec<u8>, first: Waiting) {
        let mut running = Running {
            queues: &self.queues,
            slot: &slot,
            armed: true,
        };
        let mut batch = vec![first];
        loop {
            self.send_batch(batch).await;
            let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            batch = match q.get_mut(&slot) {
                Some(w) if !w.is_empty() => std::mem::take(w),
                _ => {
                    q.remove(&slot);
                    running.armed = false;
                    return;
                }
            };
        }
    }

    /// One batch: sorted by `order` (equal values in the order queued), in
    /// one update when it fits the open bucket as remembered and is not
    /// below it. Otherwise one read of that bucket says how many fit: those
    /// go in one update, the item that finds the bucket full goes alone
    /// (through the one-push path, which opens the next bucket), and the
    /// rest go in one update to the new bucket; a late item (below the
    /// bucket) goes alone too.
    async fn send_batch(&self, mut batch: Vec<Waiting>) {
        let mut cx = Call {
            opts: Effective::Defaults(&self.defaults),
            session: None,
            txn: false,
            for_caller: false,
        };
        if let Some(order) = self.spec.order.filter(|_| batch.len() > 1) {
            // Stable: equal values keep the order queued.
            batch.sort_by(|a, b| order_cmp(a.p.doc.get(order), b.p.doc.get(order)));
        }
        let mut rest = batch.into_iter().peekable();
        let mut queued: Vec<Waiting> = Vec::new();
        // How many of the rest the remembered bucket takes, once read.
        let mut room: Option<usize> = None;
        let mut reads = 0;
        loop {
            queued.extend(rest.by_ref());
            if queued.is_empty() {
                return;
            }
            let slot = queued[0].p.slot.clone();
            let seq = self.remembered(&slot);
            let n = room.unwrap_or(queued.len()).min(queued.len());
            if let (Some(seq), true) = (seq, n > 1) {
                match self.append_batch(&queued[..n], seq, &mut cx).await {
                    Ok(Appended::Yes) => {
                        for w in queued.drain(..n) {
                            let _ = w.done.send(Ok(()));
                        }
                        room = None;
                        continue;
                    }
                    Ok(Appended::No(head)) if room.is_none() && reads < 4 => {
                        // What the bucket has room for.
                        reads += 1;
                        room = Some(self.room(&queued, head.map(|h| *h)));
                        continue;
                    }
                    Ok(Appended::No(_)) => {}
                    Err(e) => {
                        for w in queued {
                            let _ = w.done.send(Err(Error::OutcomeUnknown {
                                operation: "push",
                                source: e.clone(),
                            }));
                        }
                        return;
                    }
                }
            }
            // One alone: it finds the bucket full and opens the next, or is
            // late, or the batch could not go.
            let w = queued.remove(0);
            let r = self.push_one(&w.p, &mut cx).await;
            let _ = w.done.send(r);
            room = None;
        }
    }

    /// How many of `queued` (sorted) the bucket `head` (as just read) takes
    /// in one update: none if it is closed, marked, gone or above the first
    /// item, else as many as its count and bytes leave room for.
    fn room(&self, queued: &[Waiting], head: Option<Head>) -> usize {
        let Some(head) = head else {
            return 0;
        };
        if head.sealed || head.stale {
            return 0;
        }
        if let Some(order) = self.spec.order {
            let v = queued[0].p.doc.get(order).cloned().unwrap_or(Bson::Null);
            if order_cmp(Some(&v), head.hi.as_ref()) == std::cmp::Ordering::Less {
                return 0;
            }
        }
        let size = (i64::from(self.spec.size) - head.count).max(0) as usize;
        let mut bytes = head.bytes;
        let mut n = 0;
        for w in queued.iter().take(size) {
            if bytes + w.p.len > MAX_BUCKET_BYTES {
                break;
            }
            bytes += w.p.len;
            n += 1;
        }
        n
    }

    /// The batch appended in one update to bucket `seq` of its key, if that
    /// bucket is open, sound, has room for all of it, and holds nothing
    /// above its first item: whether it was (an update that matched
    /// nothing, or failed, is looked up by its write id, so that a batch a
    /// lost reply hid is not sent again item by item), and if not, the
    /// bucket as that lookup read it.
    async fn append_batch(
        &self,
        batch: &[Waiting],
        seq: i64,
        cx: &mut Call<'_>,
    ) -> std::result::Result<Appended, mongodb::error::Error> {
        let first = &batch[0].p;
        let key = &first.key;
        let n = batch.len() as i64;
        let len: i64 = batch.iter().map(|w| w.p.len).sum();
        if n > i64::from(self.spec.size) || len > MAX_BUCKET_BYTES {
            return Ok(Appended::No(None));
        }
        let op = ObjectId::new();
        let v = self
            .spec
            .order
            .map(|o| first.doc.get(o).cloned().unwrap_or(Bson::Null));
        let mut expr = vec![Bson::Document(self.sound())];
        if let Some(v) = &v {
            expr.push(Bson::Document(
                doc! {"$lte": [self.hi_expr(), {"$literal": v}]},
            ));
        }
        // Not a bucket opened ahead (see [`ahead`](super::ahead)): the push
        // landing first there checks its `start` and opens the next, so a
        // single push does.
        let filter = doc! {
            "_id": {"k": key.clone(), "s": seq},
            OPS: {"$ne": op},
            self.spec.key: key.clone(),
            NEXT: {"$ne": true},
            "sealed": Bson::Null,
            "count": {"$lte": i64::from(self.spec.size) - n},
            "bytes": {"$lte": MAX_BUCKET_BYTES - len},
            "$expr": {"$and": expr},
        };
        let docs: Vec<Document> = batch.iter().map(|w| w.p.doc.clone()).collect();
        let update = self
            .coll
            .update_one(filter, self.append(docs, len, op))
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
        match crate::action::run!(update, cx.session.as_deref_mut()) {
            Ok(r) if r.matched_count == 1 => Ok(Appended::Yes),
            Ok(_) => {
                // Matched nothing: the bucket changed, or this is the
                // driver's retry of an attempt that was applied and whose
                // reply was lost, run anew by a server that restarted in
                // between (its write id, now in the bucket, refuses it).
                // Its write id says which: sent again item by item, the
                // batch would be stored twice.
                match self.bucket(key, seq, Some(op), cx).await {
                    Ok(Some(h)) if h.mine => Ok(Appended::Yes),
                    Ok(found) => Ok(Appended::No(found.map(Box::new))),
                    Err(Error::Database(e)) => Err(e),
                    Err(other) => Err(mongodb::error::Error::custom(other.to_string())),
                }
            }
            Err(e) => {
                // Applied or not? Its write id says, whatever the error: the
                // driver retries this update once, and the retry's error
                // (no server yet, a pool cleared) says nothing of the first
                // attempt, which may have been applied before its reply was
                // lost. Where that read fails too, sending the items one by
                // one (each with an id of its own) could store them twice:
                // their outcome is unknown.
                match self.landed(key, op, cx).await {
                    Ok(Some(_)) => Ok(Appended::Yes),
                    Ok(None) => Ok(Appended::No(None)),
                    Err(_) => Err(e),
                }
            }
        }
    }
}
