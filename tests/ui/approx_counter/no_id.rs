use mongo_patterns::prelude::*;

// `id` is stored as `id`, not `_id`.
#[derive(Serialize, Deserialize, Model)]
struct Product {
    id: String,
    #[approx_counter(every = 100)]
    views: i64,
}

fn main() {}
