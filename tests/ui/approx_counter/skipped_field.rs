use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[serde(skip)]
    #[approx_counter(every = 100)]
    views: i64,
}

fn main() {}
