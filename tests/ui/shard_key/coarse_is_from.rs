use mongo_patterns::prelude::*;

// The derived field would overwrite the timestamp it derives from.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "ts", from = "ts", granularity = "day", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
