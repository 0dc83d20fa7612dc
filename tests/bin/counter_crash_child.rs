//! The child of `tests/approx_counter.rs`'s crash test: counts views in
//! buffered mode, says so, and waits to be killed without flushing.
//!
//! `counter-crash-child URI DATABASE N`

use std::io::Write;

use mongo_patterns::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "buffered")]
struct Buffered {
    #[serde(rename = "_id")]
    id: i64,
    #[approx_counter(every = 100, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    views: i64,
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, uri, db, n] = &args[..] else {
        eprintln!("usage: counter-crash-child URI DATABASE N");
        std::process::exit(2);
    };
    let n: i64 = n.parse().expect("N is a number");
    let client = Client::with_uri_str(uri).await?;
    let views = Buffered::views_counter(&client.database(db));
    for i in 0..n {
        views.incr(&(i % 10)).await?;
    }
    println!("counted");
    std::io::stdout().flush().expect("stdout");
    // Killed here: the pending increments are never written.
    tokio::time::sleep(std::time::Duration::from_secs(600)).await;
    Ok(())
}
