use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "system.visits")]
struct Visit {
    uuid: String,
}

fn main() {}
