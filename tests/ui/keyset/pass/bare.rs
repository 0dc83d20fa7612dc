use mongo_patterns::keyset::KeysetSpec;
use mongo_patterns::prelude::*;

// `#[keyset]` alone means the defaults: `_id` ascending, 100 a page.
#[derive(Serialize, Deserialize, Model)]
#[keyset]
struct Event {
    kind: String,
}

fn main() {
    assert_eq!(Event::KEYSET, KeysetSpec::BY_ID);
    assert!(Event::KEYSET.sort.is_empty());
    assert_eq!(Event::KEYSET.page_size, 100);
}
