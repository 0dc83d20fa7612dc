use mongo_patterns::prelude::*;

// The misspelt option is reported, not a missing `every` on top.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(evry = 100)]
    views: i64,
}

fn main() {}
