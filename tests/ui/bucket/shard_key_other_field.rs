// Only the bucket key is shared by every item of a bucket.
use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 100, key = "customerId")]
#[shard_key(hashed = "ticker")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {}
