use mongo_patterns::prelude::*;

// A wrongly typed value does not stop the reading: the unknown lint and
// the misspelt option after it are reported too.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = id, allow(monotonik), hashd = "id")]
struct Event {
    #[serde(rename = "_id")]
    id: ObjectId,
}

fn main() {}
