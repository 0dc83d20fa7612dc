//! [`PushQueue`]: pushes to one key from many tasks of one process, sent
//! together.
//!
//! Tasks that push to the same key through clones of one repository, with
//! no session and no options of their own, queue their items per key: the
//! push that finds no queue sends its item at once (one round trip), and
//! while that command is out the others wait; when it returns, everything
//! that queued meanwhile goes in one update, sorted by `order` (with one;
//! else in the order queued), and so on until the queue is empty. A task's
//! push returns when the command that carried its item has.
//!
//! Why, rather than one command per push racing at the server: items
//! dated when their push is called arrive out of order when many tasks
//! push at once, and at a rollover those below the bucket just opened are
//! late, which costs a transaction (see [`late`](super::late)). Sent from
//! one queue, the items reach the server in the order their pushes were
//! called, give or take the instant between taking a date and queueing. A
//! batch also costs one command for many pushes: at 64 tasks a push costs
//! well under one round trip.
//!
//! The queue is this process's only: pushes from other processes race at
//! the server, which the stored format alone keeps correct. Nothing
//! queued here holds anything on the server: the task sending a key's
//! queue sends one command at a time, and a push that needs a
//! transaction runs it in that task, back to back, so no transaction of
//! the repository's own waits for this queue while it is open.
//!
//! What each push keeps: its item goes in exactly once, in a command of
//! the repository's own that a caller who stops waiting does not cut (the
//! queue runs as a task); a push returns `Ok` only once its item is
//! stored. A batch that fits the open bucket and is not below it is one
//! update carrying one write id (a retry by the driver finds it); anything
//! else (a rollover, a full bucket, a late item, a fault, the server's
//! refusal of the batch) is sent item by item through the one-push path,
//! so each push gets its own outcome.
//! Not queued: pushes in a session (a caller's transaction keeps its own
//! commands), with options of their own, or unacknowledged.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use mongodb::bson::oid::ObjectId;
use mongodb::bson::Document;
use tokio::sync::oneshot;

use super::shape::{Head, Pushed};
use super::{Bucketed, Buckets};
use crate::action::{Call, Effective};
use crate::error::{Error, Result};

/// A queued push: its item, and where its outcome goes.
#[derive(Debug)]
pub(super) struct Waiting {
    p: Box<Pushed>,
    done: oneshot::Sender<Result<()>>,
}

/// Each key's pushes waiting while a batch of the key is out. Its
/// invariant: a key has an entry exactly while a task sends its queue;
/// that task alone takes the entry out, when it finds it empty (or, if it
/// ends early, its [`Sender`] guard does).
#[derive(Debug, Default)]
pub(super) struct PushQueue {
    keys: Mutex<HashMap<Vec<u8>, Vec<Waiting>>>,
}

impl PushQueue {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Vec<Waiting>>> {
        // Poisoned or not: nothing here leaves the map half changed.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `w` behind the batch of its key that is out, or, when none
    /// is, hands it back: the caller then starts the key's sender with it.
    fn enter(&self, w: Waiting) -> Option<Waiting> {
        let mut keys = self.keys();
        match keys.get_mut(&w.p.slot) {
            Some(waiting) => {
                waiting.push(w);
                None
            }
            None => {
                keys.insert(w.p.slot.clone(), Vec::new());
                Some(w)
            }
        }
    }

    /// What queued on `slot` while its batch was out; `None`, and the
    /// key's entry gone, when nothing did.
    fn next(&self, slot: &[u8]) -> Option<Vec<Waiting>> {
        let mut keys = self.keys();
        match keys.get_mut(slot) {
            Some(w) if !w.is_empty() => Some(std::mem::take(w)),
            _ => {
                keys.remove(slot);
                None
            }
        }
    }
}

/// Takes the key's entry out if the task sending it ends before emptying
/// it (a panic, the runtime shutting down): the pushes queued are told,
/// their senders dropped, not left waiting. Disarmed when the task took
/// the empty entry out itself, so that it cannot take out the entry of a
/// task started after it.
struct Sender<'a> {
    queue: &'a PushQueue,
    slot: &'a [u8],
    armed: bool,
}

impl Drop for Sender<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.keys().remove(self.slot);
        }
    }
}

impl<T: Bucketed> Buckets<T> {
    /// Whether a push in `cx` goes through its key's queue.
    pub(super) fn queues(&self, cx: &Call<'_>) -> bool {
        cx.session.is_none()
            && !cx.txn
            && *cx.opts == *self.defaults
            && !cx.opts.unacknowledged(self.coll.write_concern())
    }

