use mongo_patterns::prelude::*;

// Every mistake is reported in one build, each at its own token.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[shard_key(
    coarse = "month",
    from = "createdAt",
    granularity = "mnth",
    search = "tenant",
    allow(monotonik),
    sharded = true
)]
struct Event {
    #[serde(rename = "_id")]
    id: ObjectId,
    tenant_id: String,
    created_at: i64,
}

fn main() {}
