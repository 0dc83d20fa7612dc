//! A deterministic model of a sharded cluster, to compare shard keys with
//! numbers rather than adjectives (the workload: application logs
//! `{id: uuid, type: "app"|"web"|"admin", level, ts: epoch seconds, msg}`).
//!
//! The seed's claims, and the metric of [`Row`] that shows each:
//! - `{type: 1}` has three values, so it ends as three chunks that cannot
//!   split (*jumbo* once over the chunk size), each stuck on one shard:
//!   [`Row::jumbo_chunks`], [`Row::final_balance`], [`Row::insert_share`].
//! - `{ts: 1}` ascends, so every insert goes to the last chunk, on one
//!   shard, and the balancer keeps moving the chunks left behind:
//!   [`Row::hot_window_share`], [`Row::migrations`].
//! - `{id: 1}` (random) spreads inserts, but a migration reads the chunk in
//!   key order, which is random in the storage order, and a query by type
//!   and time goes to every shard: [`Row::page_reads_per_moved_doc`],
//!   [`Row::shards_per_query_mean`].
//! - `{month: 1, type: 1}` targets "the last month of type X" to one chunk.
//!   The model shows its costs too: `month` still ascends, so the inserts
//!   of a month land on the shard(s) holding that month's chunks (its
//!   hot-window share is close to `{ts}`'s), the balancer keeps copying
//!   older months away (more documents moved than a random key, though in
//!   sequential pages), and one (month, type) value larger than a chunk is
//!   jumbo, exactly as `{type}` alone: the coarse field must be fine enough
//!   for one value of the whole key to fit in a chunk.
//!
//! # The model, rule by rule
//! - **Chunks** ([`Cluster`]): the key space `[MinKey, MaxKey)` is cut into
//!   contiguous ranges, each on one shard; a new collection is one chunk on
//!   shard 0, as `shardCollection` on an empty collection with a range key.
//! - **Size in documents**: a chunk splits when it holds more than
//!   [`Params::chunk_docs`] documents (a stand-in for MongoDB's chunk size
//!   in bytes: 64 MB before 5.2, 128 MB after; every log is the same size).
//! - **Auto-split at the median key**, as MongoDB's auto-splitter (up to
//!   5.x) split a chunk that had grown past the chunk size. If the median
//!   equals the chunk's smallest key, the split point is the next larger
//!   key. MongoDB 6.0 removed auto-splitting on insert; this is the classic
//!   behaviour the seed describes.
//! - **Jumbo**: a chunk over the threshold whose documents all share one
//!   key value has no split point; it is marked jumbo (MongoDB's `jumbo:
//!   true`) until a different key arrives and a split succeeds.
//! - **Balancer** ([`Cluster::balance`]), every [`Params::balance_every`]
//!   inserts: MongoDB's classic chunk-count balancer (before 6.0). While the
//!   shard with the most chunks has at least [`migration_threshold`] more
//!   than the shard with the fewest (2 below 20 chunks, 4 for 20–79, 8 from
//!   80), it moves the donor's first non-jumbo chunk in key order to that
//!   shard; after a move the threshold drops to 2 (MongoDB's
//!   `balancedLastTime`/`shouldAggressivelyBalance`), so a round that
//!   starts goes on until the counts differ by less than 2. If the donor
//!   holds only jumbo chunks, nothing moves, as in MongoDB. Simplified:
//!   migrations are instantaneous and one at a time (MongoDB 3.4+ runs
//!   migrations between disjoint shard pairs in parallel; the end state is
//!   the same), and MongoDB 6.0+ balances by data size (a difference of 3
//!   chunk sizes), not by chunk count: counting chunks of unequal fill can
//!   leave the documents uneven ([`Row::final_balance`]).
//! - **Hashed keys**: the key value is a fixed 64-bit hash of the field (a
//!   SplitMix64 finalizer, not MongoDB's MD5; any well-mixed hash gives the
//!   same shape), chunks are ranges of hashes, and the empty collection
//!   starts pre-split into [`Params::hashed_chunks_per_shard`] chunks per
//!   shard (MongoDB's default: 2), evenly spaced and dealt round-robin.
//! - **Query targeting** ([`Cluster::target`]), as mongos does: equality
//!   and range predicates on a prefix of the key give a key interval; the
//!   query goes to the shards owning chunks that overlap it. Without the
//!   key's first field, or with only a range on a hashed field, it is a
//!   broadcast to every shard that owns a chunk of the collection.
//! - **Top-chunk optimization** (off by default,
//!   [`Params::top_chunk_optimization`]): MongoDB up to 5.x split the
//!   chunk ending at MaxKey of an ordered key at its largest key, not its
//!   median, and moved the new top chunk to the least loaded shard, so that
//!   an ascending key's hot spot hops between shards. With it on, the whole
//!   run's insert share of an ascending key drops; the hot window does not.
//!
//! Everything is driven by [`SplitMix64`] from a seed: the same
//! [`Workload`] and [`Params`] give identical [`Row`]s.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use mongodb::bson::DateTime;

