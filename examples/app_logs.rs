//! Shard key: application logs `{id, type, level, ts, msg}` and the shard
//! key `{month: 1, type: 1}`, with `month` derived from `ts` (seconds).
//!
//! Inserts `--logs N` logs (default 50,000) over 24 months, types 80/15/5;
//! queries "type X, the last month" through the targeted API and shows the
//! filter it sent; analyses the seed's candidate keys by `$sample`; shows
//! the commands that would shard the collection (a deployment that is not
//! sharded says so).
//!
//! `cargo run --example app_logs -- --logs 50000`, against MONGODB_URI or a
//! server on localhost.

use futures::TryStreamExt;
use mongo_patterns::bson::DateTime;
use mongo_patterns::prelude::*;
use mongo_patterns::shard_key::TimeRange;

/// The seed's log line. `month` is not a field: the repository adds it to
/// every document it writes.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: ObjectId,
    uuid: String,
    #[serde(rename = "type")]
    kind: String,
    level: String,
    ts: i64,
    msg: String,
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let n: u64 = flag("--logs").unwrap_or(50_000);
    let (client, commands) = connect().await?;
    let db = client.database("mp_example_app_logs");
    db.drop().await?;
    let logs = Log::sharded(&db);

    let start = 1_609_459_200_i64; // 2021-01-01
    let span = 2 * 365 * 86_400_i64;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let batch: Vec<Log> = (0..n)
        .map(|i| {
            let r = next() % 100;
            Log {
                id: ObjectId::new(),
                uuid: format!("{:016x}{:016x}", next(), next()),
                kind: if r < 80 {
                    "app"
                } else if r < 95 {
                    "web"
                } else {
                    "admin"
                }
                .into(),
                level: if r % 3 == 0 { "high" } else { "low" }.into(),
                ts: start + span * i as i64 / n as i64,
                msg: format!("event {i}"),
            }
        })
        .collect();
    for chunk in batch.chunks(10_000) {
        logs.insert_many(chunk).await?;
    }
    let first = db
        .collection::<Document>("logs")
        .find_one(doc! {})
        .await?
        .unwrap_or_default();
    println!("a stored log, `month` derived from `ts`:\n  {first}");

    let last_month = TimeRange::between(
        DateTime::from_millis((start + span - 31 * 86_400) * 1000),
        DateTime::from_millis((start + span) * 1000),
    );
    for kind in ["app", "web", "admin"] {
        commands.take();
        let found: Vec<Log> = logs
            .find(kind, last_month, doc! {"level": "high"})
            .await?
            .try_collect()
            .await?;
        let sent = commands.take();
        println!(
            "type {kind:>5}, the last 31 days, level high: {:>5} logs; filter sent: {}",
            found.len(),
            sent.first()
                .and_then(|(_, c)| c.get_document("filter").ok())
                .cloned()
                .unwrap_or_default()
        );
    }

    println!("\nthe seed's candidate keys, analysed on a $sample of 5,000:");
    for key in [&["type"][..], &["ts"], &["uuid"], &["month", "type"]] {
        let a = logs.analyze(key, 5_000).await?;
        println!(
            "  {{{}}}: {} distinct, most common {} ({:.0}%), correlation with insertion order {:.2}",
            key.join(", "),
            a.distinct,
            a.most_common.first().map(|(v, _, _)| v.to_string()).unwrap_or_default(),
            a.most_common.first().map_or(0.0, |(_, _, f)| f * 100.0),
            a.correlation.unwrap_or(f64::NAN),
        );
        for v in &a.verdict {
            println!("      {v}");
        }
    }

    println!(
        "\nto shard it, for a DBA to review:\n{}",
        logs.mongosh_script()
    );
    match logs.ensure_sharded().await {
        Ok(()) => println!("sharded on {}", logs.shard_spec()),
        Err(e) => println!("ensure_sharded: {e} (the index is in place)"),
    }
    db.drop().await?;
    Ok(())
}

fn flag(name: &str) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

/// The commands the client sent, from the driver's command monitoring:
/// what each call above costs.
#[derive(Clone, Default)]
struct Commands(std::sync::Arc<std::sync::Mutex<Vec<(String, Document)>>>);

impl Commands {
    /// The commands sent since the last take, oldest first.
    fn take(&self) -> Vec<(String, Document)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many commands were sent since the last take.
    #[allow(dead_code)]
    fn take_count(&self) -> usize {
        self.take().len()
    }
}

/// A client for `MONGODB_URI` (`mongodb://localhost:27017` when unset;
/// Atlas gives `mongodb+srv://user:pass@cluster0.example.mongodb.net`)
/// that counts the commands it sends.
async fn connect() -> mongo_patterns::Result<(Client, Commands)> {
    use mongo_patterns::mongodb::event::{command::CommandEvent, EventHandler};
    let uri = std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".into());
    let mut options = mongo_patterns::mongodb::options::ClientOptions::parse(&uri).await?;
    let commands = Commands::default();
    let log = commands.0.clone();
    options.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
        if let CommandEvent::Started(e) = e {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((e.command_name, e.command));
        }
    }));
    Ok((Client::with_options(options)?, commands))
}
