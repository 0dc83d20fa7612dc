use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "_id")]
struct Trade {
    #[serde(rename = "_id")]
    id: ObjectId,
    customer_id: i64,
}

fn main() {}
