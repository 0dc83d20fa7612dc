//! Filters a query takes besides its own: an untrusted one, vetted before
//! anything is sent, and `_id` ranges by creation time.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{doc, Bson, DateTime, Document};

use super::MAX_FILTER_DEPTH;
use crate::error::{Error, Result};

/// Refuses server-side JavaScript and excessive nesting in a filter, walking
/// it with an explicit stack.
pub(super) fn check_untrusted(filter: &Document) -> Result<()> {
    const JS: [&str; 3] = ["$where", "$function", "$accumulator"];
    let refuse = |why: String| Err(Error::invalid("filter", why));
    let mut stack: Vec<(&Bson, usize)> = Vec::new();
    let mut docs: Vec<(&Document, usize)> = vec![(filter, 1)];
    loop {
        if let Some((d, depth)) = docs.pop() {
            for (k, v) in d {
                if JS.contains(&k.as_str()) {
                    return refuse(format!(
                        "`{k}` runs JavaScript on the server, refused in an untrusted filter"
                    ));
                }
                stack.push((v, depth));
            }
            continue;
        }
        let Some((v, depth)) = stack.pop() else {
            return Ok(());
        };
        match v {
            Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => {
                return refuse("a JavaScript code value, refused in an untrusted filter".into())
            }
            Bson::Document(_) | Bson::Array(_) if depth >= MAX_FILTER_DEPTH => {
                return refuse(format!("nested deeper than {MAX_FILTER_DEPTH} levels"))
            }
            Bson::Document(d) => docs.push((d, depth + 1)),
            Bson::Array(a) => stack.extend(a.iter().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
}

/// A filter on `_id` for documents whose ObjectId was made in `[from, to)`.
///
/// ObjectIds hold their creation time in whole seconds, so the
/// range is widened to whole seconds: `from` rounds down and `to` rounds up.
/// Nothing in range is ever missed. Combine it with other conditions in
/// `$and`.
pub fn created_between(from: DateTime, to: DateTime) -> Result<Document> {
    if from > to {
        return Err(Error::invalid(
            "from",
            format!("{from} is after `to` ({to})"),
        ));
    }
    let lo = object_id_at(from.timestamp_millis().div_euclid(1000), "from")?;
    let hi_secs = (to.timestamp_millis() + 999).div_euclid(1000);
    let mut range = doc! {"$gte": lo};
    // Past the last second an ObjectId can hold, everything is in range.
    if hi_secs <= i64::from(u32::MAX) {
        range.insert("$lt", object_id_at(hi_secs, "to")?);
    }
    Ok(doc! {"_id": range})
}

/// A filter on `_id` for documents whose ObjectId was made at `from` or later.
pub fn created_since(from: DateTime) -> Result<Document> {
    let lo = object_id_at(from.timestamp_millis().div_euclid(1000), "from")?;
    Ok(doc! {"_id": {"$gte": lo}})
}

/// The smallest ObjectId made in second `secs` of the Unix epoch.
fn object_id_at(secs: i64, name: &'static str) -> Result<ObjectId> {
    let secs = u32::try_from(secs).map_err(|_| {
        Error::invalid(
            name,
            format!("second {secs} is outside what an ObjectId can hold (1970 to 2106)"),
        )
    })?;
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&secs.to_be_bytes());
    Ok(ObjectId::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_filters_refuse_javascript() {
        for f in [
            doc! {"$where": "sleep(100)"},
            doc! {"a": 1, "$or": [{"b": 2}, {"$where": "1"}]},
            doc! {"$expr": {"$function": {"body": "f", "args": [], "lang": "js"}}},
            doc! {"$expr": {"$eq": [{"$accumulator": {}}, 1]}},
            doc! {"a": {"$eq": Bson::JavaScriptCode("x".into())}},
        ] {
            assert!(
                matches!(
                    check_untrusted(&f),
                    Err(Error::InvalidArgument { name: "filter", .. })
                ),
                "{f}"
            );
        }
        let mut deep = doc! {"a": 1};
        for _ in 0..MAX_FILTER_DEPTH {
            deep = doc! {"$and": [deep]};
        }
        assert!(check_untrusted(&deep).is_err());
        assert!(check_untrusted(&doc! {"a": {"$in": [1, 2]}, "b": {"$regex": "^x"}}).is_ok());
    }

    #[test]
    fn time_ranges_round_outwards() {
        let f =
            created_between(DateTime::from_millis(10_500), DateTime::from_millis(20_000)).unwrap();
        assert_eq!(
            f,
            doc! {"_id": {"$gte": object_id_at(10, "").unwrap(), "$lt": object_id_at(20, "").unwrap()}}
        );
        let f = created_between(DateTime::from_millis(0), DateTime::from_millis(20_001)).unwrap();
        assert_eq!(
            f.get_document("_id").unwrap().get("$lt"),
            Some(&Bson::ObjectId(object_id_at(21, "").unwrap()))
        );
        assert!(created_between(DateTime::from_millis(2), DateTime::from_millis(1)).is_err());
        assert!(created_since(DateTime::from_millis(-1000)).is_err());
    }
}
