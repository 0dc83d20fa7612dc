//! Small helpers more than one pattern uses.

use crate::bson::{doc, Bson, Document, RawDocument};

/// `impl Trait for T {}` for each listed type: the marker traits that say
/// which Rust types a pattern accepts in a role.
macro_rules! impls {
    ($tr:ident: $($t:ty),* $(,)?) => { $(impl $tr for $t {})* };
}
pub(crate) use impls;

/// Whether a `hello` reply is a `mongos`'s (`msg: "isdbgrid"`).
pub(crate) fn is_mongos(hello: &Document) -> bool {
    hello.get_str("msg").ok() == Some("isdbgrid")
}

/// A stored number as an exact integer: an `int`, a `long`, or a `double`
/// with no fraction (what a shell or another driver may have written).
pub(crate) fn int(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.3e18 => Some(*f as i64),
        _ => None,
    }
}

/// Every document whose `_id` is `{<prefix>: key, s: …}`, by the `_id`
/// index: the documents a pattern keeps per key, numbered by `s`.
pub(crate) fn id_range(prefix: &str, key: &Bson) -> Document {
    doc! {"_id": {
        "$gte": {prefix: key.clone(), "s": Bson::MinKey},
        "$lte": {prefix: key.clone(), "s": Bson::MaxKey},
    }}
}

/// A key's identity in memory: its BSON type and value, so that equal keys
/// give equal bytes (common `_id` types without building a document).
pub(crate) fn key_bytes(key: &Bson) -> Vec<u8> {
    let tagged = |tag: u8, bytes: &[u8]| {
        let mut v = Vec::with_capacity(bytes.len() + 1);
        v.push(tag);
        v.extend_from_slice(bytes);
        v
    };
    match key {
        Bson::String(s) => tagged(0x02, s.as_bytes()),
        Bson::ObjectId(o) => tagged(0x07, &o.bytes()),
        Bson::Int32(i) => tagged(0x10, &i.to_le_bytes()),
        Bson::Int64(i) => tagged(0x12, &i.to_le_bytes()),
        other => crate::compat::to_vec(&doc! {"": other})
            .unwrap_or_else(|_| other.to_string().into_bytes()),
    }
}

/// SplitMix64's step γ (odd): the generator's state moves by it.
pub(crate) const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// γ's inverse modulo 2⁶⁴ (Newton's iteration doubles the correct low
/// bits each step: 1, 2, 4, …, 64 from γ itself, which is its own inverse
/// to 3 bits).
pub(crate) const GAMMA_INVERSE: u64 = {
    let mut x = GAMMA;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(GAMMA.wrapping_mul(x)));
        i += 1;
    }
    x
};

/// SplitMix64's output function (Steele, Lea and Flood): a bijective,
/// well-mixed 64-bit hash of the state after one step.
pub(crate) fn splitmix64(z: u64) -> u64 {
    mix64(z.wrapping_add(GAMMA))
}

/// SplitMix64's mix of a state it has already stepped.
#[inline(always)]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A raw document's `_id`, to name it in an error (`null` when it has
/// none, or one that does not parse).
pub(crate) fn id_of(raw: &RawDocument) -> Bson {
    raw.get("_id")
        .ok()
        .flatten()
        .and_then(|v| Bson::try_from(crate::compat::to_raw_bson(v)).ok())
        .unwrap_or(Bson::Null)
}

/// The primary, whatever the client's, database's or collection's read
/// preference: for every read that decides a write (a secondary's copy
/// may lag behind the write it is checking).
pub(crate) fn primary() -> mongodb::options::SelectionCriteria {
    mongodb::options::SelectionCriteria::ReadPreference(mongodb::options::ReadPreference::Primary)
}

/// A map of at most `max` entries, shared between tasks: inserting a new
/// key into a full one empties it first. For what is worth remembering and
/// cheap to forget (the board a filter led to, a key's last value read
/// back, a bucket's newest): forgetting costs a round trip or a step, never
/// correctness. A lock poisoned by a panic is used as it is: every update
/// leaves the map whole.
#[derive(Debug)]
pub(crate) struct Bounded<K, V> {
    map: std::sync::Mutex<std::collections::HashMap<K, V>>,
    max: usize,
}

impl<K: Eq + std::hash::Hash, V: Clone> Bounded<K, V> {
    /// An empty map holding at most `max` entries (at least one).
    pub(crate) fn new(max: usize) -> Self {
        Bounded {
            map: std::sync::Mutex::default(),
            max: max.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<K, V>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `key`'s value, if remembered.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + std::hash::Hash + ?Sized,
    {
        self.lock().get(key).cloned()
    }

    /// Remembers `value` for `key`: in place when `key` is there (nothing
    /// forgotten, `key` not copied), else after emptying a full map.
    pub(crate) fn insert<Q>(&self, key: &Q, value: V)
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + std::hash::Hash + ToOwned<Owned = K> + ?Sized,
    {
        let mut map = self.lock();
        if let Some(known) = map.get_mut(key) {
            *known = value;
            return;
        }
        if map.len() >= self.max {
            map.clear();
        }
        map.insert(key.to_owned(), value);
    }

    /// Remembers `f` of what `key` holds (`None`: nothing), under one lock,
    /// as [`insert`](Self::insert) does.
    pub(crate) fn update<Q>(&self, key: &Q, f: impl FnOnce(Option<&V>) -> V)
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + std::hash::Hash + ToOwned<Owned = K> + ?Sized,
    {
        let mut map = self.lock();
        if let Some(known) = map.get_mut(key) {
            *known = f(Some(known));
            return;
        }
        if map.len() >= self.max {
            map.clear();
        }
        map.insert(key.to_owned(), f(None));
    }

    /// How many entries it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_canonical() {
        assert_eq!(key_bytes(&Bson::from("a")), key_bytes(&Bson::from("a")));
        assert_ne!(key_bytes(&Bson::from("a")), key_bytes(&Bson::from("b")));
        assert_ne!(key_bytes(&Bson::Int32(1)), key_bytes(&Bson::Int64(1)));
    }

    #[test]
    fn gamma_inverse_is_its_inverse() {
        assert_eq!(GAMMA.wrapping_mul(GAMMA_INVERSE), 1);
        // SplitMix64's published first output for seed 0.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn bounded_forgets_all_when_full_and_updates_in_place() {
        let m: Bounded<Vec<u8>, i64> = Bounded::new(2);
        m.insert(&b"a"[..], 1);
        m.insert(&b"b"[..], 2);
        m.insert(&b"a"[..], 3);
        assert_eq!(
            (m.len(), m.get(&b"a"[..]), m.get(&b"b"[..])),
            (2, Some(3), Some(2))
        );
        m.insert(&b"c"[..], 4);
        assert_eq!(
            (m.len(), m.get(&b"a"[..]), m.get(&b"c"[..])),
            (1, None, Some(4))
        );
    }
}
