use mongo_patterns::prelude::*;

// A bucket stores its key at the top level, next to its own `count`.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "count")]
struct Tally {
    count: i64,
    label: String,
}

fn main() {}
