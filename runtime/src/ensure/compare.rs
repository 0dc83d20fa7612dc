//! How declarations meet the deployment: merging them per collection, and
//! telling whether an existing index serves a declared one.

use mongodb::bson::{Bson, Document};

use super::{Conflict, Declared, Index, Note, Plan, Shard};

/// One collection's declarations, merged.
pub(super) struct Wanted {
    pub(super) collection: String,
    pub(super) indexes: Vec<Index>,
    pub(super) shard: Option<Shard>,
}

/// Declarations by collection, in the order first declared; an index
/// declared twice (by name or by keys) is kept once, the first shard key
/// wins.
pub(super) fn merge(declared: Vec<Declared>) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = Vec::new();
    for d in declared {
        let at = match out.iter().position(|w| w.collection == d.collection) {
            Some(i) => i,
            None => {
                out.push(Wanted {
                    collection: d.collection.clone(),
                    indexes: Vec::new(),
                    shard: None,
                });
                out.len() - 1
            }
        };
        let w = &mut out[at];
        for model in d.indexes {
            let name = model
                .options
                .as_ref()
                .and_then(|o| o.name.clone())
                .unwrap_or_else(|| default_name(&model.keys));
            let dup = w
                .indexes
                .iter()
                .any(|i| i.name == name || same_keys(&i.keys, &model.keys));
            if !dup {
                let index = Index {
                    collection: d.collection.clone(),
                    name,
                    keys: model.keys,
                };
                w.indexes.push(index);
            }
        }
        if w.shard.is_none() {
            w.shard = d.shard_key.map(|(key, unique)| Shard {
                collection: d.collection.clone(),
                key,
                unique,
            });
        }
    }
    out
}

/// The name the server gives an unnamed index: `a_1_b_-1`.
fn default_name(keys: &Document) -> String {
    let parts: Vec<String> = keys
        .iter()
        .map(|(k, v)| match v {
            Bson::String(s) => format!("{k}_{s}"),
            other => format!("{k}_{}", direction(other).unwrap_or(1)),
        })
        .collect();
    parts.join("_")
}

/// `1` or `-1` for a numeric key, as the server reads it.
fn direction(v: &Bson) -> Option<i32> {
    let n = match v {
        Bson::Int32(n) => f64::from(*n),
        Bson::Int64(n) => *n as f64,
        Bson::Double(n) => *n,
        _ => return None,
    };
    Some(if n < 0.0 { -1 } else { 1 })
}

/// The same keys in the same order and directions (`1`, `1.0` and `1i64`
/// are one direction; `"hashed"` is compared as a string).
pub(super) fn same_keys(a: &Document, b: &Document) -> bool {
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|((ka, va), (kb, vb))| {
            ka == kb
                && match (va, vb) {
                    (Bson::String(x), Bson::String(y)) => x == y,
                    (x, y) => direction(x).is_some() && direction(x) == direction(y),
                }
        })
}

/// Whether an existing index (a `listIndexes` entry) serves every query
/// an index on `keys` would: the same keys, and no option that narrows it.
fn serves(found: &Document, keys: &Document) -> bool {
    let Ok(found_keys) = found.get_document("key") else {
        return false;
    };
    let narrowed = found.contains_key("partialFilterExpression")
        || found.get_bool("sparse").unwrap_or(false)
        || found.get_bool("hidden").unwrap_or(false)
        || found
            .get_document("collation")
            .is_ok_and(|c| c.get_str("locale").unwrap_or("simple") != "simple");
    !narrowed && same_keys(found_keys, keys)
}

pub(super) fn compare_index(plan: &mut Plan, declared: &Index, existing: &[Document]) {
    let by_name = existing
        .iter()
        .find(|ix| ix.get_str("name").ok() == Some(declared.name.as_str()));
    match by_name {
        Some(ix) if serves(ix, &declared.keys) => {}
        Some(ix) => plan.conflicts.push(Conflict::Index {
            declared: declared.clone(),
            found: ix.clone(),
        }),
        None => match existing.iter().find(|ix| serves(ix, &declared.keys)) {
            Some(ix) => plan.notes.push(Note::IndexUnderOtherName {
                declared: declared.clone(),
                found: ix.get_str("name").unwrap_or_default().to_owned(),
            }),
            None => plan.create_indexes.push(declared.clone()),
        },
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    #[test]
    fn keys_compare_by_direction() {
        assert!(same_keys(
            &doc! {"a": 1, "b": -1},
            &doc! {"a": 1.0, "b": -1_i64}
        ));
        assert!(!same_keys(&doc! {"a": 1, "b": -1}, &doc! {"a": 1, "b": 1}));
        assert!(!same_keys(&doc! {"a": 1, "b": 1}, &doc! {"b": 1, "a": 1}));
        assert!(!same_keys(&doc! {"a": 1}, &doc! {"a": 1, "b": 1}));
        assert!(same_keys(&doc! {"a": "hashed"}, &doc! {"a": "hashed"}));
        assert!(!same_keys(&doc! {"a": "hashed"}, &doc! {"a": 1}));
    }

    #[test]
    fn narrowed_indexes_do_not_serve() {
        let keys = doc! {"a": 1};
        assert!(serves(&doc! {"name": "x", "key": {"a": 1}}, &keys));
        assert!(serves(
            &doc! {"name": "x", "key": {"a": 1}, "unique": true, "collation": {"locale": "simple"}},
            &keys
        ));
        for narrowing in [
            doc! {"partialFilterExpression": {"a": {"$gt": 1}}},
            doc! {"sparse": true},
            doc! {"hidden": true},
            doc! {"collation": {"locale": "fr"}},
        ] {
            let mut ix = doc! {"name": "x", "key": {"a": 1}};
            ix.extend(narrowing.clone());
            assert!(!serves(&ix, &keys), "{narrowing}");
        }
    }

    #[test]
    fn declarations_merge_by_collection() {
        let merged = merge(vec![
            Declared::new("a"),
            Declared::new("a").index(doc! {"k": 1, "start": 1}, "mp_k"),
            Declared::new("b"),
            // The same index again, by name and by keys: kept once.
            Declared::new("a").index(doc! {"k": 1, "start": 1}, "mp_k"),
            Declared::new("a").index(doc! {"k": 1.0, "start": 1.0}, "other"),
            Declared::new("a")
                .index(doc! {"s": 1}, "mp_s")
                .sharded(doc! {"s": 1}, false),
        ]);
        let names: Vec<(&str, Vec<&str>, bool)> = merged
            .iter()
            .map(|w| {
                (
                    w.collection.as_str(),
                    w.indexes.iter().map(|i| i.name.as_str()).collect(),
                    w.shard.is_some(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [("a", vec!["mp_k", "mp_s"], true), ("b", vec![], false)]
        );
    }

    #[test]
    fn unnamed_indexes_get_the_servers_name() {
        assert_eq!(
            default_name(&doc! {"a": 1, "b": -1.0, "c": "hashed"}),
            "a_1_b_-1_c_hashed"
        );
    }
}
