//! Decoding a bucket's items in one pass over the bucket's bytes, the key
//! the bucket holds once handed to each item as its first field: no copy of
//! an item, no buffer to splice the key into.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use mongodb::bson::Bson;
use serde::de::value::{
    BoolDeserializer, BorrowedStrDeserializer, I32Deserializer, I64Deserializer,
    MapAccessDeserializer, StrDeserializer,
};
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use serde::Deserialize;

use crate::bucket::Bucketed;
use crate::compat::DeError;

/// What the one decode needs beyond the bytes: `from_slice` takes a type,
/// not a value, so it rides along here for the length of one call.
struct Want {
    items: &'static str,
    field: &'static str,
    key: Bson,
    take: usize,
}

thread_local! {
    static WANT: RefCell<Option<Want>> = const { RefCell::new(None) };
}

/// Up to `take` items of the array `items` of `bucket`, each with
/// `field: key` added. Any error is only a signal: the caller decodes the
/// bucket again item by item to say which item and why.
pub(super) fn items<T: Bucketed>(
    bucket: &[u8],
    items: &'static str,
    field: &'static str,
    key: &Bson,
    take: usize,
) -> Result<Vec<T>, DeError> {
    WANT.with(|w| {
        *w.borrow_mut() = Some(Want {
            items,
            field,
            key: key.clone(),
            take,
        })
    });
    let out = crate::compat::from_slice::<Bucket<T>>(bucket);
    WANT.with(|w| w.borrow_mut().take());
    out.map(|b| b.0)
}

struct Bucket<T>(Vec<T>);

impl<'de, T: Bucketed> Deserialize<'de> for Bucket<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let want = WANT
            .with(|w| w.borrow_mut().take())
            .ok_or_else(|| D::Error::custom("decoded outside a page read"))?;
        d.deserialize_map(BucketVisitor(want, PhantomData))
    }
}

struct BucketVisitor<T>(Want, PhantomData<fn() -> T>);

impl<'de, T: Bucketed> Visitor<'de> for BucketVisitor<T> {
    type Value = Bucket<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a bucket")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bucket<T>, A::Error> {
        let w = &self.0;
        let mut out = None;
        while let Some(is_items) = map.next_key_seed(Named(w.items))? {
            if is_items && out.is_none() {
                out = Some(map.next_value_seed(Items::<T>(w, PhantomData))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        out.map(Bucket)
            .ok_or_else(|| A::Error::custom("no items array"))
    }
}

/// Whether a field's name is this one, read without allocating.
struct Named(&'static str);

impl<'de> DeserializeSeed<'de> for Named {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Named {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

struct Items<'w, T>(&'w Want, PhantomData<fn() -> T>);

impl<'de, T: Bucketed> DeserializeSeed<'de> for Items<'_, T> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<T>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Bucketed> Visitor<'de> for Items<'_, T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of items")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Vec<T>, S::Error> {
        let w = self.0;
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(w.take));
        while out.len() < w.take {
            match seq.next_element_seed(Keyed::<T>(w, PhantomData))? {
                Some(t) => out.push(t),
                None => return Ok(out),
            }
        }
        // The rest is not wanted, but read: the array must end where it says.
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(out)
    }
}

/// One item, decoded the model's way ([`Bucketed::__decode_item`]).
struct Keyed<'w, T>(&'w Want, PhantomData<fn() -> T>);

impl<'de, T: Bucketed> DeserializeSeed<'de> for Keyed<'_, T> {
    type Value = T;

    #[inline]
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::__decode_item(&self.0.key, self.0.field, d)
    }
}

/// One stored item with `field: key` added, for any `Deserialize` model:
/// the item's own fields, then the key's.
pub(crate) fn with_key<'de, T: DeserializeOwned, D: Deserializer<'de>>(
    key: &Bson,
    field: &'static str,
    d: D,
) -> Result<T, D::Error> {
    d.deserialize_map(WithKeyVisitor(key, field, PhantomData))
}

struct WithKeyVisitor<'k, T>(&'k Bson, &'static str, PhantomData<fn() -> T>);

impl<'de, T: DeserializeOwned> Visitor<'de> for WithKeyVisitor<'_, T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an item document")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(WithKey {
            map,
            key: self.0,
            field: self.1,
            state: State::KeyName,
        }))
    }
}

/// The bucket's key as the key field's type, for a model whose derive
/// decodes items without the key (the field has no serde attribute that
/// changes how it reads).
#[inline]
pub fn key_of<K: DeserializeOwned, E: serde::de::Error>(key: &Bson) -> Result<K, E> {
    value(key, PhantomData::<K>)
}

/// Where the key's field name may appear in a model decoded without its
/// key: a stored item must not hold the key, and one that does fails here,
/// as it fails a decode of the whole model (a duplicate field).
#[derive(Default)]
pub struct KeyInItem;

impl<'de> Deserialize<'de> for KeyInItem {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(D::Error::custom("the item holds the bucket's key field"))
    }
}

/// Where an item's decoding is. The key comes first: then the item's own
/// entries are handed on as they are, with no seed to get back from the
/// inner map when it ends (a derived `Deserialize` takes fields in any
/// order).
enum State {
    /// The key's name is next.
    KeyName,
    /// The key's value is next.
    KeyValue,
    /// The item's own entries.
    Own,
}

struct WithKey<'k, A> {
    map: A,
    key: &'k Bson,
    field: &'static str,
    state: State,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for WithKey<'_, A> {
    type Error = A::Error;

    #[inline]
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        match self.state {
            State::Own => self.map.next_key_seed(seed),
            State::KeyName => {
                self.state = State::KeyValue;
                seed.deserialize(BorrowedStrDeserializer::new(self.field))
                    .map(Some)
            }
            State::KeyValue => Err(A::Error::custom("the key's value was not read")),
        }
    }

    #[inline]
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.state {
            State::Own => self.map.next_value_seed(seed),
            State::KeyValue => {
                self.state = State::Own;
                value(self.key, seed)
            }
            State::KeyName => Err(A::Error::custom("a value before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint().map(|n| n + 1)
    }
}

/// The key's value as the model reads a field: scalars without
/// allocating, the others through the BSON value deserializer.
#[inline]
fn value<'de, V: DeserializeSeed<'de>, E: serde::de::Error>(
    key: &Bson,
    seed: V,
) -> Result<V::Value, E> {
    match key {
        Bson::Int64(v) => seed.deserialize(I64Deserializer::<E>::new(*v)),
        Bson::Int32(v) => seed.deserialize(I32Deserializer::<E>::new(*v)),
        Bson::Boolean(v) => seed.deserialize(BoolDeserializer::<E>::new(*v)),
        Bson::String(s) => seed.deserialize(StrDeserializer::<E>::new(s)),
        other => seed
            .deserialize(mongodb::bson::Deserializer::new(other.clone()))
            .map_err(|e| E::custom(e.to_string())),
    }
}
