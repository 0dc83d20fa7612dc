use mongo_patterns::prelude::*;

// `init_time` (Rust name) and `initTime` (BSON name) are the same field.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[keyset(sort = ["init_time", "initTime"])]
struct Visit {
    uuid: String,
    init_time: DateTime,
}

fn main() {}
