//! One cell of a table: a design's operation run by N tasks for a fixed
//! time, and what the client and the server counted meanwhile.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{thousands, BoxResult, ServerCounters};
use mongo_patterns_testkit::Commands;

/// Operation `i` of the cell (numbered from 0 across all tasks), run by
/// task `task`.
pub(crate) type Op =
    Arc<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = BoxResult<()>> + Send>> + Send + Sync>;

/// Wraps an async closure as an [`Op`].
pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = BoxResult<()>> + Send + 'static,
{
    Arc::new(move |t, i| Box::pin(f(t, i)))
}

pub(crate) struct Ctx {
    pub db: Database,
    pub commands: Commands,
    secs: f64,
    baseline: ServerCounters,
}

/// What one cell measured.
pub(crate) struct Row {
    pub design: String,
    /// The naive design the others are compared with.
    pub naive: bool,
    pub tasks: usize,
    pub ops: u64,
    pub round_trips: usize,
    pub writes: i64,
    pub documents: i64,
    pub took: Duration,
}

impl Ctx {
    pub async fn new(db: Database, commands: Commands, secs: f64) -> BoxResult<Ctx> {
        let baseline = ServerCounters::baseline(&db).await?;
        Ok(Ctx {
            db,
            commands,
            secs,
            baseline,
        })
    }

    /// Drops every collection of the benchmark's database.
    pub async fn clear(&self) -> BoxResult<()> {
        for name in self.db.list_collection_names().await? {
            self.db.collection::<Document>(&name).drop().await?;
        }
        Ok(())
    }

    /// Runs `op` from `tasks` tasks until the cell's time is up; the number
    /// of operations done is the number started.
    pub async fn cell(&self, design: &str, naive: bool, tasks: usize, op: Op) -> BoxResult<Row> {
        let before = ServerCounters::read(&self.db).await?;
        self.commands.take();
        let next = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs_f64(self.secs);
        let mut handles = Vec::with_capacity(tasks);
        for task in 0..tasks {
            let (op, next) = (op.clone(), next.clone());
            handles.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    op(task, i).await?;
                }
                BoxResult::Ok(())
            }));
        }
        for h in handles {
            h.await??;
        }
        let took = t0.elapsed();
        let round_trips = self.commands.take_count();
        let d = ServerCounters::read(&self.db)
            .await?
            .minus(before)
            .minus(self.baseline);
        let ops = next.load(Ordering::Relaxed);
        eprintln!(
            "  {design}, {tasks} tasks: {} ops in {:.1} s",
            thousands(ops),
            took.as_secs_f64()
        );
        Ok(Row {
            design: design.to_owned(),
            naive,
            tasks,
            ops,
            round_trips,
            writes: d.op_insert + d.op_update + d.op_delete,
            documents: d.inserted + d.updated + d.deleted,
            took,
        })
    }
}

/// A section: `### title` and one row per (tasks, design), each design's
/// throughput also as a ratio to the naive design's at the same tasks.
pub(crate) fn table(title: &str, rows: &[Row]) -> String {
    let mut out = format!("### {title}\n\n| tasks | design | round trips / op | server writes / op | documents written / op | operations | ops/s | ops/s ÷ naive |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let per_op = |n: f64, ops: u64| {
        if ops == 0 {
            "n/a".to_owned()
        } else {
            format!("{:.3}", n / ops as f64)
        }
    };
    let rate = |r: &Row| r.ops as f64 / r.took.as_secs_f64();
    for r in rows {
        let naive = rows.iter().find(|n| n.naive && n.tasks == r.tasks);
        let ratio = match naive {
            Some(n) if !r.naive && rate(n) > 0.0 => format!("{:.2}×", rate(r) / rate(n)),
            _ => "1×".to_owned(),
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.tasks,
            r.design,
            per_op(r.round_trips as f64, r.ops),
            per_op(r.writes as f64, r.ops),
            per_op(r.documents as f64, r.ops),
            thousands(r.ops),
            thousands(rate(r).round() as u64),
            ratio,
        );
    }
    out.push('\n');
    out
}
