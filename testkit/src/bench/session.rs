//! A benchmark's process: its runtime, and a database of its own on the
//! test server that is dropped whatever happens.

use std::future::Future;
use std::time::Instant;

use mongo_patterns::bson::doc;
use mongo_patterns::mongodb::{Client, Database};

use super::BoxResult;
use crate::Commands;

/// The Tokio runtime a benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    CurrentThread,
    /// `workers` threads, or Tokio's default (one per core).
    MultiThread {
        workers: Option<usize>,
    },
}

/// Runs `program` on `runtime` to its end; an error is printed and ends the
/// process with status 1.
pub fn main(runtime: Runtime, program: impl Future<Output = BoxResult<()>>) {
    let mut builder = match runtime {
        Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Runtime::MultiThread { workers } => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = workers {
                b.worker_threads(n);
            }
            b
        }
    };
    let rt = builder.enable_all().build().expect("tokio runtime");
    if let Err(e) = rt.block_on(program) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A monitored client and a fresh database, `mp_bench_{name}_{pid}`.
pub struct Session {
    /// The connection string the client was made from.
    pub uri: String,
    pub client: Client,
    /// Everything the client sends.
    pub commands: Commands,
    pub db: Database,
    started: Instant,
}

impl Session {
    /// Connects to `uri` and drops what a previous run of the same process
    /// id may have left.
    pub async fn open(name: &str, uri: String) -> BoxResult<Session> {
        let started = Instant::now();
        let (client, commands) = crate::client(&uri).await;
        let db = client.database(&format!("mp_bench_{name}_{}", std::process::id()));
        db.drop().await?;
        Ok(Session {
            uri,
            client,
            commands,
            db,
            started,
        })
    }

    /// Drops the database, whatever `report` is; then prints the report to
    /// stdout and the time the whole program took to stderr.
    pub async fn finish(self, report: BoxResult<String>) -> BoxResult<()> {
        let dropped = self.db.drop().await;
        let report = report?;
        dropped?;
        print!("{report}");
        eprintln!("done in {:.1} s", self.started.elapsed().as_secs_f64());
        Ok(())
    }
}

/// Whether the server is the user's (`MONGODB_URI`) rather than the
/// surrogate the test kit starts.
pub fn external_server() -> bool {
    std::env::var("MONGODB_URI").is_ok_and(|u| !u.is_empty())
}

/// The version the server reports (`buildInfo`), or `?`.
pub async fn server_version(db: &Database) -> String {
    db.client()
        .database("admin")
        .run_command(doc! {"buildInfo": 1})
        .await
        .ok()
        .and_then(|d| d.get_str("version").ok().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The server, for a report's first line: `MONGODB_URI server, version …`
/// or `surrogate secantusd-rs (reports version …)`.
pub async fn describe_server(db: &Database) -> String {
    let version = server_version(db).await;
    if external_server() {
        format!("MONGODB_URI server, version {version}")
    } else {
        format!("surrogate secantusd-rs (reports version {version})")
    }
}
