//! Approximate counter: an insurance product's `web_page_views`, counted one write in
//! 100. `--views N` page views (default 200,000) arrive from 16 tasks and
//! are counted three ways: sampled (the seed's `random(0..99) == 0 → $inc:
//! 100`), buffered (the seed's "count to 100, then write", with `$inc`
//! where the seed's `$set` would overwrite other processes' counts) and
//! exactly, one `$inc` per view, for comparison.
//!
//! `cargo run --example page_views -- --views 200000`, against MONGODB_URI
//! (or a server on localhost).

use std::time::Instant;

use mongo_patterns::prelude::*;

/// The seed's product document.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "products")]
#[approx_counter(field = "buffered_views", every = 100, mode = "buffered")]
struct Product {
    #[serde(rename = "_id")]
    id: String,
    product_name: String,
    #[approx_counter(every = 100)]
    web_page_views: i64,
    buffered_views: i64,
    exact_views: i64,
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let views: u64 = flag("--views").unwrap_or(200_000);
    let (client, commands) = connect().await?;
    let db = client.database("mp_example_page_views");
    db.drop().await?;
    let products = Product::collection(&db);
    products
        .insert_one(Product {
            id: "vlog7923479273".into(),
            product_name: "儿童健康险（D）".into(),
            web_page_views: 0,
            buffered_views: 0,
            exact_views: 0,
        })
        .await?;

    let sampled = Product::web_page_views_counter(&db);
    let buffered = Product::buffered_views_counter(&db);
    for (name, counter) in [("sampled", &sampled), ("buffered", &buffered)] {
        commands.take();
        let start = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let counter = counter.clone();
                tokio::spawn(async move {
                    for _ in 0..views / 16 {
                        counter.incr("vlog7923479273").await?;
                    }
                    Ok::<_, mongo_patterns::Error>(())
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task")?;
        }
        counter.shutdown().await?;
        let elapsed = start.elapsed();
        let s = counter.stats();
        println!(
            "{name:>8}: {} views, {} writes ({:.0} views a write), {} commands, {:.0} views/s, estimate {}",
            s.increments,
            s.writes,
            s.saving(),
            commands.take_count(),
            s.increments as f64 / elapsed.as_secs_f64(),
            counter.estimate("vlog7923479273").await?
        );
    }
    println!(
        "          sampled's documented relative standard error at this count: {:.2}%",
        100.0 * sampled.relative_error(views / 16 * 16)
    );

    // Exact counting, one `$inc` per view, for a tenth of the views.
    let exact = views / 10;
    commands.take();
    let start = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let products = products.clone();
            tokio::spawn(async move {
                for _ in 0..exact / 16 {
                    products
                        .update_one(
                            doc! {"_id": "vlog7923479273"},
                            doc! {"$inc": {"exact_views": 1}},
                        )
                        .await?;
                }
                Ok::<_, mongo_patterns::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task")?;
    }
    let elapsed = start.elapsed();
    println!(
        "   exact: {} views, {} writes, {:.0} views/s",
        exact / 16 * 16,
        commands.take_count(),
        (exact / 16 * 16) as f64 / elapsed.as_secs_f64()
    );
    let doc = db
        .collection::<Document>("products")
        .find_one(doc! {})
        .await?
        .unwrap_or_default();
    println!("the product document: {doc}");
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
