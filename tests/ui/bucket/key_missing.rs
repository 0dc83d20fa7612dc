use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, order = "date")]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
