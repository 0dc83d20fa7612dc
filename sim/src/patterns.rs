//! The patterns' write streams on a simulated cluster: score changes on
//! many boards (rank histogram, both layouts), increments of many counters
//! (approximate counter) and pushes to many customers (bucket), each under
//! its declared shard key and under the obvious bad keys.
//!
//! The cluster is small and generic: a chunk is a range of key values
//! (`u128`, hashed values hashed with [`hash64`]) holding documents; a
//! chunk past `chunk_docs` splits at its median key value, and one whose
//! documents all share one key value cannot split (jumbo); after each
//! split the balancer moves chunks from the shard with the most to the
//! shard with the fewest while they differ by more than
//! [`migration_threshold`]. A write goes to the shard of its document's
//! chunk; an operation whose filter does not carry the key's value (or
//! spans several chunks) goes to every shard whose chunks it may touch.
//! Everything is seeded: the same arguments give the same table.

use std::collections::BTreeMap;

use crate::cluster::migration_threshold;
use crate::rng::{hash64, SplitMix64};

/// One simulated collection: chunks of key values, each on a shard.
struct Chunks {
    shards: usize,
    chunk_docs: u64,
    /// Chunk lower bound → (shard, documents by key value).
    chunks: BTreeMap<u128, (usize, BTreeMap<u128, u64>)>,
    writes: Vec<u64>,
}

impl Chunks {
    fn new(shards: usize, chunk_docs: u64) -> Self {
        let mut chunks = BTreeMap::new();
        chunks.insert(0, (0, BTreeMap::new()));
        Chunks {
            shards,
            chunk_docs,
            chunks,
            writes: vec![0; shards],
        }
    }

    fn lower(&self, v: u128) -> u128 {
        *self.chunks.range(..=v).next_back().expect("chunk 0").0
    }

    fn shard_of(&self, v: u128) -> usize {
        self.chunks[&self.lower(v)].0
    }

    /// Shards whose chunks hold any value in `lo..=hi`.
    fn shards_in(&self, lo: u128, hi: u128) -> usize {
        let mut seen = vec![false; self.shards];
        seen[self.shard_of(lo)] = true;
        for (_, (s, _)) in self.chunks.range(lo..=hi) {
            seen[*s] = true;
        }
        seen.iter().filter(|x| **x).count()
    }

    /// A write to the document with key value `v`; `new` when it creates
    /// the document.
    fn write(&mut self, v: u128, new: bool) {
        let lower = self.lower(v);
        let (shard, docs) = self.chunks.get_mut(&lower).unwrap();
        self.writes[*shard] += 1;
        if new {
            *docs.entry(v).or_insert(0) += 1;
            let total: u64 = docs.values().sum();
            if total > self.chunk_docs && docs.len() > 1 {
                self.split(lower);
            }
        }
    }

    fn split(&mut self, lower: u128) {
        let (shard, docs) = self.chunks.remove(&lower).unwrap();
        let total: u64 = docs.values().sum();
        let mut acc = 0;
        let mut at = *docs.keys().next_back().unwrap();
        for (k, n) in &docs {
            acc += n;
            if acc * 2 >= total {
                at = *k;
                break;
            }
        }
        // Split just above the median value, unless it is the last one.
        let last = *docs.keys().next_back().unwrap();
        let cut = if at == last { at } else { at + 1 };
        let (mut left, mut right) = (BTreeMap::new(), BTreeMap::new());
        for (k, n) in docs {
            if k < cut {
                left.insert(k, n)
            } else {
                right.insert(k, n)
            };
        }
        self.chunks.insert(lower, (shard, left));
        self.chunks.insert(cut, (shard, right));
        self.balance();
    }

    fn balance(&mut self) {
        let threshold = migration_threshold(self.chunks.len());
        loop {
            let mut counts = vec![0usize; self.shards];
            for (s, _) in self.chunks.values() {
                counts[*s] += 1;
            }
            let (most, &hi) = counts.iter().enumerate().max_by_key(|(_, c)| **c).unwrap();
            let (least, &lo) = counts.iter().enumerate().min_by_key(|(_, c)| **c).unwrap();
            if hi - lo <= threshold {
                return;
            }
            // Moves the first movable chunk of the fullest shard.
            let lower = self
                .chunks
                .iter()
                .find(|(_, (s, d))| *s == most && !self.jumbo_docs(d))
                .map(|(l, _)| *l);
            match lower {
                Some(l) => self.chunks.get_mut(&l).unwrap().0 = least,
                None => return,
            }
        }
    }

    fn jumbo_docs(&self, docs: &BTreeMap<u128, u64>) -> bool {
        docs.len() == 1 && docs.values().sum::<u64>() > self.chunk_docs
    }

