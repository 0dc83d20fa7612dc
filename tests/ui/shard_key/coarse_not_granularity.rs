use mongo_patterns::prelude::*;

// `period` does not say how far to round `ts`.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "period", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
