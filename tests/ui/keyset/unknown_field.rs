use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[keyset(sort = "initTme")]
struct Visit {
    uuid: String,
    init_time: DateTime,
}

fn main() {}