    fn jumbo(&self) -> usize {
        self.chunks
            .values()
            .filter(|(_, d)| self.jumbo_docs(d))
            .count()
    }

    fn hottest_share(&self) -> f64 {
        let total: u64 = self.writes.iter().sum();
        *self.writes.iter().max().unwrap() as f64 / total.max(1) as f64
    }
}

/// One row: a pattern's stream under one key.
#[derive(Debug, Clone)]
pub struct PatternRow {
    /// The pattern and its stream.
    pub pattern: &'static str,
    /// The shard key, as `shardCollection` takes it.
    pub key: &'static str,
    /// Whether the pattern declares this key.
    pub declared: bool,
    /// The hottest shard's share of the writes.
    pub hottest: f64,
    /// Chunks that cannot split.
    pub jumbo: usize,
    /// Operations sent to more than one shard.
    pub multi: u64,
    /// Operations in all.
    pub ops: u64,
    /// Chunks at the end.
    pub chunks: usize,
}

/// The stream's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Streams {
    /// Shards.
    pub shards: usize,
    /// Documents a chunk holds before it splits.
    pub chunk_docs: u64,
    /// Operations per stream.
    pub ops: u64,
    /// Boards, counters, customers.
    pub keys: u64,
    /// The seed.
    pub seed: u64,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            shards: 4,
            chunk_docs: 2_000,
            ops: 400_000,
            keys: 2_000,
            seed: 25,
        }
    }
}

/// A key drawn with recent keys hottest: keys are created in order (board
/// 0, 1, 2, ..., as monotonic ids are), and an operation picks among the
/// newest quarter half the time, uniformly otherwise.
fn pick(rng: &mut SplitMix64, created: u64) -> u64 {
    let created = created.max(1);
    if rng.below(2) == 0 {
        let recent = (created / 4).max(1);
        created - 1 - rng.below(recent)
    } else {
        rng.below(created)
    }
}

fn h(v: u128) -> u128 {
    hash64(v) as u128
}

fn row(
    pattern: &'static str,
    key: &'static str,
    declared: bool,
    c: &Chunks,
    multi: u64,
    ops: u64,
) -> PatternRow {
    PatternRow {
        pattern,
        key,
        declared,
        hottest: c.hottest_share(),
        jumbo: c.jumbo(),
        multi,
        ops,
        chunks: c.chunks.len(),
    }
}

