// The crate's front page is the repository's README (runtime/README.md is
// a link to it, which `cargo package` follows), so every snippet in it is a
// doc test. The modules are listed in its pattern table; the guide module
// holds what every pattern shares.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod action;
pub mod approx_counter;
pub mod bucket;
mod compat;
mod cut;
pub mod ensure;
mod error;
mod foreign;
pub mod guide;
pub mod keyset;
mod model;
pub mod rank_histogram;
mod retry;
pub mod shard_key;
mod util;

pub use mongodb;
pub use mongodb::bson;

pub use crate::error::{CursorError, Error, Found, Result};
pub use crate::model::Model;
/// Derives [`Model`](trait@Model) and the patterns its attributes name.
pub use mongo_patterns_macros::Model;

/// What a user module needs: the derive, the trait, the paging types, serde's
/// derives and the BSON types models hold.
pub mod prelude {
    pub use crate::approx_counter::{Counter, CounterStats};
    pub use crate::bson::oid::ObjectId;
    pub use crate::bson::{doc, DateTime, Document};
    pub use crate::bucket::{BucketPage, Bucketed, Buckets, PageRequest};
    pub use crate::ensure::{Ensured, Plan};
    pub use crate::keyset::{Keyset, Page, PageToken};
    pub use crate::rank_histogram::{Rank, RankHistogram, Ranks, ScoreCount};
    pub use crate::shard_key::{ShardKeyed, Sharded, TimeRange};
    pub use crate::{Error, Model};
    pub use mongodb::{Client, Database};
    pub use serde::{Deserialize, Serialize};
}

/// What generated code calls. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::approx_counter::{ApproxCounted, Counter, CounterSpec, CounterValue, Mode};
    pub use crate::bucket::{
        key_of as bucket_key_of, BucketKey, BucketSpec, Bucketed, Buckets, KeyInItem, OrderKey,
    };
    pub use crate::ensure::{keyset_declared, Declared};
    pub use crate::keyset::{KeysetSpec, SortKey};
    pub use crate::model::Model;
    pub use crate::rank_histogram::{BoardKey, FloatScore, Layout, RankHistogram, RankSpec, Ranks};
    pub use crate::shard_key::{
        Coarse, CoarseSlot, Derived, Granularity, ShardKeyed, ShardSpec, Sharded, TimeRepr,
        Timestamp,
    };
    pub use core;
    pub use mongodb::bson::Bson;
    pub use mongodb::Database;
    pub use serde;
    pub use std::vec::Vec;

    /// The limits and defaults the derive checks and fills in, which it
    /// repeats; generated code asserts that both agree.
    pub mod limits {
        pub use crate::approx_counter::{DEFAULT_MAX_DELAY_MS, DEFAULT_MAX_KEYS, MAX_EVERY};
        pub use crate::bucket::MAX_SIZE as BUCKET_MAX_SIZE;
        pub use crate::keyset::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
    }

    /// Compiles only when `T` can be a keyset sort key; spanned at the field.
    pub const fn assert_sort_key<T: SortKey + ?Sized>() {}

    /// Compiles only when `T` can order a bucket's items; spanned at the field.
    pub const fn assert_order_key<T: OrderKey + ?Sized>() {}

    /// Compiles only when `T` can be an approximate counter; spanned at the
    /// field.
    pub const fn assert_counter_value<T: CounterValue>() {}

    /// Compiles only when `T` can hold a derived coarse field; spanned at the
    /// field.
    pub const fn assert_coarse_slot<T: CoarseSlot>() {}

    /// Compiles only when `T` can be a rank board; spanned at the field.
    pub const fn assert_board_key<T: BoardKey + ?Sized>() {}

    /// Compiles only when `precision` can round `T`; spanned at the field.
    pub const fn assert_float_score<T: FloatScore>() {}
}
