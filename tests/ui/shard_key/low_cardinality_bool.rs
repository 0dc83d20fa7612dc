use mongo_patterns::prelude::*;

// A bool alone: two values, two chunks at most.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "active")]
struct User {
    #[serde(rename = "_id")]
    id: String,
    active: bool,
}

fn main() {}
