use mongo_patterns::prelude::*;

// A String key and an ObjectId key; `Bucketed::Key` is the key field's type,
// and numbers order items.
#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 50, key = "user", order = "seq")]
struct Message {
    user: String,
    seq: u32,
    text: String,
}

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 200, key = "deviceId", order = "celsius")]
struct Reading {
    device_id: ObjectId,
    celsius: f64,
}

#[allow(dead_code)]
async fn pages(db: Database, device: ObjectId) -> mongo_patterns::Result<()> {
    let _: BucketPage<Message> = Message::buckets(&db)
        .page(&"ada".to_owned(), PageRequest::page(1).page_size(10))
        .await?;
    let _: BucketPage<Reading> = Reading::buckets(&db)
        .page(&device, PageRequest::page(2).page_size(10))
        .await?;
    Ok(())
}

fn same<T>(_: T, _: T) {}

fn main() {
    let m = Message {
        user: "ada".to_owned(),
        seq: 1,
        text: "hi".to_owned(),
    };
    same(m.bucket_key(), &String::new());
    assert_eq!(m.bucket_key(), "ada");
    let id = ObjectId::new();
    let r = Reading {
        device_id: id,
        celsius: 21.5,
    };
    same(r.bucket_key(), &id);
    assert_eq!(<Message as Bucketed>::BUCKET.key, "user");
    assert_eq!(<Reading as Bucketed>::BUCKET.key, "deviceId");
    assert_eq!(<Reading as Bucketed>::BUCKET.order, Some("celsius"));
}
