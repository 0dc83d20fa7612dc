use mongo_patterns::prelude::*;

// An integer named as a time, alone.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "created_at")]
struct Order {
    #[serde(rename = "_id")]
    id: String,
    created_at: i64,
    total: f64,
}

fn main() {}
