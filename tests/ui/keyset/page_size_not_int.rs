use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(page_size = "50")]
struct Visit {
    uuid: String,
}

fn main() {}
