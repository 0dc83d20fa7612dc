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

// A model whose fields name `Self`, and one with serde attributes the item
// decoder copies: both compile.
#[derive(Serialize, Deserialize, Model)]
#[model(collection = "threads")]
#[bucket(size = 10, key = "topic")]
struct Post {
    topic: String,
    reply_to: Option<Box<Self>>,
}

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[model(collection = "events")]
#[bucket(size = 10, key = "acct")]
struct Event {
    #[serde(rename = "acct", alias = "account")]
    account_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(skip)]
    seen: u32,
    #[serde(rename = "type")]
    r#type: String,
}

#[allow(dead_code)]
async fn f(db: Database, t: Trade) {
    let r = Trade::buckets(&db);
    let _ = r.push(&t).await;
    let _ = r.page(&7_i64, PageRequest::page(1).page_size(25).newest_first()).await;
    let _ = Post::buckets(&db).page("rust", PageRequest::page(1).page_size(5)).await;
    let _ = Event::buckets(&db).page("a", PageRequest::page(1).page_size(5)).await;
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
