use mongo_patterns::prelude::*;

// Hashing a bool still leaves two values.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "active")]
struct User {
    #[serde(rename = "_id")]
    id: String,
    active: bool,
}

fn main() {}
