use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 10001, key = "sensor_id")]
struct Reading {
    sensor_id: String,
    at: DateTime,
    celsius: f64,
}

fn main() {}
