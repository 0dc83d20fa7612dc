use mongo_patterns::prelude::*;

// Options, but no key field.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(allow(monotonic))]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: i64,
}

fn main() {}
