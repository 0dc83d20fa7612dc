//! How declarations meet the deployment: merging them per collection, and
//! telling whether an existing index serves a declared one.

use std::collections::BTreeMap;

use mongodb::bson::{doc, Bson, Document};

use super::{Conflict, Declared, Index, Note, Plan, Shard};
use crate::error::Result;

/// One collection's declarations, merged.
pub(super) struct Wanted {
    pub(super) collection: String,
    pub(super) indexes: Vec<Index>,
    pub(super) shard: Option<Shard>,
    pub(super) needs: Vec<super::Need>,
    pub(super) checks: Vec<super::Check>,
    /// Each model's schema fragments, by the model's name.
    pub(super) parts: Parts,
    pub(super) validation: super::Validation,
}

/// A validator's parts: each model's fragments, by its name (the patterns'
/// title for schemas declared without a model).
pub(super) type Parts = BTreeMap<String, Vec<Document>>;

impl Wanted {
    /// The validator its schemas make (see [`validator`]). `None` without
    /// schemas.
    pub(super) fn validator(&self) -> Option<Document> {
        validator(&self.parts)
    }
}

/// The validator `parts` make: one `$jsonSchema` titled as the patterns'
/// own, which admits a document that meets all of one part's fragments:
/// `{title: "mongo-patterns", anyOf: [{title: <model>, allOf: [...]}, ...]}`,
/// the parts in name order, so that the models' `ensure`s, in any order,
/// set the same one. `None` without a fragment.
pub(super) fn validator(parts: &Parts) -> Option<Document> {
    let any: Vec<Bson> = parts
        .iter()
        .filter(|(_, fragments)| !fragments.is_empty())
        .map(|(name, fragments)| Bson::Document(doc! {"title": name, "allOf": fragments.clone()}))
        .collect();
    if any.is_empty() {
        return None;
    }
    Some(doc! {"$jsonSchema": {
        "bsonType": "object",
        "title": super::SCHEMA_TITLE,
        "anyOf": any,
    }})
}

/// The parts of a validator of ours as stored (see [`validator`]): none
/// for one set before parts were kept, which is replaced whole.
pub(super) fn stored_parts(validator: &Document) -> Parts {
    let mut parts = Parts::new();
    let any = validator
        .get_document("$jsonSchema")
        .and_then(|s| s.get_array("anyOf"));
    for part in any.into_iter().flatten() {
        let Some(part) = part.as_document() else {
            continue;
        };
        if let (Ok(name), Ok(all)) = (part.get_str("title"), part.get_array("allOf")) {
            let fragments = all
                .iter()
                .filter_map(|f| f.as_document().cloned())
                .collect();
            parts.insert(name.to_owned(), fragments);
        }
    }
    parts
}

/// The parts a validator of ours holds once `own` is set on it: `stored`'s
/// (another model's are kept), each of `own`'s that declares a fragment
/// in place of its old one (a model with `validate = "off"` declares
/// none, and drops nothing).
pub(super) fn with_own(stored: Option<&Document>, own: &Parts) -> Parts {
    let mut parts = stored.map(stored_parts).unwrap_or_default();
    for (name, fragments) in own.iter().filter(|(_, f)| !f.is_empty()) {
        parts.insert(name.clone(), fragments.clone());
    }
    parts
}

/// Whether `validator` (as `listCollections` shows it) is the patterns'
/// own: a `$jsonSchema` titled as [`validator`] titles it.
pub(super) fn ours(validator: &Document) -> bool {
    validator
        .get_document("$jsonSchema")
        .is_ok_and(|s| s.get_str("title").ok() == Some(super::SCHEMA_TITLE))
}

