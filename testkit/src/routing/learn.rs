//! The default map's learning (see the module's doc): which collection a
//! command names, and the keys its commands show.

use mongo_patterns::bson::{Bson, Document};

use super::{Routing, ShardKey, Source, State};

impl Routing {
    /// Learns a key from `cmd`; returns the collection whose key it
    /// learnt, if it had commands held.
    pub(super) fn learn(
        &self,
        st: &mut State,
        db: &str,
        name: &str,
        cmd: &Document,
    ) -> Option<String> {
        if ignored_db(db) && name != "bulkWrite" {
            return None;
        }
        let coll = target_coll(db, name, cmd)?;
        if matches!(st.keys.get(&coll), Some((_, Source::Declared))) {
            return None;
        }
        if name == "createIndexes" {
            for ix in array(cmd, "indexes") {
                let Some(ix) = ix.as_document() else { continue };
                let (Ok(n), Ok(key)) = (ix.get_str("name"), ix.get_document("key")) else {
                    continue;
                };
                let learnt = if n.starts_with("mp_bucket_") {
                    key.keys().next().map(|f| ShardKey::ranged(f))
                } else if n.starts_with("mp_shard_") {
                    ShardKey::from_doc(key)
                } else {
                    None
                };
                if let Some(k) = learnt {
                    st.keys.insert(coll.clone(), (k, Source::Learned));
                    return st.held.contains_key(&coll).then_some(coll);
                }
            }
            return None;
        }
        // A rank histogram of the documents layout: its `_id`s are
        // `{b, s}`, sharded by `{"_id.b": "hashed"}` (what it declares).
        for c in rank_document_colls(db, name, cmd) {
            st.keys
                .entry(c)
                .or_insert((ShardKey::hashed("_id.b"), Source::Learned));
        }
        if st.keys.contains_key(&coll) {
            return None;
        }
        if coll.ends_with(".mp_locks") {
            st.keys
                .insert(coll, (ShardKey::ranged("_id"), Source::Learned));
            return None;
        }
        // A bucket collection: its `_id`s are `{k, s}`.
        let mut docs: Vec<&Document> = Vec::new();
        let stmts = statements(name, cmd);
        for s in &stmts {
            docs.extend(s.iter().copied());
        }
        let mut bucket = false;
        for d in &docs {
            if let Some(f) = bucket_key_field(d) {
                st.keys
                    .insert(coll.clone(), (ShardKey::ranged(&f), Source::Learned));
                return st.held.contains_key(&coll).then_some(coll);
            }
            bucket |= mentions_bucket_id(d);
        }
        if bucket {
            st.held.entry(coll).or_default();
        }
        None
    }
}

pub(super) fn ignored_db(db: &str) -> bool {
    matches!(db, "admin" | "config" | "local")
}

pub(super) fn first_key(d: &Document) -> Option<String> {
    d.keys().next().cloned()
}

pub(super) fn array<'a>(d: &'a Document, k: &str) -> &'a [Bson] {
    match d.get(k) {
        Some(Bson::Array(a)) => a,
        _ => &[],
    }
}

/// The collection a command names (the first of a `bulkWrite`'s).
pub(super) fn target_coll(db: &str, name: &str, cmd: &Document) -> Option<String> {
    if name == "bulkWrite" {
        let ns = array(cmd, "nsInfo")
            .first()?
            .as_document()?
            .get_str("ns")
            .ok()?;
        return Some(ns.split_once('.').map_or(ns, |(_, c)| c).to_owned());
    }
    if ignored_db(db) {
        return None;
    }
    cmd.get_str(name).ok().map(str::to_owned)
}

