use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "customer_id", items = "mp_ops")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
