use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
