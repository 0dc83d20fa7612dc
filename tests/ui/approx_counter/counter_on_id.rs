use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    #[approx_counter(every = 100)]
    id: i64,
    views: i64,
}

fn main() {}
