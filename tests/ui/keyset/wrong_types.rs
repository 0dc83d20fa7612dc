use mongo_patterns::prelude::*;

// Every wrongly typed value is reported at once, each at its own token.
#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = ["date", 1], order = desc, page_size = "100")]
struct Visit {
    date: DateTime,
}

fn main() {}
