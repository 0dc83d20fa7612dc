use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "month")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    ts: i64,
    month: Option<DateTime>,
}

fn main() {}
