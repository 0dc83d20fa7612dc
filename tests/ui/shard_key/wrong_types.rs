use mongo_patterns::prelude::*;

// Every wrongly typed value is reported at once, each at its own token,
// and no lint judges the key the user did not manage to write.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = month, from = 1, granularity = Month, search, allow = "monotonic")]
struct Event {
    #[serde(rename = "_id")]
    id: ObjectId,
    kind: String,
    ts: i64,
}

fn main() {}
