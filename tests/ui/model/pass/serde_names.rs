use mongo_patterns::prelude::*;

// `sort` takes a field by its Rust name or by the name serde stores it under;
// `KEYSET` always holds the stored (BSON) names.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = ["init_time", "visitorId", "ts"])]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    init_time: DateTime,
    visitor_id: String,
    #[serde(rename = "ts")]
    recorded_at: i64,
}

#[allow(dead_code)]
async fn first_page(db: Database) -> mongo_patterns::Result<Page<Visit>> {
    Visit::keyset(&db).page_size(5).page().await
}

fn main() {
    assert_eq!(Visit::COLLECTION, "visits");
    assert_eq!(Visit::KEYSET.sort, ["initTime", "visitorId", "ts"]);
    assert!(!Visit::KEYSET.descending);
    assert_eq!(Visit::KEYSET.page_size, 100);
}
