use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "score", sort = "uuid")]
struct Visit {
    uuid: String,
    score: i32,
}

fn main() {}
