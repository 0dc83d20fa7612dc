//! What `#[derive(Schema)]` gives, and which of a model's fields ask for
//! it: through `Option`, `Box` and sequences, by BSON name; not a field
//! serde does not store, one with its own serializer, or one whose type
//! names a generic parameter.

use mongo_patterns::bson::Bson;
use mongo_patterns::prelude::*;

#[derive(Debug, Serialize, Deserialize, Schema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Status {
    InStock,
    #[serde(skip)]
    #[allow(dead_code)]
    Hidden,
    #[serde(rename(serialize = "gone"))]
    SoldOut,
}

#[derive(Debug, Serialize, Deserialize, Schema)]
#[serde(rename_all = "camelCase")]
struct Dimensions {
    width_mm: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    depth_mm: Option<u32>,
    tags: Vec<String>,
    status: Status,
}

/// A model's field that is not a nested type: left out.
type Alias = Dimensions;

#[derive(Debug, Serialize, Deserialize, Model)]
#[model(collection = "products")]
struct Product<T> {
    #[serde(rename = "_id")]
    id: i64,
    dims: Option<Box<Dimensions>>,
    history: Vec<Option<Status>>,
    alias: Alias,
    #[serde(skip)]
    #[allow(dead_code)]
    skipped: Option<Status>,
    extra: T,
    other: mongo_patterns::bson::Document,
}

fn main() {
    assert_eq!(
        Status::schema(),
        doc! {"enum": ["IN_STOCK", "gone"]}
    );
    assert_eq!(
        Dimensions::schema(),
        doc! {
            "bsonType": "object",
            "properties": {
                "widthMm": {"bsonType": ["int", "long"]},
                "depthMm": {"bsonType": ["int", "long", "null"]},
                "tags": {"bsonType": ["array"], "items": {"bsonType": ["string"]}},
                "status": {"enum": ["IN_STOCK", "gone"]},
            }
        }
    );
    let nested = <Product<i32> as Model>::nested();
    let names: Vec<&str> = nested.iter().map(|n| n.name).collect();
    assert_eq!(names, ["dims", "history", "alias"]);
    let mut dims = Dimensions::schema();
    dims.insert("bsonType", vec!["object", "null"]);
    assert_eq!(nested[0].schema, dims);
    assert_eq!(
        nested[1].schema,
        doc! {"bsonType": "array", "items": {"enum": ["IN_STOCK", "gone", Bson::Null]}}
    );
}
