use mongo_patterns::prelude::*;

// A wrongly typed value does not stop the reading: the misspelt option and
// the unknown field after it are reported too.
#[derive(Serialize, Deserialize, Model)]
#[keyset(page_size = 10.5, sotr = "date", sort = "dat")]
struct Visit {
    date: DateTime,
}

fn main() {}
