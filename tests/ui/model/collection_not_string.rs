use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(collection = 5)]
struct Visit {
    uuid: String,
}

fn main() {}
