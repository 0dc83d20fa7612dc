use mongo_patterns::prelude::*;

// Once on the struct and once on the field: one error, and one accessor for
// the call below (no duplicate definition).
#[derive(Serialize, Deserialize, Model)]
#[approx_counter(field = "views", every = 100)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 10)]
    views: i64,
}

#[allow(dead_code)]
fn counter(db: &Database) -> Counter<Product> {
    Product::views_counter(db)
}

fn main() {}
