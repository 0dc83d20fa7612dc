use mongo_patterns::prelude::*;

// `id` is stored as `id`, not `_id`: `upsert` and `replace` could not find
// the document.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    id: ObjectId,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

fn main() {}
