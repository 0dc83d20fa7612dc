// A bucket model's documents are buckets, not trades: it gets no typed
// collection and no `_id` keyset, which could not read them.
use mongo_patterns::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[bucket(size = 100, key = "customer")]
struct Trade {
    customer: i64,
    qty: i32,
}

fn pages(db: &Database) {
    let _ = Trade::keyset(db);
    let _ = Trade::collection(db);
}

fn main() {}
