// One bucket holds a customer's items across months: a shard key with a
// coarse time field would differ between the items of one bucket.
use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 100, key = "customerId")]
#[shard_key(coarse = "month", from = "at", granularity = "month", search = "customerId")]
struct Trade {
    customer_id: i64,
    month: DateTime,
    at: DateTime,
}

fn main() {}
