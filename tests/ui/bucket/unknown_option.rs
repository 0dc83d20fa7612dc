use mongo_patterns::prelude::*;

// The misspelt option is reported, not a missing `size` on top.
#[derive(Serialize, Deserialize, Model)]
#[bucket(sise = 1000, key = "customer_id")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
