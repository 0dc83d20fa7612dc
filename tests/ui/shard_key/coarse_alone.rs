use mongo_patterns::prelude::*;

// A timestamp as the coarse field, alone and not derived: the three lints it
// trips are reported together, each with its own fix.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "ts")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: DateTime,
    msg: String,
}

fn main() {}
