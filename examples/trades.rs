//! Bucket: a customer's stock trades, 1,000 to a bucket, shown 20, 25, 50
//! or 100 to a page, newest first as a trading app shows them.
//!
//! `cargo run --example trades -- --trades 3500` (default 3500), against
//! MONGODB_URI or a server on localhost.

use mongo_patterns::bucket::PageRequest;
use mongo_patterns::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 1000, key = "customerId", order = "date")]
struct Trade {
    customer_id: i64,
    #[serde(rename = "type")]
    kind: String,
    ticker: String,
    qty: i32,
    date: DateTime,
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let n: u32 = flag("--trades").unwrap_or(3_500);
    let (client, commands) = connect().await?;
    let db = client.database("mp_example_trades");
    db.drop().await?;
    let trades = Trade::buckets(&db);
    trades.ensure().await?;

    let customer = 7_000_000_i64;
    let tickers = ["MDB", "AAPL", "MSFT", "TSLA", "AMZN"];
    let all: Vec<Trade> = (0..n)
        .map(|i| Trade {
            customer_id: customer,
            kind: if i % 3 == 0 { "sell" } else { "buy" }.to_owned(),
            ticker: tickers[i as usize % tickers.len()].to_owned(),
            qty: 1 + (i as i32 * 37) % 500,
            date: DateTime::from_millis(1_767_225_600_000 + i64::from(i) * 3_600_000),
        })
        .collect();
    // The first hundred one at a time (one updateOne each), the rest in one go.
    commands.take();
    for t in &all[..100] {
        trades.push(t).await?;
    }
    let single = commands.take_count();
    trades.push_many(&all[100..]).await?;
    println!(
        "{n} trades for customer {customer}: 100 pushes in {single} round trips, then {} more in {} round trips",
        n - 100,
        commands.take_count()
    );
    let buckets = db
        .collection::<Document>("history")
        .count_documents(doc! {"customerId": customer})
        .await?;
    println!(
        "stored in {buckets} buckets of at most 1000; total {}",
        trades.count(&customer).await?
    );

    for per in [20, 25, 50, 100] {
        commands.take();
        let page = trades
            .page(
                &customer,
                PageRequest::page(3).page_size(per).newest_first(),
            )
            .await?;
        let first = &page.items[0];
        println!(
            "newest first, {per:>3} a page: page 3 starts at {} {} {} x{} ({} round trips)",
            first.date.try_to_rfc3339_string().unwrap_or_default(),
            first.kind,
            first.ticker,
            first.qty,
            commands.take_count()
        );
    }
    // A page that crosses from one bucket into the next.
    let page = trades
        .page(&customer, PageRequest::page(10).page_size(110))
        .await?;
    println!(
        "oldest first, page 10 of 110 crosses buckets: {} trades, {} to {}",
        page.items.len(),
        page.items.first().map_or(0, |t| t.date.timestamp_millis()),
        page.items.last().map_or(0, |t| t.date.timestamp_millis())
    );
    let removed = trades.delete(&customer, doc! {"ticker": "TSLA"}).await?;
    println!(
        "removed every TSLA trade ({removed} trades); total now {}",
        trades.count(&customer).await?
    );
    db.drop().await?;
    Ok(())
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
