use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "tags")]
struct Visit {
    uuid: String,
    tags: Vec<String>,
}

fn main() {}
