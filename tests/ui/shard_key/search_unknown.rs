use mongo_patterns::prelude::*;

// `type` by its Rust name, misspelt: the suggestion is the stored name.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "kinf")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