use super::{truncate, Granularity};

/// The most fields a compound key may have in this model.
pub const MAX_KEY_FIELDS: usize = 3;

/// SplitMix64 (Steele, Lea and Flood): a tiny seeded generator, so the
/// simulator needs no dependency and replays exactly.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// A number in `0..n` (Lemire's multiply-shift; `n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A random version 4 UUID as a `u128` (122 random bits). The version
    /// and variant bits also keep it away from 0 and `u128::MAX`, which the
    /// model uses as MinKey and MaxKey.
    pub fn uuid_v4(&mut self) -> u128 {
        let v = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        let v = (v & !(0xF << 76)) | (0x4 << 76);
        (v & !(0x3 << 62)) | (0x2 << 62)
    }
}

/// SplitMix64's finalizer: a bijective 64-bit mix.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The fixed 64-bit hash of a hashed key (of a field's encoded value).
/// MongoDB hashes with MD5; what matters here is that equal values hash
/// alike and neighbours scatter.
pub fn hash64(value: u128) -> u64 {
    mix64((value as u64) ^ mix64((value >> 64) as u64 ^ 0x5EED_0002))
}

/// A log's `type`, skewed 80/15/5 in the default workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogType {
    /// `"app"`, 80 % of the logs.
    App,
    /// `"web"`, 15 %.
    Web,
    /// `"admin"`, 5 %.
    Admin,
}

impl LogType {
    /// The three types, in the order of [`Workload::mix`] and
    /// [`Row::query_shards`].
    pub const ALL: [LogType; 3] = [LogType::App, LogType::Web, LogType::Admin];

    /// The stored string.
    pub fn name(self) -> &'static str {
        match self {
            LogType::App => "app",
            LogType::Web => "web",
            LogType::Admin => "admin",
        }
    }

    /// The key encoding: it orders as the strings do
    /// (`"admin" < "app" < "web"`), and is never 0 (MinKey).
    pub fn code(self) -> u128 {
        match self {
            LogType::Admin => 1,
            LogType::App => 2,
            LogType::Web => 3,
        }
    }
}

/// A log's `level`: on no key, generated for a realistic document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// `"info"`, 90 %.
    Info,
    /// `"warn"`, 8 %.
    Warn,
    /// `"error"`, 2 %.
    Error,
}

impl Level {
    /// The key encoding, in string order (`"error" < "info" < "warn"`).
    pub fn code(self) -> u128 {
        match self {
            Level::Error => 1,
            Level::Info => 2,
            Level::Warn => 3,
        }
    }
}

/// One log as the model sees it. `msg` is left out: no key uses it, and
/// sizes are counted in documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogDoc {
    /// A random version 4 UUID.
    pub id: u128,
    /// `type`.
    pub log_type: LogType,
    /// `level`.
    pub level: Level,
    /// Seconds since the Unix epoch.
    pub ts: i64,
    /// The start of `ts`'s calendar month (UTC), in epoch seconds: what the
    /// repository derives as the `month` date.
    pub month: i64,
}

/// The start of the calendar month (UTC) holding `ts`, in epoch seconds,
/// by the same [`truncate`] the repository derives `month` with.
pub fn month_start(ts: i64) -> i64 {
    let t = DateTime::from_millis(ts.saturating_mul(1000));
    truncate(t, Granularity::Month)
        .timestamp_millis()
        .div_euclid(1000)
}

/// The start of the month `n` months after the month holding `ts`.
pub fn add_months(ts: i64, n: u32) -> i64 {
    let mut m = month_start(ts);
    for _ in 0..n {
        // 32 days past a month's first day is always in the next month.
        m = month_start(m + 32 * 86_400);
    }
    m
}

/// An instant as a key component: the sign bit flipped, so the unsigned
/// order is the signed order and the epoch is not MinKey.
pub fn encode_time(secs: i64) -> u128 {
    u128::from((secs as u64) ^ (1 << 63))
}

/// A field of [`LogDoc`] a key can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `id`, a random UUID.
    Id,
    /// `type`.
    Type,
    /// `level`.
    Level,
    /// `ts`.
    Ts,
    /// `month`, derived from `ts`.
    Month,
}

