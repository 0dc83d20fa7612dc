use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[approx_counter(field = "webPageView", every = 100)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    web_page_views: i64,
}

fn main() {}
