use mongo_patterns::prelude::*;

// A wrongly typed value does not stop the reading: the unknown option
// after it is reported too.
#[derive(Serialize, Deserialize, Model)]
#[model(collection = 5, colection = "trades")]
struct Trade {
    ticker: String,
}

fn main() {}
