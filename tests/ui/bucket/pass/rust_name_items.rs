use mongo_patterns::prelude::*;

// `key` takes a field by its Rust name or by the name serde stores it under;
// `BUCKET` always holds the stored name. `items` names the array.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 100, key = "customer_id", items = "trades")]
struct Trade {
    customer_id: i64,
    ticker: String,
}

fn main() {
    assert_eq!(Trade::COLLECTION, "trade");
    let spec = <Trade as Bucketed>::BUCKET;
    assert_eq!(spec.size, 100);
    assert_eq!(spec.key, "customerId");
    assert_eq!(spec.order, None);
    assert_eq!(spec.items, "trades");
}
