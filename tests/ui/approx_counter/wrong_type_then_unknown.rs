use mongo_patterns::prelude::*;

// A wrongly typed value does not stop the reading: the misspelt option
// and the bad mode after it are reported too.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = "100", evry = 10, mode = "bufferd")]
    views: i64,
}

fn main() {}
