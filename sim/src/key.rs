//! Shard keys, their values, and the queries mongos routes by them.

use std::fmt;

use crate::logs::{add_months, encode_time, Field, LogDoc, LogType};
use crate::rng::hash64;

/// The most fields a compound key may have in this model.
pub const MAX_KEY_FIELDS: usize = 3;

/// A shard key value (or a bound): one encoded component per key field,
/// compared lexicographically; unused components are 0.
/// [`KeyValue::MIN`] and [`KeyValue::MAX`] are MinKey and MaxKey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyValue(pub [u128; MAX_KEY_FIELDS]);

impl KeyValue {
    /// MinKey: below every document.
    pub const MIN: KeyValue = KeyValue([0; MAX_KEY_FIELDS]);
    /// MaxKey: above every document (chunk upper bounds are exclusive).
    pub const MAX: KeyValue = KeyValue([u128::MAX; MAX_KEY_FIELDS]);
}

/// A shard key: ranges over one or more fields (`{month: 1, type: 1}`) or
/// over the hash of one field (`{id: "hashed"}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardKey {
    fields: Vec<Field>,
    hashed: bool,
}

impl ShardKey {
    /// A range key on `fields`, in key order.
    ///
    /// # Panics
    /// With no field, more than [`MAX_KEY_FIELDS`], or one field twice.
    pub fn range(fields: &[Field]) -> Self {
        assert!(
            (1..=MAX_KEY_FIELDS).contains(&fields.len()),
            "a shard key has 1 to {MAX_KEY_FIELDS} fields"
        );
        for (i, f) in fields.iter().enumerate() {
            assert!(
                !fields[..i].contains(f),
                "`{}` twice in a shard key",
                f.name()
            );
        }
        ShardKey {
            fields: fields.to_vec(),
            hashed: false,
        }
    }

    /// A hashed key on `field`.
    pub fn hashed(field: Field) -> Self {
        ShardKey {
            fields: vec![field],
            hashed: true,
        }
    }

    /// The key's fields, in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Whether it is a hashed key.
    pub fn is_hashed(&self) -> bool {
        self.hashed
    }

    /// `doc`'s key value.
    pub fn value_of(&self, doc: &LogDoc) -> KeyValue {
        let mut k = KeyValue::MIN;
        if self.hashed {
            k.0[0] = hashed_component(hash64(self.fields[0].value(doc)));
        } else {
            for (c, f) in k.0.iter_mut().zip(&self.fields) {
                *c = f.value(doc);
            }
        }
        k
    }

    /// The five keys [`compare`](crate::compare) replays, in its order:
    /// `{type: 1}`, `{ts: 1}`, `{id: 1}`, `{id: "hashed"}`,
    /// `{month: 1, type: 1}`.
    pub fn candidates() -> Vec<ShardKey> {
        vec![
            ShardKey::range(&[Field::Type]),
            ShardKey::range(&[Field::Ts]),
            ShardKey::range(&[Field::Id]),
            ShardKey::hashed(Field::Id),
            ShardKey::range(&[Field::Month, Field::Type]),
        ]
    }
}

impl fmt::Display for ShardKey {
    /// As `shardCollection` takes it: `{month: 1, type: 1}`, `{id: "hashed"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .fields
            .iter()
            .map(|x| {
                if self.hashed {
                    format!("{}: \"hashed\"", x.name())
                } else {
                    format!("{}: 1", x.name())
                }
            })
            .collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// A 64-bit hash as a key component: shifted by one so that it is never
/// MinKey.
pub(crate) fn hashed_component(h: u64) -> u128 {
    u128::from(h) + 1
}

/// A predicate on one field, in [`Field::value`]'s encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predicate {
    /// `{field: v}`.
    Eq(u128),
    /// `{field: {$gte: lo, $lt: hi}}`.
    Range {
        /// Inclusive.
        lo: u128,
        /// Exclusive.
        hi: u128,
    },
}

/// A query's predicates, ANDed: what mongos routes by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// One predicate per field at most; later ones on the same field are
    /// ignored.
    pub predicates: Vec<(Field, Predicate)>,
}

impl Query {
    /// The query each row routes, "the logs of type `t` in the month starting at
    /// `month`", as an application using `{month, type}` writes it: `month`
    /// equal, `type` equal, and `ts` in the month (which is what lets a
    /// `{ts}` key target it).
    pub fn month_of_type(month: i64, t: LogType) -> Query {
        Query {
            predicates: vec![
                (Field::Month, Predicate::Eq(encode_time(month))),
                (Field::Type, Predicate::Eq(t.code())),
                (
                    Field::Ts,
                    Predicate::Range {
                        lo: encode_time(month),
                        hi: encode_time(add_months(month, 1)),
                    },
                ),
            ],
        }
    }

    pub(crate) fn get(&self, field: Field) -> Option<Predicate> {
        self.predicates
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, p)| *p)
    }
}

/// Where a query goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targeting {
    /// Routed by the key (false: broadcast to every shard with a chunk).
    pub targeted: bool,
    /// Chunks that can hold a match (all of them for a broadcast).
    pub chunks: usize,
    /// Distinct shards the query is sent to.
    pub shards: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::Level;

    #[test]
    fn keys_print_as_shard_collection_takes_them() {
        let shown: Vec<String> = ShardKey::candidates()
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(
            shown,
            [
                "{type: 1}",
                "{ts: 1}",
                "{id: 1}",
                "{id: \"hashed\"}",
                "{month: 1, type: 1}"
            ]
        );
    }

    #[test]
    fn key_values_order_as_bson_does() {
        let log = |ts: i64, log_type| LogDoc {
            id: 1,
            log_type,
            level: Level::Info,
            ts,
            month: crate::month_start(ts),
        };
        let key = ShardKey::range(&[Field::Month, Field::Type]);
        let (a, b) = (
            log(1_700_000_000, LogType::Web),
            log(1_700_000_000, LogType::Admin),
        );
        assert!(key.value_of(&b) < key.value_of(&a), "admin < web");
        let later = log(1_710_000_000, LogType::Admin);
        assert!(key.value_of(&a) < key.value_of(&later), "the month first");
        for d in [a, b, later] {
            let v = key.value_of(&d);
            assert!(KeyValue::MIN < v && v < KeyValue::MAX);
        }
    }
}