    /// Queues `p` on its key, starting the task that sends the key's queue
    /// if none runs, and waits for the outcome.
    pub(super) async fn push_queued(&self, p: Box<Pushed>) -> Result<()> {
        let (done, outcome) = oneshot::channel();
        if let Some(first) = self.queue.enter(Waiting { p, done }) {
            let this = self.clone();
            // Boxed: the task then holds a pointer, not the whole future
            // (a few kilobytes), which spawning would copy several times.
            let send: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
                Box::pin(async move { this.send_queue(first).await });
            // In the span of the push that started the queue: the batches'
            // retries show there.
            tokio::spawn(tracing::Instrument::in_current_span(send));
        }
        // The sender gone without a word: the runtime shut down.
        outcome
            .await
            .unwrap_or_else(|_| Err(crate::task::shut_down("push")))
    }

    /// Sends `first`, then what queued on its key meanwhile, batch after
    /// batch, until the queue is empty.
    async fn send_queue(&self, first: Waiting) {
        let slot = first.p.slot.clone();
        let mut sender = Sender {
            queue: &self.queue,
            slot: &slot,
            armed: true,
        };
        let mut batch = vec![first];
        loop {
            self.send_batch(batch).await;
            match self.queue.next(&slot) {
                Some(next) => batch = next,
                None => {
                    sender.armed = false;
                    return;
                }
            }
        }
    }

