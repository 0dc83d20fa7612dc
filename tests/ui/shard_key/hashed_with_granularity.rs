use mongo_patterns::prelude::*;

// A hashed key has nothing to round.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "_id", granularity = "day")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: i64,
}

fn main() {}
