use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, mode = "geometric", max_delay_ms = 250)]
    views: i64,
}

fn main() {}
