use mongo_patterns::prelude::*;

// serde never stores a skipped field, so it cannot be in the key.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "kind")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(skip)]
    kind: String,
    ts: i64,
}

fn main() {}
