use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 0, key = "customer_id")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
