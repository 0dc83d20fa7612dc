//! `push_many`: a key's items in as few writes as fit, each bucket filled
//! to `size` and the next opened after it, all or nothing per bucket.

use super::cx::outside_transaction;
use crate::action::Call;
use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, Document, RawBsonRef};

use super::cx::{contended, raced};
use super::stored::{item_len, order_cmp, raw_int, Head, FLOOR, OPS, STALE};
use super::{Bucketed, Buckets};
use crate::error::{Error, Result};
use crate::retry::Retry;
use crate::util::key_bytes;

impl<T: Bucketed> Buckets<T> {
    /// [`Buckets::push_many`], in `cx`: the items grouped by key (keys in
    /// the order they first appear, each key's items in the order given),
    /// every item checked before the first write.
    pub(super) async fn push_groups(&self, items: &[T], cx: &mut Call<'_>) -> Result<()> {
        let mut groups: Vec<(Bson, Vec<(Document, i64)>)> = Vec::new();
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

    /// One key's items (as stored, with their lengths), in `cx`.
    async fn push_many_in(
        &self,
        key_b: Bson,
        mut docs: Vec<(Document, i64)>,
        cx: &mut Call<'_>,
    ) -> Result<()> {
        if let Some(order) = self.spec.order {
            // Stable: items with equal order values keep the order given.
            docs.sort_by(|(a, _), (b, _)| order_cmp(a.get(order), b.get(order)));
        }
        let mut rest: &[(Document, i64)] = &docs;
        // Outside a transaction, rounds that lost a race pause and are
        // counted by `retry`; rounds that stored items do neither.
        let mut retry = Retry::new("push_many");
        // In a caller's transaction, a few rounds of any kind, then a
        // transient error so that its `and_run2` runs it again: a caller's
        // transaction must not wait out the retry's bound, and it would
        // read the same snapshot again.
        let mut rounds = 0;
        let mut known: Option<Head> = None;
        while !rest.is_empty() {
            rounds += 1;
            if cx.txn && rounds > 4 {
                return Err(raced(contended("push_many", rounds - 1)));
            }
            let head = match known.take() {
                Some(h) => h,
                None => self.fresh_head(&key_b, cx).await?,
            };
            // Items below what the last bucket holds are late: each goes
            // into the bucket that covers it (they come first, the batch
            // being sorted).
            let late = rest
                .iter()
                .take_while(|(d, _)| {
                    head.exists
                        && self.order_of(d).is_some_and(|v| {
                            (head.count == 0 && head.hi.is_none())
                                || order_cmp(Some(&v), head.hi.as_ref()) == std::cmp::Ordering::Less
                        })
                })
                .count();
            if late > 0 {
                outside_transaction(cx, "a late push")?;
                let scoped = self.scoped(&cx.opts);
                for (d, len) in &rest[..late] {
                    scoped
                        .push_late(&key_b, d.clone(), *len, ObjectId::new())
                        .await?;
                }
                rest = &rest[late..];
                continue;
            }
            // Fill what room the open bucket has, if it is open.
            if head.exists && !head.sealed {
                let n = self.fits(&head, rest);
                if n > 0 {
                    let len: i64 = rest[..n].iter().map(|(_, l)| l).sum();
                    let filter = doc! {
                        self.spec.key: key_b.clone(),
                        "_id": {"k": key_b.clone(), "s": head.seq},
                        "count": head.count,
                        "sealed": Bson::Null,
                        "$expr": self.sound(),
                    };
                    let mut filter = filter;
                    let op = ObjectId::new();
                    filter.insert(OPS, doc! {"$ne": op});
                    let items = rest[..n].iter().map(|(d, _)| d.clone()).collect();
                    let update = self
                        .coll
                        .update_one(filter, self.append(items, len, op))
                        .with_options(cx.opts.driver::<mongodb::options::UpdateOptions>());
                    let r = crate::action::run!(update, cx.session.as_deref_mut())?;
                    // Not matched: changed by a concurrent push, or applied
                    // already and retried by the driver (its id is there).
                    let applied = r.matched_count == 1
                        || self
                            .bucket(&key_b, head.seq, Some(op), cx)
                            .await?
                            .is_some_and(|h| h.mine);
                    if applied {
                        let hi = rest[n - 1].0.clone();
                        rest = &rest[n..];
                        known = Some(Head {
                            count: head.count + n as i64,
                            bytes: head.bytes + len,
                            hi: self.order_of(&hi).or(head.hi.clone()),
                            ..head
                        });
                    } else if !cx.txn {
                        // A concurrent push changed the bucket: look again.
                        retry.pause().await?;
                    }
                    continue;
                }
            }
            // The open bucket has no room for the next item: close it if
            // only bytes filled it, so that nothing lands behind the new ones.
            if head.exists && !head.sealed && !self.seal_if_unchanged(&head, cx).await? {
                // Changed since it was read: a race lost.
                if !cx.txn {
                    retry.pause().await?;
                }
                continue;
            }
            // New buckets for the rest, in one ordered insert.
            let (mut seq, mut start) = if head.exists {
                (head.seq + 1, head.total())
            } else {
                (0, 0)
            };
            let mut buckets = Vec::new();
            let mut taken = 0;
            let op = ObjectId::new();
            // Each new bucket's floor: the last value before it.
            let mut floor = if head.exists { head.hi.clone() } else { None };
            while taken < rest.len() {
                // Never 0: `item_len` refused items that fit no bucket.
                let n = self.fits(&Head::default(), &rest[taken..]).max(1);
                let chunk = &rest[taken..taken + n];
                let mut b = self.new_bucket(&key_b, seq, start);
                b.insert("count", n as i64);
                b.insert("bytes", chunk.iter().map(|(_, l)| l).sum::<i64>());
                b.insert(OPS, vec![op]);
                if head.stale {
                    // Opened from a marked bucket: marked too.
                    b.insert(STALE, true);
                }
                if let (Some(f), Some(_)) = (floor.take(), self.spec.order) {
                    b.insert(FLOOR, f);
                }
                floor = chunk.last().and_then(|(d, _)| self.order_of(d));
                b.insert(
                    self.spec.items,
                    chunk
                        .iter()
                        .map(|(d, _)| Bson::Document(d.clone()))
                        .collect::<Vec<_>>(),
                );
                taken += n;
                if taken < rest.len() && ((n as u32) < self.spec.size || self.spec.order.is_some())
                {
                    // Closed by bytes before it was full, or (with order)
                    // closed as every bucket that is not the last is: a
                    // late item lands without the lease only in an open
                    // last bucket (see `near`).
                    b.insert("sealed", true);
                }
                buckets.push((b, n));
                seq += 1;
                start += n as i64;
            }
            if head.exists && self.spec.order.is_none() {
                self.drop_ahead(&key_b, head.seq, cx).await?;
            }
            let docs = buckets.iter().map(|(b, _)| b);
            let insert = self
                .coll
                .insert_many(docs)
                .with_options(cx.opts.driver::<mongodb::options::InsertManyOptions>())
                .ordered(true);
            match crate::action::run!(insert, cx.session.as_deref_mut()) {
                Ok(_) => {
                    rest = &[];
                    self.remember(&key_bytes(&key_b), seq - 1);
                }
                Err(e) => {
                    let e = Error::from(e);
                    if !e.is_duplicate_key() {
                        return Err(e);
                    }
                    if cx.txn {
                        return Err(raced(e));
                    }
                    // Another writer opened the next bucket first, or the
                    // driver retried an insert that had gone in: the
                    // buckets carrying this insert's id are what went in (a
                    // prefix, as the insert is ordered). Go again with the rest.
                    let mut mine = self.of_key(&key_b);
                    mine.insert(OPS, op);
                    let seqs: Vec<i64> = self
                        .scoped(&cx.opts)
                        .raw
                        .find(mine)
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
                    let stored: usize = buckets
                        .iter()
                        .filter(|(b, _)| {
                            b.get_document("_id")
                                .ok()
                                .and_then(|id| id.get_i64("s").ok())
                                .is_some_and(|s| seqs.contains(&s))
                        })
                        .map(|(_, n)| n)
                        .sum();
                    if stored == 0 {
                        // None of them went in: another writer's bucket
                        // was first, a race lost.
                        retry.pause().await?;
                    }
                    rest = &rest[stored..];
                }
            }
        }
        Ok(())
    }
}
