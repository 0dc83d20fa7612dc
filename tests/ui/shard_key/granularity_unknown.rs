use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "bucket", from = "ts", granularity = "mnth", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
