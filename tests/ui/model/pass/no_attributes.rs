use mongo_patterns::keyset::KeysetSpec;
use mongo_patterns::prelude::*;

// Without `#[model]`, the collection is the struct's name in snake_case;
// without `#[keyset]`, paging is by `_id`.
#[derive(Serialize, Deserialize, Model)]
struct PageView {
    path: String,
}

#[derive(Serialize, Deserialize, Model)]
struct HTTPLog {
    status: u16,
}

#[allow(dead_code)]
fn collection(db: &Database) -> mongo_patterns::mongodb::Collection<PageView> {
    PageView::collection(db)
}

fn main() {
    assert_eq!(<PageView as Model>::COLLECTION, "page_view");
    assert_eq!(<HTTPLog as Model>::COLLECTION, "http_log");
    assert_eq!(<PageView as Model>::KEYSET, KeysetSpec::BY_ID);
}
