// `#[shard_key]` on a `#[bucket]` model says how its buckets shard: on the
// bucket key, hashed (the default) or ranged. The model gets no `Sharded`
// repository: its documents are buckets.
use mongo_patterns::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 100, key = "customerId")]
#[shard_key(search = "customerId")]
struct Ranged {
    customer_id: String,
    qty: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 100, key = "customerId")]
#[shard_key(hashed = "customerId")]
struct Hashed {
    customer_id: i64,
    qty: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 100, key = "customerId")]
struct Default {
    customer_id: i64,
    qty: i32,
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Nothing runs, so nothing connects (port 1 refuses).
        let client = Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100")
            .await
            .unwrap();
        let db = client.database("never_used");
        let key = |d: Vec<mongo_patterns::ensure::Declared>| d.into_iter().find_map(|d| d.shard_key);
        assert_eq!(Ranged::buckets(&db).shard_key(), doc! {"customerId": 1});
        assert_eq!(key(Ranged::declared(&db)), Some((doc! {"customerId": 1}, false)));
        assert_eq!(Hashed::buckets(&db).shard_key(), doc! {"customerId": "hashed"});
        assert_eq!(key(Hashed::declared(&db)), Some((doc! {"customerId": "hashed"}, false)));
        assert_eq!(key(Default::declared(&db)), Some((doc! {"customerId": "hashed"}, false)));
    });
}
