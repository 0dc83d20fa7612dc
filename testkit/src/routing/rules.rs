//! The targeting rules of `mongos`: a command split into operations, each
//! judged against its collection's shard key.

use std::collections::HashMap;

use mongo_patterns::bson::{Bson, Document};

use super::learn::{array, ignored_db};
use super::{Kind, ShardKey, Verdict};

/// A `$merge` without `on`: it matches on the document key, which holds
/// the shard key.
const DOCUMENT_KEY: &str = "$documentKey";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpKind {
    UpdateOne { upsert: bool },
    UpdateMany { upsert: bool },
    DeleteOne,
    DeleteMany,
    FindAndModify { upsert: bool },
    Insert,
    Merge,
    Read,
}

impl OpKind {
    pub(super) fn is_write(self) -> bool {
        !matches!(self, OpKind::Read)
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            OpKind::UpdateOne { upsert: false } => "updateOne",
            OpKind::UpdateOne { upsert: true } => "updateOne upsert",
            OpKind::UpdateMany { upsert: false } => "updateMany",
            OpKind::UpdateMany { upsert: true } => "updateMany upsert",
            OpKind::DeleteOne => "deleteOne",
            OpKind::DeleteMany => "deleteMany",
            OpKind::FindAndModify { upsert: false } => "findAndModify",
            OpKind::FindAndModify { upsert: true } => "findAndModify upsert",
            OpKind::Insert => "insert",
            OpKind::Merge => "$merge",
            OpKind::Read => "read",
        }
    }
}

/// One operation of a command, on one collection.
pub(super) struct Op {
    pub(super) coll: String,
    pub(super) command: String,
    pub(super) kind: OpKind,
    /// The filter (for an insert: the document; for `$merge`: `on`).
    pub(super) filter: Document,
    /// The update, if any.
    pub(super) update: Option<Bson>,
}

