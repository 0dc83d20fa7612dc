use mongo_patterns::prelude::*;

// `id` is stored as `_id`: the same mistake as `key = "_id"`.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "id")]
struct Trade {
    #[serde(rename = "_id")]
    id: ObjectId,
    customer_id: i64,
}

fn main() {}
