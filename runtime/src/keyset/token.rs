//! Resume tokens: a page's boundary key, opaque to clients.
//!
//! Layout, before URL-safe base64 without padding:
//! `[version: u8][fingerprint: u32 LE][BSON {"v": [key values..., _id]}][FNV-1a 64 of all before: u64 LE]`.
//!
//! The checksum catches altered and cut tokens; it is not a signature. A
//! client that forges a well-formed token can only move where a page starts
//! inside the query's own filter: decoded values are plain BSON scalars (or
//! documents of them), always used as operands of `$eq`/`$gt`/`$lt`, so they
//! never become query operators.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bson::{Bson, Document};

use crate::error::{CursorError, Error};

const VERSION: u8 = 1;
const HEADER: usize = 1 + 4;
const CHECKSUM: usize = 8;
/// Deepest document nesting accepted inside a token value.
const MAX_DEPTH: usize = 8;

/// Where a page ends, handed to clients as an opaque string.
///
/// `Display` writes the token; `FromStr` checks it fully (encoding, version,
/// checksum, value types). Whether it belongs to the query it is used with is
/// checked when the page is fetched.
#[derive(Clone, PartialEq)]
pub struct PageToken {
    fingerprint: u32,
    values: Vec<Bson>,
}

impl PageToken {
    pub(crate) fn new(fingerprint: u32, values: Vec<Bson>) -> Self {
        PageToken {
            fingerprint,
            values,
        }
    }

    /// The boundary values, if the token was issued for `fingerprint` with
    /// `arity` values.
    pub(crate) fn values_for(&self, fingerprint: u32, arity: usize) -> Result<&[Bson], Error> {
        if self.fingerprint != fingerprint || self.values.len() != arity {
            return Err(CursorError::Foreign.into());
        }
        Ok(&self.values)
    }

    fn encode(&self) -> Vec<u8> {
        let mut doc = Document::new();
        doc.insert("v", Bson::Array(self.values.clone()));
        let mut out = Vec::with_capacity(64);
        out.push(VERSION);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        // A document of plain values always serializes.
        doc.to_writer(&mut out).expect("writing BSON to a Vec");
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, CursorError> {
        if bytes.len() < HEADER + 5 + CHECKSUM {
            return Err(CursorError::Truncated);
        }
        if bytes[0] != VERSION {
            return Err(CursorError::UnsupportedVersion(bytes[0]));
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM);
        let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        if fnv1a64(body) != sum {
            return Err(CursorError::Corrupted);
        }
        let fingerprint = u32::from_le_bytes(body[1..HEADER].try_into().expect("4 bytes"));
        let mut rest = &body[HEADER..];
        let doc = Document::from_reader(&mut rest)
            .map_err(|e| CursorError::Malformed(format!("not BSON: {e}")))?;
        if !rest.is_empty() {
            return Err(CursorError::Malformed("trailing bytes".into()));
        }
        if doc.len() != 1 {
            return Err(CursorError::Malformed("unexpected fields".into()));
        }
        let values = match doc.get("v") {
            Some(Bson::Array(values)) if !values.is_empty() => values.clone(),
            _ => return Err(CursorError::Malformed("no key values".into())),
        };
        for v in &values {
            check_value(v, 0)?;
        }
        Ok(PageToken {
            fingerprint,
            values,
        })
    }
}

/// Whether `v` may stand in a token, and so in a query as a comparison
/// operand. Arrays are refused (their comparison semantics are not a sort
/// position), and so are documents with `$` keys and every code-like type.
pub(crate) fn check_value(v: &Bson, depth: usize) -> Result<(), CursorError> {
    match v {
        Bson::Double(_)
        | Bson::String(_)
        | Bson::Boolean(_)
        | Bson::Null
        | Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::Timestamp(_)
        | Bson::Binary(_)
        | Bson::ObjectId(_)
        | Bson::DateTime(_)
        | Bson::Decimal128(_) => Ok(()),
        Bson::Document(d) if depth < MAX_DEPTH => {
            for (k, v) in d {
                if k.starts_with('$') {
                    return Err(CursorError::Malformed(format!("operator key `{k}`")));
                }
                check_value(v, depth + 1)?;
            }
            Ok(())
        }
        other => Err(CursorError::Malformed(format!(
            "a value of type {:?} is not allowed",
            other.element_type()
        ))),
    }
}

/// FNV-1a, 64 bits: fixed forever, unlike `std`'s hasher, so tokens written
/// by one build are read by the next.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl fmt::Display for PageToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.encode()))
    }
}

/// Tokens are secrets of a kind (they show key values), so `Debug` shows the
/// token as a client would see it, not the decoded values.
impl fmt::Debug for PageToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageToken({self})")
    }
}

impl FromStr for PageToken {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bytes = URL_SAFE_NO_PAD
            .decode(s.trim())
            .map_err(|_| CursorError::NotBase64)?;
        Ok(PageToken::decode(&bytes)?)
    }
}

impl serde::Serialize for PageToken {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PageToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::oid::ObjectId;

    fn token() -> PageToken {
        PageToken::new(
            7,
            vec![Bson::String("a\"b".into()), Bson::ObjectId(ObjectId::new())],
        )
    }

    #[test]
    fn round_trips() {
        let t = token();
        let s = t.to_string();
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(s.parse::<PageToken>().unwrap(), t);
    }

    #[test]
    fn every_single_byte_change_is_refused() {
        let bytes = token().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            assert!(PageToken::decode(&b).is_err(), "flip at byte {i} accepted");
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let s = token().to_string();
        for n in 0..s.len() {
            assert!(s[..n].parse::<PageToken>().is_err(), "prefix {n} accepted");
        }
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let err = |s: &str| match s.parse::<PageToken>() {
            Err(Error::InvalidCursor(e)) => e,
            other => panic!("{s:?} gave {other:?}"),
        };
        assert_eq!(err("!!!"), CursorError::NotBase64);
        assert_eq!(err("AAAA"), CursorError::Truncated);
        let mut b = token().encode();
        b[0] = 9;
        assert_eq!(
            err(&URL_SAFE_NO_PAD.encode(&b)),
            CursorError::UnsupportedVersion(9)
        );
    }

    /// A token built by hand with a valid checksum still cannot carry an
    /// operator or a code value.
    #[test]
    fn forged_operators_are_refused() {
        let forge = |v: Bson| {
            let mut out = vec![VERSION, 0, 0, 0, 0];
            bson::doc! {"v": [v]}.to_writer(&mut out).unwrap();
            let sum = fnv1a64(&out);
            out.extend_from_slice(&sum.to_le_bytes());
            URL_SAFE_NO_PAD.encode(out).parse::<PageToken>()
        };
        assert!(forge(Bson::Document(bson::doc! {"$ne": 1})).is_err());
        assert!(forge(Bson::Document(bson::doc! {"a": {"$where": "1"}})).is_err());
        assert!(forge(Bson::JavaScriptCode("sleep(1)".into())).is_err());
        assert!(forge(Bson::Array(vec![])).is_err());
        assert!(forge(Bson::MinKey).is_err());
        assert!(forge(Bson::Document(bson::doc! {"a": 1})).is_ok());
    }

    #[test]
    fn foreign_tokens_are_refused() {
        let t = token();
        assert!(t.values_for(7, 2).is_ok());
        assert!(matches!(
            t.values_for(8, 2),
            Err(Error::InvalidCursor(CursorError::Foreign))
        ));
        assert!(t.values_for(7, 1).is_err());
    }
}
