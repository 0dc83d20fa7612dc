use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(field = "views", every = 100)]
    views: i64,
}

fn main() {}
