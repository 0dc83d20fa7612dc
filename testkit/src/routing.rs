//! A routing checker: what `mongos` would do with each command a test
//! sends, given the shard keys declared for its collections. No `mongos`
//! runs here; the checker watches the commands through the driver's
//! command monitoring (the hook [`crate::client`] installs) and judges each
//! write and read by the targeting rules of `mongos` 4.4 to 6.x:
//!
//! - **refused**: a single-document write `mongos` rejects: an upsert
//!   without equality on the full shard key; an `updateOne`/`deleteOne`
//!   (`update` with `multi: false`, `delete` with `limit: 1`) with neither
//!   equality on the full shard key nor on `_id`; a `findAndModify` without
//!   equality on the full shard key (`_id` alone is not enough); an update
//!   that changes a shard key field without equality on the full key; a
//!   `$merge` whose `on` fields lack a shard key field; an inserted document
//!   without every shard key field (4.2 and before refuse it; 4.4 and after
//!   store it as missing, every such document on one chunk).
//!   MongoDB 7.0 and after run most of these through a two-phase "write
//!   without shard key" (a query to every shard, then the write): what is
//!   refused here is a broadcast there.
//! - **broadcast**: a write sent to every shard: `updateOne`/`deleteOne` by
//!   `_id` without the shard key, and `updateMany`/`deleteMany` whose
//!   filter targets no shard key range.
//! - **scatter**: a read (`find`, `aggregate`'s leading `$match`, `count`,
//!   `distinct`) with no equality on the shard key's first field (nor a
//!   range or `$in` on it, for a ranged key): scatter-gather.
//!
//! Writes on the full shard key and reads on its prefix are counted as
//! targeted (`$in` or a range on the prefix targets several shards:
//! counted as `multi`). Commands on collections with no declared key, and
//! on the `admin`, `config` and `local` databases (but `bulkWrite`, which
//! runs on `admin` and names its collections in `nsInfo`), are ignored.
//!
//! # Turning it on
//!
//! - In a test: `let routing = Routing::new().key("orders",
//!   ShardKey::ranged("customerId"));` then
//!   `testkit::client_with(&uri, Some(routing.clone()))` or
//!   [`crate::fresh_db_with`]; at the end `routing.assert_clean()` (panics
//!   listing the refused and broadcast writes), or read
//!   [`Routing::violations`], [`Routing::counts`], [`Routing::report`].
//! - For a whole suite, with no change to its tests: `MP_ROUTING=strict`
//!   (or `1`) makes [`crate::client`] (and so [`crate::fresh_db`]) install
//!   [`Routing::from_env`]: a refused or broadcast write panics in the
//!   command's own call (run with `RUST_BACKTRACE=1` to see which runtime
//!   function sent it), and the test fails. `MP_ROUTING=report` records and
//!   prints each finding to stderr instead, and `MP_ROUTING_LOG=<file>`
//!   appends each one to a file (one tab-separated line: verdict,
//!   collection, command, operation, filter shape, reason), to sum a suite.
//!
//! # The default map ([`Routing::from_env`])
//!
//! The test kit cannot see the models, so the default map comes from what
//! the commands show, first match wins:
//! 1. `MP_ROUTING_KEYS=coll=field:1,other:hashed;coll2=...` (`1` ranged,
//!    `hashed`): declared.
//! 2. An index `ensure` creates: `mp_bucket_<key>_start` (a bucket
//!    collection) gives `{<key>: 1}`; `mp_shard_*` (the shard key pattern)
//!    gives that index's key.
//! 3. A bucket collection (its `_id`s are `{k, s}`): the top-level field
//!    whose value is `_id.k` in a bucket it inserts or upserts gives
//!    `{<field>: 1}`. Commands on a collection that showed a bucket `_id`
//!    before its key field was seen are held, and judged when it is.
//! 4. `<coll>.mp_locks` (the bucket's leases): `{_id: 1}`.
//! 5. Any other collection: `{_id: 1}`. That keys rank histograms by board
//!    (`_id` is the board in the array layout, `{b, s}` in the documents
//!    one, ordered by board first), counters and leases by `_id`, and
//!    everything else by `_id`. A test can declare the hashed `_id` of a
//!    counter, or any other key, with [`Routing::key`].

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::sync::{Arc, Mutex};

use mongo_patterns::bson::{Bson, Document};

/// A `$merge` without `on`: it matches on the document key, which holds
/// the shard key.
const DOCUMENT_KEY: &str = "$documentKey";

/// How a shard key field distributes documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `1`: chunks are ranges of the field's values.
    Ranged,
    /// `"hashed"`: chunks are ranges of the value's hash.
    Hashed,
}

/// A shard key: its fields (dotted paths) in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardKey(pub Vec<(String, Kind)>);

impl ShardKey {
    /// `{field: 1}`.
    pub fn ranged(field: &str) -> ShardKey {
        ShardKey(vec![(field.to_owned(), Kind::Ranged)])
    }