impl Field {
    /// The BSON field name.
    pub fn name(self) -> &'static str {
        match self {
            Field::Id => "id",
            Field::Type => "type",
            Field::Level => "level",
            Field::Ts => "ts",
            Field::Month => "month",
        }
    }

    /// The field's value in `doc`, encoded so that `u128` order is BSON
    /// order for the field's type and 0 and `u128::MAX` never occur.
    pub fn value(self, doc: &LogDoc) -> u128 {
        match self {
            Field::Id => doc.id,
            Field::Type => doc.log_type.code(),
            Field::Level => doc.level.code(),
            Field::Ts => encode_time(doc.ts),
            Field::Month => encode_time(doc.month),
        }
    }
}

/// A shard key value (or a bound): one encoded component per key field,
/// compared lexicographically; unused components are 0.
/// [`KeyValue::MIN`] and [`KeyValue::MAX`] are MinKey and MaxKey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyValue(pub [u128; MAX_KEY_FIELDS]);

impl KeyValue {
    /// MinKey: below every document.
    pub const MIN: KeyValue = KeyValue([0; MAX_KEY_FIELDS]);
    /// MaxKey: above every document (chunk upper bounds are exclusive).
    pub const MAX: KeyValue = KeyValue([u128::MAX; MAX_KEY_FIELDS]);
}

/// A shard key: ranges over one or more fields (`{month: 1, type: 1}`) or
/// over the hash of one field (`{id: "hashed"}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardKey {
    fields: Vec<Field>,
    hashed: bool,
}

impl ShardKey {
    /// A range key on `fields`, in key order.
    ///
    /// # Panics
    /// With no field, more than [`MAX_KEY_FIELDS`], or one field twice.
    pub fn range(fields: &[Field]) -> Self {
        assert!(
            (1..=MAX_KEY_FIELDS).contains(&fields.len()),
            "a shard key has 1 to {MAX_KEY_FIELDS} fields"
        );
        for (i, f) in fields.iter().enumerate() {
            assert!(
                !fields[..i].contains(f),
                "`{}` twice in a shard key",
                f.name()
            );
        }
        ShardKey {
            fields: fields.to_vec(),
            hashed: false,
        }
    }

    /// A hashed key on `field`.
    pub fn hashed(field: Field) -> Self {
        ShardKey {
            fields: vec![field],
            hashed: true,
        }
    }

    /// The key's fields, in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Whether it is a hashed key.
    pub fn is_hashed(&self) -> bool {
        self.hashed
    }

    /// `doc`'s key value.
    pub fn value_of(&self, doc: &LogDoc) -> KeyValue {
        let mut k = KeyValue::MIN;
        if self.hashed {
            k.0[0] = hashed_component(hash64(self.fields[0].value(doc)));
        } else {
            for (c, f) in k.0.iter_mut().zip(&self.fields) {
                *c = f.value(doc);
            }
        }
        k
    }

    /// The five keys the seed discusses, in its order: `{type: 1}`,
    /// `{ts: 1}`, `{id: 1}`, `{id: "hashed"}`, `{month: 1, type: 1}`.
    pub fn seed_keys() -> Vec<ShardKey> {
        vec![
            ShardKey::range(&[Field::Type]),
            ShardKey::range(&[Field::Ts]),
            ShardKey::range(&[Field::Id]),
            ShardKey::hashed(Field::Id),
            ShardKey::range(&[Field::Month, Field::Type]),
        ]
    }
}

impl fmt::Display for ShardKey {
    /// As `shardCollection` takes it: `{month: 1, type: 1}`, `{id: "hashed"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .fields
            .iter()
            .map(|x| {
                if self.hashed {
                    format!("{}: \"hashed\"", x.name())
                } else {
                    format!("{}: 1", x.name())
                }
            })
            .collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// A 64-bit hash as a key component: shifted by one so that it is never
/// MinKey.
fn hashed_component(h: u64) -> u128 {
    u128::from(h) + 1
}

/// A predicate on one field, in [`Field::value`]'s encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predicate {
    /// `{field: v}`.
    Eq(u128),
    /// `{field: {$gte: lo, $lt: hi}}`.
    Range {
        /// Inclusive.
        lo: u128,
        /// Exclusive.
        hi: u128,
    },
}

/// A query's predicates, ANDed: what mongos routes by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// One predicate per field at most; later ones on the same field are
    /// ignored.
    pub predicates: Vec<(Field, Predicate)>,
}

