use mongo_patterns::prelude::*;

// A coarse field alone: a month's documents share one key value.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: i64,
    msg: String,
}

fn main() {}
