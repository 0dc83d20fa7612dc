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
//! The test kit cannot see the models unless a suite shows them, so the
//! default map comes from what the suite declares and what the commands
//! show, first match wins:
//! 1. `MP_ROUTING_KEYS=coll=field:1,other:hashed;coll2=...` (`1` ranged,
//!    `hashed`): declared.
//! 2. The models' own declarations, given to [`declare`] (a suite calls
//!    `routing::declare(Model::declared(&db))` where it makes its
//!    database, so that every test of it is judged by the keys `ensure`
//!    would shard by).
//! 3. An index `ensure` creates: `mp_bucket_<key>_start` (a bucket
//!    collection) gives `{<key>: 1}`; `mp_shard_*` (the shard key pattern)
//!    gives that index's key.
//! 4. A bucket collection (its `_id`s are `{k, s}`): the top-level field
//!    whose value is `_id.k` in a bucket it inserts or upserts gives
//!    `{<field>: 1}`. Commands on a collection that showed a bucket `_id`
//!    before its key field was seen are held, and judged when it is.
//! 5. `<coll>.mp_locks` (the bucket's leases): `{_id: 1}`.
//! 6. A collection whose `_id`s are `{b, s}` (a rank histogram of the
//!    documents layout): `{"_id.b": "hashed"}`, the key it declares.
//! 7. Any other collection: `{_id: 1}`. That keys array-layout rank
//!    histograms by board (`_id`), counters and leases by `_id`, and
//!    everything else by `_id`: for a write by `_id` the same verdict as
//!    the hashed `_id` the histogram and the counter declare (a range of
//!    `_id`s reads some shards under `{_id: 1}`, every shard under a hashed
//!    key). A test can declare any other key with [`Routing::key`], or
//!    take a model's own declarations with [`Routing::declared`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mongo_patterns::bson::{Bson, Document};
use mongo_patterns::ensure::Declared;

mod key;
mod learn;
mod report;
mod rules;

pub use key::{declare, Kind, ShardKey};
pub use report::{shape, Counts, Finding, Mode, Verdict};

use key::parse_keys;
use learn::{first_key, target_coll};
use rules::{judge, operations};

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

    /// Declares the shard key of each collection in `declared` that has
    /// one, as `ensure` would send it to `shardCollection` (the first key
    /// declared for a collection wins, as in `ensure`):
    /// `Routing::new().declared(Model::declared(&db))`.
    pub fn declared(self, declared: impl IntoIterator<Item = Declared>) -> Routing {
        let mut r = self;
        let mut seen = Vec::new();
        for d in declared {
            if seen.contains(&d.collection) {
                continue;
            }
            if let Some((key, _unique)) = &d.shard_key {
                let key = ShardKey::from_doc(key)
                    .unwrap_or_else(|| panic!("routing: unreadable shard key {key}"));
                r = r.key(&d.collection, key);
                seen.push(d.collection);
            }
        }
        r
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
                report::append_to_log(path, f);
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
        match st.keys.get(coll) {
            Some((k, Source::Declared)) => return Some(k.clone()),
            learnt => {
                if let Some(k) = self.inner.learn.then(|| key::suite_key(coll)).flatten() {
                    return Some(k);
                }
                if let Some((k, _)) = learnt {
                    return Some(k.clone());
                }
            }
        }
        if self.inner.fallback_id && !coll.starts_with("system.") {
            return Some(ShardKey::ranged("_id"));
        }
        None
    }
}
