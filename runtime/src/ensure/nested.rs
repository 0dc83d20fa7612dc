//! The schema of a type stored inside a model's documents (a nested
//! struct, an enum of unit variants), where it derives [`Schema`]: the
//! validator then checks its fields too, instead of leaving it open.

use std::marker::PhantomData;

use mongodb::bson::{doc, Bson, Document};

/// A type stored inside a model's documents whose BSON shape the
/// collection's validator checks, as a field's value, an `Option`'s or a
/// sequence's elements. `#[derive(Schema)]` writes it for a struct with
/// named fields (its fields' types, as serde stores them, none required)
/// and for an enum of unit variants (the names serde stores). A field
/// whose type does not implement it is left open.
///
/// ```
/// # use mongo_patterns::prelude::*;
/// use mongo_patterns::Schema;
///
/// #[derive(Debug, Clone, Serialize, Deserialize, Schema)]
/// #[serde(rename_all = "lowercase")]
/// enum Side { Buy, Sell }
///
/// #[derive(Debug, Clone, Serialize, Deserialize, Schema)]
/// struct Fill { price: f64, qty: i32 }
///
/// #[derive(Debug, Clone, Serialize, Deserialize, Model)]
/// #[bucket(size = 1000, key = "customer")]
/// struct Trade { customer: i64, side: Side, fills: Vec<Fill> }
///
/// assert_eq!(Side::schema(), doc! {"enum": ["buy", "sell"]});
/// ```
pub trait Schema {
    /// Its `$jsonSchema`: `{bsonType: "object", properties: {...}}` for a
    /// struct, `{enum: [...]}` for an enum of unit variants.
    fn schema() -> Document;
}

/// How a field holds its nested type, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrap {
    /// `Option<T>`: the value may be `null`.
    Option,
    /// `Vec<T>` and the other sequences: an array of them.
    Seq,
}

/// A stored field whose type, inside `Option`s and sequences, implements
/// [`Schema`]: its BSON name and the schema its value takes
/// ([`Model::nested`](crate::Model::nested)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Nested {
    /// The BSON name.
    pub name: &'static str,
    /// The field's `$jsonSchema`.
    pub schema: Document,
}

impl Nested {
    /// Field `name` holding `inner`'s values inside `wraps` (outermost
    /// first).
    pub fn new(name: &'static str, inner: Document, wraps: &[Wrap]) -> Nested {
        let schema = wraps.iter().rev().fold(inner, |s, w| match w {
            Wrap::Seq => doc! {"bsonType": "array", "items": s},
            Wrap::Option => nullable(s),
        });
        Nested { name, schema }
    }
}

/// `s`, taking `null` too.
fn nullable(mut s: Document) -> Document {
    if let Some(t) = s.get_mut("bsonType") {
        match t {
            Bson::String(one) => *t = Bson::Array(vec![one.as_str().into(), "null".into()]),
            Bson::Array(all) => all.push("null".into()),
            _ => {}
        }
    }
    if let Ok(values) = s.get_array_mut("enum") {
        values.push(Bson::Null);
    }
    s
}

/// What the derive calls to find whether a field's type implements
/// [`Schema`] without requiring it: `(&&Probe::<T>::new()).schema()` is
/// `Some` exactly when it does (method resolution takes the impl on
/// `&Probe<T>` first, when it applies).
#[doc(hidden)]
pub mod probe {
    use super::*;
    use std::cell::RefCell;

    pub struct Probe<T: ?Sized>(PhantomData<T>);

    impl<T: ?Sized> Probe<T> {
        #[allow(clippy::new_without_default)]
        pub const fn new() -> Self {
            Probe(PhantomData)
        }
    }

    pub trait ViaSchema {
        fn schema(&self) -> Option<Document>;
    }

    pub trait ViaNothing {
        fn schema(&self) -> Option<Document>;
    }

    thread_local! {
        /// The types whose schema is being built, outermost first: a type
        /// that holds itself (`Vec<Node>` in `Node`) is left open there.
        static BUILDING: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
    }

    /// Takes the type off [`BUILDING`] when its schema is done.
    struct Building;

    impl Drop for Building {
        fn drop(&mut self) {
            BUILDING.with(|b| b.borrow_mut().pop());
        }
    }

    impl<T: Schema + ?Sized> ViaSchema for &Probe<T> {
        fn schema(&self) -> Option<Document> {
            let name = std::any::type_name::<T>();
            let again = BUILDING.with(|b| {
                let mut b = b.borrow_mut();
                let again = b.contains(&name);
                if !again {
                    b.push(name);
                }
                again
            });
            if again {
                return None;
            }
            let _done = Building;
            Some(T::schema())
        }
    }

    impl<T: ?Sized> ViaNothing for Probe<T> {
        fn schema(&self) -> Option<Document> {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::probe::{Probe, ViaNothing as _, ViaSchema as _};
    use super::*;

    struct Leaf;
    impl Schema for Leaf {
        fn schema() -> Document {
            doc! {"bsonType": "object", "properties": {"n": {"bsonType": ["int", "long"]}}}
        }
    }

    /// Holds itself: its own field is left open.
    struct Node;
    impl Schema for Node {
        fn schema() -> Document {
            let mut properties = Document::new();
            if let Some(s) = (&&Probe::<Node>::new()).schema() {
                properties.insert("child", s);
            }
            doc! {"bsonType": "object", "properties": properties}
        }
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the borrow is what the probe is
    fn the_probe_finds_the_impl_and_only_it() {
        assert!((&&Probe::<Leaf>::new()).schema().is_some());
        assert!((&&Probe::<String>::new()).schema().is_none());
    }

    #[test]
    fn a_type_that_holds_itself_is_left_open_there() {
        let s = (&&Probe::<Node>::new()).schema().unwrap();
        assert_eq!(s, doc! {"bsonType": "object", "properties": {}});
    }

    #[test]
    fn wraps_apply_from_the_inside() {
        let n = Nested::new("f", Leaf::schema(), &[Wrap::Option, Wrap::Seq]);
        assert_eq!(
            n.schema,
            doc! {"bsonType": ["array", "null"], "items": Leaf::schema()}
        );
        let e = Nested::new("e", doc! {"enum": ["a"]}, &[Wrap::Option]);
        assert_eq!(e.schema, doc! {"enum": ["a", Bson::Null]});
        let v = Nested::new("v", doc! {"enum": ["a"]}, &[Wrap::Seq, Wrap::Option]);
        assert_eq!(
            v.schema,
            doc! {"bsonType": "array", "items": {"enum": ["a", Bson::Null]}}
        );
    }
}