    /// `{field: "hashed"}`.
    pub fn hashed(field: &str) -> ShardKey {
        ShardKey(vec![(field.to_owned(), Kind::Hashed)])
    }

    /// This key followed by `field`.
    pub fn then(mut self, field: &str, kind: Kind) -> ShardKey {
        self.0.push((field.to_owned(), kind));
        self
    }

    /// A key document as `shardCollection` takes it: `{a: 1, b: "hashed"}`.
    pub fn from_doc(key: &Document) -> Option<ShardKey> {
        let mut fields = Vec::new();
        for (f, v) in key {
            let kind = match v {
                Bson::String(s) if s == "hashed" => Kind::Hashed,
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => Kind::Ranged,
                _ => return None,
            };
            fields.push((f.clone(), kind));
        }
        (!fields.is_empty()).then_some(ShardKey(fields))
    }

    fn fields(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(f, _)| f.as_str())
    }
}

impl fmt::Display for ShardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(n, k)| match k {
                Kind::Ranged => format!("{n}: 1"),
                Kind::Hashed => format!("{n}: \"hashed\""),
            })
            .collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// What `mongos` does with one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// A write `mongos` rejects.
    Refused,
    /// A write sent to every shard.
    Broadcast,
    /// A read sent to every shard.
    Scatter,
    /// Sent to the shards of some key values or ranges (`$in`, a range, a
    /// key prefix).
    Multi,
    /// Sent to one shard.
    Targeted,
}

impl Verdict {
    /// Whether it fails a strict check: a refused or broadcast write.
    pub fn is_violation(self) -> bool {
        matches!(self, Verdict::Refused | Verdict::Broadcast)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Refused => "refused",
            Verdict::Broadcast => "broadcast",
            Verdict::Scatter => "scatter",
            Verdict::Multi => "multi",
            Verdict::Targeted => "targeted",
        })
    }
}

/// One judged operation (a statement of a command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub verdict: Verdict,
    /// The collection's name.
    pub coll: String,
    /// The command: `update`, `delete`, `findAndModify`, `insert`,
    /// `bulkWrite`, `find`, `aggregate`, `count`, `distinct`.
    pub command: String,
    /// The operation: `updateOne`, `updateOne upsert`, `updateMany`,
    /// `deleteOne`, `deleteMany`, `findAndModify`, `insert`, `read`,
    /// `$merge`.
    pub op: String,
    /// The filter with its values replaced by `?`.
    pub shape: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({}) on {} filter {}: {}",
            self.verdict, self.command, self.op, self.coll, self.shape, self.why
        )
    }
}

/// How many operations got each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub refused: usize,
    pub broadcast: usize,
    pub targeted_writes: usize,
    pub multi_writes: usize,
    pub scatter: usize,
    pub multi_reads: usize,
    pub targeted_reads: usize,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "writes: {} refused, {} broadcast, {} multi, {} targeted; reads: {} scatter, {} multi, {} targeted",
            self.refused,
            self.broadcast,
            self.multi_writes,
            self.targeted_writes,
            self.scatter,
            self.multi_reads,
            self.targeted_reads
        )
    }
}

/// What the checker does on a refused or broadcast write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Records it; [`Routing::assert_clean`] fails on it.
    Record,
    /// Records it and prints it to stderr (as every scatter read).
    Report,
    /// Records it and panics in the call that sent the command.
    Panic,
}

/// The routing checker. Clones share their state.
#[derive(Clone)]
pub struct Routing {
    inner: Arc<Inner>,
}

struct Inner {
    mode: Mode,
    learn: bool,
    fallback_id: bool,
    log: Option<std::path::PathBuf>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, (ShardKey, Source)>,
    /// Bucket collections whose key field is not known yet, with the
    /// commands held for them.
    held: HashMap<String, Vec<(String, Document)>>,
    findings: Vec<Finding>,
    counts: Counts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Declared,
    Learned,
}

impl Default for Routing {
    fn default() -> Self {
        Routing::new()
    }
}

impl Routing {
    /// A checker with no keys, recording ([`Mode::Record`]).
    pub fn new() -> Routing {
        Routing::build(Mode::Record, false, false, None)
    }

