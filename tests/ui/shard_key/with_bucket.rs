use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "type")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
