use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "type", search = "level")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    level: String,
    ts: i64,
}

fn main() {}
