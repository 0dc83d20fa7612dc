use mongo_patterns::prelude::*;

// Every mistake is reported in one build, each at its own token.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 0, key = "custmerId", order = "dat", items = "start", sise = 10)]
struct Trade {
    customer_id: i64,
    date: DateTime,
}

fn main() {}
