//! `push_many`: a key's items in as few writes as fit, each bucket filled
//! to `size` and the next opened after it, all or nothing per bucket.

use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawBsonRef};

use super::late::Late;
use super::moves::raced;
use super::shape::{below, item_len, raw_int, Head, OPS};
use super::{Bucketed, Buckets};
use crate::action::Call;
use crate::error::{Error, Result};
use crate::retry::Retry;
use crate::util::key_bytes;

/// A key's items as stored, with their lengths.
type Items = Vec<(Document, i64)>;

/// What one round of `push_many` stored.
enum Stored {
    /// The first `n` items, and the key's last bucket after them when
    /// known without a read.
    Items(usize, Option<Box<Head>>),
    /// Nothing: a race lost, the key's buckets read again.
    Nothing,
}

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::push_many`], in `cx`: the items grouped by key (keys in
    /// the order they first appear, each key's items in the order given),
    /// every item checked before the first write.
    pub(super) async fn push_groups(&self, items: &[T], cx: &mut Call<'_>) -> Result<()> {
        let mut groups: Vec<(Bson, Items)> = Vec::new();
        let mut index = std::collections::HashMap::new();
        for item in items {
            let key = self.key_bson(item.bucket_key())?;
            let d = self.item_doc(item)?;
            let len = item_len(&d)?;
            let at = *index.entry(key_bytes(&key)).or_insert_with(|| {
                groups.push((key, Vec::new()));
                groups.len() - 1
            });
            groups[at].1.push((d, len));
        }
        for (key, docs) in groups {
            self.push_many_in(key, docs, cx).await?;
        }
        Ok(())
    }

    /// One key's items, in `cx`: sorted by `order` (stably: equal values
    /// keep the order given), then round after round, each storing a
    /// prefix of what is left.
    async fn push_many_in(&self, key: Bson, mut docs: Items, cx: &mut Call<'_>) -> Result<()> {
        if let Some(order) = self.shape.spec.order {
            docs.sort_by(|(a, _), (b, _)| super::shape::order_cmp(a.get(order), b.get(order)));
        }
        let mut rest: &[(Document, i64)] = &docs;
        // Outside a transaction, rounds that lost a race pause and are
        // counted by `retry`; rounds that stored items do neither. In a
        // caller's transaction, a few rounds, then a transient error for
        // its `and_run2`: it must not wait out the retry's bound, and would
        // read the same snapshot again.
        let mut retry = Retry::new("push_many");
        let mut known: Option<Head> = None;
        for round in 1.. {
            if rest.is_empty() {
                break;
            }
            if cx.txn && round > 4 {
                return Err(raced(Error::Contended {
                    operation: "push_many",
                    attempts: round - 1,
                }));
            }
            let head = match known.take() {
                Some(h) => h,
                None => self.head(&key, None, cx).await?,
            };
            match self.many_round(&key, &head, rest, cx).await? {
                Stored::Items(n, after) => {
                    rest = &rest[n..];
                    known = after.map(|h| *h);
                }
                Stored::Nothing if cx.txn => {}
                Stored::Nothing => retry.pause().await?,
            }
        }
        Ok(())
    }

    /// One round: late items one by one, else what the open bucket has
    /// room for, else new buckets for the rest.
    async fn many_round(
        &self,
        key: &Bson,
        head: &Head,
        rest: &[(Document, i64)],
        cx: &mut Call<'_>,
    ) -> Result<Stored> {
        // Items below what the last bucket holds are late: each goes into
        // the bucket that covers it (they come first, the batch being
        // sorted).
        let unbounded = head.count == 0 && head.hi.is_none();
        let late = |d: &Document| {
            head.exists
                && self
                    .shape
                    .order_of(d)
                    .is_some_and(|v| unbounded || below(&v, head.hi.as_ref()))
        };
        if let Some((d, len)) = rest.first().filter(|(d, _)| late(d)) {
            let v = self.shape.order_of(d).unwrap_or(Bson::Null);
            let item = d.clone();
            let (key, len, op) = (key.clone(), *len, ObjectId::new());
            let late = Late {
                key,
                item,
                v,
                len,
                op,
            };
            return Ok(match self.moved(late, cx).await? {
                Some(_) => Stored::Items(1, None),
                None => Stored::Nothing,
            });
        }
        let closed;
        let head = match head.exists && !head.sealed {
            true => {
                let n = self.shape.fits(head, rest.iter().map(|(_, l)| *l));
                if n > 0 {
                    return self.fill_open(key, head, &rest[..n], cx).await;
                }
                // No room for the next item: closed first, so that nothing
                // lands behind the new buckets. Boxed: its `findAndModify`
                // would sit in every round's future.
                let first = rest.first().map(|(d, _)| d);
                match Box::pin(self.close(head, first, cx)).await? {
                    Some(h) => {
                        closed = h;
                        &closed
                    }
                    None => return Ok(Stored::Nothing),
                }
            }
            false => head,
        };
        self.new_buckets(key, head, rest, cx).await
    }

    /// `items`, which fit, appended to the open bucket `head` in one
    /// update by its `count` as read.
    async fn fill_open(
        &self,
        key: &Bson,
        head: &Head,
        items: &[(Document, i64)],
        cx: &mut Call<'_>,
    ) -> Result<Stored> {
        let n = items.len();
        let len: i64 = items.iter().map(|(_, l)| l).sum();
        let op = ObjectId::new();
        let mut filter = self.shape.unchanged(head);
        filter.insert(OPS, doc! {"$ne": op});
        let docs = items.iter().map(|(d, _)| d.clone()).collect();
        let update = self
            .coll
            .update_one(filter, self.shape.append(docs, len, op))
            .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
        let r = crate::action::run!(update, cx.session.as_deref_mut())?;
        // Not matched: changed by a concurrent push, or applied already and
        // retried by the driver (its id is there).
        let applied = r.matched_count == 1
            || self
                .bucket(key, head.seq, Some(op), cx)
                .await?
                .is_some_and(|h| h.mine);
        if !applied {
            return Ok(Stored::Nothing);
        }
        let hi = items.last().and_then(|(d, _)| self.shape.order_of(d));
        Ok(Stored::Items(
            n,
            Some(Box::new(Head {
                count: head.count + n as i64,
                bytes: head.bytes + len,
                hi: hi.or(head.hi.clone()),
                ..head.clone()
            })),
        ))
    }

    /// New buckets after `head` (closed, or none) for `rest`, in one
    /// ordered insert: each filled to `size` (or the byte limit), each but
    /// the last closed. Without `order`, an empty bucket opened ahead
    /// after `head` takes the first of them instead, by an update naming
    /// its `start`.
    async fn new_buckets(
        &self,
        key: &Bson,
        head: &Head,
        rest: &[(Document, i64)],
        cx: &mut Call<'_>,
    ) -> Result<Stored> {
        let (mut seq, start) = match head.exists {
            true => (head.seq + 1, head.total()),
            false => (0, 0),
        };
        let op = ObjectId::new();
        let fits = |from: usize| {
            self.shape
                .fits(&Head::default(), rest[from..].iter().map(|(_, l)| *l))
                .max(1)
        };
        if head.exists && self.shape.spec.order.is_none() {
            let n = fits(0);
            let (filter, update) = self.shape.adopt(key, seq, start, &rest[..n], op);
            let update = self.coll.update_one(filter, update);
            if crate::action::run!(update, cx.session.as_deref_mut())?.matched_count == 1 {
                return Ok(Stored::Items(n, None));
            }
        }
        let buckets = self
            .shape
            .new_buckets(key, (seq, start), head.hi.clone(), rest, op);
        seq += buckets.len() as i64;
        let insert = self
            .coll
            .insert_many(buckets.iter().map(|(b, _)| b))
            .with_options(cx.opts.driver::<mongodb::options::InsertManyOptions>())
            .ordered(true);
        match crate::action::run!(insert, cx.session.as_deref_mut()).map_err(Error::from) {
            Ok(_) => {
                self.remember(&key_bytes(key), seq - 1);
                Ok(Stored::Items(rest.len(), None))
            }
            Err(e) if e.is_duplicate_key() && cx.txn => Err(raced(e)),
            Err(e) if e.is_duplicate_key() => {
                // Another writer opened the next bucket first, or the
                // driver retried an insert that had gone in: the buckets
                // carrying this insert's id are what went in (a prefix, as
                // the insert is ordered). Go again with the rest.
                let stored = self.stored_by(key, op, &buckets).await?;
                Ok(match stored {
                    0 => Stored::Nothing,
                    n => Stored::Items(n, None),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// How many items the `buckets` (with their item counts) that hold
    /// write `op` carry: those of an ordered insert that went in.
    async fn stored_by(
        &self,
        key: &Bson,
        op: ObjectId,
        buckets: &[(Document, usize)],
    ) -> Result<usize> {
        let seqs: Vec<i64> = self
            .raw
            .find(self.shape.holding(key, op))
            .projection(doc! {"_id": 1})
            .await?
            .try_collect::<Vec<_>>()
            .await?
            .iter()
            .filter_map(|d| match d.get("_id") {
                Ok(Some(RawBsonRef::Document(id))) => raw_int(id, "s").ok(),
                _ => None,
            })
            .collect();
        Ok(buckets
            .iter()
            .filter(|(b, _)| {
                b.get_document("_id")
                    .ok()
                    .and_then(|id| id.get_i64("s").ok())
                    .is_some_and(|s| seqs.contains(&s))
            })
            .map(|(_, n)| n)
            .sum())
    }
}
