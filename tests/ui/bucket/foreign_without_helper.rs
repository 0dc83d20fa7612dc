// A `time::OffsetDateTime` order stored without bson's helper would be a
// tuple (a stand-in module: the derive sees the path only).
mod time {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct OffsetDateTime(pub i64);
}

use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 100, key = "customer", order = "at")]
struct Trade {
    customer: i64,
    at: time::OffsetDateTime,
}

fn main() {}