impl Query {
    /// The seed's query, "the logs of type `t` in the month starting at
    /// `month`", as an application using `{month, type}` writes it: `month`
    /// equal, `type` equal, and `ts` in the month (which is what lets a
    /// `{ts}` key target it).
    pub fn month_of_type(month: i64, t: LogType) -> Query {
        Query {
            predicates: vec![
                (Field::Month, Predicate::Eq(encode_time(month))),
                (Field::Type, Predicate::Eq(t.code())),
                (
                    Field::Ts,
                    Predicate::Range {
                        lo: encode_time(month),
                        hi: encode_time(add_months(month, 1)),
                    },
                ),
            ],
        }
    }

    fn get(&self, field: Field) -> Option<Predicate> {
        self.predicates
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, p)| *p)
    }
}

/// Where a query goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targeting {
    /// Routed by the key (false: broadcast to every shard with a chunk).
    pub targeted: bool,
    /// Chunks that can hold a match (all of them for a broadcast).
    pub chunks: usize,
    /// Distinct shards the query is sent to.
    pub shards: usize,
}

/// The MongoDB balancer's classic migration threshold (before 6.0) for a
/// collection of `total_chunks` chunks: the chunk-count difference between
/// the most and the least loaded shard at which a round starts.
pub fn migration_threshold(total_chunks: usize) -> usize {
    match total_chunks {
        0..=19 => 2,
        20..=79 => 4,
        _ => 8,
    }
}

/// The cluster's knobs. [`Params::new`] derives the balancer interval from
/// the chunk size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Shards in the cluster.
    pub shards: usize,
    /// A chunk holding more documents than this splits (the chunk size).
    pub chunk_docs: usize,
    /// The balancer runs after every this many inserts (0: only when
    /// [`Cluster::balance`] is called). The default, an eighth of a chunk,
    /// lets it react well before the next split, as MongoDB's balancer
    /// (a round every 10 s) does under a steady log stream.
    pub balance_every: usize,
    /// Chunks per shard an empty hashed collection starts with.
    pub hashed_chunks_per_shard: usize,
    /// MongoDB's top-chunk optimization (see the module docs); off by
    /// default.
    pub top_chunk_optimization: bool,
    /// Insert windows for [`Row::hot_window_share`] (100: 1 % of the
    /// inserts each).
    pub windows: usize,
    /// Documents per storage page for [`Row::page_reads_per_moved_doc`]:
    /// a document's page is its insertion index divided by this.
    pub page_docs: usize,
}

impl Params {
    /// `shards` shards, chunks of `chunk_docs` documents, the balancer every
    /// `chunk_docs / 8` inserts, the rest as [`Params::default`].
    pub fn new(shards: usize, chunk_docs: usize) -> Self {
        Params {
            shards,
            chunk_docs,
            balance_every: (chunk_docs / 8).max(1),
            hashed_chunks_per_shard: 2,
            top_chunk_optimization: false,
            windows: 100,
            page_docs: 100,
        }
    }
}

impl Default for Params {
    /// 4 shards, chunks of 32,768 documents.
    fn default() -> Self {
        Params::new(4, 32_768)
    }
}

/// Counters of a [`Cluster`] since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Documents inserted.
    pub inserts: u64,
    /// Successful chunk splits.
    pub splits: u64,
    /// Chunk migrations (balancer moves and top-chunk moves).
    pub migrations: u64,
    /// Documents the migrations copied.
    pub docs_moved: u64,
    /// Storage pages the migrations read (see [`Row::page_reads`]).
    pub page_reads: u64,
}

/// A chunk as [`Cluster::chunks`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkInfo {
    /// Inclusive lower bound.
    pub min: KeyValue,
    /// Exclusive upper bound.
    pub max: KeyValue,
    /// The shard that owns it.
    pub shard: usize,
    /// Documents in it.
    pub docs: usize,
    /// Over the chunk size with no split point.
    pub jumbo: bool,
}

#[derive(Debug)]
struct Chunk {
    min: KeyValue,
    max: KeyValue,
    shard: usize,
    /// (key, insertion index), unsorted between splits.
    docs: Vec<(KeyValue, u32)>,
    jumbo: bool,
}

/// The model of a sharded collection: chunks, shards and the balancer
/// (rules in the module docs).
#[derive(Debug)]
pub struct Cluster {
    key: ShardKey,
    params: Params,
    chunks: Vec<Chunk>,
    /// Chunk lower bound → index in `chunks`.
    by_min: BTreeMap<KeyValue, usize>,
    shard_chunks: Vec<usize>,
    shard_docs: Vec<u64>,
    stats: ClusterStats,
}

