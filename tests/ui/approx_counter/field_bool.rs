use mongo_patterns::prelude::*;

// The struct-level form checks the field's type the same way.
#[derive(Serialize, Deserialize, Model)]
#[approx_counter(field = "featured", every = 100)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    featured: bool,
}

fn main() {}
