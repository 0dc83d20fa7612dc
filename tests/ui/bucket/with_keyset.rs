use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "customer_id", order = "date")]
#[keyset(sort = "date")]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
