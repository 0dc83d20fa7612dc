use mongo_patterns::prelude::*;

// A customer's trades, 1,000 to a bucket, kept in date
// order. `BUCKET` holds the stored (BSON) names.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 1000, key = "customerId", order = "date")]
struct Trade {
    customer_id: i64,
    #[serde(rename = "type")]
    kind: String,
    ticker: String,
    qty: i32,
    date: DateTime,
}

#[allow(dead_code)]
async fn f(db: Database, t: Trade) {
    let r = Trade::buckets(&db);
    let _ = r.push(&t).await;
    let _ = r.page(&7_i64, PageRequest::new(1, 25).newest_first()).await;
}

// A web handler's future must be `Send`.
#[allow(dead_code)]
fn send<F: std::future::Future + Send>(_: F) {}

#[allow(dead_code)]
fn handler_futures_are_send(db: Database, t: Trade) {
    send(f(db, t));
}

fn main() {
    assert_eq!(Trade::COLLECTION, "history");
    let spec = <Trade as Bucketed>::BUCKET;
    assert_eq!(spec.size, 1000);
    assert_eq!(spec.key, "customerId");
    assert_eq!(spec.order, Some("date"));
    assert_eq!(spec.items, "items");
}
