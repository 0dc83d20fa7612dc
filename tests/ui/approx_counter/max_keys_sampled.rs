use mongo_patterns::prelude::*;

// `sampled` is the default mode.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, max_keys = 500)]
    views: i64,
}

fn main() {}
