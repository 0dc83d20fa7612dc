use mongo_patterns::prelude::*;

// Even broken syntax stops only its own option: a missing comma and a
// value that is no expression are reported, and the options around them
// still read (`size` is not reported as missing, `key` is judged).
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000 key = "customer_id", order = +, items = "trades", sise = 3)]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
