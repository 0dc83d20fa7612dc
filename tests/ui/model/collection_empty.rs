use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "")]
struct Visit {
    uuid: String,
}

fn main() {}
