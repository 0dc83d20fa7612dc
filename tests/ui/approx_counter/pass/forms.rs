use mongo_patterns::approx_counter::{CounterSpec, Mode};
use mongo_patterns::prelude::*;

// Both forms with every option. `field` takes a field by its Rust name or by
// the name serde stores it under; the spec holds the stored (BSON) name.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "products")]
#[approx_counter(
    field = "like_count",
    every = 10,
    mode = "buffered",
    max_delay_ms = 250,
    max_keys = 5000,
    upsert = true
)]
#[approx_counter(
    field = "shareCount",
    every = 1000,
    mode = "geometric",
    max_keys = 100,
    upsert = false
)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    product_name: String,
    #[approx_counter(every = 100)]
    web_page_views: i64,
    #[approx_counter(every = 50, mode = "sampled", upsert = true)]
    downloads: u64,
    like_count: u32,
    share_count: i32,
    // A raw identifier: the accessor is `type_counter`.
    #[approx_counter(every = 1_000_000, mode = "buffered")]
    r#type: f64,
}

// An `ObjectId` `_id` under its own name, and an `f64` counter.
#[derive(Serialize, Deserialize, Model)]
struct Video {
    _id: ObjectId,
    #[approx_counter(every = 2, mode = "geometric")]
    watch_hours: f64,
}

#[allow(dead_code)]
async fn use_it(db: Database, id: String, video: ObjectId) -> mongo_patterns::Result<()> {
    let views: Counter<Product> = Product::web_page_views_counter(&db);
    views.incr("p1").await?;
    views.incr(&id).await?;
    views.incr_by("p1", 250).await?;
    let _: i64 = views.estimate("p1").await?;
    let likes = Product::like_count_counter(&db);
    likes.incr("p1").await?;
    likes.flush().await?;
    likes.shutdown().await?;
    let _: CounterStats = likes.stats();
    let _ = Product::share_count_counter(&db)
        .clone()
        .seeded(7)
        .incr("p1")
        .await;
    let _ = Product::downloads_counter(&db).incr("p1").await;
    let _ = Product::type_counter(&db).incr("p1").await;
    let _ = Video::watch_hours_counter(&db).incr(&video).await;
    Ok(())
}

// A web handler's future must be `Send`, and a counter shared between tasks.
#[allow(dead_code)]
fn send<F: std::future::Future + Send>(_: F) {}
#[allow(dead_code)]
fn shared<T: Clone + Send + Sync + 'static>(_: &T) {}

#[allow(dead_code)]
fn futures_are_send(db: Database, id: String, video: ObjectId) {
    shared(&Product::web_page_views_counter(&db));
    send(use_it(db, id, video));
}

fn main() {
    // `Counter::new` needs a `Database`, and the driver's client a Tokio
    // runtime; neither talks to a server until an operation runs, and none
    // does here (port 1 refuses).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100")
            .await
            .unwrap();
        let db = client.database("never_used");
        let spec = |s: CounterSpec| {
            (
                s.field,
                s.every,
                s.mode,
                s.max_delay_ms,
                s.max_keys,
                s.upsert,
            )
        };
        assert_eq!(
            spec(Product::web_page_views_counter(&db).spec()),
            ("webPageViews", 100, Mode::Sampled, 1000, 10_000, false)
        );
        assert_eq!(
            spec(Product::downloads_counter(&db).spec()),
            ("downloads", 50, Mode::Sampled, 1000, 10_000, true)
        );
        assert_eq!(
            spec(Product::like_count_counter(&db).spec()),
            ("likeCount", 10, Mode::Buffered, 250, 5000, true)
        );
        assert_eq!(
            spec(Product::share_count_counter(&db).spec()),
            ("shareCount", 1000, Mode::Geometric, 1000, 100, false)
        );
        assert_eq!(
            spec(Product::type_counter(&db).spec()),
            ("type", 1_000_000, Mode::Buffered, 1000, 10_000, false)
        );
        assert_eq!(
            spec(Video::watch_hours_counter(&db).spec()),
            ("watch_hours", 2, Mode::Geometric, 1000, 10_000, false)
        );
        assert_eq!(Product::COLLECTION, "products");
        assert_eq!(Video::COLLECTION, "video");
    });

    let p = Product {
        id: "p1".to_owned(),
        product_name: "儿童健康险（D）".to_owned(),
        web_page_views: 0,
        downloads: 0,
        like_count: 0,
        share_count: 0,
        r#type: 0.0,
    };
    let _ = (&p.id, &p.product_name, p.web_page_views, p.downloads);
    let _ = (p.like_count, p.share_count, p.r#type);
    let v = Video {
        _id: ObjectId::new(),
        watch_hours: 0.5,
    };
    let _ = (v._id, v.watch_hours);
}
