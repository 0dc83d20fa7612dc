// A facade crate that re-exports `mongo_patterns`: `#[model(crate = "...")]`
// points the derive at it, as `#[serde(crate = "...")]` does for serde.
mod facade {
    pub use mongo_patterns::*;
}

use mongo_patterns::prelude::{Deserialize, Model, Serialize};

#[derive(Serialize, Deserialize, Model)]
#[model(crate = "crate::facade", collection = "visits")]
#[keyset(sort = "at", page_size = 50)]
struct Visit {
    #[serde(rename = "_id")]
    id: String,
    at: i64,
    #[approx_counter(every = 10)]
    hits: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[model(crate = "crate::facade")]
#[bucket(size = 100, key = "sensor")]
struct Reading {
    sensor: String,
    value: f64,
}

fn main() {
    assert_eq!(<Visit as facade::Model>::COLLECTION, "visits");
    assert_eq!(<Visit as facade::Model>::KEYSET.page_size, 50);
    assert_eq!(<Reading as facade::__private::Bucketed>::BUCKET.size, 100);
}
