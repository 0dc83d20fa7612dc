use mongo_patterns::prelude::*;

// `from` must be a timestamp; a string is reported at its type.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: String,
}

fn main() {}
