use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: i64,
}

fn main() {}
