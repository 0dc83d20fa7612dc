use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "cached_rank")]
struct Visit {
    uuid: String,
    #[serde(skip)]
    cached_rank: i64,
}

fn main() {}
