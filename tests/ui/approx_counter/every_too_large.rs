use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 5_000_000)]
    views: i64,
}

fn main() {}
