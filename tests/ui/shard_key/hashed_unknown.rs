use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "uid")]
struct Session {
    #[serde(rename = "_id")]
    id: String,
    uuid: String,
}

fn main() {}
