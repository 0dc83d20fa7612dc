use mongo_patterns::prelude::*;

// Every wrongly typed value is reported at once, each at its own token,
// and no option is also reported as missing.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = "1000", key = customer_id, order = 1, items)]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
