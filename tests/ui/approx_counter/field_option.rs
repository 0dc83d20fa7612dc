use mongo_patterns::prelude::*;

// `$inc` on a missing or null field: the counter must be a plain number.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100)]
    views: Option<i64>,
}

fn main() {}