    fn build(mode: Mode, learn: bool, fallback_id: bool, log: Option<std::path::PathBuf>) -> Self {
        Routing {
            inner: Arc::new(Inner {
                mode,
                learn,
                fallback_id,
                log,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The same declarations, in another mode (a new, empty record).
    pub fn mode(self, mode: Mode) -> Routing {
        let keys = self.inner.state.lock().unwrap().keys.clone();
        let r = Routing::build(
            mode,
            self.inner.learn,
            self.inner.fallback_id,
            self.inner.log.clone(),
        );
        r.inner.state.lock().unwrap().keys = keys;
        r
    }

    /// With the default map's rules (see the module's doc): keys learned
    /// from `ensure`'s indexes and from bucket documents, `{_id: 1}` for
    /// every other collection.
    pub fn with_default_map(self) -> Routing {
        let keys = self.inner.state.lock().unwrap().keys.clone();
        let r = Routing::build(self.inner.mode, true, true, self.inner.log.clone());
        r.inner.state.lock().unwrap().keys = keys;
        r
    }

    /// Declares collection `coll`'s shard key.
    pub fn key(self, coll: &str, key: ShardKey) -> Routing {
        self.inner
            .state
            .lock()
            .unwrap()
            .keys
            .insert(coll.to_owned(), (key, Source::Declared));
        self
    }

    /// What `MP_ROUTING` asks for: `None` when unset, empty or `0`;
    /// `strict`/`1` panics on a refused or broadcast write, `report`
    /// prints. The default map, plus `MP_ROUTING_KEYS`; findings are
    /// appended to `MP_ROUTING_LOG` when set.
    pub fn from_env() -> Option<Routing> {
        let mode = match std::env::var("MP_ROUTING").ok()?.as_str() {
            "" | "0" => return None,
            "report" => Mode::Report,
            "record" => Mode::Record,
            _ => Mode::Panic,
        };
        let log = std::env::var_os("MP_ROUTING_LOG").map(Into::into);
        let mut r = Routing::build(mode, true, true, log);
        if let Ok(spec) = std::env::var("MP_ROUTING_KEYS") {
            for (coll, key) in parse_keys(&spec) {
                r = r.key(&coll, key);
            }
        }
        Some(r)
    }

    /// The key collection `coll` is judged by now, if any.
    pub fn key_of(&self, coll: &str) -> Option<ShardKey> {
        let st = self.inner.state.lock().unwrap();
        self.resolve(&st, coll)
    }

    /// Every finding that is not targeted, in order.
    pub fn findings(&self) -> Vec<Finding> {
        self.inner.state.lock().unwrap().findings.clone()
    }

    /// The refused and broadcast writes, in order.
    pub fn violations(&self) -> Vec<Finding> {
        self.findings()
            .into_iter()
            .filter(|f| f.verdict.is_violation())
            .collect()
    }

    /// The verdicts so far, counted.
    pub fn counts(&self) -> Counts {
        self.inner.state.lock().unwrap().counts
    }

    /// Forgets the findings and counts so far (the keys stay), returning
    /// them: per operation of a test.
    pub fn take(&self) -> (Counts, Vec<Finding>) {
        let mut st = self.inner.state.lock().unwrap();
        (
            std::mem::take(&mut st.counts),
            std::mem::take(&mut st.findings),
        )
    }

    /// The counts and every finding, one a line.
    pub fn report(&self) -> String {
        let st = self.inner.state.lock().unwrap();
        let mut out = format!("routing: {}\n", st.counts);
        for f in &st.findings {
            out.push_str(&format!("  {f}\n"));
        }
        for (coll, held) in &st.held {
            out.push_str(&format!(
                "  {} commands on bucket collection {coll} not judged: its key field was never seen\n",
                held.len()
            ));
        }
        out
    }

    /// Panics listing the refused and broadcast writes, if any.
    pub fn assert_clean(&self) {
        let v = self.violations();
        if !v.is_empty() {
            let lines: Vec<String> = v.iter().map(|f| format!("  {f}")).collect();
            panic!(
                "routing: {} write(s) mongos would refuse or broadcast:\n{}",
                v.len(),
                lines.join("\n")
            );
        }
    }

    /// Judges one command as it is sent: what the command monitoring hook
    /// calls. Returns the findings it adds (targeted ones included).
    pub fn observe(&self, db: &str, name: &str, cmd: &Document) -> Vec<Finding> {
        let mut st = self.inner.state.lock().unwrap();
        let mut out = Vec::new();
        if self.inner.learn {
            if let Some(coll) = self.learn(&mut st, db, name, cmd) {
                // Its key field is known now: judge what waited for it.
                for (held_db, held) in st.held.remove(&coll).unwrap_or_default() {
                    let held_name = first_key(&held).unwrap_or_default();
                    out.extend(self.judge_locked(&mut st, &held_db, &held_name, &held));
                }
            }
            if let Some(coll) = target_coll(db, name, cmd) {
                if let Some(held) = st.held.get_mut(&coll) {
                    held.push((db.to_owned(), cmd.clone()));
                    drop(st);
                    return self.emit(out);
                }
            }
        }
        out.extend(self.judge_locked(&mut st, db, name, cmd));
        drop(st);
        self.emit(out)
    }

    fn emit(&self, out: Vec<Finding>) -> Vec<Finding> {
        for f in out.iter().filter(|f| f.verdict < Verdict::Multi) {
            if let Some(path) = &self.inner.log {
                if let Ok(mut file) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                {
                    // One `write` per line: lines from parallel calls
                    // do not interleave. Nextest runs a test per process,
                    // named after `--exact`.
                    let test = std::env::args()
                        .skip_while(|a| a != "--exact")
                        .nth(1)
                        .unwrap_or_default();
                    let line = format!(
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                        f.verdict, f.coll, f.command, f.op, f.shape, f.why, test
                    );
                    let _ = file.write_all(line.as_bytes());
                }
            }
            match self.inner.mode {
                Mode::Record => {}
                Mode::Report => eprintln!("ROUTING {f}"),
                Mode::Panic if f.verdict.is_violation() => panic!("routing: {f}"),
                Mode::Panic => eprintln!("ROUTING {f}"),
            }
        }
        out
    }

    fn judge_locked(&self, st: &mut State, db: &str, name: &str, cmd: &Document) -> Vec<Finding> {
        let ops = operations(db, name, cmd);
        let mut out = Vec::new();
        for op in ops {
            let Some(key) = self.resolve(st, &op.coll) else {
                continue;
            };
            let (verdict, why) = judge(&op, &key);
            let c = &mut st.counts;
            match (verdict, op.kind.is_write()) {
                (Verdict::Refused, _) => c.refused += 1,
                (Verdict::Broadcast, _) => c.broadcast += 1,
                (Verdict::Scatter, _) => c.scatter += 1,
                (Verdict::Multi, true) => c.multi_writes += 1,
                (Verdict::Multi, false) => c.multi_reads += 1,
                (Verdict::Targeted, true) => c.targeted_writes += 1,
                (Verdict::Targeted, false) => c.targeted_reads += 1,
            }
            let finding = Finding {
                verdict,
                coll: op.coll.clone(),
                command: op.command.clone(),
                op: op.kind.name().to_owned(),
                shape: shape(&Bson::Document(op.filter.clone())),
                why,
            };
            if verdict < Verdict::Multi {
                st.findings.push(finding.clone());
            }
            out.push(finding);
        }
        out
    }

    fn resolve(&self, st: &State, coll: &str) -> Option<ShardKey> {
        if let Some((k, _)) = st.keys.get(coll) {
            return Some(k.clone());
        }
        if self.inner.fallback_id && !coll.starts_with("system.") {
            return Some(ShardKey::ranged("_id"));
        }
        None
    }

    /// Learns a key from `cmd`; returns the collection whose key it
    /// learnt, if it had commands held.
    fn learn(&self, st: &mut State, db: &str, name: &str, cmd: &Document) -> Option<String> {
        if ignored_db(db) && name != "bulkWrite" {
            return None;
        }
        let coll = target_coll(db, name, cmd)?;
        if matches!(st.keys.get(&coll), Some((_, Source::Declared))) {
            return None;
        }
        if name == "createIndexes" {
            for ix in array(cmd, "indexes") {
                let Some(ix) = ix.as_document() else { continue };
                let (Ok(n), Ok(key)) = (ix.get_str("name"), ix.get_document("key")) else {
                    continue;
                };
                let learnt = if n.starts_with("mp_bucket_") {
                    key.keys().next().map(|f| ShardKey::ranged(f))
                } else if n.starts_with("mp_shard_") {
                    ShardKey::from_doc(key)
                } else {
                    None
                };
                if let Some(k) = learnt {
                    st.keys.insert(coll.clone(), (k, Source::Learned));
                    return st.held.contains_key(&coll).then_some(coll);
                }
            }
            return None;
        }
        if st.keys.contains_key(&coll) {
            return None;
        }
        if coll.ends_with(".mp_locks") {
            st.keys
                .insert(coll, (ShardKey::ranged("_id"), Source::Learned));
            return None;
        }
        // A bucket collection: its `_id`s are `{k, s}`.
        let mut docs: Vec<&Document> = Vec::new();
        let stmts = statements(name, cmd);
        for s in &stmts {
            docs.extend(s.iter().copied());
        }
        let mut bucket = false;
        for d in &docs {
            if let Some(f) = bucket_key_field(d) {
                st.keys
                    .insert(coll.clone(), (ShardKey::ranged(&f), Source::Learned));
                return st.held.contains_key(&coll).then_some(coll);
            }
            bucket |= mentions_bucket_id(d);
        }
        if bucket {
            st.held.entry(coll).or_default();
        }
        None
    }
}

/// `coll=field:1,other:hashed;coll2=field:1`.
fn parse_keys(spec: &str) -> Vec<(String, ShardKey)> {
    let mut out = Vec::new();
    for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
        let Some((coll, fields)) = part.split_once('=') else {
            continue;
        };
        let mut key = ShardKey(Vec::new());
        for f in fields.split(',') {
            let (name, kind) = f.split_once(':').unwrap_or((f, "1"));
            let kind = if kind.trim() == "hashed" {
                Kind::Hashed
            } else {
                Kind::Ranged
            };
            key.0.push((name.trim().to_owned(), kind));
        }
        if !key.0.is_empty() {
            out.push((coll.trim().to_owned(), key));
        }
    }
    out
}

fn ignored_db(db: &str) -> bool {
    matches!(db, "admin" | "config" | "local")
}

fn first_key(d: &Document) -> Option<String> {
    d.keys().next().cloned()
}

fn array<'a>(d: &'a Document, k: &str) -> &'a [Bson] {
    match d.get(k) {
        Some(Bson::Array(a)) => a,
        _ => &[],
    }
}

/// The collection a command names (the first of a `bulkWrite`'s).
fn target_coll(db: &str, name: &str, cmd: &Document) -> Option<String> {
    if name == "bulkWrite" {
        let ns = array(cmd, "nsInfo")
            .first()?
            .as_document()?
            .get_str("ns")
            .ok()?;
        return Some(ns.split_once('.').map_or(ns, |(_, c)| c).to_owned());
    }
    if ignored_db(db) {
        return None;
    }
    cmd.get_str(name).ok().map(str::to_owned)
}

/// The documents of a command that may show a bucket: filters, inserted
/// documents, `$setOnInsert`.
fn statements<'a>(name: &str, cmd: &'a Document) -> Vec<Vec<&'a Document>> {
    let mut out = Vec::new();
    let push_update =
        |out: &mut Vec<Vec<&'a Document>>, q: Option<&'a Document>, u: Option<&'a Bson>| {
            let mut v: Vec<&Document> = q.into_iter().collect();
            if let Some(Bson::Document(u)) = u {
                if let Ok(s) = u.get_document("$setOnInsert") {
                    v.push(s);
                }
                if !u.keys().any(|k| k.starts_with('$')) {
                    v.push(u);
                }
            }
            out.push(v);
        };
    match name {
        "insert" => {
            for d in array(cmd, "documents").iter().filter_map(Bson::as_document) {
                out.push(vec![d]);
            }
        }
        "update" => {
            for s in array(cmd, "updates").iter().filter_map(Bson::as_document) {
                push_update(&mut out, s.get_document("q").ok(), s.get("u"));
            }
        }
        "delete" => {
            for s in array(cmd, "deletes").iter().filter_map(Bson::as_document) {
                out.extend(s.get_document("q").ok().map(|q| vec![q]));
            }
        }
        "findAndModify" => push_update(&mut out, cmd.get_document("query").ok(), cmd.get("update")),
        "find" | "count" | "distinct" => {
            for k in ["filter", "query"] {
                out.extend(cmd.get_document(k).ok().map(|q| vec![q]));
            }
        }
        "aggregate" => {
            if let Some(m) = array(cmd, "pipeline")
                .first()
                .and_then(Bson::as_document)
                .and_then(|s| s.get_document("$match").ok())
            {
                out.push(vec![m]);
            }
        }
        "bulkWrite" => {
            for op in array(cmd, "ops").iter().filter_map(Bson::as_document) {
                if let Ok(d) = op.get_document("document") {
                    out.push(vec![d]);
                } else {
                    push_update(
                        &mut out,
                        op.get_document("filter").ok(),
                        op.get("updateMods"),
                    );
                }
            }
        }
        _ => {}
    }
    out
}

