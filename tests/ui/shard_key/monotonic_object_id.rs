use mongo_patterns::prelude::*;

// An ObjectId `_id` alone: it starts with a timestamp, so it only grows.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "_id")]
struct Log {
    #[serde(rename = "_id")]
    id: ObjectId,
    msg: String,
}

fn main() {}
