use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize)]
struct Account {
    bank: String,
    number: u64,
}

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "account")]
struct Trade {
    account: Account,
    ticker: String,
}

fn main() {}
