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
use error::failover;
mod feature;
mod foreign;
pub mod guide;
pub mod keyset;
mod model;
mod order;
mod paging;
pub mod progress;
pub mod rank_histogram;
mod retry;
pub mod shard_key;
mod task;
mod transaction;
mod util;

pub use mongodb;
pub use mongodb::bson;

pub use crate::ensure::Schema;
pub use crate::error::{CursorError, Error, Found, Result};
pub use crate::model::{Documents, Model};
/// Derives [`Model`](trait@Model) and the patterns its attributes name. The
/// reference of every attribute follows; its examples are compiled as doc
/// tests of `mongo-patterns-macros`.
pub use mongo_patterns_macros::Model;
/// Derives [`Schema`](trait@Schema) for a type stored inside a model: a
/// struct with named fields, or an enum (unit variants and variants with
/// data, in any of serde's taggings).
pub use mongo_patterns_macros::Schema;

/// What a user module needs: the derive, the trait, the paging types, serde's
/// derives, the BSON types models hold, the options every action takes
/// (with the driver's concern and read preference types) and
/// `TryStreamExt` for the streams.
pub mod prelude {
    pub use crate::action::Options;
    pub use crate::approx_counter::{Counter, CounterStats};
    pub use crate::bson::oid::ObjectId;
    pub use crate::bson::{doc, DateTime, Document};
    pub use crate::bucket::{BucketPage, Bucketed, Buckets, PageRequest};
    pub use crate::ensure::{Ensured, Plan};
    pub use crate::keyset::{Keyset, Page, PageToken};
    pub use crate::rank_histogram::{Rank, RankHistogram, Ranks, ScoreCount};
    pub use crate::shard_key::{ShardKeyed, Sharded, TimeRange};
    pub use crate::{Documents, Error, Model, Schema};
    pub use futures::TryStreamExt;
    pub use mongodb::options::{
        Acknowledgment, ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
    };
    pub use mongodb::{Client, Database};
    pub use serde::{Deserialize, Serialize};
}

/// What generated code calls. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::approx_counter::{ApproxCounted, Counter, CounterSpec, CounterValue, Mode};
    pub use crate::bucket::{
        key_of as bucket_key_of, BucketKey, BucketSpec, Bucketed, Buckets, KeyInItem, KeySharding,
        OrderKey,
    };
    pub use crate::ensure::{
        for_model, object_schema, probe, variant, with_fields, with_validation, Declared,
        FieldType, Nested, Schema, Validation, Wrap,
    };
    pub use crate::keyset::{KeysetSpec, SortKey};
    pub use crate::model::{Documents, Model};
    pub use crate::rank_histogram::{BoardKey, FloatScore, Layout, RankHistogram, RankSpec, Ranks};
    pub use crate::shard_key::{
        Coarse, CoarseSlot, Derived, Granularity, ShardKeyed, ShardSpec, Sharded, TimeRepr,
        Timestamp,
    };
    pub use core;
    pub use mongodb::bson::Bson;
    pub use mongodb::bson::Document;
    pub use mongodb::Database;
    pub use serde;
    pub use std::vec::Vec;

    /// What a model's keyset paging needs (see [`KeysetSpec::declared`]).
    pub fn keyset_declared(db: &Database, collection: &str, spec: KeysetSpec) -> Vec<Declared> {
        spec.declared(db, collection)
    }

    /// The limits and defaults the derive checks and fills in, which it
    /// repeats; generated code asserts that both agree.
    pub mod limits {
        pub use crate::approx_counter::{DEFAULT_MAX_DELAY_MS, DEFAULT_MAX_KEYS, MAX_EVERY};
        pub use crate::bucket::MAX_SIZE as BUCKET_MAX_SIZE;
        pub use crate::keyset::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};

        /// Whether the field names the derive refuses for a bucket's key
        /// and items (`fixed`, and every name starting with `prefix`) are
        /// the ones a bucket keeps for itself ([`crate::bucket::RESERVED`]):
        /// each of those refused, and each of `fixed` among them.
        pub const fn bucket_reserved_is(fixed: &[&str], prefix: &str) -> bool {
            let kept = crate::bucket::RESERVED;
            let mut i = 0;
            while i < kept.len() {
                if !contains(fixed, kept[i]) && !starts_with(kept[i], prefix) {
                    return false;
                }
                i += 1;
            }
            let mut j = 0;
            while j < fixed.len() {
                if !contains(kept, fixed[j]) {
                    return false;
                }
                j += 1;
            }
            true
        }

        const fn contains(list: &[&str], name: &str) -> bool {
            let mut i = 0;
            while i < list.len() {
                if eq(list[i].as_bytes(), name.as_bytes()) {
                    return true;
                }
                i += 1;
            }
            false
        }

        const fn starts_with(name: &str, prefix: &str) -> bool {
            let (n, p) = (name.as_bytes(), prefix.as_bytes());
            n.len() >= p.len() && same_start(n, p)
        }

        const fn eq(a: &[u8], b: &[u8]) -> bool {
            a.len() == b.len() && same_start(a, b)
        }

        /// `a` begins with `b` (`a` at least as long).
        const fn same_start(a: &[u8], b: &[u8]) -> bool {
            let mut i = 0;
            while i < b.len() {
                if a[i] != b[i] {
                    return false;
                }
                i += 1;
            }
            true
        }
    }

    /// Compiles only when `T` can be a keyset sort key; spanned at the field.
    pub const fn assert_sort_key<T: SortKey + ?Sized>() {}

    /// Compiles only when `T` can be a bucket key; spanned at the field.
    /// (The derive now checks it through `Bucketed::Key`; kept so that code
    /// generated by an earlier derive still compiles.)
    pub const fn assert_bucket_key<T: BucketKey + ?Sized>() {}

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