    /// One batch: sorted by `order` (equal values in the order queued), in
    /// one update when it fits the open bucket as remembered and is not
    /// below it. Otherwise one read of that bucket says how many fit: those
    /// go in one update, the item that finds the bucket full goes alone
    /// (through the one-push path, which opens the next bucket), and the
    /// rest go in one update to the new bucket; a late item goes alone too.
    /// A batch larger than the room this handle knows the bucket has left
    /// (its `size` less the count it last saw, a lower bound) would match
    /// nothing: the read goes first instead, and the count it finds is
    /// remembered, so that the item going alone into a full bucket goes
    /// straight to the one-command push. Other instances' pushes fill the
    /// bucket this handle remembers: with four instances on one key, each
    /// one's batches met a full bucket at each rollover.
    async fn send_batch(&self, mut batch: Vec<Waiting>) {
        let mut cx = Call {
            opts: Effective::Defaults(&self.defaults),
            session: None,
            txn: false,
            for_caller: false,
        };
        if let Some(order) = self.shape.spec.order.filter(|_| batch.len() > 1) {
            // Stable: equal values keep the order queued.
            batch.sort_by(|a, b| super::shape::order_cmp(a.p.doc.get(order), b.p.doc.get(order)));
        }
        let mut queued = std::collections::VecDeque::from(batch);
        // How many of the rest the remembered bucket takes, once read.
        let mut room: Option<usize> = None;
        let mut reads = 0;
        // The server refused a batch (a validator, say): the rest go one
        // by one, each with its own answer.
        let mut refused = false;
        while !queued.is_empty() {
            let n = room.take().unwrap_or(queued.len()).min(queued.len());
            let known = self.remembered_fill(&queued[0].p.slot);
            if let (Some((seq, count)), true) = (known, n > 1 && !refused) {
                let part = queued.make_contiguous();
                // A batch the bucket has no room for, as far as this
                // handle knows (it held `count` at least), would match
                // nothing: the read it would be followed by, at once.
                let sent = match count + n as i64 > self.shape.size() && reads < 4 {
                    true => self.read_room(&part[0].p, seq, &mut cx).await,
                    false => self.append_batch(&part[..n], seq, &mut cx).await,
                };
                match sent {
                    Ok(None) => {
                        let slot = &queued[0].p.slot;
                        self.remember_fill(slot, seq, count + n as i64);
                        for w in queued.drain(..n) {
                            let _ = w.done.send(Ok(()));
                        }
                        continue;
                    }
                    Ok(Some(head)) if reads < 4 => {
                        // What the bucket has room for; and its count, for
                        // the push that goes alone next (one update while
                        // there is room, else straight to the one-command
                        // push).
                        reads += 1;
                        if let Some(h) = head.as_ref().filter(|h| h.exists) {
                            self.remember_fill(&queued[0].p.slot, h.seq, h.count);
                        }
                        room = Some(self.room(queued.make_contiguous(), head));
                        continue;
                    }
                    Ok(Some(_)) => {}
                    Err(e) if crate::failover::outcome(&e) == crate::failover::Outcome::Failed => {
                        refused = true;
                    }
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
            if let Some(w) = queued.pop_front() {
                let r = self.push_one(&w.p, &mut cx).await;
                let _ = w.done.send(r);
            }
        }
    }

    /// How many of `queued` (sorted) the bucket `head` (as just read) takes
    /// in one update: none if it is closed, gone or above the first item,
    /// else as many as its count and bytes leave room for.
    fn room(&self, queued: &[Waiting], head: Option<Head>) -> usize {
        let Some(head) = head.filter(|h| !h.sealed) else {
            return 0;
        };
        let v = self.shape.order_of(&queued[0].p.doc);
        if v.is_some_and(|v| super::shape::below(&v, head.hi.as_ref())) {
            return 0;
        }
        self.shape.fits(&head, queued.iter().map(|w| w.p.len))
    }

    /// Bucket `seq` of `p`'s key as read now, as [`Buckets::append_batch`]
    /// returns it when its update matched nothing. A read that fails
    /// stored nothing: as a bucket with no room, so that the pushes go
    /// one by one, each with its own outcome.
    async fn read_room(
        &self,
        p: &Pushed,
        seq: i64,
        cx: &mut Call<'_>,
    ) -> std::result::Result<Option<Option<Head>>, mongodb::error::Error> {
        Ok(Some(
            self.bucket(&p.key, seq, None, cx).await.unwrap_or(None),
        ))
    }

    /// The batch appended in one update to bucket `seq` of its key, if that
    /// bucket is open, sound, has room for all of it, and holds nothing
    /// above its first item: `None` if it was, and if not, the bucket as
    /// read when the update matched nothing. One write id for the batch,
    /// kept by the bucket: an update that matched nothing, or failed, is
    /// looked up by it, and a batch whose outcome that lookup cannot tell
    /// is sent again under the same id (which the bucket refuses if it
    /// holds it), never item by item under new ones, which could store it
    /// twice.
    async fn append_batch(
        &self,
        batch: &[Waiting],
        seq: i64,
        cx: &mut Call<'_>,
    ) -> std::result::Result<Option<Option<Head>>, mongodb::error::Error> {
        let first = &batch[0].p;
        let key = &first.key;
        let n = batch.len() as i64;
        let len: i64 = batch.iter().map(|w| w.p.len).sum();
        if n > self.shape.size() || len > super::MAX_BUCKET_BYTES {
            return Ok(Some(None));
        }
        let op = ObjectId::new();
        let mut resent = false;
        loop {
            let update = self.batch_action(batch, seq, n, len, op, cx);
            match crate::action::run!(update, cx.session.as_deref_mut()) {
                Ok(r) if r.matched_count == 1 => return Ok(None),
                // Matched nothing: the bucket changed, or this attempt
                // found the batch's write id there (applied by one whose
                // reply was lost).
                Ok(_) => {
                    return match self.bucket(key, seq, Some(op), cx).await {
                        Ok(Some(h)) if h.mine => Ok(None),
                        Ok(found) => Ok(Some(found)),
                        Err(Error::Database(e)) => Err(e),
                        Err(other) => Err(mongodb::error::Error::custom(other.to_string())),
                    }
                }
                // The server's answer, such as a validator's refusal:
                // nothing was stored, and sending it again fails the same.
                Err(e) if crate::failover::outcome(&e) == crate::failover::Outcome::Failed => {
                    return Err(e)
                }
                // Applied or not? The driver sent it again once already
                // (a retryable write); its write id says, read on the
                // primary. Not there: sent once more, under the same id.
                Err(e) => match self.landed(key, op, cx).await {
                    Ok(Some(_)) => return Ok(None),
                    Ok(None) if !resent => resent = true,
                    _ => return Err(e),
                },
            }
        }
    }

    /// The update of [`Buckets::append_batch`].
    fn batch_action(
        &self,
        batch: &[Waiting],
        seq: i64,
        n: i64,
        len: i64,
        op: ObjectId,
        cx: &Call<'_>,
    ) -> mongodb::action::Update<'_> {
        let first = &batch[0].p;
        let v = self.shape.order_of(&first.doc);
        let filter = self
            .shape
            .open_to_batch(&first.key, seq, n, len, op, v.as_ref());
        let docs: Vec<Document> = batch.iter().map(|w| w.p.doc.clone()).collect();
        self.coll
            .update_one(filter, self.shape.append(docs, len, op))
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>())
    }
}
