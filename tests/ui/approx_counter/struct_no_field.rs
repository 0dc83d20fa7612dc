use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[approx_counter(every = 100)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    views: i64,
}

fn main() {}
