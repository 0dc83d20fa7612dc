//! Resume tokens: a page's boundary key, opaque to clients.
//!
//! Layout, before URL-safe base64 without padding (version 2):
//! `[version: u8 = 2][flags: u8][fingerprint: u64 LE][BSON {"v": [key values..., _id]}]`
//! `[HMAC-SHA-256: 32 bytes, if flags & 1][FNV-1a 64 of all before: u64 LE]`.
//!
//! The fingerprint hashes the database, the collection, the sort keys, the
//! direction and the collation (when there is one), so a token is refused by
//! any other query (`Foreign`).
//!
//! Two modes. Unsigned, the checksum catches altered and cut tokens by
//! accident, not a forger: anyone can build a well-formed token, but it can
//! only move where a page starts inside the query's own filter, since
//! decoded values are plain BSON scalars (or documents of them) always used
//! as operands of comparison operators, never query operators. Signed
//! (a key on the query), the HMAC covers the token and the caller's filter:
//! a token that this key did not issue for this very filter is refused.
//!
//! Decoding is bounded before anything recursive runs: the string's length
//! first ([`MAX_TOKEN_LEN`]), then the nesting depth, walked iteratively over
//! the raw bytes ([`MAX_TOKEN_DEPTH`]). Only then are values decoded.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use mongodb::bson::raw::{RawBsonRef, RawDocument, RawIter};
use mongodb::bson::spec::ElementType;
use mongodb::bson::{Bson, Document};
use sha2::Sha256;

use crate::error::{CursorError, Error};

/// The longest token string [`PageToken::from_str`] decodes, in bytes
/// (characters: tokens are ASCII). Checked before base64 decoding, so a
/// huge token costs one comparison.
pub const MAX_TOKEN_LEN: usize = 4096;
/// The deepest document nesting a token value may have (a compound `_id`
/// of documents in documents). Checked without recursion before decoding.
pub const MAX_TOKEN_DEPTH: usize = 8;
/// The most bytes one document's sort values may take together (as BSON):
/// past it, a token would pass [`MAX_TOKEN_LEN`], so paging refuses the
/// document rather than hand out a token it could not read back.
pub const MAX_KEY_BYTES: usize = 2048;

const VERSION: u8 = 2;
const SIGNED: u8 = 1;
const HEADER: usize = 1 + 1 + 8;
const MAC: usize = 32;
const CHECKSUM: usize = 8;
/// Smallest BSON document: its length and its terminator.
const MIN_DOC: usize = 5;
/// Separates this crate's MACs from any other use of the same key.
const DOMAIN: &[u8] = b"mongo-patterns keyset token v2\0";

/// A secret for signing page tokens; `Debug` never shows it.
#[derive(Clone)]
pub(crate) struct SigningKey(pub(crate) Arc<[u8]>);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({} bytes)", self.0.len())
    }
}

/// Where a page ends, handed to clients as an opaque string.
///
/// `Display` writes the token; `FromStr` checks its length, encoding,
/// version, checksum, depth and value types. Whether it belongs to the
/// query it is used with (and, for a query with a signing key, its
/// signature) is checked when the page is fetched, before anything is sent.
#[derive(Clone, PartialEq)]
pub struct PageToken {
    fingerprint: u64,
    values: Vec<Bson>,
    mac: Option<[u8; MAC]>,
}

impl PageToken {
    pub(crate) fn new(fingerprint: u64, values: Vec<Bson>) -> Self {
        PageToken {
            fingerprint,
            values,
            mac: None,
        }
    }

    /// This token, signed with `key` for the filter whose BSON is `filter`.
    pub(crate) fn signed(mut self, key: &SigningKey, filter: &[u8]) -> Result<Self, Error> {
        let body = self.body(SIGNED);
        let mac = hmac(key, &body, filter)?;
        self.mac = Some(mac.finalize().into_bytes().into());
        Ok(self)
    }

    /// The boundary values, if the token was issued for `fingerprint` with
    /// `arity` values, and, when the query signs (`key` with its filter's
    /// BSON), signed by that key for that filter.
    pub(crate) fn values_for(
        &self,
        fingerprint: u64,
        arity: usize,
        key: Option<(&SigningKey, &[u8])>,
    ) -> Result<&[Bson], Error> {
        if self.fingerprint != fingerprint || self.values.len() != arity {
            return Err(CursorError::Foreign.into());
        }
        match (key, &self.mac) {
            (None, None) => {}
            (None, Some(_)) => return Err(CursorError::Foreign.into()),
            (Some(_), None) => return Err(CursorError::BadSignature.into()),
            (Some((key, filter)), Some(tag)) => {
                // Over the values as this build encodes them: what is
                // checked is exactly what will be used.
                hmac(key, &self.body(SIGNED), filter)?
                    .verify_slice(tag)
                    .map_err(|_| CursorError::BadSignature)?;
            }
        }
        Ok(&self.values)
    }