/// The field `f` of a bucket document or filter `{_id: {k: v, s}, f: v}`.
fn bucket_key_field(d: &Document) -> Option<String> {
    let id = d.get_document("_id").ok()?;
    let k = id.get("k")?;
    if !id.contains_key("s") || id.keys().any(|x| x.starts_with('$')) {
        return None;
    }
    d.iter()
        .find(|(f, v)| f.as_str() != "_id" && !f.starts_with('$') && *v == k)
        .map(|(f, _)| f.clone())
}

/// Whether `_id` is compared with `{k, s}` documents (a bucket's).
fn mentions_bucket_id(d: &Document) -> bool {
    fn is_bucket_id(b: &Bson) -> bool {
        match b {
            Bson::Document(d) => {
                (d.contains_key("k") && d.contains_key("s")) || d.values().any(|v| match v {
                    Bson::Array(a) => a.iter().any(is_bucket_id),
                    v => {
                        matches!(v, Bson::Document(x) if x.contains_key("k") && x.contains_key("s"))
                    }
                })
            }
            _ => false,
        }
    }
    d.get("_id").is_some_and(is_bucket_id)
        || array(d, "$and")
            .iter()
            .filter_map(Bson::as_document)
            .any(mentions_bucket_id)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    UpdateOne { upsert: bool },
    UpdateMany { upsert: bool },
    DeleteOne,
    DeleteMany,
    FindAndModify { upsert: bool },
    Insert,
    Merge,
    Read,
}

