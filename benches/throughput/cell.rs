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
    /// Clients of their own, standing in for other processes (see
    /// [`Ctx::instances`]).
    others: tokio::sync::Mutex<Vec<(Database, Commands)>>,
}

/// What one cell measured.
pub(crate) struct Row {
    pub design: String,
    /// The naive design the others are compared with.
    pub naive: bool,
    /// Clients (instances) the tasks ran on, and tasks each.
    pub instances: usize,
    pub tasks: usize,
    pub ops: u64,
    pub round_trips: usize,
    pub writes: i64,
    pub documents: i64,
    pub took: Duration,
    /// The longest operation, and how many took a second or more: a task
    /// held up (an instance whose pushes wait behind one another's) shows
    /// here, not in the rate.
    pub longest: Duration,
    pub over_1s: u64,
}

impl Ctx {
    pub async fn new(db: Database, commands: Commands, secs: f64) -> BoxResult<Ctx> {
        let baseline = ServerCounters::baseline(&db).await?;
        Ok(Ctx {
            db,
            commands,
            secs,
            baseline,
            others: Default::default(),
        })
    }

    /// The benchmark's database through `n` clients: this one and `n - 1`
    /// of their own, each with its own connection pool of `pool` and its
    /// own command counter. Clients in one program stand in for the
    /// processes of a service run as `n` instances: they share nothing in
    /// memory (no connection, session or repository), only the server.
    pub async fn instances(&self, n: usize, pool: u32) -> BoxResult<Vec<(Database, Commands)>> {
        let mut others = self.others.lock().await;
        while others.len() + 1 < n {
            let uri =
                mongo_patterns_testkit::with_pool(&mongo_patterns_testkit::server_uri(), pool);
            let (client, commands) = mongo_patterns_testkit::client(&uri).await;
            others.push((client.database(self.db.name()), commands));
        }
        let mut all = vec![(self.db.clone(), self.commands.clone())];
        all.extend(others.iter().take(n - 1).cloned());
        Ok(all)
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
        self.cell_of(design, naive, 1, tasks, op).await
    }

    /// [`Ctx::cell`] from `instances` clients of [`Ctx::instances`] with
    /// `tasks` tasks each (task `t` is on instance `t % instances`): the
    /// round trips are every client's.
    pub async fn cell_of(
        &self,
        design: &str,
        naive: bool,
        instances: usize,
        tasks: usize,
        op: Op,
    ) -> BoxResult<Row> {
        let counters: Vec<Commands> = {
            let others = self.others.lock().await;
            let extra = others.iter().take(instances.saturating_sub(1));
            std::iter::once(self.commands.clone())
                .chain(extra.map(|(_, c)| c.clone()))
                .collect()
        };
        let tasks = tasks * instances;
        let before = ServerCounters::read(&self.db).await?;
        for c in &counters {
            c.take();
        }
        let next = Arc::new(AtomicU64::new(0));
        // With `MP_BENCH_KINDS`: operations by how long they took (under
        // 10 ms, 100 ms, 1 s, and longer), and the longest (µs).
        let slow: Arc<[AtomicU64; 5]> = Arc::default();
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs_f64(self.secs);
        let mut handles = Vec::with_capacity(tasks);
        for task in 0..tasks {
            let (op, next, slow) = (op.clone(), next.clone(), slow.clone());
            handles.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let t = Instant::now();
                    op(task, i).await?;
                    let us = t.elapsed().as_micros() as u64;
                    let at = [10_000, 100_000, 1_000_000]
                        .iter()
                        .position(|&b| us < b)
                        .unwrap_or(3);
                    slow[at].fetch_add(1, Ordering::Relaxed);
                    slow[4].fetch_max(us, Ordering::Relaxed);
                }
                BoxResult::Ok(())
            }));
        }
        for h in handles {
            h.await??;
        }
        let took = t0.elapsed();
        if std::env::var_os("MP_BENCH_KINDS").is_some() {
            let n: Vec<u64> = slow.iter().map(|a| a.load(Ordering::Relaxed)).collect();
            eprintln!(
                "    ops <10ms {} <100ms {} <1s {} >=1s {}; longest {} ms",
                n[0],
                n[1],
                n[2],
                n[3],
                n[4] / 1000
            );
        }
        let round_trips = match std::env::var_os("MP_BENCH_KINDS") {
            Some(_) => kinds(&counters),
            None => counters.iter().map(Commands::take_count).sum(),
        };
        let d = ServerCounters::read(&self.db)
            .await?
            .minus(before)
            .minus(self.baseline);
        let ops = next.load(Ordering::Relaxed);
        eprintln!(
            "  {design}, {instances} x {} tasks: {} ops in {:.1} s",
            tasks / instances,
            thousands(ops),
            took.as_secs_f64()
        );
        Ok(Row {
            design: design.to_owned(),
            naive,
            instances,
            tasks: tasks / instances,
            ops,
            round_trips,
            writes: d.op_insert + d.op_update + d.op_delete,
            documents: d.inserted + d.updated + d.deleted,
            took,
            longest: Duration::from_micros(slow[4].load(Ordering::Relaxed)),
            over_1s: slow[3].load(Ordering::Relaxed),
        })
    }
}

