//! The keys that spoil a shard key, each a lint the user can allow.

use syn::{LitStr, Type};

use crate::ast::Field;
use crate::ctxt::Ctxt;

pub const MONOTONIC: &str = "monotonic";
pub const LOW_CARDINALITY: &str = "low_cardinality";
pub const COARSE_NOT_DERIVED: &str = "coarse_not_derived";
pub const MISSING_SEARCH: &str = "missing_search";
pub const LINTS: &[&str] = &[
    MONOTONIC,
    LOW_CARDINALITY,
    COARSE_NOT_DERIVED,
    MISSING_SEARCH,
];

/// Types whose values only grow as documents are written.
const MONOTONIC_TYPES: &[&str] = &[
    "DateTime",
    "OffsetDateTime",
    "ObjectId",
    "Timestamp",
    "SystemTime",
    "Instant",
];
/// Integer field names that suggest a timestamp or a counter.
const MONOTONIC_NAMES: &[&str] = &[
    "ts",
    "time",
    "timestamp",
    "created",
    "seq",
    "sequence",
    "counter",
    "version",
];

pub fn low_cardinality(cx: &Ctxt, at: &LitStr, field: &str) {
    cx.error_spanned_by(at, low_cardinality_message(field));
}

pub fn low_cardinality_message(field: &str) -> String {
    format!("`{field}` alone is a low-cardinality shard key (lint `low_cardinality`): it has a handful of values, so there can be no more chunks than values, each value's chunk can never split (jumbo), and its shard stays hot; put it after a coarse time field, as in `coarse = \"month\", from = \"ts\", search = \"{field}\"`, or `allow(low_cardinality)`")
}

pub fn is_bool(ty: &Type) -> bool {
    last_ident(ty).is_some_and(|i| i == "bool")
}

/// What `from` accepts (the runtime's `Timestamp` impls; `DateTime` is
/// bson's or chrono's, `OffsetDateTime` time's).
pub fn is_timestamp(ty: &Type) -> bool {
    last_ident(ty).is_some_and(|i| {
        ["DateTime", "OffsetDateTime", "i32", "i64", "u32", "u64"].contains(&i.as_str())
    })
}

fn last_ident(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

/// A timestamp or ObjectId by type, or an integer whose name says time or
/// sequence.
pub fn looks_monotonic(f: &Field) -> bool {
    let Some(ty) = last_ident(f.ty) else {
        return false;
    };
    if MONOTONIC_TYPES.contains(&ty.as_str()) {
        return true;
    }
    let integer = ["i32", "i64", "u32", "u64", "isize", "usize"].contains(&ty.as_str());
    let name = f.rust_name.to_lowercase();
    integer
        && (MONOTONIC_NAMES.contains(&name.as_str())
            || name.ends_with("_at")
            || name.ends_with("_time")
            || name.ends_with("_ts")
            || name.starts_with("created"))
}
