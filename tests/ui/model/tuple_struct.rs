use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Visit(String, DateTime);

fn main() {}