impl OpKind {
    fn is_write(self) -> bool {
        !matches!(self, OpKind::Read)
    }

    fn name(self) -> &'static str {
        match self {
            OpKind::UpdateOne { upsert: false } => "updateOne",
            OpKind::UpdateOne { upsert: true } => "updateOne upsert",
            OpKind::UpdateMany { upsert: false } => "updateMany",
            OpKind::UpdateMany { upsert: true } => "updateMany upsert",
            OpKind::DeleteOne => "deleteOne",
            OpKind::DeleteMany => "deleteMany",
            OpKind::FindAndModify { upsert: false } => "findAndModify",
            OpKind::FindAndModify { upsert: true } => "findAndModify upsert",
            OpKind::Insert => "insert",
            OpKind::Merge => "$merge",
            OpKind::Read => "read",
        }
    }
}

/// One operation of a command, on one collection.
struct Op {
    coll: String,
    command: String,
    kind: OpKind,
    /// The filter (for an insert: the document; for `$merge`: `on`).
    filter: Document,
    /// The update, if any.
    update: Option<Bson>,
}

fn operations(db: &str, name: &str, cmd: &Document) -> Vec<Op> {
    let mut out = Vec::new();
    if name == "bulkWrite" {
        let colls: Vec<String> = array(cmd, "nsInfo")
            .iter()
            .filter_map(|n| n.as_document()?.get_str("ns").ok())
            .map(|ns| ns.split_once('.').map_or(ns, |(_, c)| c).to_owned())
            .collect();
        for op in array(cmd, "ops").iter().filter_map(Bson::as_document) {
            let (kind_key, kind) = if op.contains_key("insert") {
                ("insert", OpKind::Insert)
            } else if op.contains_key("update") {
                let upsert = op.get_bool("upsert").unwrap_or(false);
                if op.get_bool("multi").unwrap_or(false) {
                    ("update", OpKind::UpdateMany { upsert })
                } else {
                    ("update", OpKind::UpdateOne { upsert })
                }
            } else if op.contains_key("delete") {
                if op.get_bool("multi").unwrap_or(false) {
                    ("delete", OpKind::DeleteMany)
                } else {
                    ("delete", OpKind::DeleteOne)
                }
            } else {
                continue;
            };
            let idx = match op.get(kind_key) {
                Some(Bson::Int32(i)) => *i as usize,
                Some(Bson::Int64(i)) => *i as usize,
                _ => continue,
            };
            let Some(coll) = colls.get(idx) else { continue };
            let filter = if kind == OpKind::Insert {
                op.get_document("document").cloned().unwrap_or_default()
            } else {
                op.get_document("filter").cloned().unwrap_or_default()
            };
            out.push(Op {
                coll: coll.clone(),
                command: "bulkWrite".into(),
                kind,
                filter,
                update: op.get("updateMods").cloned(),
            });
        }
        return out;
    }
    if ignored_db(db) {
        return out;
    }
    let Ok(coll) = cmd.get_str(name) else {
        return out;
    };
    let mk = |kind, filter: Option<&Document>, update: Option<&Bson>| Op {
        coll: coll.to_owned(),
        command: name.to_owned(),
        kind,
        filter: filter.cloned().unwrap_or_default(),
        update: update.cloned(),
    };
    match name {
        "insert" => {
            for d in array(cmd, "documents").iter().filter_map(Bson::as_document) {
                out.push(mk(OpKind::Insert, Some(d), None));
            }
        }
        "update" => {
            for s in array(cmd, "updates").iter().filter_map(Bson::as_document) {
                let upsert = s.get_bool("upsert").unwrap_or(false);
                let kind = if s.get_bool("multi").unwrap_or(false) {
                    OpKind::UpdateMany { upsert }
                } else {
                    OpKind::UpdateOne { upsert }
                };
                out.push(mk(kind, s.get_document("q").ok(), s.get("u")));
            }
        }
        "delete" => {
            for s in array(cmd, "deletes").iter().filter_map(Bson::as_document) {
                let one = matches!(s.get("limit"), Some(Bson::Int32(1) | Bson::Int64(1)))
                    || matches!(s.get("limit"), Some(Bson::Double(x)) if *x == 1.0);
                let kind = if one {
                    OpKind::DeleteOne
                } else {
                    OpKind::DeleteMany
                };
                out.push(mk(kind, s.get_document("q").ok(), None));
            }
        }
        "findAndModify" => {
            let upsert = cmd.get_bool("upsert").unwrap_or(false);
            out.push(mk(
                OpKind::FindAndModify { upsert },
                cmd.get_document("query").ok(),
                cmd.get("update"),
            ));
        }
        "find" => out.push(mk(OpKind::Read, cmd.get_document("filter").ok(), None)),
        "count" | "distinct" => out.push(mk(OpKind::Read, cmd.get_document("query").ok(), None)),
        "aggregate" => {
            let pipeline = array(cmd, "pipeline");
            let first = pipeline
                .first()
                .and_then(Bson::as_document)
                .and_then(|s| s.get_document("$match").ok());
            out.push(mk(OpKind::Read, first, None));
            // `$merge` into a collection: its `on` must hold the key.
            if let Some(m) = pipeline
                .last()
                .and_then(Bson::as_document)
                .and_then(|s| s.get_document("$merge").ok())
            {
                let into = match m.get("into") {
                    Some(Bson::String(s)) => Some(s.clone()),
                    Some(Bson::Document(d)) => d.get_str("coll").ok().map(str::to_owned),
                    _ => None,
                };
                let on: Vec<String> = match m.get("on") {
                    Some(Bson::String(s)) => vec![s.clone()],
                    Some(Bson::Array(a)) => a
                        .iter()
                        .filter_map(|b| b.as_str().map(str::to_owned))
                        .collect(),
                    // The default: the document key (`_id` and, on a
                    // sharded collection, the shard key).
                    _ => vec![DOCUMENT_KEY.into()],
                };
                if let Some(into) = into {
                    let mut on_doc = Document::new();
                    for f in on {
                        on_doc.insert(f, 1);
                    }
                    out.push(Op {
                        coll: into,
                        command: "aggregate".into(),
                        kind: OpKind::Merge,
                        filter: on_doc,
                        update: None,
                    });
                }
            }
        }
        _ => {}
    }
    out
}

