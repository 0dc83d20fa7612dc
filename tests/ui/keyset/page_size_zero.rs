use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(page_size = 0)]
struct Visit {
    uuid: String,
}

fn main() {}
