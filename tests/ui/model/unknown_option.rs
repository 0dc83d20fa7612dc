use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(colection = "visits")]
struct Visit {
    uuid: String,
}

fn main() {}