/// The documents of a command that may show a bucket: filters, inserted
/// documents, `$setOnInsert`.
pub(super) fn statements<'a>(name: &str, cmd: &'a Document) -> Vec<Vec<&'a Document>> {
    let mut out = Vec::new();
    let push_update =
        |out: &mut Vec<Vec<&'a Document>>, q: Option<&'a Document>, u: Option<&'a Bson>| {
            let mut v: Vec<&Document> = q.into_iter().collect();
            if let Some(Bson::Document(u)) = u {
                if let Ok(s) = u.get_document("$setOnInsert") {
                    v.push(s);
                }
                if !u.keys().any(|k| k.starts_with('$')) {
                    v.push(u);
                }
            }
            out.push(v);
        };
    match name {
        "insert" => {
            for d in array(cmd, "documents").iter().filter_map(Bson::as_document) {
                out.push(vec![d]);
            }
        }
        "update" => {
            for s in array(cmd, "updates").iter().filter_map(Bson::as_document) {
                push_update(&mut out, s.get_document("q").ok(), s.get("u"));
            }
        }
        "delete" => {
            for s in array(cmd, "deletes").iter().filter_map(Bson::as_document) {
                out.extend(s.get_document("q").ok().map(|q| vec![q]));
            }
        }
        "findAndModify" => push_update(&mut out, cmd.get_document("query").ok(), cmd.get("update")),
        "find" | "count" | "distinct" => {
            for k in ["filter", "query"] {
                out.extend(cmd.get_document(k).ok().map(|q| vec![q]));
            }
        }
        "aggregate" => {
            if let Some(m) = array(cmd, "pipeline")
                .first()
                .and_then(Bson::as_document)
                .and_then(|s| s.get_document("$match").ok())
            {
                out.push(vec![m]);
            }
        }
        "bulkWrite" => {
            for op in array(cmd, "ops").iter().filter_map(Bson::as_document) {
                if let Ok(d) = op.get_document("document") {
                    out.push(vec![d]);
                } else {
                    push_update(
                        &mut out,
                        op.get_document("filter").ok(),
                        op.get("updateMods"),
                    );
                }
            }
        }
        _ => {}
    }
    out
}

/// The field `f` of a bucket document or filter `{_id: {k: v, s}, f: v}`.
pub(super) fn bucket_key_field(d: &Document) -> Option<String> {
    let id = d.get_document("_id").ok()?;
    let k = id.get("k")?;
    if !id.contains_key("s") || id.keys().any(|x| x.starts_with('$')) {
        return None;
    }
    d.iter()
        .find(|(f, v)| f.as_str() != "_id" && !f.starts_with('$') && *v == k)
        .map(|(f, _)| f.clone())
}

/// Whether `_id` is compared with `{k, s}` documents (a bucket's).
pub(super) fn mentions_bucket_id(d: &Document) -> bool {
    fn is_bucket_id(b: &Bson) -> bool {
        match b {
            Bson::Document(d) => {
                (d.contains_key("k") && d.contains_key("s")) || d.values().any(|v| match v {
                    Bson::Array(a) => a.iter().any(is_bucket_id),
                    v => {
                        matches!(v, Bson::Document(x) if x.contains_key("k") && x.contains_key("s"))
                    }
                })
            }
            _ => false,
        }
    }
    d.get("_id").is_some_and(is_bucket_id)
        || array(d, "$and")
            .iter()
            .filter_map(Bson::as_document)
            .any(mentions_bucket_id)
}

/// Whether `d` names a rank histogram document of the documents layout:
/// `_id` is `{b, s}`, or a range between two of them.
fn is_rank_document_filter(d: &Document) -> bool {
    let pair = |b: &Bson| matches!(b, Bson::Document(x) if x.len() == 2 && x.contains_key("b") && x.contains_key("s"));
    match d.get("_id") {
        Some(Bson::Document(id)) if pair(&Bson::Document(id.clone())) => true,
        Some(Bson::Document(id)) => {
            !id.is_empty()
                && id.iter().all(|(op, v)| {
                    matches!(op.as_str(), "$gte" | "$lte" | "$gt" | "$lt") && pair(v)
                })
        }
        _ => false,
    }
}

/// The collections `cmd` writes or reads rank histogram documents of the
/// documents layout in (a `bulkWrite`'s by each statement's namespace).
fn rank_document_colls(db: &str, name: &str, cmd: &Document) -> Vec<String> {
    let mut out = Vec::new();
    if name == "bulkWrite" {
        let colls: Vec<String> = array(cmd, "nsInfo")
            .iter()
            .filter_map(|n| n.as_document()?.get_str("ns").ok())
            .map(|ns| ns.split_once('.').map_or(ns, |(_, c)| c).to_owned())
            .collect();
        for op in array(cmd, "ops").iter().filter_map(Bson::as_document) {
            let (idx, d) = match (op.get("insert"), op.get("update"), op.get("delete")) {
                (Some(i), _, _) => (i, op.get_document("document").ok()),
                (_, Some(i), _) | (_, _, Some(i)) => (i, op.get_document("filter").ok()),
                _ => continue,
            };
            let idx = match idx {
                Bson::Int32(i) => *i as usize,
                Bson::Int64(i) => *i as usize,
                _ => continue,
            };
            if let (Some(c), Some(d)) = (colls.get(idx), d) {
                if is_rank_document_filter(d) && !out.contains(c) {
                    out.push(c.clone());
                }
            }
        }
        return out;
    }
    let Some(coll) = target_coll(db, name, cmd) else {
        return out;
    };
    if statements(name, cmd)
        .iter()
        .flatten()
        .any(|d| is_rank_document_filter(d))
    {
        out.push(coll);
    }
    out
}
