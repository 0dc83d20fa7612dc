//! The child of `tests/approx_counter.rs`'s process tests: counts views in
//! buffered mode from `TASKS` tasks on one handle (default 1), says so
//! with the handle's writes, and then either waits to be killed without
//! flushing (`kill`, the default) or shuts the handle down (`flush`) and
//! says so.
//!
//! `counter-crash-child URI DATABASE N [TASKS] [kill|flush]`

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

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().expect("stdout");
}

#[tokio::main]
async fn main() -> mongo_patterns::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (uri, db, n, tasks, mode) = match &args[1..] {
        [uri, db, n] => (uri, db, n, "1", "kill"),
        [uri, db, n, tasks] => (uri, db, n, tasks.as_str(), "kill"),
        [uri, db, n, tasks, mode] => (uri, db, n, tasks.as_str(), mode.as_str()),
        _ => {
            eprintln!("usage: counter-crash-child URI DATABASE N [TASKS] [kill|flush]");
            std::process::exit(2);
        }
    };
    let n: i64 = n.parse().expect("N is a number");
    let tasks: i64 = tasks.parse().expect("TASKS is a number");
    let client = Client::with_uri_str(uri).await?;
    let views = Buffered::views_counter(&client.database(db));
    // Task `t` counts views `t`, `t + tasks`, … of the N, view `i` on key
    // `i % 10`.
    let running: Vec<tokio::task::JoinHandle<mongo_patterns::Result<()>>> = (0..tasks)
        .map(|t| {
            let views = views.clone();
            tokio::spawn(async move {
                let mut i = t;
                while i < n {
                    views.incr(&(i % 10)).await?;
                    i += tasks;
                }
                Ok::<_, mongo_patterns::Error>(())
            })
        })
        .collect();
    for t in running {
        t.await.expect("a counting task panicked")?;
    }
    say(&format!("counted {}", views.stats().writes));
    if mode == "flush" {
        views.shutdown().await?;
        say("flushed");
        return Ok(());
    }
    // Killed here: the pending increments are never written.
    tokio::time::sleep(std::time::Duration::from_secs(600)).await;
    Ok(())
}
