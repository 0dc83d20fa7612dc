use mongo_patterns::prelude::*;

// `upsert` takes a value, as serde's flags do not.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, upsert)]
    views: i64,
}

fn main() {}
