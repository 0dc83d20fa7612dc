use mongo_patterns::bucket::MAX_SIZE;
use mongo_patterns::prelude::*;

// The largest bucket the macro accepts is the runtime's `MAX_SIZE`.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 10000, key = "sensor_id", order = "at")]
struct Reading {
    sensor_id: String,
    at: DateTime,
    celsius: f64,
}

fn main() {
    assert_eq!(<Reading as Bucketed>::BUCKET.size, MAX_SIZE);
    assert_eq!(<Reading as Bucketed>::BUCKET.order, Some("at"));
}
