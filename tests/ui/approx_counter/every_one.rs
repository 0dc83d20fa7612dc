use mongo_patterns::prelude::*;

// One write per increment is an exact counter, not an approximate one.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 1)]
    views: i64,
}

fn main() {}
