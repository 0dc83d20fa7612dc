use mongo_patterns::prelude::*;

// `from` says where `coarse` comes from, and there is no `coarse`.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
