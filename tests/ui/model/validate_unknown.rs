use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(validate = "lenient")]
#[bucket(size = 100, key = "customer")]
struct Trade {
    customer: i64,
}

fn main() {}
