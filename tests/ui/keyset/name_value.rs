use mongo_patterns::prelude::*;

// Options go in parentheses; `#[keyset = ...]` is refused at the attribute.
#[derive(Serialize, Deserialize, Model)]
#[keyset = "date"]
struct Visit {
    date: DateTime,
}

fn main() {}
