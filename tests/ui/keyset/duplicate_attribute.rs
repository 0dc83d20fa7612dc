use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "score")]
#[keyset(order = "desc")]
struct Visit {
    uuid: String,
    score: i32,
}

fn main() {}