/// Every pattern under each of its keys.
pub fn simulate_patterns(s: Streams) -> Vec<PatternRow> {
    let mut out = Vec::new();
    // Rank, array layout: one document per board; a score change writes
    // it, a rank reads it. Boards appear over time (monotonic ids).
    for (key, declared, hashed) in [
        ("{_id: \"hashed\"} (board)", true, true),
        ("{_id: 1} (board, ranged)", false, false),
    ] {
        let mut c = Chunks::new(s.shards, s.chunk_docs / 50);
        let mut rng = SplitMix64::new(s.seed);
        let mut created = 0;
        for i in 0..s.ops {
            if created < s.keys && i.is_multiple_of((s.ops / s.keys).max(1)) {
                let b = created as u128;
                c.write(if hashed { h(b) } else { b }, true);
                created += 1;
                continue;
            }
            let b = pick(&mut rng, created) as u128;
            c.write(if hashed { h(b) } else { b }, false);
        }
        out.push(row(
            "rank, array layout: score changes",
            key,
            declared,
            &c,
            0,
            s.ops,
        ));
    }
    // Rank, documents layout: one document per (board, score); a change
    // writes two of them (-1, +1); a rank reads one board's range.
    // Scores: 0..1000, a few boards hold most of them.
    for (key, declared) in [
        ("{_id.b: \"hashed\"} (board)", true),
        ("{_id: 1} (board, score)", false),
        ("{_id.b: 1} (board, ranged)", false),
        ("{count: 1}", false),
    ] {
        let mut c = Chunks::new(s.shards, s.chunk_docs);
        let mut rng = SplitMix64::new(s.seed);
        let mut seen = std::collections::HashSet::new();
        let mut counts: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        let (mut multi, mut ops) = (0, 0);
        let boards = (s.keys / 10).max(1);
        for i in 0..s.ops {
            let created = (i * boards / s.ops + 1).min(boards);
            let b = pick(&mut rng, created);
            let score = rng.below(1_000);
            let n = counts.entry((b, score)).or_insert(0);
            *n += 1;
            let count = *n;
            let v = |b: u64, sc: u64, count: u64| -> u128 {
                match key.as_bytes()[1] {
                    b'_' if key.starts_with("{_id.b: \"") => h(b as u128),
                    b'_' if key.starts_with("{_id.b") => b as u128,
                    b'_' => ((b as u128) << 32) | sc as u128,
                    _ => count as u128,
                }
            };
            let new = seen.insert((b, score));
            // `{count: 1}` moves the document with every change: the
            // write needs the old and new count, and is refused without
            // them (counted as going to every shard).
            c.write(v(b, score, count), new);
            ops += 1;
            if key.starts_with("{count") {
                multi += 1;
            }
            // Every 10th operation is a rank read of the board.
            if i.is_multiple_of(10) {
                ops += 1;
                let shards = match key {
                    k if k.starts_with("{_id.b: \"") => 1,
                    k if k.starts_with("{_id.b") => c.shards_in(b as u128, b as u128),
                    k if k.starts_with("{_id") => {
                        c.shards_in((b as u128) << 32, ((b as u128) << 32) | 0xffff_ffff)
                    }
                    _ => s.shards,
                };
                if shards > 1 {
                    multi += 1;
                }
            }
        }
        out.push(row(
            "rank, documents layout: score changes, 1 rank read in 10",
            key,
            declared,
            &c,
            multi,
            ops,
        ));
    }
    // Approximate counter: increments of many counters, ids monotonic.
    for (key, declared, hashed) in [
        ("{_id: \"hashed\"}", true, true),
        ("{_id: 1}", false, false),
    ] {
        let mut c = Chunks::new(s.shards, s.chunk_docs);
        let mut rng = SplitMix64::new(s.seed);
        let counters = s.keys * 50;
        let mut created = 0;
        for i in 0..s.ops {
            let target = (i * counters / s.ops + 1).min(counters);
            let (id, new) = if created < target {
                created += 1;
                (created - 1, true)
            } else {
                (pick(&mut rng, created), false)
            };
            let v = if hashed { h(id as u128) } else { id as u128 };
            c.write(v, new);
        }
        out.push(row(
            "approx counter: increments (upserts)",
            key,
            declared,
            &c,
            0,
            s.ops,
        ));
    }
    // Bucket: pushes to many customers; a bucket `{_id: {k, s}, customerId,
    // start}` holds 100 items; a page reads one customer's buckets.
    for (key, declared) in [
        ("{customerId: 1}", false),
        ("{customerId: \"hashed\"}", false),
        ("{_id: 1} ({k, s})", false),
        ("{start: 1} (time)", false),
    ] {
        let mut c = Chunks::new(s.shards, s.chunk_docs / 10);
        let mut rng = SplitMix64::new(s.seed);
        let mut items: Vec<u64> = vec![0; s.keys as usize];
        let (mut multi, mut ops) = (0, 0);
        for t in 0..s.ops {
            let cust = rng.below(s.keys);
            let n = items[cust as usize];
            items[cust as usize] += 1;
            let bucket = n / 100;
            let new = n.is_multiple_of(100);
            let start = if new { t } else { t - (n % 100) };
            let v = match key {
                "{customerId: 1}" => cust as u128,
                "{customerId: \"hashed\"}" => h(cust as u128),
                "{_id: 1} ({k, s})" => ((cust as u128) << 32) | bucket as u128,
                _ => start as u128,
            };
            c.write(v, new);
            ops += 1;
            // The push's filter names the customer (the key) but not the
            // bucket's start: under a time key it cannot be targeted.
            if key.starts_with("{start") {
                multi += 1;
            }
            if t.is_multiple_of(10) {
                ops += 1;
                let shards = match key {
                    "{customerId: 1}" => c.shards_in(cust as u128, cust as u128),
                    "{customerId: \"hashed\"}" => 1,
                    "{_id: 1} ({k, s})" => {
                        c.shards_in((cust as u128) << 32, ((cust as u128) << 32) | 0xffff_ffff)
                    }
                    _ => s.shards,
                };
                if shards > 1 {
                    multi += 1;
                }
            }
        }
        out.push(row(
            "bucket: pushes, 1 page read in 10",
            key,
            declared,
            &c,
            multi,
            ops,
        ));
    }
    out
}

/// The rows as a markdown table.
pub fn patterns_table(rows: &[PatternRow]) -> String {
    let mut out = String::from(
        "| pattern and stream | shard key | declared | hottest shard's share of writes | jumbo chunks | operations on more than one shard | chunks |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | `{}` | {} | {:.1}% | {} | {} of {} ({:.1}%) | {} |\n",
            r.pattern,
            r.key,
            if r.declared { "yes" } else { "" },
            r.hottest * 100.0,
            r.jumbo,
            r.multi,
            r.ops,
            r.multi as f64 * 100.0 / r.ops.max(1) as f64,
            r.chunks
        ));
    }
    out
}
