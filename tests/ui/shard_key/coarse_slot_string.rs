use mongo_patterns::prelude::*;

// The repository stores a date in `month`; the struct cannot read it back
// as a string.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
    month: String,
}

fn main() {}
