//! `fill_coarse`: the derived coarse field written on the documents that
//! lack it or hold another value (another granularity's period, after the
//! attribute changed), batch by batch, as [`Sharded::audit`] would find
//! them; its action, [`FillCoarse`], beside it.

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, DateTime, Document};
use mongodb::options::{CountOptions, EstimatedDocumentCountOptions, FindOptions};
use mongodb::ClientSession;

use super::time::{name, other_granularities, stored_time, truncate};
use super::{Derived, Granularity, ShardKeyed, Sharded};
use crate::action::{action, run, Call, Options};
use crate::error::{Error, Result};
use crate::progress::{OnProgress, Progress};

/// Documents one read and one write of `fill_coarse` take by default.
const BATCH: u32 = 1_000;
/// Unfillable documents a report names by default.
const MAX_DAMAGED: usize = 100;

action! {
    /// [`Sharded::fill_coarse`]: write and read options, `session`,
    /// `on_progress`, `batch_size`, `max_damaged`, `sharded`.
    FillCoarse<'a, T: ShardKeyed> on Sharded, "fill_coarse", both, guarded;
    { progress: Option<OnProgress>, batch: u32, max_damaged: usize, pipeline: bool, sharded: Option<bool> } -> Fill;
    |this, cx| this.repo.fill_in(this.progress, this.batch, this.max_damaged, this.pipeline, this.sharded, cx).await
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

    /// Whether the collection is sharded already (by default: whether
    /// the deployment is a `mongos`, asked with one `hello`). On a sharded
    /// collection each document gets a statement of its own whose filter
    /// names its whole shard key as stored (`null` for a missing field),
    /// and a batch's statements run in a transaction: what `mongos` needs
    /// to change a document's shard key value.
    pub fn sharded(mut self, sharded: bool) -> Self {
        self.sharded = Some(sharded);
        self
    }

    /// Writes one statement a document, as on a server without
    /// `$dateTrunc`: for the tests of that path.
    #[doc(hidden)]
    pub fn per_document(mut self) -> Self {
        self.pipeline = false;
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
    /// write (deleted, given a timestamp of another type, or the right
    /// coarse field; without `$dateTrunc`, any change of the timestamp):
    /// not changed, left as that writer left them; a second run takes any
    /// that still need it. Counts come from the server's `nModified`:
    /// under an unacknowledged write concern, which returns none, every
    /// write counts as skipped.
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
    /// A write of `want`, for the reason `kind`; the timestamp is `at`.
    Write(Kind, DateTime, DateTime),
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
        None => Verdict::Write(Kind::Missing, want, at),
        Some(Bson::DateTime(v)) if *v == want => Verdict::Right,
        Some(Bson::DateTime(v)) if !other_granularities(at, *v, derived.granularity).is_empty() => {
            Verdict::Write(Kind::OtherGranularity, want, at)
        }
        Some(_) => Verdict::Write(Kind::Wrong, want, at),
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

/// The first and last millisecond of the years 1 to 9999, the dates a
/// server's `$dateTrunc` is trusted with; a timestamp outside is written
/// by a statement of its own, with the value computed here.
const FIRST_MS: i64 = -62_135_596_800_000;
const LAST_MS: i64 = 253_402_300_799_999;

/// A batch's writes of one kind: the `_id`s of the documents a pipeline
/// statement writes, by how their timestamp is stored (a date, an
/// integer of seconds), with the same documents' own statements should
/// the server refuse `$dateTrunc`; and the statements written one a
/// document.
#[derive(Default)]
struct Writes {
    dates: Vec<Bson>,
    seconds: Vec<Bson>,
    in_pipeline: Vec<Document>,
    direct: Vec<Document>,
}

impl Writes {
    fn add(&mut self, run: &Run<'_>, stored: &Document, want: DateTime, at: DateTime) {
        let id = stored.get("_id").cloned().unwrap_or(Bson::Null);
        let ts = stored.get(run.derived.from).cloned().unwrap_or(Bson::Null);
        let alias = type_alias(&ts);
        let mut q = doc! {
            "_id": id.clone(),
            run.derived.from: {"$eq": ts.clone(), "$type": alias},
            run.coarse: {"$ne": want},
        };
        // On a sharded collection, the whole shard key as stored (the
        // coarse field's value replaces its guard): `null` matches a
        // missing field.
        for f in run.keyed.iter().flatten() {
            q.insert(*f, stored.get(*f).cloned().unwrap_or(Bson::Null));
        }
        let statement = doc! {"q": q, "u": {"$set": {run.coarse: want}}, "multi": false};
        let ms = at.timestamp_millis();
        if !run.pipeline || run.keyed.is_some() || !(FIRST_MS..=LAST_MS).contains(&ms) {
            self.direct.push(statement);
            return;
        }
        match ts {
            Bson::DateTime(_) => self.dates.push(id),
            _ => self.seconds.push(id),
        }
        self.in_pipeline.push(statement);
    }

    /// The pipeline statements: one for the dates, one for the seconds.
    fn pipeline(&mut self, run: &Run<'_>) -> Vec<Document> {
        let mut statements = Vec::new();
        for (ids, dates) in [(&mut self.dates, true), (&mut self.seconds, false)] {
            if !ids.is_empty() {
                statements.push(pipeline_statement(run, std::mem::take(ids), dates));
            }
        }
        statements
    }
}

/// One pipeline statement writing the period of the timestamp, as the
/// server computes it when the write runs (`$dateTrunc`, UTC, weeks from
/// Monday: the same value as [`truncate`]), on the documents `ids`
/// whose timestamp is still a date (`dates`) or an integer of seconds,
/// within the years 1 to 9999. A timestamp another writer changed
/// meanwhile gets its own period, never a stale one. One condition on
/// the timestamp, not an `$or` of both kinds nor an `$expr`: either made
/// the test server read 4 to 5 times slower.
fn pipeline_statement(run: &Run<'_>, ids: Vec<Bson>, dates: bool) -> Document {
    let from = format!("${}", run.derived.from);
    let (guard, date) = match dates {
        true => (
            doc! {
                "$gte": DateTime::from_millis(FIRST_MS),
                "$lte": DateTime::from_millis(LAST_MS),
            },
            Bson::String(from),
        ),
        false => (
            doc! {
                "$gte": FIRST_MS / 1_000,
                "$lte": LAST_MS / 1_000,
                "$type": ["int", "long"],
            },
            Bson::Document(doc! {"$toDate": {"$multiply": [{"$toLong": from}, 1_000_i64]}}),
        ),
    };
    let g = run.derived.granularity;
    let mut t = doc! {"date": date, "unit": name(g), "timezone": "UTC"};
    if g == Granularity::Week {
        t.insert("startOfWeek", "monday");
    }
    doc! {
        "q": {"_id": {"$in": ids}, run.derived.from: guard},
        "u": [{"$set": {run.coarse: {"$dateTrunc": t}}}],
        "multi": true,
    }
}

/// Documents whose coarse field `coarse` is missing or not their
/// timestamp's period, as the server computes it: what `plan` counts
/// (see [`Sharded::declared`]). A timestamp outside the years 1 to 9999,
/// or of another type, is left to the audit, which names it.
pub(super) fn stale_filter(coarse: &str, derived: &Derived) -> Document {
    let from = format!("${}", derived.from);
    let date = match derived.repr {
        super::TimeRepr::DateTime => doc! {"$cond": [
            {"$and": [
                {"$eq": [{"$type": &from}, "date"]},
                {"$gte": [&from, DateTime::from_millis(FIRST_MS)]},
                {"$lte": [&from, DateTime::from_millis(LAST_MS)]},
            ]},
            &from,
            Bson::Null,
        ]},
        super::TimeRepr::EpochSeconds => doc! {"$cond": [
            {"$and": [
                {"$in": [{"$type": &from}, ["int", "long"]]},
                {"$gte": [&from, FIRST_MS / 1_000]},
                {"$lte": [&from, LAST_MS / 1_000]},
            ]},
            {"$toDate": {"$multiply": [{"$toLong": &from}, 1_000_i64]}},
            Bson::Null,
        ]},
    };
    let g = derived.granularity;
    let mut t = doc! {"date": date, "unit": name(g), "timezone": "UTC"};
    if g == Granularity::Week {
        t.insert("startOfWeek", "monday");
    }
    doc! {"$or": [
        {coarse: {"$exists": false}},
        {"$expr": {"$ne": [format!("${coarse}"), {"$ifNull": [{"$dateTrunc": t}, format!("${coarse}")]}]}},
    ]}
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
    /// Writes go through `$dateTrunc` pipelines until the server refuses
    /// one.
    pipeline: bool,
    /// On a sharded collection: the shard key's fields, which each
    /// statement names (see [`FillCoarse::sharded`]).
    keyed: Option<Vec<&'static str>>,
    /// The call runs in the caller's transaction.
    txn: bool,
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
    /// It reads the collection in `_id` order (one cursor), projected to
    /// `_id`, the coarse field and the timestamp, in batches of 1,000
    /// ([`FillCoarse::batch_size`]), judges each document as the audit
    /// does, and writes those that need it with one `update` command a
    /// batch (one per kind of change it holds): a pipeline statement on
    /// their `_id`s that sets the field to `$dateTrunc` of the timestamp
    /// as stored when the write runs (the same value as
    /// [`truncate`]), guarded by the timestamp still
    /// being of the type read, so that a timestamp another writer changes
    /// meanwhile gets its own period, never a stale one. On a server
    /// without `$dateTrunc` (before MongoDB 5.0), and for timestamps
    /// outside the years 1 to 9999, each document gets a statement of its
    /// own with the value computed here, guarded by `_id`, the timestamp
    /// still the value and type read, and the field still not that value.
    /// Either way, a document not changed because another writer changed
    /// it first is counted as [`Fill::skipped`]. A document whose
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
    /// **Before sharding** is the cheaper time: fill, check that
    /// [`Sharded::audit`] is clean (but for the unfillable documents,
    /// which you repair or delete), then [`Sharded::ensure_sharded`].
    ///
    /// **On a sharded collection** (found by itself on a `mongos`, or said
    /// with [`FillCoarse::sharded`]) the coarse field is part of the shard
    /// key, and MongoDB takes setting a missing key field, or changing
    /// one, as changing the document's shard key value: only through
    /// `mongos`, one document per statement with an equality on the full
    /// shard key in its filter, as a retryable write or in a transaction.
    /// So there each document gets its own statement, with the value
    /// computed here, filtered by `_id`, the timestamp as read and its
    /// whole shard key as stored (`null` for a missing field), and a
    /// batch's statements (of one kind of change) run in one transaction
    /// (the caller's, or one of the call's own, rerun on a conflict). A
    /// document may move to another shard; [`Sharded::find`] sees it once
    /// it has. Checked against `mongos`'s rules by the test kit's routing
    /// checker; the test server does not shard.
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
        FillCoarse::new(self, None, BATCH, MAX_DAMAGED, true, None)
    }

    pub(super) async fn fill_in(
        &self,
        progress: Option<OnProgress>,
        batch: u32,
        max_damaged: usize,
        pipeline: bool,
        sharded: Option<bool>,
        cx: Call<'_>,
    ) -> Result<Fill> {
        let (Some(coarse), Some(derived)) = (self.spec.coarse(), self.spec.derived()) else {
            return Err(Error::invalid(
                "fill_coarse",
                "the model's shard key has no coarse field derived from a timestamp (`from`): nothing to fill",
            ));
        };
        let (o, mut session, txn) = (cx.opts, cx.session, cx.txn);
        let sharded = match sharded {
            Some(s) => s,
            None => self.on_mongos().await?,
        };
        let mut run = Run {
            coarse,
            derived,
            collection: self.coll.name(),
            max_damaged,
            report: Fill::default(),
            started: Instant::now(),
            of: 0,
            progress,
            pipeline,
            keyed: sharded.then(|| super::key_fields(&self.spec)),
            txn,
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
        let mut projection = doc! {"_id": 1, coarse: 1, derived.from: 1};
        for f in run.keyed.iter().flatten() {
            projection.insert(*f, 1);
        }
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

    /// Judges a batch, writes what it needs (per kind of change, one
    /// `update` command: see [`Sharded::fill_coarse`]), and reports the
    /// progress.
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
        let mut writes: [Writes; 3] = Default::default();
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
                Verdict::Write(kind, want, at) => {
                    let i = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
                    writes[i].add(run, d, want, at);
                }
            }
        }
        for (kind, mut w) in KINDS.into_iter().zip(writes) {
            let mut direct = std::mem::take(&mut w.direct);
            let mut n = 0;
            let pipeline = w.pipeline(run);
            if !pipeline.is_empty() {
                let sent = w.in_pipeline.len() as u64;
                match self.send(pipeline, true, o, session.as_deref_mut()).await? {
                    Some(written) => {
                        n += written.min(sent);
                        run.report.skipped += sent - written.min(sent);
                    }
                    None => {
                        tracing::info!(
                            target: "mongo_patterns::fallback",
                            fallback = "dateTrunc",
                            collection = run.collection,
                            "the server refused $dateTrunc (MongoDB 5.0+): fill_coarse writes one statement a document"
                        );
                        run.pipeline = false;
                        direct.extend(w.in_pipeline);
                    }
                }
            }
            if !direct.is_empty() {
                let sent = direct.len() as u64;
                let written = match run.keyed.is_some() && !run.txn {
                    true => self.send_in_transaction(direct, o).await?,
                    false => self.send(direct, false, o, session.as_deref_mut()).await?,
                };
                let written = written.unwrap_or(0).min(sent);
                n += written;
                run.report.skipped += sent - written;
            }
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

    /// Whether the deployment is a `mongos` (`hello`'s `msg: "isdbgrid"`).
    async fn on_mongos(&self) -> Result<bool> {
        let hello = self.db.run_command(doc! {"hello": 1}).await?;
        Ok(crate::util::is_mongos(&hello))
    }

    /// [`send`](Self::send) in a transaction of a session of its own: on a
    /// sharded collection, a change of shard key values must be a
    /// retryable write or in a transaction, and this command is neither
    /// otherwise. A conflict reruns it (its statements are guarded by the
    /// values read, so a rerun writes only what is still to write).
    async fn send_in_transaction(
        &self,
        statements: Vec<Document>,
        o: &Options,
    ) -> Result<Option<u64>> {
        let mut s = self.db.client().start_session().await?;
        let inside = o.clone().in_transaction();
        let context = (self, &statements, &inside);
        crate::transaction::run(
            &mut s,
            o,
            "fill_coarse",
            context,
            |s, (this, st, inside)| Box::pin(this.send(st.to_vec(), false, inside, Some(s))),
        )
        .await
    }

    /// One `update` command of `statements` (unordered): the documents
    /// it changed (`nModified`), or,
    /// when `refusable`, `None` if the server does not know an operator
    /// the statements use (nothing was written: each statement is parsed
    /// before it runs, and they all use it).
    async fn send(
        &self,
        statements: Vec<Document>,
        refusable: bool,
        o: &Options,
        session: Option<&mut ClientSession>,
    ) -> Result<Option<u64>> {
        let mut command = doc! {
            "update": self.coll.name(),
            "updates": statements,
            "ordered": false,
        };
        o.command_fields(&mut command, self.coll.write_concern(), true)?;
        let refused = |e: &mongodb::error::Error| {
            refusable && crate::error::code::unknown_operator(e).is_some()
        };
        let reply = match run!(self.db.run_command(command), session) {
            Err(e) if refused(&e) => return Ok(None),
            reply => reply?,
        };
        if let Some((_, e)) = crate::action::first_write_error(&reply) {
            if refused(&e) {
                return Ok(None);
            }
        }
        crate::action::command_write_errors(&reply)?;
        let n = reply.get("nModified").and_then(crate::util::int);
        Ok(Some(n.map_or(0, |n| n.max(0) as u64)))
    }
}
