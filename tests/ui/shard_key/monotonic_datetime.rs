use mongo_patterns::prelude::*;

// A timestamp alone: every insert lands in the last chunk.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "ts")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: DateTime,
    msg: String,
}

fn main() {}
