use mongo_patterns::prelude::*;

// A hashed key is one field.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "_id", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
}

fn main() {}
