use mongo_patterns::prelude::*;

// A wrongly typed value does not stop the reading: the misspelt option and
// the unknown field after it are reported too.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = "1000", key = "custmer_id", ordr = "date")]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
