//! MongoDB's order of BSON values, across types: the order of a sort, of an
//! index, and of `$lt`/`$gt` within a type. Said once, here, for every
//! pattern that compares values as the server would (a shard key's
//! analysis, keyset boundaries, a bucket's items by `order`).
//!
//! Types first, in brackets ([`Bracket`], the server's canonical types):
//! MinKey < undefined < null < numbers < strings < documents < arrays <
//! binary < ObjectId < bool < date < timestamp < regex < DB pointer <
//! code < code with scope < MaxKey. Then the values within a bracket
//! ([`cmp`]). A missing field sorts as null: a caller with an
//! `Option<&Bson>` compares `unwrap_or(&Bson::Null)`.

use std::cmp::Ordering;

use mongodb::bson::Bson;

/// A value's type bracket: every value of one sorts before every value of
/// the next. The server's canonical types (`canonicalizeBSONType`), so
/// that int, long, double and decimal are one bracket, as are string and
/// symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Bracket {
    MinKey,
    Undefined,
    /// Null, and a missing field.
    Null,
    /// Int, long, double and decimal; NaN first.
    Number,
    /// String and symbol.
    String,
    Document,
    Array,
    Binary,
    ObjectId,
    Boolean,
    Date,
    Timestamp,
    Regex,
    DbPointer,
    Code,
    CodeWithScope,
    MaxKey,
}

/// `v`'s type bracket.
pub(crate) fn bracket(v: &Bson) -> Bracket {
    match v {
        Bson::MinKey => Bracket::MinKey,
        Bson::Undefined => Bracket::Undefined,
        Bson::Null => Bracket::Null,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => Bracket::Number,
        Bson::String(_) | Bson::Symbol(_) => Bracket::String,
        Bson::Document(_) => Bracket::Document,
        Bson::Array(_) => Bracket::Array,
        Bson::Binary(_) => Bracket::Binary,
        Bson::ObjectId(_) => Bracket::ObjectId,
        Bson::Boolean(_) => Bracket::Boolean,
        Bson::DateTime(_) => Bracket::Date,
        Bson::Timestamp(_) => Bracket::Timestamp,
        Bson::RegularExpression(_) => Bracket::Regex,
        Bson::DbPointer(_) => Bracket::DbPointer,
        Bson::JavaScriptCode(_) => Bracket::Code,
        Bson::JavaScriptCodeWithScope(_) => Bracket::CodeWithScope,
        Bson::MaxKey => Bracket::MaxKey,
    }
}

/// NaN, as a double or a decimal (whose combination field is all ones).
pub(crate) fn is_nan(v: &Bson) -> bool {
    match v {
        Bson::Double(f) => f.is_nan(),
        Bson::Decimal128(d) => d.bytes()[15] & 0x7c == 0x7c,
        _ => false,
    }
}

/// MongoDB's order of `a` and `b`: by [`Bracket`], then within it.
/// Numbers by value across int, long, double and decimal (a long and a
/// double exactly; a decimal as its nearest double), NaN below every other
/// number and equal to NaN, `-0.0` equal to `0`. Strings (and symbols) by
/// their UTF-8 bytes, as the server does without a collation. Documents and
/// arrays element by element: each element's bracket, then (documents) its
/// name, then its value; a prefix first. Binary by length, then subtype,
/// then bytes. ObjectIds by bytes, `false < true`, dates by milliseconds,
/// timestamps by time then increment. Regexes, DB pointers and code, which
/// no pattern stores, by their text.
pub(crate) fn cmp(a: &Bson, b: &Bson) -> Ordering {
    bracket(a).cmp(&bracket(b)).then_with(|| within(a, b))
}

/// `a` and `b` of one bracket.
fn within(a: &Bson, b: &Bson) -> Ordering {
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => x.cmp(y),
        (Bson::Document(x), Bson::Document(y)) => cmp_elements(
            x.iter().map(|(k, v)| (k.as_str(), v)),
            y.iter().map(|(k, v)| (k.as_str(), v)),
        ),
        (Bson::Array(x), Bson::Array(y)) => {
            cmp_elements(x.iter().map(|v| ("", v)), y.iter().map(|v| ("", v)))
        }
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.cmp(y),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => cmp_numbers(x, y),
            // One bracket, no value to compare (null, MinKey, MaxKey,
            // undefined), or the types no pattern stores.
            _ => a.to_string().cmp(&b.to_string()),
        },
    }
}

/// Two documents' (or arrays') elements in order: each one's bracket, its
/// name, its value; when one runs out first, it is the lesser.
fn cmp_elements<'a>(
    mut x: impl Iterator<Item = (&'a str, &'a Bson)>,
    mut y: impl Iterator<Item = (&'a str, &'a Bson)>,
) -> Ordering {
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((kx, vx)), Some((ky, vy))) => {
                let o = bracket(vx)
                    .cmp(&bracket(vy))
                    .then_with(|| kx.cmp(ky))
                    .then_with(|| within(vx, vy));
                if o.is_ne() {
                    return o;
                }
            }
        }
    }
}

/// A number as it is compared: an integer exactly, else a double.
#[derive(Debug, Clone, Copy)]
enum Number {
    Int(i64),
    Float(f64),
}

fn number(v: &Bson) -> Option<Number> {
    match v {
        Bson::Int32(i) => Some(Number::Int(i64::from(*i))),
        Bson::Int64(i) => Some(Number::Int(*i)),
        Bson::Double(f) => Some(Number::Float(*f)),
        Bson::Decimal128(_) if is_nan(v) => Some(Number::Float(f64::NAN)),
        Bson::Decimal128(d) => d.to_string().parse().ok().map(Number::Float),
        _ => None,
    }
}

