//! The filter `delete` and `replace` take, as an aggregation expression over
//! one item (`$$this`).
//!
//! Both calls work inside a bucket's array, where the query language cannot
//! reach (a query selects documents, not array elements), so the filter is
//! translated into an expression that the server evaluates for each item.
//! The same expression selects the buckets and the items, so the number
//! removed is exactly what matched. Only operators whose meaning translates
//! faithfully are accepted; any other is refused before anything is sent,
//! rather than compared as a literal document (which would match nothing).

use mongodb::bson::{doc, Bson, Document};

use crate::error::{Error, Result};

/// Field operators `delete` and `replace` accept.
pub const FIELD_OPERATORS: &[&str] = &[
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists",
];
/// Operators that combine filters.
pub const LOGICAL_OPERATORS: &[&str] = &["$and", "$or", "$nor"];

/// Nesting past this is refused: filters come from callers.
const MAX_DEPTH: usize = 32;

/// Translates `filter` into a boolean expression over `$$this`. `key` and
/// its value stand for the key field, which items do not store.
pub(super) fn item_cond(filter: &Document, key: (&str, &Bson)) -> Result<Document> {
    if filter.is_empty() {
        return Err(Error::invalid(
            "matching",
            "name at least one item field (an empty filter would match every item)",
        ));
    }
    filter_expr(filter, key, 0)
}

fn filter_expr(filter: &Document, key: (&str, &Bson), depth: usize) -> Result<Document> {
    if depth > MAX_DEPTH {
        return Err(Error::invalid("matching", "nested too deep"));
    }
    let mut terms = Vec::with_capacity(filter.len());
    for (name, value) in filter {
        if let Some(op) = name.strip_prefix('$') {
            terms.push(Bson::Document(logical(op, value, key, depth)?));
        } else {
            terms.push(Bson::Document(field_expr(name, value, key)?));
        }
    }
    Ok(doc! {"$and": terms})
}

fn logical(op: &str, value: &Bson, key: (&str, &Bson), depth: usize) -> Result<Document> {
    let name = format!("${op}");
    if !LOGICAL_OPERATORS.contains(&name.as_str()) {
        return Err(refused(&name));
    }
    let Bson::Array(parts) = value else {
        return Err(Error::invalid(
            "matching",
            format!("`{name}` takes an array of filters"),
        ));
    };
    if parts.is_empty() {
        return Err(Error::invalid(
            "matching",
            format!("`{name}` needs at least one filter"),
        ));
    }
    let mut terms = Vec::with_capacity(parts.len());
    for p in parts {
        let Bson::Document(d) = p else {
            return Err(Error::invalid(
                "matching",
                format!("`{name}` takes an array of filters"),
            ));
        };
        if d.is_empty() {
            return Err(Error::invalid(
                "matching",
                format!("an empty filter inside `{name}`"),
            ));
        }
        terms.push(Bson::Document(filter_expr(d, key, depth + 1)?));
    }
    Ok(match name.as_str() {
        "$and" => doc! {"$and": terms},
        "$or" => doc! {"$or": terms},
        _ => doc! {"$not": [{"$or": terms}]},
    })
}

/// `{field: value}` or `{field: {$op: value, ...}}`.
fn field_expr(field: &str, value: &Bson, key: (&str, &Bson)) -> Result<Document> {
    if field.is_empty() || field.split('.').any(|p| p.is_empty() || p.starts_with('$')) {
        return Err(Error::invalid(
            "matching",
            format!("`{field}` is not a field path"),
        ));
    }
    // The key is not stored in items: its value is known.
    let path = if field == key.0 {
        Bson::Document(doc! {"$literal": key.1.clone()})
    } else {
        Bson::String(format!("$$this.{field}"))
    };
    let ops = match value {
        Bson::Document(d) if d.keys().any(|k| k.starts_with('$')) => d,
        // A plain value, or a document without operators: equality.
        v => return eq(&path, v),
    };
    if ops.keys().any(|k| !k.starts_with('$')) {
        return Err(Error::invalid(
            "matching",
            format!("`{field}` mixes operators and fields"),
        ));
    }
    let mut terms = Vec::with_capacity(ops.len());
    for (op, v) in ops {
        let term = match op.as_str() {
            "$eq" => eq(&path, v)?,
            "$ne" => doc! {"$not": [eq(&path, v)?]},
            "$gt" | "$gte" | "$lt" | "$lte" => compare(&path, op, v)?,
            "$in" => any_of(&path, op, v)?,
            "$nin" => doc! {"$not": [any_of(&path, op, v)?]},
            "$exists" => {
                let present = if field == key.0 {
                    doc! {"$literal": true}
                } else {
                    present(field)
                };
                match v {
                    Bson::Boolean(true) => present,
                    Bson::Boolean(false) => doc! {"$not": [present]},
                    _ => return Err(Error::invalid("matching", "`$exists` takes true or false")),
                }
            }
            other => return Err(refused(other)),
        };
        terms.push(Bson::Document(term));
    }
    Ok(doc! {"$and": terms})
}

/// Whether the item has `field`: its name among its parent's keys. (Some
/// servers give a missing field's `$type` as "null", not "missing".)
fn present(field: &str) -> Document {
    let (parent, last) = match field.rsplit_once('.') {
        Some((p, l)) => (format!("$$this.{p}"), l),
        None => ("$$this".to_owned(), field),
    };
    let is_object = doc! {"$eq": [{"$type": "$$mp_o"}, "object"]};
    doc! {"$let": {
        "vars": {"mp_o": parent},
        "in": {"$and": [
            &is_object,
            {"$in": [last, {"$map": {
                "input": {"$objectToArray": {"$cond": [&is_object, "$$mp_o", {}]}},
                "as": "mp_kv",
                "in": "$$mp_kv.k",
            }}]},
        ]},
    }}
}

