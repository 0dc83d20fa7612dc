// A `chrono::DateTime` sort key stored without bson's helper would be an
// RFC 3339 string and sort as text; a `uuid::Uuid` one a string. The
// derive sees the types' paths only, so stand-in modules (the suite builds
// without the features) show the errors; with `#[serde(with = "...")]` on
// the fields it compiles.
mod chrono {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct DateTime<Tz>(pub Tz);
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Utc;
}
mod uuid {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Uuid(pub u128);
}

use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = ["at", "reference"])]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    at: chrono::DateTime<chrono::Utc>,
    reference: Option<uuid::Uuid>,
}

fn main() {}
