use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sotr = "score")]
struct Visit {
    uuid: String,
    score: i32,
}

fn main() {}
