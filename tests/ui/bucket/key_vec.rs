use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "account")]
struct Trade {
    account: Vec<u8>,
    ticker: String,
}

fn main() {}
