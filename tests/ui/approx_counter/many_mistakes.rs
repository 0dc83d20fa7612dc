use mongo_patterns::prelude::*;

// Every mistake is reported in one build, each at its own token, and none
// that another implies (no missing `field` after `feild`, no `max_delay_ms`
// check against a misspelt mode).
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[approx_counter(field = "like", every = 10)]
#[approx_counter(feild = "shares", every = 10)]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 1, mode = "bufferd", max_delay_ms = 100)]
    web_page_views: i64,
    #[approx_counter(every = 0, max_keys = 10, upsert = 1)]
    likes: i64,
    #[approx_counter(every = 10, mode = "geometric", max_delay_ms = 100)]
    shares: i64,
    #[approx_counter(every = 10_000_000, upsert)]
    downloads: i64,
}

fn main() {}
