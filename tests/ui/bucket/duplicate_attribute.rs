use mongo_patterns::prelude::*;

// Options split over two attributes: only the split is reported, not a
// missing `key` on top.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000)]
#[bucket(key = "customer_id")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
