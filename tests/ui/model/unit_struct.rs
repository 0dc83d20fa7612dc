use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Marker;

fn main() {}
