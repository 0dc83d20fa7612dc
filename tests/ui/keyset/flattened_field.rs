use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize)]
struct Meta {
    day: i32,
}

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "meta")]
struct Visit {
    uuid: String,
    #[serde(flatten)]
    meta: Meta,
}

fn main() {}
