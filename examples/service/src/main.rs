//! The service as a process.
//!
//! ```text
//! MONGODB_URI=mongodb://localhost:27017 cargo run -p mongo-patterns-service-example
//! ```
//!
//! - `MONGODB_URI`: a replica set (orders run transactions; a single-node
//!   one will do), `mongodb://localhost:27017` when unset. For Atlas, the
//!   `mongodb+srv://` string it gives:
//!   `MONGODB_URI='mongodb+srv://user:pass@cluster0.abcde.mongodb.net/?retryWrites=true&w=majority'`.
//! - `MONGODB_DB` (`mongo_patterns_service`), `BIND` (`127.0.0.1:3000`),
//!   `SERVICE_DEADLINE_MS` (5000), `FEED_TOKEN_KEY` (see `Config::from_env`).
//! - `RUST_LOG`: `info,mongo_patterns=debug` by default, which prints each
//!   pattern call's span (`mongo_patterns{pattern=... operation=...
//!   collection=...}`) as it closes, with its time.
//!
//! Ctrl-C or SIGTERM: stops accepting, lets requests in flight finish, then
//! flushes the view and like counters.

use std::io::IsTerminal;

use mongo_patterns::mongodb::Client;
use mongo_patterns_service_example::{serve, App, Config};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,mongo_patterns=debug")),
        )
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(std::io::stdout().is_terminal())
        .init();

    let uri = std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".into());
    let client = Client::with_uri_str(&uri).await?;
    let db = client
        .database(&std::env::var("MONGODB_DB").unwrap_or_else(|_| "mongo_patterns_service".into()));
    let app = App::new(client, db, Config::from_env()).await?;

    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    serve(listener, app, stop_signal()).await?;
    tracing::info!("stopped; counters flushed");
    Ok(())
}

/// Ctrl-C, or SIGTERM (what a container runtime sends first).
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("stopping: finishing requests in flight");
}
