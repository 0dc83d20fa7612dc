use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
enum Status {
    Open,
    Closed,
}

fn main() {}
