use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(crate = "my facade")]
struct Visit {
    uuid: String,
}

fn main() {}
