//! The schema of a type stored inside a model's documents (a nested
//! struct, an enum of unit variants), where it derives [`Schema`]: the
//! validator then checks its fields too, instead of leaving it open.

use std::marker::PhantomData;

use mongodb::bson::{doc, Bson, Document};

/// A type stored inside a model's documents whose BSON shape the
/// collection's validator checks, as a field's value, an `Option`'s or a
/// sequence's elements. `#[derive(Schema)]` writes it for a struct with
/// named fields (its fields' types, as serde stores them, none required)
/// and for an enum: the names serde stores its unit variants under, and
/// for each variant with data the shape its `#[serde]` tagging gives it
/// (`{Name: content}` by default, the `tag` field beside the fields, the
/// `tag` and `content` fields, or the content alone when `untagged`; a
/// tuple variant is an array of its length). A field whose type does not
/// implement it is left open, and so is a variant's content the derive
/// cannot see through.
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
    /// struct, `{enum: [...]}` for an enum of unit variants, an `anyOf`
    /// of its variants for an enum with data.
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
    if let Ok(any) = s.get_array_mut("anyOf") {
        any.push(doc! {"bsonType": "null"}.into());
    }
    s
}

/// The schemas of an enum's variants as serde stores them, for the
/// derive's [`Schema`] of an enum with data: one `anyOf` of its variants'
/// shapes, each tagged as the enum's `#[serde]` attributes say. A
/// variant's content the derive cannot see through is left open.
#[doc(hidden)]
pub mod variant {
    use super::*;

    /// A value of the BSON `types` (an array of `items`, when given).
    pub fn value(types: &[&str], items: &[&str]) -> Document {
        let mut s = doc! {"bsonType": types.to_vec()};
        if !items.is_empty() {
            s.insert("items", doc! {"bsonType": items.to_vec()});
        }
        s
    }

    /// A tuple variant's content: an array of its `len` fields.
    pub fn tuple(len: usize) -> Document {
        let len = len as i64;
        doc! {"bsonType": "array", "minItems": len, "maxItems": len}
    }

    /// An untagged unit variant: `null`.
    pub fn null() -> Document {
        doc! {"bsonType": "null"}
    }

    /// The default tagging of a variant with data: `{name: content}`.
    pub fn external(name: &str, content: Document) -> Document {
        doc! {
            "bsonType": "object",
            "required": [name],
            "properties": {name: content},
            "additionalProperties": false,
        }
    }

    /// `#[serde(tag)]`: `{tag: name}` beside the content's own fields
    /// (serde takes only a struct, a map or nothing there).
    pub fn internal(tag: &str, name: &str, content: Option<Document>) -> Document {
        let mut properties = content
            .and_then(|c| c.get_document("properties").ok().cloned())
            .unwrap_or_default();
        properties.insert(tag, doc! {"enum": [name]});
        doc! {"bsonType": "object", "required": [tag], "properties": properties}
    }

    /// `#[serde(tag, content)]`: `{tag: name, content_key: content}`.
    pub fn adjacent(
        tag: &str,
        content_key: &str,
        name: &str,
        content: Option<Document>,
    ) -> Document {
        let mut properties = doc! {tag: {"enum": [name]}};
        let mut required = vec![tag];
        if let Some(c) = content {
            properties.insert(content_key, c);
            required.push(content_key);
        }
        doc! {"bsonType": "object", "required": required, "properties": properties}
    }

    /// The enum: any of `shapes`, or of the `names` its unit variants are
    /// stored as (the default tagging). An enum with no variant serde
    /// stores is left open (the server refuses an empty `anyOf`).
    pub fn any_of(names: &[&str], shapes: Vec<Document>) -> Document {
        let names = (!names.is_empty()).then(|| doc! {"enum": names.to_vec()});
        match (names, shapes.is_empty()) {
            (None, true) => Document::new(),
            (Some(names), true) => names,
            (names, _) => {
                let any: Vec<Document> = names.into_iter().chain(shapes).collect();
                doc! {"anyOf": any}
            }
        }
    }
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
    fn an_enum_is_any_of_its_shapes() {
        use super::variant::*;
        assert_eq!(any_of(&[], Vec::new()), doc! {});
        assert_eq!(any_of(&["a"], Vec::new()), doc! {"enum": ["a"]});
        let ext = external("B", value(&["int"], &[]));
        assert_eq!(
            any_of(&["a"], vec![ext.clone()]),
            doc! {"anyOf": [{"enum": ["a"]}, ext]}
        );
        let shape = nullable(any_of(&[], vec![null()]));
        assert_eq!(
            shape,
            doc! {"anyOf": [{"bsonType": "null"}, {"bsonType": "null"}]}
        );
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
