//! Shard keys: how a collection is declared sharded, by hand, by
//! `MP_ROUTING_KEYS`, or from the patterns' own declarations.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use mongo_patterns::bson::{Bson, Document};
use mongo_patterns::ensure::Declared;

/// How a shard key field distributes documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `1`: chunks are ranges of the field's values.
    Ranged,
    /// `"hashed"`: chunks are ranges of the value's hash.
    Hashed,
}

/// A shard key: its fields (dotted paths) in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardKey(pub Vec<(String, Kind)>);

impl ShardKey {
    /// `{field: 1}`.
    pub fn ranged(field: &str) -> ShardKey {
        ShardKey(vec![(field.to_owned(), Kind::Ranged)])
    }

    /// `{field: "hashed"}`.
    pub fn hashed(field: &str) -> ShardKey {
        ShardKey(vec![(field.to_owned(), Kind::Hashed)])
    }

    /// This key followed by `field`.
    pub fn then(mut self, field: &str, kind: Kind) -> ShardKey {
        self.0.push((field.to_owned(), kind));
        self
    }

    /// A key document as `shardCollection` takes it: `{a: 1, b: "hashed"}`.
    pub fn from_doc(key: &Document) -> Option<ShardKey> {
        let mut fields = Vec::new();
        for (f, v) in key {
            let kind = match v {
                Bson::String(s) if s == "hashed" => Kind::Hashed,
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => Kind::Ranged,
                _ => return None,
            };
            fields.push((f.clone(), kind));
        }
        (!fields.is_empty()).then_some(ShardKey(fields))
    }

    pub(super) fn fields(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(f, _)| f.as_str())
    }
}

impl fmt::Display for ShardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(n, k)| match k {
                Kind::Ranged => format!("{n}: 1"),
                Kind::Hashed => format!("{n}: \"hashed\""),
            })
            .collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// `coll=field:1,other:hashed;coll2=field:1`.
pub(super) fn parse_keys(spec: &str) -> Vec<(String, ShardKey)> {
    let mut out = Vec::new();
    for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
        let Some((coll, fields)) = part.split_once('=') else {
            continue;
        };
        let mut key = ShardKey(Vec::new());
        for f in fields.split(',') {
            let (name, kind) = f.split_once(':').unwrap_or((f, "1"));
            let kind = if kind.trim() == "hashed" {
                Kind::Hashed
            } else {
                Kind::Ranged
            };
            key.0.push((name.trim().to_owned(), kind));
        }
        if !key.0.is_empty() {
            out.push((coll.trim().to_owned(), key));
        }
    }
    out
}

/// The keys [`declare`] was given, for every checker of the default map in
/// this process.
static SUITE_KEYS: Mutex<Option<HashMap<String, ShardKey>>> = Mutex::new(None);

/// Declares, for every checker of the default map in this process
/// ([`Routing::from_env`](super::Routing::from_env), what `MP_ROUTING`
/// installs), the shard key of each collection in `declared` that has one,
/// as `ensure` would send it to `shardCollection` (the first key declared
/// for a collection wins, as in `ensure`). A key a test gives its own
/// checker ([`Routing::key`](super::Routing::key)) comes first.
pub fn declare(declared: impl IntoIterator<Item = Declared>) {
    let mut keys = SUITE_KEYS.lock().unwrap();
    let keys = keys.get_or_insert_with(HashMap::new);
    for d in declared {
        if let Some((key, _unique)) = &d.shard_key {
            let key = ShardKey::from_doc(key)
                .unwrap_or_else(|| panic!("routing: unreadable shard key {key}"));
            keys.entry(d.collection).or_insert(key);
        }
    }
}

/// The key [`declare`] gave `coll`, if any.
pub(super) fn suite_key(coll: &str) -> Option<ShardKey> {
    SUITE_KEYS.lock().unwrap().as_ref()?.get(coll).cloned()
}
