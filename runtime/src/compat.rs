//! The few `bson` functions and types that bson 3 renamed, under one name
//! for both versions: the crate builds with the driver's `bson-2` (its
//! default) or `bson-3`, whichever the application turns on.

use mongodb::bson::{RawBson, RawBsonRef, RawDocumentBuf};

/// What serializing to BSON can fail with.
#[cfg(not(feature = "bson-3"))]
pub type SerError = mongodb::bson::ser::Error;
/// What serializing to BSON can fail with.
#[cfg(feature = "bson-3")]
pub type SerError = mongodb::bson::error::Error;

/// What deserializing from BSON can fail with.
#[cfg(not(feature = "bson-3"))]
pub type DeError = mongodb::bson::de::Error;
/// What deserializing from BSON can fail with.
#[cfg(feature = "bson-3")]
pub type DeError = mongodb::bson::error::Error;

/// What reading raw BSON can fail with.
#[cfg(not(feature = "bson-3"))]
pub(crate) type RawError = mongodb::bson::raw::Error;
#[cfg(feature = "bson-3")]
pub(crate) type RawError = mongodb::bson::error::Error;

#[cfg(feature = "bson-3")]
pub(crate) use mongodb::bson::{
    deserialize_from_bson as from_bson, deserialize_from_document as from_document,
    deserialize_from_slice as from_slice, serialize_to_bson as to_bson,
    serialize_to_document as to_document, serialize_to_vec as to_vec,
};
#[cfg(not(feature = "bson-3"))]
pub(crate) use mongodb::bson::{
    from_bson, from_document, from_slice, to_bson, to_document, to_vec,
};

/// An owned copy of a raw value.
pub(crate) fn to_raw_bson(v: RawBsonRef<'_>) -> RawBson {
    #[cfg(not(feature = "bson-3"))]
    {
        v.to_raw_bson()
    }
    #[cfg(feature = "bson-3")]
    {
        RawBson::from(v)
    }
}

/// A raw element's key as `str` (bson 3 keys are `CStr`).
#[cfg(not(feature = "bson-3"))]
pub(crate) fn key_str(k: &str) -> &str {
    k
}
#[cfg(feature = "bson-3")]
pub(crate) fn key_str(k: &mongodb::bson::raw::CStr) -> &str {
    k.as_str()
}

/// Appends `value` under `key`, which the caller guarantees holds no NUL
/// (it is a field name from the model); a key that did not would be
/// refused by the server, so it is skipped here rather than panicking.
pub(crate) fn append(doc: &mut RawDocumentBuf, key: &str, value: RawBson) {
    #[cfg(not(feature = "bson-3"))]
    {
        doc.append(key, value);
    }
    #[cfg(feature = "bson-3")]
    {
        if let Ok(key) = <&mongodb::bson::raw::CStr>::try_from(key) {
            doc.append(key, value);
        }
    }
}

/// A value or a document that has no raw BSON form (a key holding a NUL):
/// `what` it was (`"value"`, `"document"`) and bson's reason. The crate's
/// `Error` takes it as `InvalidArgument` (`error.rs`), so that this module
/// stays below it.
#[derive(Debug)]
pub(crate) struct NotRaw {
    pub(crate) what: &'static str,
    pub(crate) source: RawError,
}

/// `value` as raw BSON: a command built as bytes skips the driver's
/// serialization of a `Document`.
pub(crate) fn raw(value: &mongodb::bson::Bson) -> Result<RawBson, NotRaw> {
    RawBson::try_from(value.clone()).map_err(|source| NotRaw {
        what: "value",
        source,
    })
}

/// `d` as raw BSON.
pub(crate) fn raw_document(d: &mongodb::bson::Document) -> Result<RawDocumentBuf, NotRaw> {
    RawDocumentBuf::try_from(d).map_err(|source| NotRaw {
        what: "document",
        source,
    })
}

/// The model's deserialization error inside a driver error from a cursor
/// (`deserialize_current`, a typed `find`): its own kind with bson 2, a
/// bson error with bson 3. Any other error is given back.
pub(crate) fn deserialization(e: mongodb::error::Error) -> Result<DeError, mongodb::error::Error> {
    use mongodb::error::ErrorKind;
    match &*e.kind {
        ErrorKind::BsonDeserialization(source) => Ok(source.clone()),
        #[cfg(feature = "bson-3")]
        ErrorKind::Bson(source) => Ok(source.clone()),
        _ => Err(e),
    }
}