fn cmp_numbers(a: Number, b: Number) -> Ordering {
    match (a, b) {
        (Number::Int(x), Number::Int(y)) => x.cmp(&y),
        (Number::Float(x), Number::Float(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            (false, false) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        },
        (Number::Int(x), Number::Float(y)) => cmp_int_float(x, y),
        (Number::Float(x), Number::Int(y)) => cmp_int_float(y, x).reverse(),
    }
}

/// A long and a double, exactly (as a double, a long past 2^53 would lose
/// its last digits).
fn cmp_int_float(i: i64, f: f64) -> Ordering {
    /// 2^63: the first double past every long.
    const PAST_LONGS: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() || f < -PAST_LONGS {
        return Ordering::Greater;
    }
    if f >= PAST_LONGS {
        return Ordering::Less;
    }
    // Within the longs: the whole part is one exactly, then the fraction.
    let whole = f.trunc();
    i.cmp(&(whole as i64))
        .then_with(|| 0.0_f64.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::oid::ObjectId;
    use mongodb::bson::{doc, Binary, Bson, DateTime, Decimal128, Timestamp};

    fn decimal(s: &str) -> Bson {
        Bson::Decimal128(s.parse::<Decimal128>().unwrap())
    }

    /// Each value sorts strictly before the next.
    fn ascending(values: &[Bson]) {
        for w in values.windows(2) {
            assert_eq!(cmp(&w[0], &w[1]), Ordering::Less, "{} < {}", w[0], w[1]);
            assert_eq!(cmp(&w[1], &w[0]), Ordering::Greater, "{} > {}", w[1], w[0]);
        }
    }

    #[test]
    fn types_in_the_server_order() {
        ascending(&[
            Bson::MinKey,
            Bson::Undefined,
            Bson::Null,
            Bson::Double(f64::NAN),
            Bson::Double(f64::NEG_INFINITY),
            Bson::Int32(-1),
            Bson::Int64(i64::MAX),
            Bson::Double(f64::INFINITY),
            Bson::String(String::new()),
            Bson::String("a".into()),
            Bson::Document(doc! {}),
            Bson::Document(doc! {"a": 1}),
            Bson::Array(vec![]),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Binary(Binary {
                subtype: mongodb::bson::spec::BinarySubtype::Generic,
                bytes: vec![9],
            }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::ObjectId(ObjectId::from_bytes([1; 12])),
            Bson::Boolean(false),
            Bson::Boolean(true),
            Bson::DateTime(DateTime::from_millis(-1)),
            Bson::DateTime(DateTime::from_millis(0)),
            Bson::Timestamp(Timestamp {
                time: 0,
                increment: 9,
            }),
            Bson::Timestamp(Timestamp {
                time: 1,
                increment: 0,
            }),
            Bson::MaxKey,
        ]);
    }

    #[test]
    fn numbers_across_types() {
        ascending(&[
            decimal("NaN"),
            Bson::Double(-1.5),
            Bson::Int32(-1),
            Bson::Double(-0.5),
            Bson::Int64(0),
            decimal("0.25"),
            Bson::Double(0.5),
            Bson::Int32(1),
            decimal("1.5"),
            Bson::Int64(2),
        ]);
        for (a, b) in [
            (Bson::Int32(1), Bson::Double(1.0)),
            (Bson::Int64(1), decimal("1")),
            (Bson::Double(-0.0), Bson::Int32(0)),
            (Bson::Double(f64::NAN), decimal("NaN")),
            (Bson::Symbol("a".into()), Bson::String("a".into())),
        ] {
            assert_eq!(cmp(&a, &b), Ordering::Equal, "{a} = {b}");
        }
    }

    /// A long past 2^53 and the double nearest it: equal as doubles, not
    /// as numbers.
    #[test]
    fn longs_and_doubles_exactly() {
        let big = (1_i64 << 53) + 1;
        assert_eq!(
            cmp(&Bson::Int64(big), &Bson::Double(big as f64)),
            Ordering::Greater
        );
        assert_eq!(
            cmp(&Bson::Int64(i64::MAX), &Bson::Double(2f64.powi(63))),
            Ordering::Less
        );
        assert_eq!(
            cmp(&Bson::Int64(i64::MIN), &Bson::Double(-(2f64.powi(63)))),
            Ordering::Equal
        );
    }

    #[test]
    fn documents_and_arrays_element_by_element() {
        ascending(&[
            Bson::Document(doc! {"a": 1}),
            Bson::Document(doc! {"a": 1, "b": 0}),
            Bson::Document(doc! {"a": 2}),
            Bson::Document(doc! {"b": 0}),
            // An element's type before its name.
            Bson::Document(doc! {"a": "x"}),
        ]);
        ascending(&[
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Array(vec![Bson::Int32(1), Bson::Null]),
            Bson::Array(vec![Bson::Int32(2)]),
        ]);
    }

    #[test]
    fn binary_by_length_then_subtype() {
        let bin = |subtype, bytes: Vec<u8>| Bson::Binary(Binary { subtype, bytes });
        use mongodb::bson::spec::BinarySubtype::{Generic, Uuid};
        ascending(&[
            bin(Uuid, vec![9]),
            bin(Generic, vec![0, 0]),
            bin(Uuid, vec![0, 0]),
            bin(Uuid, vec![0, 1]),
        ]);
    }

    #[test]
    fn nans_are_nan() {
        assert!(is_nan(&decimal("NaN")) && is_nan(&Bson::Double(f64::NAN)));
        assert!(!is_nan(&decimal("1")));
    }
}
