use mongo_patterns::prelude::*;
use serde::de::DeserializeOwned;

// A generic model: the derive keeps the struct's parameters and bounds.
#[derive(Serialize, Deserialize, Model)]
#[model(collection = "wrapped")]
#[keyset(sort = "at")]
struct Wrapper<T> {
    at: DateTime,
    value: T,
}

#[allow(dead_code)]
async fn first<T>(db: Database) -> mongo_patterns::Result<Page<Wrapper<T>>>
where
    T: DeserializeOwned + Send + Sync,
{
    Wrapper::<T>::keyset(&db).page().await
}

fn main() {
    assert_eq!(<Wrapper<String> as Model>::COLLECTION, "wrapped");
    assert_eq!(<Wrapper<Vec<u8>> as Model>::KEYSET.sort, ["at"]);
}