/// Equality as a query means it for a scalar or a whole document: numbers
/// equal across types, and `null` matches a missing field too.
fn eq(path: &Bson, v: &Bson) -> Result<Document> {
    check_value(v)?;
    Ok(match v {
        Bson::Null => doc! {"$in": [{"$type": path}, ["null", "missing", "undefined"]]},
        v => doc! {"$eq": [path, {"$literal": v.clone()}]},
    })
}

/// A range comparison as a query means it: only values of the same type
/// bracket compare (a string is not greater than 2, a missing field is not
/// less than it).
fn compare(path: &Bson, op: &str, v: &Bson) -> Result<Document> {
    check_value(v)?;
    let bracket = match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            doc! {"$isNumber": path}
        }
        Bson::String(_) => doc! {"$in": [{"$type": path}, ["string", "symbol"]]},
        Bson::DateTime(_) => doc! {"$eq": [{"$type": path}, "date"]},
        Bson::ObjectId(_) => doc! {"$eq": [{"$type": path}, "objectId"]},
        Bson::Boolean(_) => doc! {"$eq": [{"$type": path}, "bool"]},
        Bson::Timestamp(_) => doc! {"$eq": [{"$type": path}, "timestamp"]},
        _ => {
            return Err(Error::invalid(
                "matching",
                format!(
                    "`{op}` compares numbers, strings, dates, ObjectIds, booleans or timestamps"
                ),
            ))
        }
    };
    Ok(doc! {"$and": [bracket, {op: [path, {"$literal": v.clone()}]}]})
}

fn any_of(path: &Bson, op: &str, v: &Bson) -> Result<Document> {
    let Bson::Array(vs) = v else {
        return Err(Error::invalid("matching", format!("`{op}` takes an array")));
    };
    let terms = vs
        .iter()
        .map(|v| eq(path, v).map(Bson::Document))
        .collect::<Result<Vec<_>>>()?;
    Ok(doc! {"$or": terms})
}

/// Values whose query meaning is not equality: refused, not guessed.
fn check_value(v: &Bson) -> Result<()> {
    match v {
        Bson::RegularExpression(_) => Err(Error::invalid(
            "matching",
            "a regular expression matches by pattern, which `delete` and `replace` do not support",
        )),
        Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => Err(Error::invalid(
            "matching",
            "JavaScript is not a value to compare",
        )),
        Bson::Array(_) => Err(Error::invalid(
            "matching",
            "an array value (a query would match it element by element); name a scalar",
        )),
        Bson::Document(d) => d.values().try_for_each(check_nested),
        _ => Ok(()),
    }
}

/// Inside a document compared whole, arrays compare whole too.
fn check_nested(v: &Bson) -> Result<()> {
    match v {
        Bson::Array(a) => a.iter().try_for_each(check_nested),
        Bson::Document(d) => d.values().try_for_each(check_nested),
        v => check_value(v),
    }
}

fn refused(op: &str) -> Error {
    Error::invalid(
        "matching",
        format!(
            "`{op}` is not supported here; use {} on item fields, combined with {}",
            FIELD_OPERATORS.join(" "),
            LOGICAL_OPERATORS.join(" ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: (&str, &Bson) = ("k", &Bson::Null);

    fn refusal(f: Document) -> String {
        match item_cond(&f, KEY) {
            Err(Error::InvalidArgument { reason, .. }) => reason,
            other => panic!("{f} gave {other:?}"),
        }
    }

    #[test]
    fn bucket_filters_outside_the_subset_are_refused() {
        for f in [
            doc! {},
            doc! {"n": {"$regex": "a"}},
            doc! {"n": {"$elemMatch": {"a": 1}}},
            doc! {"$where": "true"},
            doc! {"$expr": {"$eq": [1, 1]}},
            doc! {"n": {"$not": {"$gt": 1}}},
            doc! {"n": {"$size": 1}},
            doc! {"n": {"$type": "int"}},
            doc! {"n": {"$gt": 1, "a": 1}},
            doc! {"n": {"$in": 1}},
            doc! {"n": {"$gt": Bson::Null}},
            doc! {"n": [1, 2]},
            doc! {"$or": []},
            doc! {"$or": [{}]},
            doc! {"a..b": 1},
            doc! {"a.$b": 1},
            doc! {"n": {"$exists": 1}},
        ] {
            refusal(f);
        }
        assert!(refusal(doc! {"n": {"$foo": 1}}).contains("$foo"));
    }

    #[test]
    fn bucket_filters_translate_to_expressions() {
        let e = item_cond(&doc! {"n": {"$gt": 2}}, KEY).unwrap();
        assert_eq!(
            e,
            doc! {"$and": [{"$and": [{"$and": [{"$isNumber": "$$this.n"}, {"$gt": ["$$this.n", {"$literal": 2}]}]}]}]}
        );
        // The key field is not stored in items: its value stands in.
        let e = item_cond(&doc! {"k": 5}, ("k", &Bson::Int32(5))).unwrap();
        assert_eq!(
            e,
            doc! {"$and": [{"$eq": [{"$literal": 5}, {"$literal": 5}]}]}
        );
        // Deep nesting is refused, not recursed into without bound.
        let mut f = doc! {"n": 1};
        for _ in 0..40 {
            f = doc! {"$and": [f]};
        }
        refusal(f);
    }
}
