//! A user's program: the derive on models of each pattern, and, under each
//! optional feature, a field of that crate's type in the roles it enables.
//! Built, never run (it would need a server).

use mongo_patterns::bucket::PageRequest;
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;

#[derive(Debug, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = "visitedAt", order = "desc")]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    visited_at: DateTime,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 1000, key = "customerId", order = "at")]
struct Trade {
    customer_id: i64,
    at: DateTime,
    amount: f64,
}

/// bson's serde helpers, named as the bson in use names them.
#[cfg(not(feature = "bson-3"))]
#[allow(unused_imports)]
mod helpers {
    #[cfg(feature = "chrono")]
    pub use mongo_patterns::bson::serde_helpers::chrono_datetime_as_bson_datetime as chrono_date;
    #[cfg(feature = "time")]
    pub use mongo_patterns::bson::serde_helpers::time_0_3_offsetdatetime_as_bson_datetime as time_date;
    #[cfg(feature = "uuid")]
    pub use mongo_patterns::bson::serde_helpers::uuid_1_as_binary as uuid_binary;
}
#[cfg(feature = "bson-3")]
#[allow(unused_imports)]
mod helpers {
    #[cfg(feature = "chrono")]
    pub use mongo_patterns::bson::serde_helpers::datetime::FromChrono04DateTime as chrono_date;
    #[cfg(feature = "time")]
    pub use mongo_patterns::bson::serde_helpers::datetime::FromTime03OffsetDateTime as time_date;
    #[cfg(feature = "uuid")]
    pub use mongo_patterns::bson::serde_helpers::uuid_1::AsBinary as uuid_binary;
}

#[cfg(feature = "chrono")]
mod with_chrono {
    use super::*;
    type At = chrono::DateTime<chrono::Utc>;

    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "readings")]
    #[bucket(size = 100, key = "day", order = "at")]
    pub struct Reading {
        #[serde(with = "helpers::chrono_date")]
        pub day: At,
        #[serde(with = "helpers::chrono_date")]
        pub at: At,
    }

    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "orders")]
    #[keyset(sort = "at")]
    #[shard_key(coarse = "month", from = "at", search = "tenant")]
    pub struct Order {
        #[serde(rename = "_id")]
        pub id: i64,
        pub tenant: String,
        #[serde(with = "helpers::chrono_date")]
        pub at: At,
    }

    pub fn use_them(db: &Database) {
        let _ = Reading::buckets(db).page(&At::default(), PageRequest::page(1).page_size(10));
        let _ = Order::keyset(db).page_size(10);
        let _ = Order::sharded(db);
    }
}

#[cfg(feature = "time")]
mod with_time {
    use super::*;
    use time::OffsetDateTime;

    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "shipments")]
    #[bucket(size = 100, key = "day", order = "at")]
    pub struct Shipment {
        #[serde(with = "helpers::time_date")]
        pub day: OffsetDateTime,
        #[serde(with = "helpers::time_date")]
        pub at: OffsetDateTime,
    }

    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "events")]
    #[keyset(sort = "at", order = "desc")]
    #[shard_key(coarse = "week", from = "at", search = "tenant")]
    pub struct Event {
        #[serde(rename = "_id")]
        pub id: i64,
        pub tenant: String,
        #[serde(with = "helpers::time_date")]
        pub at: OffsetDateTime,
    }

    pub fn use_them(db: &Database) {
        let _ = Shipment::buckets(db).count(&OffsetDateTime::UNIX_EPOCH);
        let _ = Event::keyset(db).page_size(10);
        let _ = Event::sharded(db);
    }
}

#[cfg(feature = "uuid")]
mod with_uuid {
    use super::*;
    use uuid::Uuid;

    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "pings")]
    #[bucket(size = 100, key = "device", order = "n")]
    pub struct Ping {
        #[serde(with = "helpers::uuid_binary")]
        pub device: Uuid,
        pub n: i64,
    }

    #[derive(Debug, Serialize, Deserialize, Model)]
    #[model(collection = "devices")]
    #[keyset(sort = "token")]
    pub struct Device {
        #[serde(rename = "_id")]
        pub id: i64,
        #[serde(with = "helpers::uuid_binary")]
        pub token: Uuid,
    }

    pub fn use_them(db: &Database) {
        let _ = Ping::buckets(db).count(&Uuid::nil());
        let _ = Device::keyset(db).page_size(10);
    }
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let uri = std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".into());
    let client = Client::with_uri_str(&uri).await?;
    let db = client.database("consumer");
    let _ = Visit::keyset(&db).page_size(20);
    let _ = Trade::buckets(&db).page(&1_i64, PageRequest::page(1).page_size(50));
    #[cfg(feature = "chrono")]
    with_chrono::use_them(&db);
    #[cfg(feature = "time")]
    with_time::use_them(&db);
    #[cfg(feature = "uuid")]
    with_uuid::use_them(&db);
    Ok(())
}