/// What a filter says of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cond {
    Other,
    Range,
    In,
    Eq,
}

/// The conditions of a filter by path (top-level `$and` merged).
fn conditions(filter: &Document) -> HashMap<String, Cond> {
    let mut out = HashMap::new();
    collect(filter, "", &mut out);
    out
}

fn add(out: &mut HashMap<String, Cond>, path: String, c: Cond) {
    let e = out.entry(path).or_insert(c);
    if c > *e {
        *e = c;
    }
}

fn collect(filter: &Document, prefix: &str, out: &mut HashMap<String, Cond>) {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(a) = v {
                for d in a.iter().filter_map(Bson::as_document) {
                    collect(d, prefix, out);
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Bson::Document(d) if d.keys().next().is_some_and(|x| x.starts_with('$')) => {
                let mut c = Cond::Other;
                for (op, arg) in d {
                    let this = match op.as_str() {
                        "$eq" => Cond::Eq,
                        "$in" => match arg {
                            Bson::Array(a) if a.len() == 1 => Cond::Eq,
                            _ => Cond::In,
                        },
                        "$gt" | "$gte" | "$lt" | "$lte" => Cond::Range,
                        _ => Cond::Other,
                    };
                    c = c.max(this);
                }
                add(out, path, c);
            }
            Bson::Document(d) => {
                // An exact match on a document: equality on it, and on
                // each of its fields.
                add(out, path.clone(), Cond::Eq);
                collect(d, &path, out);
            }
            Bson::RegularExpression(_) => add(out, path, Cond::Other),
            _ => add(out, path, Cond::Eq),
        }
    }
}

