//! Keyset pagination: find the returning visitors of a site with ten million visits,
//! on a machine that cannot hold them all.
//!
//! The seed's job pages through every visit before a date with `_id > last`
//! instead of `skip`, and groups the visits by visitor. Here the date range is
//! an `_id` range (an ObjectId carries its creation second), the pages come
//! from a stream, and the job checkpoints a resume token so that it can stop
//! and carry on where it was.
//!
//! `cargo run --example visitors -- --visits 200000` (default 100000), against
//! MONGODB_URI or a server on localhost.

use std::collections::HashMap;

use futures::{StreamExt, TryStreamExt};
use mongo_patterns::keyset::created_between;
use mongo_patterns::prelude::*;

#[derive(Debug, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    uuid: String,
    page: String,
}

const DAY: u32 = 86_400;
const START: u32 = 1_767_225_600; // 2026-01-01

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let visits: u32 = flag("--visits").unwrap_or(100_000);
    let (client, commands) = connect().await?;
    let db = client.database("mp_example_visitors");
    db.drop().await?;

    // 30 days of visits from 20,000 visitors; the `_id` is made at the visit's second.
    let coll = Visit::collection(&db);
    let batch: Vec<Visit> = (0..visits)
        .map(|i| Visit {
            id: object_id_at(
                START + (u64::from(i) * 30 * u64::from(DAY) / u64::from(visits)) as u32,
                i,
            ),
            uuid: format!("visitor-{}", (i * 7_919) % 20_000),
            page: format!("/product/{}", i % 50),
        })
        .collect();
    for chunk in batch.chunks(10_000) {
        coll.insert_many(chunk).await?;
    }
    println!("{visits} visits over 30 days from 20,000 visitors");

    // Visitors of the last day, then everyone seen in the 29 days before it.
    let last_day = DateTime::from_millis(i64::from(START + 29 * DAY) * 1000);
    let end = DateTime::from_millis(i64::from(START + 30 * DAY) * 1000);
    let start = DateTime::from_millis(i64::from(START) * 1000);
    let today: Vec<Visit> = Visit::keyset(&db)
        .filter(created_between(last_day, end)?)
        .page_size(10_000)
        .stream()
        .try_collect()
        .await?;

    // The long job: 10,000 visits a page, and a checkpoint after each page.
    // It stops after 3 pages, as if the machine ran out of memory, and then
    // resumes from the saved token (a string a job can store anywhere).
    let history = Visit::keyset(&db)
        .filter(created_between(start, last_day)?)
        .page_size(10_000);
    let mut earlier: HashMap<String, u32> = HashMap::new();
    let mut checkpoint: Option<String> = None;
    let mut pages = 0;
    let mut run = history.clone().pages().take(3).boxed();
    while let Some(page) = run.try_next().await? {
        pages += 1;
        for v in page.items {
            *earlier.entry(v.uuid).or_default() += 1;
        }
        checkpoint = page.next.map(|t| t.to_string());
    }
    println!(
        "stopped after {pages} pages; checkpoint token: {}",
        checkpoint.as_deref().unwrap_or("-")
    );
    if let Some(saved) = checkpoint {
        let token: PageToken = saved.parse()?;
        commands.take();
        let mut rest = history.after(&token).pages().boxed();
        while let Some(page) = rest.try_next().await? {
            pages += 1;
            for v in page.items {
                *earlier.entry(v.uuid).or_default() += 1;
            }
        }
        println!(
            "resumed: {} more finds, no skip, no count",
            commands.take_count()
        );
    }
    let returning = today
        .iter()
        .filter(|v| earlier.contains_key(&v.uuid))
        .map(|v| &v.uuid)
        .collect::<std::collections::HashSet<_>>();
    let seen: u32 = earlier.values().sum();
    println!(
        "{pages} pages, {seen} earlier visits by {} visitors",
        earlier.len()
    );
    println!(
        "last day: {} visits, {} returning visitors",
        today.len(),
        returning.len()
    );
    db.drop().await?;
    Ok(())
}

/// An ObjectId made at second `secs`, unique by `n`.
fn object_id_at(secs: u32, n: u32) -> ObjectId {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&secs.to_be_bytes());
    b[8..].copy_from_slice(&n.to_be_bytes());
    ObjectId::from_bytes(b)
}

fn flag(name: &str) -> Option<u32> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
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