pub(super) fn operations(db: &str, name: &str, cmd: &Document) -> Vec<Op> {
    let mut out = Vec::new();
    if name == "bulkWrite" {
        let colls: Vec<String> = array(cmd, "nsInfo")
            .iter()
            .filter_map(|n| n.as_document()?.get_str("ns").ok())
            .map(|ns| ns.split_once('.').map_or(ns, |(_, c)| c).to_owned())
            .collect();
        for op in array(cmd, "ops").iter().filter_map(Bson::as_document) {
            let (kind_key, kind) = if op.contains_key("insert") {
                ("insert", OpKind::Insert)
            } else if op.contains_key("update") {
                let upsert = op.get_bool("upsert").unwrap_or(false);
                if op.get_bool("multi").unwrap_or(false) {
                    ("update", OpKind::UpdateMany { upsert })
                } else {
                    ("update", OpKind::UpdateOne { upsert })
                }
            } else if op.contains_key("delete") {
                if op.get_bool("multi").unwrap_or(false) {
                    ("delete", OpKind::DeleteMany)
                } else {
                    ("delete", OpKind::DeleteOne)
                }
            } else {
                continue;
            };
            let idx = match op.get(kind_key) {
                Some(Bson::Int32(i)) => *i as usize,
                Some(Bson::Int64(i)) => *i as usize,
                _ => continue,
            };
            let Some(coll) = colls.get(idx) else { continue };
            let filter = if kind == OpKind::Insert {
                op.get_document("document").cloned().unwrap_or_default()
            } else {
                op.get_document("filter").cloned().unwrap_or_default()
            };
            out.push(Op {
                coll: coll.clone(),
                command: "bulkWrite".into(),
                kind,
                filter,
                update: op.get("updateMods").cloned(),
            });
        }
        return out;
    }
    if ignored_db(db) {
        return out;
    }
    let Ok(coll) = cmd.get_str(name) else {
        return out;
    };
    let mk = |kind, filter: Option<&Document>, update: Option<&Bson>| Op {
        coll: coll.to_owned(),
        command: name.to_owned(),
        kind,
        filter: filter.cloned().unwrap_or_default(),
        update: update.cloned(),
    };
    match name {
        "insert" => {
            for d in array(cmd, "documents").iter().filter_map(Bson::as_document) {
                out.push(mk(OpKind::Insert, Some(d), None));
            }
        }
        "update" => {
            for s in array(cmd, "updates").iter().filter_map(Bson::as_document) {
                let upsert = s.get_bool("upsert").unwrap_or(false);
                let kind = if s.get_bool("multi").unwrap_or(false) {
                    OpKind::UpdateMany { upsert }
                } else {
                    OpKind::UpdateOne { upsert }
                };
                out.push(mk(kind, s.get_document("q").ok(), s.get("u")));
            }
        }
        "delete" => {
            for s in array(cmd, "deletes").iter().filter_map(Bson::as_document) {
                let one = matches!(s.get("limit"), Some(Bson::Int32(1) | Bson::Int64(1)))
                    || matches!(s.get("limit"), Some(Bson::Double(x)) if *x == 1.0);
                let kind = if one {
                    OpKind::DeleteOne
                } else {
                    OpKind::DeleteMany
                };
                out.push(mk(kind, s.get_document("q").ok(), None));
            }
        }
        "findAndModify" => {
            let upsert = cmd.get_bool("upsert").unwrap_or(false);
            out.push(mk(
                OpKind::FindAndModify { upsert },
                cmd.get_document("query").ok(),
                cmd.get("update"),
            ));
        }
        "find" => out.push(mk(OpKind::Read, cmd.get_document("filter").ok(), None)),
        "count" | "distinct" => out.push(mk(OpKind::Read, cmd.get_document("query").ok(), None)),
        "aggregate" => {
            let pipeline = array(cmd, "pipeline");
            let first = pipeline
                .first()
                .and_then(Bson::as_document)
                .and_then(|s| s.get_document("$match").ok());
            out.push(mk(OpKind::Read, first, None));
            // `$merge` into a collection: its `on` must hold the key.
            if let Some(m) = pipeline
                .last()
                .and_then(Bson::as_document)
                .and_then(|s| s.get_document("$merge").ok())
            {
                let into = match m.get("into") {
                    Some(Bson::String(s)) => Some(s.clone()),
                    Some(Bson::Document(d)) => d.get_str("coll").ok().map(str::to_owned),
                    _ => None,
                };
                let on: Vec<String> = match m.get("on") {
                    Some(Bson::String(s)) => vec![s.clone()],
                    Some(Bson::Array(a)) => a
                        .iter()
                        .filter_map(|b| b.as_str().map(str::to_owned))
                        .collect(),
                    // The default: the document key (`_id` and, on a
                    // sharded collection, the shard key).
                    _ => vec![DOCUMENT_KEY.into()],
                };
                if let Some(into) = into {
                    let mut on_doc = Document::new();
                    for f in on {
                        on_doc.insert(f, 1);
                    }
                    out.push(Op {
                        coll: into,
                        command: "aggregate".into(),
                        kind: OpKind::Merge,
                        filter: on_doc,
                        update: None,
                    });
                }
            }
        }
        _ => {}
    }
    out
}

/// What a filter says of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Cond {
    Other,
    Range,
    In,
    Eq,
}

/// The conditions of a filter by path (top-level `$and` merged).
pub(super) fn conditions(filter: &Document) -> HashMap<String, Cond> {
    let mut out = HashMap::new();
    collect(filter, "", &mut out);
    out
}

pub(super) fn add(out: &mut HashMap<String, Cond>, path: String, c: Cond) {
    let e = out.entry(path).or_insert(c);
    if c > *e {
        *e = c;
    }
}

