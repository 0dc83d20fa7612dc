use mongo_patterns::prelude::*;

// Every mistake is reported in one build, each at its own token.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits", colection = "sessions")]
#[keyset(sort = ["initTme", "_id", "score", "score"], order = "up", page_size = 0, sotr = "uuid")]
struct Visit {
    uuid: String,
    init_time: DateTime,
    score: i32,
}

fn main() {}
