use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, mode = "buffered", max_delay_ms = 0)]
    views: i64,
}

fn main() {}
