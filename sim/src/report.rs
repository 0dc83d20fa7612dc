//! One replay of the workload per key, and the table of results.

use std::fmt::Write as _;

use mongo_patterns_testkit::bench::thousands;

use crate::cluster::{Cluster, Params};
use crate::key::{Query, ShardKey};
use crate::logs::{generate, LogDoc, LogType, Workload};

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

/// [`ShardKey::candidates`] on the same workload.
pub fn compare(workload: &Workload, params: &Params) -> Vec<Row> {
    compare_keys(&ShardKey::candidates(), workload, params)
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
