use mongo_patterns::prelude::*;

// `month` is stored as the caller writes it: nothing keeps it coarse.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "type")]
    kind: String,
    month: DateTime,
}

fn main() {}