pub(super) fn collect(filter: &Document, prefix: &str, out: &mut HashMap<String, Cond>) {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(a) = v {
                for d in a.iter().filter_map(Bson::as_document) {
                    collect(d, prefix, out);
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Bson::Document(d) if d.keys().next().is_some_and(|x| x.starts_with('$')) => {
                let mut c = Cond::Other;
                for (op, arg) in d {
                    let this = match op.as_str() {
                        "$eq" => Cond::Eq,
                        "$in" => match arg {
                            Bson::Array(a) if a.len() == 1 => Cond::Eq,
                            _ => Cond::In,
                        },
                        "$gt" | "$gte" | "$lt" | "$lte" => Cond::Range,
                        _ => Cond::Other,
                    };
                    c = c.max(this);
                }
                add(out, path, c);
            }
            Bson::Document(d) => {
                // An exact match on a document: equality on it, and on
                // each of its fields.
                add(out, path.clone(), Cond::Eq);
                collect(d, &path, out);
            }
            Bson::RegularExpression(_) => add(out, path, Cond::Other),
            _ => add(out, path, Cond::Eq),
        }
    }
}

/// How the filter targets `key`: Targeted (equality on every field),
/// Multi (some shards), Scatter (every shard).
pub(super) fn targeting(conds: &HashMap<String, Cond>, key: &ShardKey) -> Verdict {
    let all_eq = key
        .fields()
        .all(|f| conds.get(f).copied() == Some(Cond::Eq));
    if all_eq {
        return Verdict::Targeted;
    }
    let (first, kind) = &key.0[0];
    match (conds.get(first.as_str()).copied(), kind) {
        (Some(Cond::Eq | Cond::In), _) => Verdict::Multi,
        (Some(Cond::Range), Kind::Ranged) => Verdict::Multi,
        _ => Verdict::Scatter,
    }
}

