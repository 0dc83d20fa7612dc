use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "price")]
struct Trade {
    price: f64,
    ticker: String,
}

fn main() {}
