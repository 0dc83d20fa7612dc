//! The optional features `chrono`, `time` and `uuid`: their types in the
//! roles the patterns' marker traits gate, which a user cannot add for
//! them (neither the trait nor the type is theirs).
//!
//! | type | feature | roles |
//! | --- | --- | --- |
//! | `chrono::DateTime<Utc>` | `chrono` | bucket key, `order`, keyset sort key, shard key `from` |
//! | `time::OffsetDateTime` | `time` | bucket key, `order`, keyset sort key, shard key `from` |
//! | `uuid::Uuid` | `uuid` | bucket key, keyset sort key |
//!
//! The patterns compare these fields as stored, so the field is stored as
//! the BSON type its role compares: a date for the two times, a binary of
//! subtype 4 for a UUID. Serde's own impls write strings (and `time` a
//! tuple), so the field names one of bson's serde helpers, which each
//! feature turns on:
//!
//! | type | bson 2 (`bson-2`) | bson 3 (`bson-3`) |
//! | --- | --- | --- |
//! | `chrono::DateTime<Utc>` | `serde_helpers::chrono_datetime_as_bson_datetime` | `serde_helpers::datetime::FromChrono04DateTime` |
//! | `time::OffsetDateTime` | `serde_helpers::time_0_3_offsetdatetime_as_bson_datetime` | `serde_helpers::datetime::FromTime03OffsetDateTime` |
//! | `uuid::Uuid` | `serde_helpers::uuid_1_as_binary` | `serde_helpers::uuid_1::AsBinary` |
//!
//! as in `#[serde(with = "mongo_patterns::bson::serde_helpers::uuid_1_as_binary")]`.
//! A key given to a bucket call (`page(&key, ..)`) is turned into the same
//! BSON value (`BucketKey::__stored`). A field stored without its helper
//! is refused where a pattern needs a date (`Error::UnsupportedValue` for
//! an `order` or `from` field), a bucket key without it does not read
//! back, and a sort key without it sorts as a string.

#[cfg(any(feature = "chrono", feature = "time", feature = "uuid"))]
use crate::{
    bson::Bson,
    bucket::BucketKey,
    error::{Error, Result},
    keyset::SortKey,
    util::impls,
};
#[cfg(any(feature = "chrono", feature = "time"))]
use crate::{
    bucket::OrderKey,
    shard_key::{TimeRepr, Timestamp},
};

/// A key's value back from its serde form: the serializer that wrote it
/// reads it (strings for chrono and uuid, a tuple for time).
#[cfg(any(feature = "chrono", feature = "time", feature = "uuid"))]
fn from_serde_form<K: serde::de::DeserializeOwned>(serde_form: Bson) -> Result<K> {
    crate::compat::from_bson(serde_form).map_err(|e| Error::invalid("key", e.to_string()))
}

#[cfg(feature = "chrono")]
mod chrono_impls {
    use super::*;
    use chrono::{DateTime, Utc};

    impl BucketKey for DateTime<Utc> {
        fn __stored(serde_form: Bson) -> Result<Bson> {
            let t: DateTime<Utc> = from_serde_form(serde_form)?;
            Ok(Bson::DateTime(crate::bson::DateTime::from_chrono(t)))
        }
    }
    impls!(OrderKey: DateTime<Utc>);
    impls!(SortKey: DateTime<Utc>);

    impl Timestamp for DateTime<Utc> {
        const REPR: TimeRepr = TimeRepr::DateTime;
    }
}

#[cfg(feature = "time")]
mod time_impls {
    use super::*;
    use time::OffsetDateTime;

    impl BucketKey for OffsetDateTime {
        fn __stored(serde_form: Bson) -> Result<Bson> {
            let t: OffsetDateTime = from_serde_form(serde_form)?;
            Ok(Bson::DateTime(crate::bson::DateTime::from_time_0_3(t)))
        }
    }
    impls!(OrderKey: OffsetDateTime);
    impls!(SortKey: OffsetDateTime);

    impl Timestamp for OffsetDateTime {
        const REPR: TimeRepr = TimeRepr::DateTime;
    }
}

#[cfg(feature = "uuid")]
mod uuid_impls {
    use super::*;
    use uuid::Uuid;

    impl BucketKey for Uuid {
        fn __stored(serde_form: Bson) -> Result<Bson> {
            let u: Uuid = from_serde_form(serde_form)?;
            Ok(Bson::from(crate::bson::Uuid::from(u)))
        }
    }
    impls!(SortKey: Uuid);
}
