use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = kind)]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    kind: String,
    ts: i64,
}

fn main() {}
