//! A deterministic model of a sharded cluster, to compare shard keys with
//! numbers rather than adjectives (the workload: application logs
//! `{id: uuid, type: "app"|"web"|"admin", level, ts: epoch seconds, msg}`).
//!
//! What each key is known for, and the metric of [`Row`] that shows it:
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
//!   key. MongoDB 6.0 removed auto-splitting on insert; the model keeps the
//!   classic behaviour.
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
//!
//! The crate is not published: the `shard_sim` benchmark and its tests use
//! it.

#![warn(missing_docs)]

mod cluster;
mod key;
mod logs;
mod patterns;
mod report;
mod rng;

pub use crate::cluster::{migration_threshold, ChunkInfo, Cluster, ClusterStats, Params};
pub use crate::key::{KeyValue, Predicate, Query, ShardKey, Targeting, MAX_KEY_FIELDS};
pub use crate::logs::{
    add_months, encode_time, generate, month_start, Field, Level, LogDoc, LogType, Workload,
};
pub use crate::patterns::{patterns_table, simulate_patterns, PatternRow, Streams};
pub use crate::report::{compare, compare_keys, markdown_table, simulate, Row};
pub use crate::rng::{hash64, SplitMix64};