/// Declarations by collection, in the order first declared; an index
/// declared twice (by name, or by keys and options) is kept once, the first
/// shard key wins.
pub(super) fn merge(declared: Vec<Declared>) -> Result<Vec<Wanted>> {
    let mut out: Vec<Wanted> = Vec::new();
    for d in declared {
        let at = match out.iter().position(|w| w.collection == d.collection) {
            Some(i) => i,
            None => {
                out.push(Wanted {
                    collection: d.collection.clone(),
                    indexes: Vec::new(),
                    shard: None,
                    needs: Vec::new(),
                    checks: Vec::new(),
                    parts: Parts::new(),
                    validation: d.validation,
                });
                out.len() - 1
            }
        };
        let w = &mut out[at];
        for model in d.indexes {
            let mut options = match &model.options {
                Some(o) => crate::compat::to_document(o)?,
                None => Document::new(),
            };
            let name = match options.remove("name") {
                Some(Bson::String(name)) => name,
                _ => default_name(&model.keys),
            };
            let dup = w.indexes.iter().any(|i| {
                i.name == name || (same_keys(&i.keys, &model.keys) && i.options == options)
            });
            if !dup {
                let index = Index {
                    collection: d.collection.clone(),
                    name,
                    keys: model.keys,
                    options,
                };
                w.indexes.push(index);
            }
        }
        let name = d.model.as_deref().unwrap_or(super::SCHEMA_TITLE);
        let part = w.parts.entry(name.to_owned()).or_default();
        for f in d.schemas {
            if !part.contains(&f) {
                part.push(f);
            }
        }
        for c in d.checks {
            if !w.checks.contains(&c) {
                w.checks.push(c);
            }
        }
        for n in d.needs {
            if !w.needs.contains(&n) {
                w.needs.push(n);
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
    Ok(out)
}

/// The index `shardCollection` needs on a collection that may already
/// hold documents, unless one listed (`existing`, as `listIndexes` gives
/// them) or planned serves: one whose keys start with the shard key, with
/// no option that narrows it (`partialFilterExpression`, `sparse`,
/// `hidden`) and, for a unique key, unique. `mongod` builds that index
/// itself only when it shards an empty collection; on one with documents
/// it refuses (`InvalidOptions`, "Please create an index that starts with
/// the proposed shard key before sharding the collection").
pub(super) fn shard_key_index(
    shard: &Shard,
    existing: &[Document],
    planned: &[Index],
) -> Option<Index> {
    let starts_with_key = |keys: &Document| {
        keys.len() >= shard.key.len() && {
            let prefix: Document = keys
                .iter()
                .take(shard.key.len())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            same_keys(&prefix, &shard.key)
        }
    };
    let plain = |options: &Document| {
        !["partialFilterExpression", "sparse", "hidden"]
            .iter()
            .any(|o| options.get(*o).is_some_and(|v| v != &Bson::Boolean(false)))
            && (!shard.unique || matches!(options.get_bool("unique"), Ok(true)))
    };
    let listed = existing
        .iter()
        .any(|i| i.get_document("key").is_ok_and(starts_with_key) && plain(i));
    let to_create = planned
        .iter()
        .any(|i| i.collection == shard.collection && starts_with_key(&i.keys) && plain(&i.options));
    if listed || to_create {
        return None;
    }
    let mut options = Document::new();
    if shard.unique {
        options.insert("unique", true);
    }
    Some(Index {
        collection: shard.collection.clone(),
        name: default_name(&shard.key),
        keys: shard.key.clone(),
        options,
    })
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
    let n = number(v)?;
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

/// The same value as the server compares index options: numbers by value
/// (`1`, `1.0`, `1i64`), documents field by field in order.
fn same_value(a: &Bson, b: &Bson) -> bool {
    match (a, b) {
        (Bson::Document(x), Bson::Document(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|((kx, vx), (ky, vy))| kx == ky && same_value(vx, vy))
        }
        (Bson::Array(x), Bson::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| same_value(p, q))
        }
        (x, y) => match (number(x), number(y)) {
            (Some(p), Some(q)) => p == q,
            _ => x == y,
        },
    }
}

fn number(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    }
}

/// A collation, or `None` for the simple one (none at all, or
/// `{locale: "simple"}`).
fn collation(options: &Document) -> Option<&Document> {
    options
        .get_document("collation")
        .ok()
        .filter(|c| c.get_str("locale").unwrap_or("simple") != "simple")
}

/// Whether an index of collation `found` (as `listIndexes` shows it: the
/// server fills in every field) compares strings as `declared` does. Both
/// simple, or the same locale with every field `declared` names equal;
/// `strength` (3), `caseLevel` and `numericOrdering` (false) default the
/// same in every locale, so they are compared even when `declared` leaves
/// them out; the other fields' defaults depend on the locale, which the
/// server filled in, and `version` is the server's ICU release.
fn same_collation(found: Option<&Document>, declared: Option<&Document>) -> bool {
    let (found, declared) = match (found, declared) {
        (None, None) => return true,
        (Some(f), Some(d)) => (f, d),
        _ => return false,
    };
    let defaults = [
        ("strength", Bson::Int32(3)),
        ("caseLevel", Bson::Boolean(false)),
        ("numericOrdering", Bson::Boolean(false)),
    ];
    let field = |c: &Document, k: &str| {
        c.get(k)
            .or_else(|| defaults.iter().find(|(d, _)| *d == k).map(|(_, v)| v))
            .cloned()
    };
    let same = |k: &str| match (field(found, k), field(declared, k)) {
        (Some(f), Some(d)) => same_value(&f, &d),
        (f, d) => f.is_none() && d.is_none(),
    };
    declared
        .keys()
        .filter(|k| k.as_str() != "version")
        .all(|k| same(k))
        && defaults.iter().all(|(k, _)| same(k))
}

/// Options that keep an index from holding every document, when the
/// declaration does not ask for them.
const NARROWING: [&str; 3] = ["partialFilterExpression", "sparse", "hidden"];

/// Options the server ignores or reports in its own way, never compared.
const IGNORED: [&str; 3] = ["background", "v", "collation"];

/// Whether an existing index (a `listIndexes` entry) serves every query
/// the declared one would: the same keys, the same collation, no narrowing
/// option the declaration lacks, and every option the declaration names
/// with the same value (a boolean option absent is `false`). Options the
/// declaration leaves out and that narrow nothing (`unique`,
/// `expireAfterSeconds`) do not matter for the queries it serves.
fn serves(found: &Document, declared: &Index) -> bool {
    let Ok(found_keys) = found.get_document("key") else {
        return false;
    };
    let option = |d: &Document, k: &str| -> Option<Bson> {
        match d.get(k) {
            None | Some(Bson::Boolean(false)) => None,
            Some(v) => Some(v.clone()),
        }
    };
    let same_option = |k: &str| match (option(found, k), option(&declared.options, k)) {
        (None, None) => true,
        (Some(f), Some(d)) => same_value(&f, &d),
        _ => false,
    };
    same_keys(found_keys, &declared.keys)
        && same_collation(collation(found), collation(&declared.options))
        && NARROWING.iter().all(|k| same_option(k))
        && declared
            .options
            .keys()
            .filter(|k| !IGNORED.contains(&k.as_str()))
            .all(|k| same_option(k))
}

pub(super) fn compare_index(plan: &mut Plan, declared: &Index, existing: &[Document]) {
    let by_name = existing
        .iter()
        .find(|ix| ix.get_str("name").ok() == Some(declared.name.as_str()));
    match by_name {
        Some(ix) if serves(ix, declared) => {}
        Some(ix) => plan.conflicts.push(Conflict::Index {
            declared: declared.clone(),
            found: ix.clone(),
        }),
        None => match existing.iter().find(|ix| serves(ix, declared)) {
            Some(ix) => plan.notes.push(Note::IndexUnderOtherName {
                declared: declared.clone(),
                found: ix.get_str("name").unwrap_or_default().to_owned(),
            }),
            None => plan.create_indexes.push(declared.clone()),
        },
    }
}

/// Notes the indexes of `existing` this library named (`mp_`) that no
/// declaration of the collection lists: what a changed attribute (a
/// keyset's `sort` or `order`, a bucket's `key`, a board or score, a shard
/// key) leaves behind. Left in place (`ensure` drops nothing); another
/// model of the same collection, not in this plan, may still use it.
pub(super) fn undeclared_indexes(plan: &mut Plan, w: &Wanted, existing: &[Document]) {
    for ix in existing {
        let Ok(name) = ix.get_str("name") else {
            continue;
        };
        if name.starts_with("mp_") && !w.indexes.iter().any(|d| d.name == name) {
            plan.notes.push(Note::UndeclaredIndex {
                collection: w.collection.clone(),
                name: name.to_owned(),
                keys: ix.get_document("key").cloned().unwrap_or_default(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    #[test]
    fn a_shard_key_needs_an_index_that_starts_with_it() {
        use mongodb::bson::doc;
        let shard = Shard {
            collection: "trades".into(),
            key: doc! {"customerId": "hashed"},
            unique: false,
        };
        // None listed, none planned: the hashed index, under the server's
        // own name for it.
        let ix = shard_key_index(&shard, &[doc! {"key": {"_id": 1}, "name": "_id_"}], &[]).unwrap();
        assert_eq!(ix.keys, doc! {"customerId": "hashed"});
        assert_eq!(ix.name, "customerId_hashed");
        assert!(ix.options.is_empty());
        // One listed that starts with the key serves; a partial one does not.
        let serving = doc! {"key": {"customerId": "hashed", "start": 1}, "name": "x"};
        assert!(shard_key_index(&shard, &[serving], &[]).is_none());
        let partial = doc! {"key": {"customerId": "hashed"}, "name": "p", "partialFilterExpression": {"a": 1}};
        assert!(shard_key_index(&shard, &[partial], &[]).is_some());
        // A ranged index on the field is not a hashed one.
        let ranged = doc! {"key": {"customerId": 1}, "name": "customerId_1"};
        assert!(shard_key_index(&shard, &[ranged], &[]).is_some());
        // A planned index on the same collection serves; on another, not.
        let planned = |collection: &str| Index {
            collection: collection.into(),
            name: "k".into(),
            keys: doc! {"customerId": "hashed"},
            options: Document::new(),
        };
        assert!(shard_key_index(&shard, &[], &[planned("trades")]).is_none());
        assert!(shard_key_index(&shard, &[], &[planned("other")]).is_some());
        // A unique key needs a unique index.
        let unique = Shard {
            collection: "logs".into(),
            key: doc! {"month": 1, "type": 1},
            unique: true,
        };
        let plain = doc! {"key": {"month": 1, "type": 1}, "name": "m"};
        let ix = shard_key_index(&unique, &[plain], &[]).unwrap();
        assert_eq!(ix.options, doc! {"unique": true});
        assert_eq!(ix.name, "month_1_type_1");
        let uniq = doc! {"key": {"month": 1.0, "type": 1_i64}, "name": "m", "unique": true};
        assert!(shard_key_index(&unique, &[uniq], &[]).is_none());
    }

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

    fn declared(keys: Document, options: Document) -> Index {
        Index {
            collection: "c".into(),
            name: "x".into(),
            keys,
            options,
        }
    }

    #[test]
    fn narrowed_indexes_do_not_serve() {
        let plain = declared(doc! {"a": 1}, doc! {});
        assert!(serves(&doc! {"name": "x", "key": {"a": 1}}, &plain));
        assert!(serves(
            &doc! {"name": "x", "key": {"a": 1}, "unique": true, "collation": {"locale": "simple"}},
            &plain
        ));
        for narrowing in [
            doc! {"partialFilterExpression": {"a": {"$gt": 1}}},
            doc! {"sparse": true},
            doc! {"hidden": true},
            doc! {"collation": {"locale": "fr"}},
        ] {
            let mut ix = doc! {"name": "x", "key": {"a": 1}};
            ix.extend(narrowing.clone());
            assert!(!serves(&ix, &plain), "{narrowing}");
            // Declared with that very option, it serves.
            let mut options = narrowing.clone();
            if let Ok(c) = options.get_document_mut("collation") {
                c.insert("strength", 3);
            }
            assert!(
                serves(&ix, &declared(doc! {"a": 1}, options)),
                "{narrowing}"
            );
        }
        // A declared option the index lacks, or has with another value.
        let unique = declared(doc! {"a": 1}, doc! {"unique": true, "hidden": false});
        assert!(!serves(&doc! {"name": "x", "key": {"a": 1}}, &unique));
        assert!(serves(
            &doc! {"name": "x", "key": {"a": 1}, "unique": true},
            &unique
        ));
        let ttl = declared(doc! {"a": 1}, doc! {"expireAfterSeconds": 60});
        assert!(serves(
            &doc! {"name": "x", "key": {"a": 1}, "expireAfterSeconds": 60_i64},
            &ttl
        ));
        assert!(!serves(
            &doc! {"name": "x", "key": {"a": 1}, "expireAfterSeconds": 61},
            &ttl
        ));
    }

    /// A collated declaration is served only by an index of that collation,
    /// as `listIndexes` shows it (every field filled in by the server).
    #[test]
    fn collations_must_match() {
        let listed = |collation: Document| {
            doc! {"v": 2, "key": {"s": 1, "_id": 1}, "name": "x", "collation": collation}
        };
        let en2 = listed(doc! {
            "locale": "en", "caseLevel": false, "caseFirst": "off", "strength": 2,
            "numericOrdering": false, "alternate": "non-ignorable",
            "maxVariable": "punct", "normalization": false, "backwards": false,
            "version": "57.1",
        });
        let en3 = listed(doc! {
            "locale": "en", "caseLevel": false, "caseFirst": "off", "strength": 3,
            "numericOrdering": false, "alternate": "non-ignorable",
            "maxVariable": "punct", "normalization": false, "backwards": false,
            "version": "57.1",
        });
        let simple = doc! {"v": 2, "key": {"s": 1, "_id": 1}, "name": "x"};
        let keys = doc! {"s": 1, "_id": 1};
        let want = |c: Document| declared(keys.clone(), doc! {"collation": c});
        let en_secondary = want(doc! {"locale": "en", "strength": 2});
        assert!(serves(&en2, &en_secondary));
        // As the server echoes what it was given.
        assert!(serves(
            &listed(doc! {"locale": "en", "strength": 2}),
            &en_secondary
        ));
        assert!(!serves(&en3, &en_secondary));
        assert!(!serves(&simple, &en_secondary));
        assert!(!serves(&en2, &declared(keys.clone(), doc! {})));
        assert!(!serves(&en2, &want(doc! {"locale": "fr", "strength": 2})));
        // Strength left out is tertiary.
        assert!(serves(&en3, &want(doc! {"locale": "en"})));
        assert!(!serves(&en2, &want(doc! {"locale": "en"})));
        assert!(!serves(
            &en2,
            &want(doc! {"locale": "en", "strength": 2, "numericOrdering": true})
        ));
        // `{locale: "simple"}` is no collation at all.
        assert!(serves(&simple, &want(doc! {"locale": "simple"})));
    }

    /// The collation a keyset query declares reaches the merged index.
    #[test]
    fn declared_options_are_kept() {
        let options = mongodb::options::IndexOptions::builder()
            .name("n".to_owned())
            .collation(
                mongodb::options::Collation::builder()
                    .locale("en")
                    .strength(mongodb::options::CollationStrength::Secondary)
                    .build(),
            )
            .build();
        let mut d = Declared::new("c");
        d.indexes.push(
            mongodb::IndexModel::builder()
                .keys(doc! {"s": 1})
                .options(options)
                .build(),
        );
        let merged = merge(vec![d]).unwrap();
        let ix = &merged[0].indexes[0];
        assert_eq!(ix.name, "n");
        assert_eq!(
            ix.options,
            doc! {"collation": {"locale": "en", "strength": 2}}
        );
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
        ])
        .unwrap();
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
