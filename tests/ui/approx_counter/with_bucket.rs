use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "product")]
struct View {
    #[serde(rename = "_id")]
    id: ObjectId,
    product: String,
    #[approx_counter(every = 100)]
    views: i64,
}

fn main() {}
