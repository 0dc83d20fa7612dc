use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "visits$2024")]
struct Visit {
    uuid: String,
}

fn main() {}
