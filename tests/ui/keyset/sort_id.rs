use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = ["score", "_id"])]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    score: i32,
}

fn main() {}
