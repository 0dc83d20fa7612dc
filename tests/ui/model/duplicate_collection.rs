use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "visits", collection = "sessions")]
struct Visit {
    uuid: String,
}

fn main() {}
