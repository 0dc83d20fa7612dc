use mongo_patterns::prelude::*;

// `granularity` rounds `from`, which is missing.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", granularity = "month", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
