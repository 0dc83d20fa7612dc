use mongo_patterns::keyset::SortKey;
use mongo_patterns::prelude::*;

// A user newtype that serializes to one BSON scalar opts in to `SortKey`.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct Cents(i64);

impl SortKey for Cents {}

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "orders")]
#[keyset(sort = "total")]
struct Order {
    total: Cents,
    customer: String,
}

fn main() {
    assert_eq!(Order::COLLECTION, "orders");
    assert_eq!(Order::KEYSET.sort, ["total"]);
}
