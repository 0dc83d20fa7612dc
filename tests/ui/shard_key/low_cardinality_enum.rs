use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize)]
enum Level {
    Low,
    High,
}

// A fieldless enum alone: caught by its size, at the field's type.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(search = "level")]
struct Log {
    #[serde(rename = "_id")]
    id: String,
    level: Level,
    msg: String,
}

fn main() {}
