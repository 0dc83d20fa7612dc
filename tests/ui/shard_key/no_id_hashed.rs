use mongo_patterns::prelude::*;

// No `_id` at all, under a hashed key.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "user")]
struct Session {
    user: String,
    started: DateTime,
}

fn main() {}