    /// Version, flags, fingerprint and values: what the MAC covers.
    fn body(&self, flags: u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(VERSION);
        out.push(flags);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        let mut doc = Document::new();
        doc.insert("v", Bson::Array(self.values.clone()));
        // Infallible: a document of plain values always serializes into a
        // Vec (`to_writer` fails only on I/O errors and invalid keys, and
        // our only key is "v").
        let _ = doc.to_writer(&mut out);
        out
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = self.body(if self.mac.is_some() { SIGNED } else { 0 });
        if let Some(tag) = &self.mac {
            out.extend_from_slice(tag);
        }
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, CursorError> {
        if bytes.len() < HEADER + MIN_DOC + CHECKSUM {
            return Err(CursorError::Truncated);
        }
        if bytes[0] != VERSION {
            return Err(CursorError::UnsupportedVersion(bytes[0]));
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM);
        if fnv1a64(body) != u64::from_le_bytes(array(sum)?) {
            return Err(CursorError::Corrupted);
        }
        let flags = body[1];
        if flags & !SIGNED != 0 {
            return Err(CursorError::Malformed(format!(
                "unknown flags {flags:#04x}"
            )));
        }
        let fingerprint = u64::from_le_bytes(array(&body[2..HEADER])?);
        let (doc, mac) = if flags & SIGNED != 0 {
            if body.len() < HEADER + MIN_DOC + MAC {
                return Err(CursorError::Truncated);
            }
            let (doc, tag) = body[HEADER..].split_at(body.len() - HEADER - MAC);
            (doc, Some(array(tag)?))
        } else {
            (&body[HEADER..], None)
        };
        let values = decode_values(doc)?;
        Ok(PageToken {
            fingerprint,
            values,
            mac,
        })
    }
}

fn hmac(key: &SigningKey, body: &[u8], filter: &[u8]) -> Result<Hmac<Sha256>, Error> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0)
        .map_err(|_| Error::invalid("signing_key", "not usable as an HMAC key"))?;
    mac.update(DOMAIN);
    mac.update(&(body.len() as u64).to_le_bytes());
    mac.update(body);
    mac.update(filter);
    Ok(mac)
}

fn array<const N: usize>(bytes: &[u8]) -> Result<[u8; N], CursorError> {
    bytes.try_into().map_err(|_| CursorError::Truncated)
}

/// `{"v": [values...]}`, checked without recursion, then decoded.
fn decode_values(bytes: &[u8]) -> Result<Vec<Bson>, CursorError> {
    let not_bson = |e: crate::compat::RawError| CursorError::Malformed(format!("not BSON: {e}"));
    let doc = RawDocument::from_bytes(bytes).map_err(not_bson)?;
    let mut fields = doc.iter_elements();
    let array = match fields.next() {
        Some(Ok(e)) if e.key() == "v" && e.element_type() == ElementType::Array => {
            match e.value().map_err(not_bson)? {
                RawBsonRef::Array(a) => a,
                _ => return Err(CursorError::Malformed("no key values".into())),
            }
        }
        Some(Err(e)) => return Err(not_bson(e)),
        _ => return Err(CursorError::Malformed("no key values".into())),
    };
    if fields.next().is_some() {
        return Err(CursorError::Malformed("unexpected fields".into()));
    }
    // Every element is checked (bounded, iterative) before any is decoded.
    let raw: Vec<RawBsonRef<'_>> = array
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(not_bson)?;
    if raw.is_empty() {
        return Err(CursorError::Malformed("no key values".into()));
    }
    for v in &raw {
        check_raw(*v)?;
    }
    raw.into_iter()
        .map(|v| {
            Bson::try_from(crate::compat::to_raw_bson(v))
                .map_err(|e| CursorError::Malformed(format!("not BSON: {e}")))
        })
        .collect()
}

/// Whether a raw value may stand in a token, and so in a query as a
/// comparison operand: the scalar types of [`SortKey`](super::SortKey), and
/// documents of them without `$` keys, at most [`MAX_TOKEN_DEPTH`] deep.
/// Arrays (no single sort position), code, regexes, MinKey/MaxKey and the
/// deprecated types are refused. Walks documents with an explicit stack: no
/// recursion, whatever the input. A scalar, the common case (every
/// document of a page has its sort values checked), is decided inline.
#[inline]
pub(crate) fn check_raw(v: RawBsonRef<'_>) -> Result<(), CursorError> {
    if positioned_scalar(&v) {
        return Ok(());
    }
    check_walk(v)
}

