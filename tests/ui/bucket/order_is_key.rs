use mongo_patterns::prelude::*;

// `customer_id` and `customerId` are the same field.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 1000, key = "customerId", order = "customer_id")]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