/// The shard key fields an update sets or removes.
pub(super) fn touched_key_fields(update: &Bson, key: &ShardKey) -> Vec<String> {
    let touches = |path: &str| {
        key.fields()
            .filter(|f| {
                *f == path
                    || f.starts_with(&format!("{path}."))
                    || path.starts_with(&format!("{f}."))
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    match update {
        Bson::Document(u) if u.keys().any(|k| k.starts_with('$')) => {
            for (op, fields) in u {
                if op == "$setOnInsert" {
                    continue;
                }
                if let Bson::Document(fields) = fields {
                    for f in fields.keys() {
                        out.extend(touches(f));
                    }
                    if op == "$rename" {
                        for to in fields.values().filter_map(Bson::as_str) {
                            out.extend(touches(to));
                        }
                    }
                }
            }
        }
        Bson::Array(stages) => {
            for s in stages.iter().filter_map(Bson::as_document) {
                for (op, arg) in s {
                    match (op.as_str(), arg) {
                        ("$set" | "$addFields", Bson::Document(d)) => {
                            for f in d.keys() {
                                out.extend(touches(f));
                            }
                        }
                        ("$unset", Bson::String(f)) => out.extend(touches(f)),
                        ("$unset", Bson::Array(a)) => {
                            for f in a.iter().filter_map(Bson::as_str) {
                                out.extend(touches(f));
                            }
                        }
                        ("$replaceRoot" | "$replaceWith", _) => {
                            out.extend(key.fields().map(str::to_owned))
                        }
                        ("$project", Bson::Document(p)) => {
                            let keeps = |v: &Bson| {
                                matches!(v, Bson::Boolean(true) | Bson::Int32(1) | Bson::Int64(1))
                                    || matches!(v, Bson::Double(x) if *x == 1.0)
                            };
                            let inclusion = p.iter().any(|(f, v)| f != "_id" && keeps(v));
                            for f in key.fields() {
                                match p.get(f) {
                                    Some(v) if !keeps(v) => out.push(f.to_owned()),
                                    None if inclusion => out.push(f.to_owned()),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        _ => {}
    }
    // No update changes `_id`: the server refuses it, sharded or not.
    out.retain(|f| f != "_id");
    out.sort();
    out.dedup();
    out
}

pub(super) fn has_path(d: &Document, path: &str) -> bool {
    let mut cur = d;
    let mut parts = path.split('.').peekable();
    while let Some(p) = parts.next() {
        match cur.get(p) {
            Some(Bson::Document(sub)) if parts.peek().is_some() => cur = sub,
            Some(_) if parts.peek().is_none() => return true,
            _ => return false,
        }
    }
    false
}

pub(super) fn judge(op: &Op, key: &ShardKey) -> (Verdict, String) {
    if op.kind == OpKind::Insert {
        let missing: Vec<&str> = key.fields().filter(|f| !has_path(&op.filter, f)).collect();
        return if missing.is_empty() {
            (Verdict::Targeted, format!("carries the shard key {key}"))
        } else {
            (
                Verdict::Refused,
                format!(
                    "the document lacks shard key field(s) {missing:?} of {key} (refused up to 4.2; 4.4+ stores them missing, all on one chunk)"
                ),
            )
        };
    }
    if op.kind == OpKind::Merge {
        if op.filter.contains_key(DOCUMENT_KEY) {
            return (
                Verdict::Targeted,
                "`on` is the default, the document key (`_id` and the shard key)".into(),
            );
        }
        let missing: Vec<&str> = key
            .fields()
            .filter(|f| !op.filter.contains_key(*f))
            .collect();
        return if missing.is_empty() {
            (Verdict::Targeted, format!("`on` holds the shard key {key}"))
        } else {
            (
                Verdict::Refused,
                format!("$merge into a sharded collection needs `on` to hold every shard key field; {missing:?} of {key} missing"),
            )
        };
    }
    let conds = conditions(&op.filter);
    let target = targeting(&conds, key);
    let full = target == Verdict::Targeted;
    let by_id = conds.get("_id").copied() == Some(Cond::Eq);
    if let Some(u) = &op.update {
        let touched = touched_key_fields(u, key);
        let single = matches!(
            op.kind,
            OpKind::UpdateOne { .. } | OpKind::FindAndModify { .. }
        );
        if !touched.is_empty() && (!full || !single) {
            return (
                Verdict::Refused,
                format!(
                    "the update may change shard key field(s) {touched:?} of {key} without equality on the full shard key in a single-document write"
                ),
            );
        }
    }
    match op.kind {
        OpKind::Read => {
            let why = match target {
                Verdict::Targeted => format!("equality on the shard key {key}"),
                Verdict::Multi => format!("$in, a range or a prefix of the shard key {key}"),
                _ => format!("no equality (nor range on a ranged key) on {}, the first field of {key}", key.0[0].0),
            };
            (target, why)
        }
        OpKind::UpdateOne { upsert: true }
        | OpKind::UpdateMany { upsert: true }
        | OpKind::FindAndModify { upsert: true } => {
            if full {
                (Verdict::Targeted, format!("upsert on the full shard key {key}"))
            } else {
                (
                    Verdict::Refused,
                    format!("an upsert needs equality on the full shard key {key} (7.0+ takes an `_id` equality through a write without shard key)"),
                )
            }
        }
        OpKind::FindAndModify { upsert: false } => {
            if full {
                (Verdict::Targeted, format!("equality on the full shard key {key}"))
            } else {
                (
                    Verdict::Refused,
                    format!("findAndModify needs equality on the full shard key {key}{} (7.0+: a two-phase write without shard key, a query to every shard first)", if by_id { "; `_id` is not enough" } else { "" }),
                )
            }
        }
        OpKind::UpdateOne { upsert: false } | OpKind::DeleteOne => {
            if full {
                (Verdict::Targeted, format!("equality on the full shard key {key}"))
            } else if by_id {
                (
                    Verdict::Broadcast,
                    format!("single-document write by `_id` without the shard key {key}: sent to every shard"),
                )
            } else {
                (
                    Verdict::Refused,
                    format!("a single-document write needs equality on the full shard key {key} or on `_id` (7.0+: a two-phase write without shard key)"),
                )
            }
        }
        OpKind::UpdateMany { upsert: false } | OpKind::DeleteMany => match target {
            Verdict::Targeted => (Verdict::Targeted, format!("equality on the shard key {key}")),
            Verdict::Multi => (Verdict::Multi, format!("$in, a range or a prefix of the shard key {key}")),
            _ => (
                Verdict::Broadcast,
                format!("a multi-document write with no condition on {}, the first field of {key}: sent to every shard", key.0[0].0),
            ),
        },
        OpKind::Insert | OpKind::Merge => unreachable!("judged above"),
    }
}