/// The scalar types that have a sort position.
#[inline]
fn positioned_scalar(v: &RawBsonRef<'_>) -> bool {
    matches!(
        v,
        RawBsonRef::Double(_)
            | RawBsonRef::String(_)
            | RawBsonRef::Boolean(_)
            | RawBsonRef::Null
            | RawBsonRef::Int32(_)
            | RawBsonRef::Int64(_)
            | RawBsonRef::Timestamp(_)
            | RawBsonRef::Binary(_)
            | RawBsonRef::ObjectId(_)
            | RawBsonRef::DateTime(_)
            | RawBsonRef::Decimal128(_)
    )
}

/// [`check_raw`] of a value that is not a positioned scalar.
fn check_walk(v: RawBsonRef<'_>) -> Result<(), CursorError> {
    let mut stack: Vec<RawIter<'_>> = Vec::new();
    let mut next = Some(v);
    loop {
        if let Some(v) = next.take() {
            match v {
                v if positioned_scalar(&v) => {}
                RawBsonRef::Document(d) => {
                    if stack.len() >= MAX_TOKEN_DEPTH {
                        return Err(CursorError::TooDeep {
                            limit: MAX_TOKEN_DEPTH,
                        });
                    }
                    stack.push(d.iter_elements());
                }
                other => {
                    return Err(CursorError::Malformed(format!(
                        "a value of type {:?} is not allowed",
                        other.element_type()
                    )))
                }
            }
        }
        let Some(top) = stack.last_mut() else {
            return Ok(());
        };
        match top.next() {
            None => {
                stack.pop();
            }
            Some(Err(e)) => return Err(CursorError::Malformed(format!("not BSON: {e}"))),
            Some(Ok(e)) => {
                if crate::compat::key_str(e.key()).starts_with('$') {
                    return Err(CursorError::Malformed(format!(
                        "operator key `{}`",
                        e.key()
                    )));
                }
                next = Some(
                    e.value()
                        .map_err(|e| CursorError::Malformed(format!("not BSON: {e}")))?,
                );
            }
        }
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

    /// Refuses a string longer than [`MAX_TOKEN_LEN`] before looking at it.
    fn from_str(s: &str) -> Result<Self, Error> {
        if s.len() > MAX_TOKEN_LEN {
            return Err(CursorError::TooLong {
                len: s.len(),
                limit: MAX_TOKEN_LEN,
            }
            .into());
        }
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

/// Parses straight from the deserializer's string, without copying it, so
/// an oversized token is refused before any allocation.
impl<'de> serde::Deserialize<'de> for PageToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Token;
        impl serde::de::Visitor<'_> for Token {
            type Value = PageToken;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a page token string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<PageToken, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson;
    use mongodb::bson::oid::ObjectId;

    fn token() -> PageToken {
        PageToken::new(
            7,
            vec![Bson::String("a\"b".into()), Bson::ObjectId(ObjectId::new())],
        )
    }

    fn key() -> SigningKey {
        SigningKey(Arc::from(&b"0123456789abcdef0123456789abcdef"[..]))
    }

    /// Token bytes built by hand around `doc`, with a valid checksum.
    fn forge_bytes(doc: &[u8]) -> Vec<u8> {
        let mut out = vec![VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        out.extend_from_slice(doc);
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn forge_doc(doc: &[u8]) -> Result<PageToken, Error> {
        URL_SAFE_NO_PAD
            .encode(forge_bytes(doc))
            .parse::<PageToken>()
    }

    fn forge(v: Bson) -> Result<PageToken, Error> {
        forge_doc(&crate::compat::to_vec(&bson::doc! {"v": [v]}).unwrap())
    }

    #[test]
    fn round_trips() {
        let t = token();
        let s = t.to_string();
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(s.parse::<PageToken>().unwrap(), t);
        let signed = token().signed(&key(), b"filter").unwrap();
        assert_eq!(
            signed.to_string().parse::<PageToken>().unwrap(),
            signed,
            "signed"
        );
    }

    #[test]
    fn every_single_byte_change_is_refused() {
        for t in [token(), token().signed(&key(), b"f").unwrap()] {
            let bytes = t.encode();
            for i in 0..bytes.len() {
                let mut b = bytes.clone();
                b[i] ^= 0x01;
                assert!(PageToken::decode(&b).is_err(), "flip at byte {i} accepted");
            }
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
        // Version 1 tokens (a 32-bit fingerprint without the database or
        // direction) are no longer read.
        b[0] = 1;
        assert_eq!(
            err(&URL_SAFE_NO_PAD.encode(&b)),
            CursorError::UnsupportedVersion(1)
        );
        let huge = "A".repeat(10 << 20);
        assert_eq!(
            err(&huge),
            CursorError::TooLong {
                len: 10 << 20,
                limit: MAX_TOKEN_LEN
            }
        );
    }

    /// A token built by hand with a valid checksum still cannot carry an
    /// operator or a code value.
    #[test]
    fn forged_operators_are_refused() {
        assert!(forge(Bson::Document(bson::doc! {"$ne": 1})).is_err());
        assert!(forge(Bson::Document(bson::doc! {"a": {"$where": "1"}})).is_err());
        assert!(forge(Bson::JavaScriptCode("sleep(1)".into())).is_err());
        assert!(forge(Bson::Array(vec![])).is_err());
        assert!(forge(Bson::MinKey).is_err());
        assert!(forge(Bson::Document(bson::doc! {"a": 1})).is_ok());
    }

    /// Nesting is refused past the limit without recursing, whatever the
    /// depth: 150 levels once aborted the process inside the BSON decoder.
    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let nest = |depth: usize| {
            let mut v = Bson::Int32(1);
            for _ in 0..depth {
                v = Bson::Document(bson::doc! {"a": v});
            }
            v
        };
        assert!(forge(nest(MAX_TOKEN_DEPTH)).is_ok());
        for depth in [MAX_TOKEN_DEPTH + 1, 150] {
            match forge(nest(depth)) {
                Err(Error::InvalidCursor(CursorError::TooDeep { .. })) => {}
                other => panic!("depth {depth} gave {other:?}"),
            }
        }
        // Deeper than bson itself could write, past the length limit so
        // straight to the decoder: built byte by byte.
        assert_eq!(
            PageToken::decode(&forge_bytes(&raw_nest(100_000))),
            Err(CursorError::TooDeep {
                limit: MAX_TOKEN_DEPTH
            })
        );
    }

    /// `{"v": [{"0": {"0": ...}}]}`, `depth` containers below the root.
    fn raw_nest(depth: usize) -> Vec<u8> {
        let total = 8 * depth + 5;
        let mut out = Vec::with_capacity(total);
        for i in 0..depth {
            let len = (total - 8 * i) as i32;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(if i == 0 { b"\x04v\0" } else { b"\x030\0" });
        }
        out.extend_from_slice(&5i32.to_le_bytes());
        out.resize(total, 0);
        out
    }

    #[test]
    fn serde_round_trips_and_refuses_oversized_strings() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Request {
            token: PageToken,
        }
        let doc = crate::compat::to_document(&Request { token: token() }).unwrap();
        let back: Request = crate::compat::from_document(doc).unwrap();
        assert_eq!(back.token, token_with(&back.token));
        let huge = bson::doc! {"token": "A".repeat(MAX_TOKEN_LEN + 1)};
        assert!(crate::compat::from_document::<Request>(huge).is_err());
    }

    /// `token()` holds a fresh ObjectId: rebuild it with `t`'s.
    fn token_with(t: &PageToken) -> PageToken {
        PageToken::new(7, vec![Bson::String("a\"b".into()), t.values[1].clone()])
    }

    #[test]
    fn foreign_tokens_are_refused() {
        let t = token();
        assert!(t.values_for(7, 2, None).is_ok());
        assert!(matches!(
            t.values_for(8, 2, None),
            Err(Error::InvalidCursor(CursorError::Foreign))
        ));
        assert!(t.values_for(7, 1, None).is_err());
    }

    #[test]
    fn signatures_bind_key_and_filter() {
        let k = key();
        let other = SigningKey(Arc::from(&b"another key, also 32 bytes long!"[..]));
        let t = token().signed(&k, b"tenant a").unwrap();
        let t: PageToken = t.to_string().parse().unwrap();
        assert!(t.values_for(7, 2, Some((&k, b"tenant a"))).is_ok());
        let bad = |r: Result<&[Bson], Error>| {
            matches!(r, Err(Error::InvalidCursor(CursorError::BadSignature)))
        };
        assert!(bad(t.values_for(7, 2, Some((&k, b"tenant b")))));
        assert!(bad(t.values_for(7, 2, Some((&other, b"tenant a")))));
        assert!(bad(token().values_for(7, 2, Some((&k, b"tenant a")))));
        assert!(matches!(
            t.values_for(7, 2, None),
            Err(Error::InvalidCursor(CursorError::Foreign))
        ));
        // A forger who changes a value and recomputes the checksum.
        let mut forged = t.clone();
        forged.values[0] = Bson::String("z".into());
        let forged: PageToken = forged.to_string().parse().unwrap();
        assert!(bad(forged.values_for(7, 2, Some((&k, b"tenant a")))));
    }
}