impl Cluster {
    /// An empty collection sharded on `key`: one chunk on shard 0, or for
    /// a hashed key `hashed_chunks_per_shard × shards` chunks spaced evenly
    /// over the hash space and dealt round-robin.
    ///
    /// # Panics
    /// With no shard or a chunk size of 0.
    pub fn new(key: ShardKey, params: Params) -> Self {
        assert!(params.shards > 0, "a cluster needs a shard");
        assert!(params.chunk_docs > 0, "the chunk size must be positive");
        let mut c = Cluster {
            key,
            chunks: Vec::new(),
            by_min: BTreeMap::new(),
            shard_chunks: vec![0; params.shards],
            shard_docs: vec![0; params.shards],
            stats: ClusterStats::default(),
            params,
        };
        let n = if c.key.hashed {
            (c.params.shards * c.params.hashed_chunks_per_shard).max(1)
        } else {
            1
        };
        let mut bounds = vec![KeyValue::MIN];
        for i in 1..n {
            let h = ((1u128 << 64) * i as u128 / n as u128) as u64;
            let mut b = KeyValue::MIN;
            b.0[0] = hashed_component(h);
            bounds.push(b);
        }
        bounds.push(KeyValue::MAX);
        for (i, w) in bounds.windows(2).enumerate() {
            c.add_chunk(w[0], w[1], i % c.params.shards, Vec::new());
        }
        c
    }

    fn add_chunk(
        &mut self,
        min: KeyValue,
        max: KeyValue,
        shard: usize,
        docs: Vec<(KeyValue, u32)>,
    ) -> usize {
        let id = self.chunks.len();
        self.shard_chunks[shard] += 1;
        self.shard_docs[shard] += docs.len() as u64;
        self.chunks.push(Chunk {
            min,
            max,
            shard,
            docs,
            jumbo: false,
        });
        self.by_min.insert(min, id);
        id
    }

