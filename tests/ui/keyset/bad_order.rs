use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "score", order = "up")]
struct Visit {
    uuid: String,
    score: i32,
}

fn main() {}
