use mongo_patterns::prelude::*;

// Every wrongly typed value is reported at once, each at its own token,
// and `every` is not also reported as missing.
#[derive(Serialize, Deserialize, Model)]
#[approx_counter(field = views, every = "100")]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    views: i64,
    #[approx_counter(every = 1.5, mode = buffered, max_delay_ms = "10", max_keys = -1, upsert = "yes")]
    likes: i64,
}

fn main() {}