    /// The shard key.
    pub fn key(&self) -> &ShardKey {
        &self.key
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The counters.
    pub fn stats(&self) -> ClusterStats {
        self.stats
    }

    /// Chunks per shard.
    pub fn shard_chunk_counts(&self) -> &[usize] {
        &self.shard_chunks
    }

    /// Documents per shard.
    pub fn shard_doc_counts(&self) -> &[u64] {
        &self.shard_docs
    }

    /// All chunks, in key order.
    pub fn chunks(&self) -> Vec<ChunkInfo> {
        self.by_min
            .values()
            .map(|&i| {
                let c = &self.chunks[i];
                ChunkInfo {
                    min: c.min,
                    max: c.max,
                    shard: c.shard,
                    docs: c.docs.len(),
                    jumbo: c.jumbo,
                }
            })
            .collect()
    }

    fn chunk_of(&self, k: &KeyValue) -> usize {
        *self
            .by_min
            .range(..=*k)
            .next_back()
            .expect("the first chunk starts at MinKey")
            .1
    }

    /// Inserts `doc` into the chunk its key falls in, splits that chunk if
    /// it outgrew the chunk size, and runs the balancer when its interval
    /// comes round. Returns the shard the insert went to.
    pub fn insert(&mut self, doc: &LogDoc) -> usize {
        let k = self.key.value_of(doc);
        let id = self.chunk_of(&k);
        let index = u32::try_from(self.stats.inserts).expect("at most 2^32 inserts");
        let shard = self.chunks[id].shard;
        let c = &mut self.chunks[id];
        // A jumbo chunk holds one key value: only a different one gives it a
        // split point again.
        let retry = !c.jumbo || c.docs[0].0 != k;
        c.docs.push((k, index));
        self.shard_docs[shard] += 1;
        self.stats.inserts += 1;
        if retry && self.chunks[id].docs.len() > self.params.chunk_docs {
            self.split(id);
        }
        let every = self.params.balance_every;
        if every > 0 && self.stats.inserts.is_multiple_of(every as u64) {
            self.balance();
        }
        shard
    }

    /// Splits chunk `id` (and the halves, while one is still over the
    /// chunk size) at the median key, or marks it jumbo.
    fn split(&mut self, id: usize) {
        let mut work = vec![id];
        while let Some(id) = work.pop() {
            let limit = self.params.chunk_docs;
            let top_opt = self.params.top_chunk_optimization && !self.key.hashed;
            let c = &mut self.chunks[id];
            if c.docs.len() <= limit {
                c.jumbo = false;
                continue;
            }
            c.docs.sort_unstable();
            let first = c.docs[0].0;
            let is_top = c.max == KeyValue::MAX;
            let last = c.docs[c.docs.len() - 1].0;
            let point = if top_opt && is_top && last > first {
                // MongoDB's top-chunk split: at the largest key, leaving the
                // new top chunk (nearly) empty for the inserts to come.
                Some(last)
            } else {
                let median = c.docs[c.docs.len() / 2].0;
                if median > first {
                    Some(median)
                } else {
                    // The median is the smallest key: split after its run.
                    let p = c.docs.partition_point(|d| d.0 <= first);
                    c.docs.get(p).map(|d| d.0)
                }
            };
            let Some(point) = point else {
                c.jumbo = true;
                continue;
            };
            c.jumbo = false;
            let at = c.docs.partition_point(|d| d.0 < point);
            let right = c.docs.split_off(at);
            let (max, shard) = (c.max, c.shard);
            c.max = point;
            self.shard_docs[shard] -= right.len() as u64;
            let new = self.add_chunk(point, max, shard, right);
            self.stats.splits += 1;
            work.push(id);
            work.push(new);
            if top_opt && is_top && self.params.balance_every > 0 {
                let to = argmin(&self.shard_chunks);
                if to != shard {
                    self.migrate(new, to);
                }
            }
        }
    }

    /// One balancer round (the classic rules in the module docs). Returns
    /// the number of chunks it moved.
    pub fn balance(&mut self) -> usize {
        let mut moved = 0;
        loop {
            let threshold = if moved > 0 {
                2
            } else {
                migration_threshold(self.chunks.len())
            };
            let from = argmax(&self.shard_chunks);
            let to = argmin(&self.shard_chunks);
            if self.shard_chunks[from] - self.shard_chunks[to] < threshold {
                return moved;
            }
            let candidate = self
                .by_min
                .values()
                .copied()
                .find(|&i| self.chunks[i].shard == from && !self.chunks[i].jumbo);
            let Some(id) = candidate else {
                // All of the donor's chunks are jumbo.
                return moved;
            };
            self.migrate(id, to);
            moved += 1;
        }
    }

    /// Moves chunk `id` to shard `to`, reading its documents in key order
    /// as `moveChunk` does through the shard key index.
    fn migrate(&mut self, id: usize, to: usize) {
        let page_docs = self.params.page_docs.max(1) as u32;
        let c = &mut self.chunks[id];
        c.docs.sort_unstable();
        let mut reads = 0;
        let mut last_page = None;
        for &(_, index) in &c.docs {
            let page = index / page_docs;
            if last_page != Some(page) {
                reads += 1;
                last_page = Some(page);
            }
        }
        let n = c.docs.len() as u64;
        let from = c.shard;
        c.shard = to;
        self.shard_chunks[from] -= 1;
        self.shard_chunks[to] += 1;
        self.shard_docs[from] -= n;
        self.shard_docs[to] += n;
        self.stats.migrations += 1;
        self.stats.docs_moved += n;
        self.stats.page_reads += reads;
    }

    /// Where mongos would send `query` (rules in the module docs).
    pub fn target(&self, query: &Query) -> Targeting {
        let owners = self.shard_chunks.iter().filter(|&&n| n > 0).count();
        let broadcast = Targeting {
            targeted: false,
            chunks: self.chunks.len(),
            shards: owners,
        };
        let Some((lo, hi)) = self.interval(query) else {
            return broadcast;
        };
        let mut shards = vec![false; self.params.shards];
        let mut chunks = 0;
        if lo <= hi {
            let start = self.chunk_of(&lo);
            let starting = self.chunks[start].min;
            for (_, &i) in self.by_min.range(starting..=hi) {
                let c = &self.chunks[i];
                if c.min <= hi && lo < c.max {
                    chunks += 1;
                    shards[c.shard] = true;
                }
            }
        }
        Targeting {
            targeted: true,
            chunks,
            shards: shards.iter().filter(|&&s| s).count(),
        }
    }

    /// The inclusive key interval `query` covers, or `None` when it cannot
    /// be routed (no predicate on the key's first field, or a range on a
    /// hashed field).
    fn interval(&self, query: &Query) -> Option<(KeyValue, KeyValue)> {
        let mut lo = KeyValue::MIN;
        let mut hi = KeyValue::MIN;
        if self.key.hashed {
            let Some(Predicate::Eq(v)) = query.get(self.key.fields[0]) else {
                return None;
            };
            lo.0[0] = hashed_component(hash64(v));
            return Some((lo, lo));
        }
        let n = self.key.fields.len();
        for (i, f) in self.key.fields.iter().enumerate() {
            let open_from = match query.get(*f) {
                Some(Predicate::Eq(v)) => {
                    lo.0[i] = v;
                    hi.0[i] = v;
                    continue;
                }
                Some(Predicate::Range { lo: a, hi: b }) => {
                    if b <= a {
                        // Empty: an interval with lo > hi matches no chunk.
                        return Some((KeyValue::MAX, KeyValue::MIN));
                    }
                    lo.0[i] = a;
                    hi.0[i] = b - 1;
                    i + 1
                }
                None if i == 0 => return None,
                None => i,
            };
            lo.0[open_from..n].fill(0);
            hi.0[open_from..n].fill(u128::MAX);
            break;
        }
        Some((lo, hi))
    }
}

/// The first index of the largest value.
fn argmax(v: &[usize]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// The first index of the smallest value.
fn argmin(v: &[usize]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x < v[best] {
            best = i;
        }
    }
    best
}

/// The seed's workload: logs in `ts` order over whole calendar months.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Logs to insert.
    pub logs: usize,
    /// Calendar months they span.
    pub months: u32,
    /// The first month's start, in epoch seconds (UTC).
    pub start: i64,
    /// Relative weights of app, web and admin ([`LogType::ALL`] order).
    pub mix: [u32; 3],
    /// The PRNG seed.
    pub seed: u64,
}

