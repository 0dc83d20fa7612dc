use mongo_patterns::prelude::*;

// One more than `mongo_patterns::keyset::MAX_PAGE_SIZE`.
#[derive(Serialize, Deserialize, Model)]
#[keyset(page_size = 10001)]
struct Visit {
    uuid: String,
}

fn main() {}