/// A section: `### title` and one row per (tasks, design), each design's
/// throughput also as a ratio to the naive design's at the same tasks.
pub(crate) fn table(title: &str, rows: &[Row]) -> String {
    let mut out = format!("### {title}\n\n| tasks | design | round trips / op | server writes / op | documents written / op | operations | ops/s | ops/s ÷ naive | longest op | ops ≥ 1 s |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let per_op = |n: f64, ops: u64| {
        if ops == 0 {
            "n/a".to_owned()
        } else {
            format!("{:.3}", n / ops as f64)
        }
    };
    let rate = |r: &Row| r.ops as f64 / r.took.as_secs_f64();
    for r in rows {
        let naive = rows
            .iter()
            .find(|n| n.naive && n.tasks == r.tasks && n.instances == r.instances);
        let ratio = match naive {
            Some(n) if !r.naive && rate(n) > 0.0 => format!("{:.2}×", rate(r) / rate(n)),
            _ => "1×".to_owned(),
        };
        let tasks = match r.instances {
            1 => r.tasks.to_string(),
            n => format!("{n} × {}", r.tasks),
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} ms | {} |\n",
            tasks,
            r.design,
            per_op(r.round_trips as f64, r.ops),
            per_op(r.writes as f64, r.ops),
            per_op(r.documents as f64, r.ops),
            thousands(r.ops),
            thousands(rate(r).round() as u64),
            ratio,
            thousands(r.longest.as_millis() as u64),
            thousands(r.over_1s),
        );
    }
    out.push('\n');
    out
}

/// The commands `counters` saw, counted by kind on stderr (with
/// `MP_BENCH_KINDS` set: where a cell's round trips go), and how many.
fn kinds(counters: &[Commands]) -> usize {
    use std::collections::BTreeMap;
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    let mut all = 0;
    for c in counters {
        for (name, cmd) in c.take() {
            all += 1;
            *by.entry(kind(&name, &cmd)).or_default() += 1;
        }
        for (name, why) in c.take_failed() {
            *by.entry(format!("FAILED {name}: {why}")).or_default() += 1;
        }
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    for (k, n) in v {
        eprintln!("    {n:>8}  {k}");
    }
    all
}

fn kind(name: &str, cmd: &Document) -> String {
    let txn = match cmd.get_bool("autocommit") {
        Ok(false) => " [txn]",
        _ => "",
    };
    let keys = |d: Option<&Document>| {
        d.map(|d| d.keys().cloned().collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    };
    let detail = match name {
        "update" => {
            let u = cmd
                .get_array("updates")
                .ok()
                .and_then(|a| a.first())
                .and_then(|b| b.as_document());
            let q = u.and_then(|u| u.get_document("q").ok());
            let count = q
                .and_then(|q| q.get("count"))
                .map(|c| c.to_string())
                .unwrap_or_default();
            let pipe = match u.and_then(|u| u.get("u")) {
                Some(mongo_patterns::bson::Bson::Array(_)) => "pipeline",
                _ => "doc",
            };
            format!(" q[{}] count={count} u={pipe}", keys(q))
        }
        "find" => format!(" filter[{}]", keys(cmd.get_document("filter").ok())),
        "findAndModify" => format!(" query[{}]", keys(cmd.get_document("query").ok())),
        _ => String::new(),
    };
    format!("{name}{txn}{detail}")
}