/// How the filter targets `key`: Targeted (equality on every field),
/// Multi (some shards), Scatter (every shard).
fn targeting(conds: &HashMap<String, Cond>, key: &ShardKey) -> Verdict {
    let all_eq = key
        .fields()
        .all(|f| conds.get(f).copied() == Some(Cond::Eq));
    if all_eq {
        return Verdict::Targeted;
    }
    let (first, kind) = &key.0[0];
    match (conds.get(first.as_str()).copied(), kind) {
        (Some(Cond::Eq | Cond::In), _) => Verdict::Multi,
        (Some(Cond::Range), Kind::Ranged) => Verdict::Multi,
        _ => Verdict::Scatter,
    }
}

/// The shard key fields an update sets or removes.
fn touched_key_fields(update: &Bson, key: &ShardKey) -> Vec<String> {
    let touches = |path: &str| {
        key.fields()
            .filter(|f| {
                *f == path
                    || f.starts_with(&format!("{path}."))
                    || path.starts_with(&format!("{f}."))
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    match update {
        Bson::Document(u) if u.keys().any(|k| k.starts_with('$')) => {
            for (op, fields) in u {
                if op == "$setOnInsert" {
                    continue;
                }
                if let Bson::Document(fields) = fields {
                    for f in fields.keys() {
                        out.extend(touches(f));
                    }
                    if op == "$rename" {
                        for to in fields.values().filter_map(Bson::as_str) {
                            out.extend(touches(to));
                        }
                    }
                }
            }
        }
        Bson::Array(stages) => {
            for s in stages.iter().filter_map(Bson::as_document) {
                for (op, arg) in s {
                    match (op.as_str(), arg) {
                        ("$set" | "$addFields", Bson::Document(d)) => {
                            for f in d.keys() {
                                out.extend(touches(f));
                            }
                        }
                        ("$unset", Bson::String(f)) => out.extend(touches(f)),
                        ("$unset", Bson::Array(a)) => {
                            for f in a.iter().filter_map(Bson::as_str) {
                                out.extend(touches(f));
                            }
                        }
                        ("$replaceRoot" | "$replaceWith", _) => {
                            out.extend(key.fields().map(str::to_owned))
                        }
                        ("$project", Bson::Document(p)) => {
                            let keeps = |v: &Bson| {
                                matches!(v, Bson::Boolean(true) | Bson::Int32(1) | Bson::Int64(1))
                                    || matches!(v, Bson::Double(x) if *x == 1.0)
                            };
                            let inclusion = p.iter().any(|(f, v)| f != "_id" && keeps(v));
                            for f in key.fields() {
                                match p.get(f) {
                                    Some(v) if !keeps(v) => out.push(f.to_owned()),
                                    None if inclusion => out.push(f.to_owned()),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        _ => {}
    }
    // No update changes `_id`: the server refuses it, sharded or not.
    out.retain(|f| f != "_id");
    out.sort();
    out.dedup();
    out
}

fn has_path(d: &Document, path: &str) -> bool {
    let mut cur = d;
    let mut parts = path.split('.').peekable();
    while let Some(p) = parts.next() {
        match cur.get(p) {
            Some(Bson::Document(sub)) if parts.peek().is_some() => cur = sub,
            Some(_) if parts.peek().is_none() => return true,
            _ => return false,
        }
    }
    false
}

fn judge(op: &Op, key: &ShardKey) -> (Verdict, String) {
    if op.kind == OpKind::Insert {
        let missing: Vec<&str> = key.fields().filter(|f| !has_path(&op.filter, f)).collect();
        return if missing.is_empty() {
            (Verdict::Targeted, format!("carries the shard key {key}"))
        } else {
            (
                Verdict::Refused,
                format!(
                    "the document lacks shard key field(s) {missing:?} of {key} (refused up to 4.2; 4.4+ stores them missing, all on one chunk)"
                ),
            )
        };
    }
    if op.kind == OpKind::Merge {
        if op.filter.contains_key(DOCUMENT_KEY) {
            return (
                Verdict::Targeted,
                "`on` is the default, the document key (`_id` and the shard key)".into(),
            );
        }
        let missing: Vec<&str> = key
            .fields()
            .filter(|f| !op.filter.contains_key(*f))
            .collect();
        return if missing.is_empty() {
            (Verdict::Targeted, format!("`on` holds the shard key {key}"))
        } else {
            (
                Verdict::Refused,
                format!("$merge into a sharded collection needs `on` to hold every shard key field; {missing:?} of {key} missing"),
            )
        };
    }
    let conds = conditions(&op.filter);
    let target = targeting(&conds, key);
    let full = target == Verdict::Targeted;
    let by_id = conds.get("_id").copied() == Some(Cond::Eq);
    if let Some(u) = &op.update {
        let touched = touched_key_fields(u, key);
        let single = matches!(
            op.kind,
            OpKind::UpdateOne { .. } | OpKind::FindAndModify { .. }
        );
        if !touched.is_empty() && (!full || !single) {
            return (
                Verdict::Refused,
                format!(
                    "the update may change shard key field(s) {touched:?} of {key} without equality on the full shard key in a single-document write"
                ),
            );
        }
    }
    match op.kind {
        OpKind::Read => {
            let why = match target {
                Verdict::Targeted => format!("equality on the shard key {key}"),
                Verdict::Multi => format!("$in, a range or a prefix of the shard key {key}"),
                _ => format!("no equality (nor range on a ranged key) on {}, the first field of {key}", key.0[0].0),
            };
            (target, why)
        }
        OpKind::UpdateOne { upsert: true }
        | OpKind::UpdateMany { upsert: true }
        | OpKind::FindAndModify { upsert: true } => {
            if full {
                (Verdict::Targeted, format!("upsert on the full shard key {key}"))
            } else {
                (
                    Verdict::Refused,
                    format!("an upsert needs equality on the full shard key {key} (7.0+ takes an `_id` equality through a write without shard key)"),
                )
            }
        }
        OpKind::FindAndModify { upsert: false } => {
            if full {
                (Verdict::Targeted, format!("equality on the full shard key {key}"))
            } else {
                (
                    Verdict::Refused,
                    format!("findAndModify needs equality on the full shard key {key}{} (7.0+: a two-phase write without shard key, a query to every shard first)", if by_id { "; `_id` is not enough" } else { "" }),
                )
            }
        }
        OpKind::UpdateOne { upsert: false } | OpKind::DeleteOne => {
            if full {
                (Verdict::Targeted, format!("equality on the full shard key {key}"))
            } else if by_id {
                (
                    Verdict::Broadcast,
                    format!("single-document write by `_id` without the shard key {key}: sent to every shard"),
                )
            } else {
                (
                    Verdict::Refused,
                    format!("a single-document write needs equality on the full shard key {key} or on `_id` (7.0+: a two-phase write without shard key)"),
                )
            }
        }
        OpKind::UpdateMany { upsert: false } | OpKind::DeleteMany => match target {
            Verdict::Targeted => (Verdict::Targeted, format!("equality on the shard key {key}")),
            Verdict::Multi => (Verdict::Multi, format!("$in, a range or a prefix of the shard key {key}")),
            _ => (
                Verdict::Broadcast,
                format!("a multi-document write with no condition on {}, the first field of {key}: sent to every shard", key.0[0].0),
            ),
        },
        OpKind::Insert | OpKind::Merge => unreachable!("judged above"),
    }
}

/// `b` with its values replaced by `?`: the keys and operators stay.
pub fn shape(b: &Bson) -> String {
    match b {
        Bson::Document(d) => {
            let parts: Vec<String> = d
                .iter()
                .map(|(k, v)| format!("{k}: {}", shape(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Bson::Array(a) => match a.first() {
            None => "[]".into(),
            Some(first) if a.len() == 1 => format!("[{}]", shape(first)),
            Some(first) => format!("[{}, …]", shape(first)),
        },
        _ => "?".into(),
    }
}
