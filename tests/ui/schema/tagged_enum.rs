use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Schema)]
#[serde(tag = "kind")]
enum Order {
    Market,
    Stop,
}

fn main() {}
