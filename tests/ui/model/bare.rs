use mongo_patterns::prelude::*;

// `#[model]` without options says nothing: it is refused, with the default
// it would have meant.
#[derive(Serialize, Deserialize, Model)]
#[model]
struct Visit {
    uuid: String,
}

fn main() {}