impl Default for Workload {
    /// 1,000,000 logs over the 24 months from 2023-01, 80/15/5, seed 2.
    fn default() -> Self {
        Workload {
            logs: 1_000_000,
            months: 24,
            start: 1_672_531_200, // 2023-01-01T00:00:00Z
            mix: [80, 15, 5],
            seed: 2,
        }
    }
}

/// The logs of `w`: `ts` evenly spread over the months (so a 31-day month
/// holds more logs than February), ascending; a random UUID each; the type
/// drawn by `w.mix`; `month` derived from `ts`.
pub fn generate(w: &Workload) -> Vec<LogDoc> {
    let start = month_start(w.start);
    let span = (add_months(start, w.months) - start) as u128;
    let total = u64::from(w.mix.iter().sum::<u32>().max(1));
    let mut rng = SplitMix64::new(w.seed);
    let mut month = (i64::MIN, i64::MIN);
    (0..w.logs)
        .map(|i| {
            let ts = start + (i as u128 * span / w.logs as u128) as i64;
            if ts >= month.1 {
                month = (month_start(ts), add_months(ts, 1));
            }
            let id = rng.uuid_v4();
            let mut r = rng.below(total);
            let mut log_type = LogType::Admin;
            for (t, weight) in LogType::ALL.into_iter().zip(w.mix) {
                if r < u64::from(weight) {
                    log_type = t;
                    break;
                }
                r -= u64::from(weight);
            }
            let level = match rng.below(100) {
                0..=1 => Level::Error,
                2..=9 => Level::Warn,
                _ => Level::Info,
            };
            LogDoc {
                id,
                log_type,
                level,
                ts,
                month: month.0,
            }
        })
        .collect()
}

/// One key's results from one replay of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The key, as `shardCollection` takes it.
    pub key: String,
    /// The largest share of all inserts any one shard took over the run.
    pub insert_share: f64,
    /// The mean, over windows of 1 % of the inserts ([`Params::windows`]),
    /// of the share the busiest shard of that window took: how hot the hot
    /// shard is at any moment (1/shards is perfect, 1.0 is one shard).
    pub hot_window_share: f64,
    /// Chunks at the end.
    pub chunks: usize,
    /// Jumbo chunks at the end.
    pub jumbo_chunks: usize,
    /// Successful splits.
    pub splits: u64,
    /// Chunk migrations.
    pub migrations: u64,
    /// Documents the migrations copied.
    pub docs_moved: u64,
    /// Storage pages the migrations read: each migrated chunk is read in
    /// key order, and a read is counted whenever the next document lives on
    /// another page than the previous one (pages are runs of
    /// [`Params::page_docs`] documents in insertion order).
    pub page_reads: u64,
    /// `page_reads / docs_moved` (`None` without migrations): about
    /// 1/[`Params::page_docs`] when a chunk's documents were inserted
    /// together (sequential I/O), about 1 when key order is random with
    /// respect to insertion order (a random read per document).
    pub page_reads_per_moved_doc: Option<f64>,
    /// Shards the query "the last month of type X" goes to, per type in
    /// [`LogType::ALL`] order.
    pub query_shards: [usize; 3],
    /// Chunks that query can find documents in, per type.
    pub query_chunks: [usize; 3],
    /// Whether every query was targeted (false: a broadcast).
    pub queries_targeted: bool,
    /// Mean of [`Row::query_shards`].
    pub shards_per_query_mean: f64,
    /// Largest of [`Row::query_shards`].
    pub shards_per_query_max: usize,
    /// Documents on the fullest shard over the mean per shard at the end
    /// (1.0 is even).
    pub final_balance: f64,
}

