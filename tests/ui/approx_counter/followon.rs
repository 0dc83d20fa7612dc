use mongo_patterns::prelude::*;

// After a mistake in the attribute, the accessors it declares still exist:
// only the mistake is reported, not the calls below.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[approx_counter(field = "likes", every = 1)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, mode = "bufered")]
    web_page_views: i64,
    likes: u32,
}

#[allow(dead_code)]
async fn count(db: Database) -> mongo_patterns::Result<()> {
    let views: Counter<Product> = Product::web_page_views_counter(&db);
    views.incr("p1").await?;
    Product::likes_counter(&db).incr_by("p1", 3).await?;
    let _ = views.spec();
    Ok(())
}

fn main() {}
