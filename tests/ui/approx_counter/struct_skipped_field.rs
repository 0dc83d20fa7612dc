use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[approx_counter(field = "views", every = 100)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[serde(skip)]
    views: i64,
}

fn main() {}
