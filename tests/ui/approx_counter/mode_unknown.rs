use mongo_patterns::prelude::*;

// The misspelt mode is reported, not `max_delay_ms` as if the mode were not
// `buffered`.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, mode = "bufered", max_delay_ms = 250)]
    views: i64,
}

fn main() {}
