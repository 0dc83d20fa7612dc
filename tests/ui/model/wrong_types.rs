use mongo_patterns::prelude::*;

// Both options are wrongly typed: both are reported, each at its value.
#[derive(Serialize, Deserialize, Model)]
#[model(collection = history, crate = 1)]
struct Trade {
    ticker: String,
}

fn main() {}
