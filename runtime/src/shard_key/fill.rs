//! `fill_coarse`: the derived coarse field written on the documents that
//! lack it or hold another value (another granularity's period, after the
//! attribute changed), batch by batch, as [`Sharded::audit`] would find
//! them; its action, [`FillCoarse`], beside it.

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::{CountOptions, EstimatedDocumentCountOptions, FindOptions};
use mongodb::ClientSession;

use super::time::{other_granularities, stored_time, truncate};
use super::{Derived, ShardKeyed, Sharded};
use crate::action::{action, run, Call, Options};
use crate::error::{Error, Result};
use crate::progress::{OnProgress, Progress};

/// Documents one read and one write of `fill_coarse` take by default.
const BATCH: u32 = 1_000;
/// Unfillable documents a report names by default.
const MAX_DAMAGED: usize = 100;

action! {
    /// [`Sharded::fill_coarse`]: write and read options, `session`,
    /// `on_progress`, `batch_size`, `max_damaged`.
    FillCoarse<'a, T: ShardKeyed> on Sharded, "fill_coarse", both, guarded;
    { progress: Option<OnProgress>, batch: u32, max_damaged: usize } -> Fill;
    |this, cx| this.repo.fill_in(this.progress, this.batch, this.max_damaged, cx).await
}

impl<'a, T: ShardKeyed + Send + Sync + 'a> FillCoarse<'a, T> {
    /// Called after each batch with the documents read so far, of how
    /// many (the collection's count when the call began), and the time so
    /// far: for a log line or a progress bar.
    pub fn on_progress(mut self, f: impl FnMut(Progress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// Documents a batch reads, and at most writes in one `update`
    /// command (1,000 by default; at least 1).
    pub fn batch_size(mut self, n: u32) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How many unfillable documents the report names (100 by default);
    /// all are counted.
    pub fn max_damaged(mut self, n: usize) -> Self {
        self.max_damaged = n;
        self
    }
}

/// What [`Sharded::fill_coarse`] did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Fill {
    /// Documents read: the whole collection, as the scan met it.
    pub scanned: u64,
    /// Documents whose coarse field was already their timestamp's period.
    pub already_right: u64,
    /// Documents that lacked the coarse field, now written.
    pub filled: u64,
    /// Documents whose coarse field held their timestamp's period at
    /// another granularity (the attribute changed), now rewritten.
    pub migrated: u64,
    /// Documents whose coarse field held anything else (not a date, or a
    /// date that is no period of their timestamp), now rewritten.
    pub corrected: u64,
    /// Documents another writer changed between this call's read and its
    /// write (the timestamp, or the coarse field to its right value): not
    /// written, left as that writer left them; a second run takes them.
    pub skipped: u64,
    /// Documents whose timestamp is missing or not one the model reads:
    /// no coarse field can be derived, nothing written.
    pub unfillable: u64,
    /// Up to `max_damaged` of the unfillable ones, in `_id` order, each an
    /// [`Error::Damaged`] naming its `_id` and the timestamp field.
    pub damaged: Vec<Error>,
}

impl Fill {
    /// Documents written: `filled + migrated + corrected`.
    pub fn written(&self) -> u64 {
        self.filled + self.migrated + self.corrected
    }
}

/// What a stored document needs.
enum Verdict {
    Right,
    Unfillable(Error),
    /// A write of `want`, for the reason `kind`.
    Write(Kind, DateTime),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Missing,
    OtherGranularity,
    Wrong,
}

const KINDS: [Kind; 3] = [Kind::Missing, Kind::OtherGranularity, Kind::Wrong];

/// What `stored` (projected to `_id`, the coarse field and the timestamp)
/// needs: the same judgement as the audit's, so that a document the
/// audit reports is one this writes or names.
fn judge(collection: &str, coarse: &str, derived: &Derived, stored: &Document) -> Verdict {
    let ts = stored.get(derived.from);
    let Some(at) = stored_time(ts, derived.repr) else {
        let id = stored.get("_id").cloned().unwrap_or(Bson::Null);
        return Verdict::Unfillable(Error::damaged(
            collection,
            id,
            derived.from,
            format!(
                "holds {}, not a timestamp the shard key derives from: `{coarse}` cannot be filled",
                super::audit::type_name(ts)
            ),
        ));
    };
    let want = truncate(at, derived.granularity);
    match stored.get(coarse) {
        None => Verdict::Write(Kind::Missing, want),
        Some(Bson::DateTime(v)) if *v == want => Verdict::Right,
        Some(Bson::DateTime(v)) if !other_granularities(at, *v, derived.granularity).is_empty() => {
            Verdict::Write(Kind::OtherGranularity, want)
        }
        Some(_) => Verdict::Write(Kind::Wrong, want),
    }
}

