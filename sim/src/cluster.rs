//! The cluster: chunks, splits, jumbo chunks and the balancer.

use std::collections::BTreeMap;

use crate::key::{hashed_component, KeyValue, Predicate, Query, ShardKey, Targeting};
use crate::logs::LogDoc;
use crate::rng::hash64;

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
    /// Insert windows for [`Row::hot_window_share`](crate::Row::hot_window_share) (100: 1 % of the
    /// inserts each).
    pub windows: usize,
    /// Documents per storage page for [`Row::page_reads_per_moved_doc`](crate::Row::page_reads_per_moved_doc):
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
    /// Storage pages the migrations read (see [`Row::page_reads`](crate::Row::page_reads)).
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
        let n = if c.key.is_hashed() {
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

    /// The key the collection is sharded on.
    pub fn key(&self) -> &ShardKey {
        &self.key
    }

    /// The knobs it was created with.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// What it has done so far: inserts, splits and migrations.
    pub fn stats(&self) -> ClusterStats {
        self.stats
    }

    /// Chunks per shard, by shard index: what the classic balancer evens
    /// out.
    pub fn shard_chunk_counts(&self) -> &[usize] {
        &self.shard_chunks
    }

    /// Documents per shard, by shard index: the data balance, which
    /// counting chunks does not even out.
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
            let top_opt = self.params.top_chunk_optimization && !self.key.is_hashed();
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
        if self.key.is_hashed() {
            let Some(Predicate::Eq(v)) = query.get(self.key.fields()[0]) else {
                return None;
            };
            lo.0[0] = hashed_component(hash64(v));
            return Some((lo, lo));
        }
        let n = self.key.fields().len();
        for (i, f) in self.key.fields().iter().enumerate() {
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
