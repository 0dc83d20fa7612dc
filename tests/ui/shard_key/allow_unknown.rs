use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "ts", allow(monotonc))]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: DateTime,
}

fn main() {}