/// The `$type` alias of a timestamp as stored, for a guard that matches
/// that very value (a filter on a number matches every numeric type).
fn type_alias(v: &Bson) -> &'static str {
    match v {
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        _ => "date",
    }
}

/// One call's running state: the report, the progress, the batch being
/// gathered.
struct Run<'r> {
    coarse: &'static str,
    derived: Derived,
    collection: &'r str,
    max_damaged: usize,
    report: Fill,
    started: Instant,
    of: u64,
    progress: Option<OnProgress>,
}

impl<T: ShardKeyed> Sharded<T> {
    /// Writes the derived coarse field on every document that lacks it,
    /// or holds anything but its timestamp's period: documents another
    /// service stored, or stored before the model had `#[shard_key]`, and
    /// documents stored under another `granularity` (the attribute
    /// changed: this is the migration). Those are the documents
    /// [`Sharded::audit`] reports; [`Sharded::find`] cannot see them, and
    /// writes to them are refused, until this has run.
    ///
    /// It reads the collection in `_id` order, projected to `_id`, the
    /// coarse field and the timestamp, in batches of 1,000
    /// ([`FillCoarse::batch_size`]), computes each value as every other
    /// write does ([`truncate`](super::truncate)), and sends one `update`
    /// command a batch (one per kind of change it holds) with one
    /// statement per document, guarded: `_id`, the timestamp still the
    /// value and type it read, and the coarse field still not the right
    /// value. A document another writer changed meanwhile is left as that
    /// writer left it and counted as [`Fill::skipped`]. A document whose
    /// timestamp is missing or not one the model reads is counted and
    /// named (up to [`FillCoarse::max_damaged`]), never written, and the
    /// scan moves past it.
    ///
    /// Resumable and idempotent: a call cut short leaves the batches it
    /// wrote, and running it again reads the collection again and writes
    /// only what still needs it; on a consistent collection it writes
    /// nothing. `on_progress` hears after each batch (documents read, of
    /// the collection's count when it began, time so far).
    ///
    /// **Before sharding.** Fill, check that [`Sharded::audit`] is clean
    /// (but for the unfillable documents, which you repair or delete),
    /// then [`Sharded::ensure_sharded`]. On a collection that is sharded
    /// already the coarse field is part of the shard key, and MongoDB
    /// treats setting a missing key field to a value, or changing one, as
    /// changing the document's shard key value: only through `mongos`,
    /// one document per statement, as a retryable write or in a
    /// transaction, with an equality on the full shard key in the filter.
    /// This call's batched `update` commands are not retryable writes and
    /// filter by `_id`, so `mongos` refuses them; it is written and tested
    /// for a replica set or a collection that is not sharded yet.
    ///
    /// ```no_run
    /// # use mongo_patterns::prelude::*;
    /// # #[derive(Debug, Clone, Serialize, Deserialize, Model)]
    /// # #[shard_key(coarse = "month", from = "ts", search = "type")]
    /// # struct Log {
    /// #     #[serde(rename = "_id")] id: ObjectId,
    /// #     #[serde(rename = "type")] kind: String,
    /// #     ts: i64,
    /// # }
    /// # async fn f(db: Database) -> mongo_patterns::Result<()> {
    /// let logs = Log::sharded(&db);
    /// let fill = logs
    ///     .fill_coarse()
    ///     .on_progress(|p| eprintln!("{} of {} documents, {:.0}/s", p.done, p.of, p.rate()))
    ///     .await?;
    /// println!("{} filled, {} migrated", fill.filled, fill.migrated);
    /// for e in &fill.damaged {
    ///     eprintln!("cannot fill: {e}");               // no timestamp to derive from
    /// }
    /// # Ok(()) }
    /// ```
    pub fn fill_coarse(&self) -> FillCoarse<'_, T> {
        FillCoarse::new(self, None, BATCH, MAX_DAMAGED)
    }

    pub(super) async fn fill_in(
        &self,
        progress: Option<OnProgress>,
        batch: u32,
        max_damaged: usize,
        cx: Call<'_>,
    ) -> Result<Fill> {
        let (Some(coarse), Some(derived)) = (self.spec.coarse(), self.spec.derived()) else {
            return Err(Error::invalid(
                "fill_coarse",
                "the model's shard key has no coarse field derived from a timestamp (`from`): nothing to fill",
            ));
        };
        let (o, mut session) = (cx.opts, cx.session);
        let mut run = Run {
            coarse,
            derived,
            collection: self.coll.name(),
            max_damaged,
            report: Fill::default(),
            started: Instant::now(),
            of: 0,
            progress,
        };
        // What needs writing decides the writes: the primary's.
        let reads = Options {
            write_concern: None,
            ..(*o).clone()
        };
        run.of = match session.as_deref_mut() {
            // The collection's metadata: no scan.
            None => {
                self.coll
                    .estimated_document_count()
                    .with_options(Some(reads.deciding::<EstimatedDocumentCountOptions>()))
                    .await?
            }
            // `count` cannot run in a transaction: an aggregation can.
            Some(s) => {
                self.coll
                    .count_documents(doc! {})
                    .with_options(Some(reads.deciding::<CountOptions>()))
                    .session(s)
                    .await?
            }
        };
        let projection = doc! {"_id": 1, coarse: 1, derived.from: 1};
        let find = self
            .coll
            .find(doc! {})
            .with_options(Some(reads.deciding::<FindOptions>()))
            .projection(projection)
            .sort(doc! {"_id": 1})
            .batch_size(batch);
        let batch = batch as usize;
        let mut docs = Vec::with_capacity(batch);
        match session {
            None => {
                let mut cursor = find.await?;
                while let Some(d) = cursor.try_next().await? {
                    docs.push(d);
                    if docs.len() == batch {
                        self.fill_batch(&mut run, std::mem::take(&mut docs), &o, None)
                            .await?;
                    }
                }
                self.fill_batch(&mut run, docs, &o, None).await?;
            }
            Some(s) => {
                let mut cursor = find.session(&mut *s).await?;
                while let Some(d) = cursor.next(&mut *s).await.transpose()? {
                    docs.push(d);
                    if docs.len() == batch {
                        self.fill_batch(&mut run, std::mem::take(&mut docs), &o, Some(&mut *s))
                            .await?;
                    }
                }
                self.fill_batch(&mut run, docs, &o, Some(&mut *s)).await?;
            }
        }
        Ok(run.report)
    }

    /// Judges a batch, writes what it needs (one `update` command per
    /// kind of change), and reports the progress.
    async fn fill_batch(
        &self,
        run: &mut Run<'_>,
        docs: Vec<Document>,
        o: &Options,
        mut session: Option<&mut ClientSession>,
    ) -> Result<()> {
        if docs.is_empty() {
            return Ok(());
        }
        let mut writes: [Vec<Document>; 3] = Default::default();
        for d in &docs {
            run.report.scanned += 1;
            match judge(run.collection, run.coarse, &run.derived, d) {
                Verdict::Right => run.report.already_right += 1,
                Verdict::Unfillable(e) => {
                    run.report.unfillable += 1;
                    if run.report.damaged.len() < run.max_damaged {
                        run.report.damaged.push(e);
                    }
                }
                Verdict::Write(kind, want) => {
                    let ts = d.get(run.derived.from).cloned().unwrap_or(Bson::Null);
                    let alias = type_alias(&ts);
                    let q = doc! {
                        "_id": d.get("_id").cloned().unwrap_or(Bson::Null),
                        run.derived.from: {"$eq": ts, "$type": alias},
                        run.coarse: {"$ne": want},
                    };
                    let i = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
                    writes[i].push(doc! {
                        "q": q,
                        "u": {"$set": {run.coarse: want}},
                        "multi": false,
                    });
                }
            }
        }
        for (kind, statements) in KINDS.into_iter().zip(writes) {
            if statements.is_empty() {
                continue;
            }
            let sent = statements.len() as u64;
            let mut command = doc! {
                "update": self.coll.name(),
                "updates": statements,
                "ordered": false,
            };
            o.command_fields(&mut command, self.coll.write_concern(), true)?;
            let reply = run!(self.db.run_command(command), session.as_deref_mut())?;
            crate::action::command_write_errors(&reply)?;
            let n = reply
                .get("n")
                .and_then(crate::util::int)
                .map_or(0, |n| n.max(0) as u64)
                .min(sent);
            run.report.skipped += sent - n;
            *match kind {
                Kind::Missing => &mut run.report.filled,
                Kind::OtherGranularity => &mut run.report.migrated,
                Kind::Wrong => &mut run.report.corrected,
            } += n;
        }
        if let Some(f) = run.progress.as_mut() {
            let done = run.report.scanned;
            f(Progress::new(done, run.of.max(done), run.started.elapsed()));
        }
        Ok(())
    }
}
