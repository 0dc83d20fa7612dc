use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 1000, key = "custmerId")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