/// Replays `docs` in order on a fresh cluster sharded on `key`, then routes
/// the query "the last month of type X" for each type.
pub fn simulate(key: &ShardKey, docs: &[LogDoc], params: &Params) -> Row {
    let mut cluster = Cluster::new(key.clone(), params.clone());
    let shards = params.shards;
    let n = docs.len();
    let window_len = n.div_ceil(params.windows.max(1)).max(1);
    let mut total = vec![0u64; shards];
    let mut window = vec![0u64; shards];
    let mut in_window = 0u64;
    let (mut share_sum, mut windows) = (0.0, 0u32);
    for doc in docs {
        let s = cluster.insert(doc);
        total[s] += 1;
        window[s] += 1;
        in_window += 1;
        if in_window == window_len as u64 {
            share_sum += max_u64(&window) as f64 / in_window as f64;
            windows += 1;
            window.fill(0);
            in_window = 0;
        }
    }
    if in_window > 0 {
        share_sum += max_u64(&window) as f64 / in_window as f64;
        windows += 1;
    }

    let mut query_shards = [0; 3];
    let mut query_chunks = [0; 3];
    let mut queries_targeted = true;
    if let Some(last) = docs.last() {
        for (i, t) in LogType::ALL.into_iter().enumerate() {
            let r = cluster.target(&Query::month_of_type(last.month, t));
            query_shards[i] = r.shards;
            query_chunks[i] = r.chunks;
            queries_targeted &= r.targeted;
        }
    }

    let stats = cluster.stats();
    let chunks = cluster.chunks();
    let per_shard = cluster.shard_doc_counts();
    let mean_docs = per_shard.iter().sum::<u64>() as f64 / shards as f64;
    Row {
        key: key.to_string(),
        insert_share: ratio(max_u64(&total), n as u64),
        hot_window_share: if windows == 0 {
            0.0
        } else {
            share_sum / f64::from(windows)
        },
        chunks: chunks.len(),
        jumbo_chunks: chunks.iter().filter(|c| c.jumbo).count(),
        splits: stats.splits,
        migrations: stats.migrations,
        docs_moved: stats.docs_moved,
        page_reads: stats.page_reads,
        page_reads_per_moved_doc: (stats.docs_moved > 0)
            .then(|| stats.page_reads as f64 / stats.docs_moved as f64),
        query_shards,
        query_chunks,
        queries_targeted,
        shards_per_query_mean: query_shards.iter().sum::<usize>() as f64 / 3.0,
        shards_per_query_max: query_shards.into_iter().max().unwrap_or(0),
        final_balance: if mean_docs > 0.0 {
            max_u64(per_shard) as f64 / mean_docs
        } else {
            0.0
        },
    }
}

fn max_u64(v: &[u64]) -> u64 {
    v.iter().copied().max().unwrap_or(0)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Generates `workload` once and replays it for each of `keys`.
pub fn compare_keys(keys: &[ShardKey], workload: &Workload, params: &Params) -> Vec<Row> {
    let docs = generate(workload);
    keys.iter().map(|k| simulate(k, &docs, params)).collect()
}

/// The seed's comparison: [`ShardKey::seed_keys`] on the same workload.
pub fn compare(workload: &Workload, params: &Params) -> Vec<Row> {
    compare_keys(&ShardKey::seed_keys(), workload, params)
}

/// `rows` as a markdown table, one row per key.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| shard key | top shard's inserts, whole run | top shard's inserts, 1% windows (mean) \
         | chunks | jumbo | migrations | docs moved | page reads (per moved doc) \
         | shards per query (mean / max) | chunks per query (mean) | final balance (max / mean docs) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        let reads = r.page_reads_per_moved_doc.map_or("–".to_owned(), |x| {
            format!("{} ({x:.3})", thousands(r.page_reads))
        });
        let routing = if r.queries_targeted {
            ""
        } else {
            " (broadcast)"
        };
        let chunks_mean = r.query_chunks.iter().sum::<usize>() as f64 / 3.0;
        let _ = writeln!(
            out,
            "| `{}` | {:.1} % | {:.1} % | {} | {} | {} | {} | {} | {:.2} / {}{} | {:.2} | {:.2} |",
            r.key,
            r.insert_share * 100.0,
            r.hot_window_share * 100.0,
            r.chunks,
            r.jumbo_chunks,
            thousands(r.migrations),
            thousands(r.docs_moved),
            reads,
            r.shards_per_query_mean,
            r.shards_per_query_max,
            routing,
            chunks_mean,
            r.final_balance,
        );
    }
    out
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}
