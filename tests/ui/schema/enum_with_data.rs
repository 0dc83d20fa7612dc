use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Schema)]
enum Order {
    Market,
    Limit { price: f64 },
}

fn main() {}
