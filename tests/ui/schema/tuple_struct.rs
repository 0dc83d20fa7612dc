use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Schema)]
struct Price(f64);

fn main() {}
