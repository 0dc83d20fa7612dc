use mongo_patterns::prelude::*;

// After a mistake in the attribute, the repository still exists: only the
// mistake is reported, not the calls below.
#[derive(Serialize, Deserialize, Model)]
#[shard_key(coarse = "month", from = "ts", granularity = "mnth", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: ObjectId,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
}

#[allow(dead_code)]
async fn use_it(db: Database, log: Log) -> mongo_patterns::Result<()> {
    let repo: Sharded<Log> = Log::sharded(&db);
    let _ = repo.find("app", TimeRange::last_days(30), doc! {}).await?;
    repo.upsert(&log).await?;
    repo.update(DateTime::now(), "app", doc! {}, doc! {"$set": {"x": 1}})
        .await?;
    let _ = Log::SHARD;
    Ok(())
}

fn main() {}
