//! The runs: each mode, and the exact baseline, counting the same views
//! from the same tasks, with the server's and the client's figures around.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::approx_counter::{CounterSpec, CounterStats};
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{cpu_ns, thousands, BoxResult, ServerCounters};
use mongo_patterns_testkit::Commands;

use crate::by_hand::exact_incr;
use crate::workload::{share, Workload};
use crate::{Args, Product, Run, COLLECTION};

/// Commands sent, by name, drained from the monitored client's log as they
/// come (a million logged commands would not fit in memory).
#[derive(Clone)]
pub(crate) struct Tally {
    pub(crate) commands: Commands,
    pub(crate) counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Tally {
    pub(crate) fn drain(&self) {
        // Taken under the map's lock, so that `reset` cannot interleave.
        let mut m = self.counts.lock().expect("tally");
        for (name, _) in self.commands.take() {
            *m.entry(name).or_default() += 1;
        }
    }

    pub(crate) fn reset(&self) {
        let mut m = self.counts.lock().expect("tally");
        self.commands.take();
        m.clear();
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, u64> {
        self.drain();
        self.counts.lock().expect("tally").clone()
    }
}

// ------------------------------------------------------------------ runs

/// What the tasks count with.
#[derive(Clone)]
enum Sink {
    Counter(Counter<Product>),
    Exact(Collection<Document>),
}

impl Sink {
    async fn incr(&self, id: &str) -> BoxResult<()> {
        match self {
            Sink::Counter(c) => c.incr(id).await?,
            Sink::Exact(coll) => exact_incr(coll, id).await?,
        }
        Ok(())
    }
}

/// The handle of `run`'s field, with `every` as the flag says.
fn handle(db: &Database, run: Run, every: u32) -> Counter<Product> {
    let declared = match run {
        Run::Sampled => Product::web_page_views_counter(db),
        Run::Buffered => Product::buffered_views_counter(db),
        Run::Geometric => Product::geometric_views_counter(db),
        Run::Exact => unreachable!("the exact run has no handle"),
    };
    if declared.spec().every == every {
        declared
    } else {
        let spec = CounterSpec {
            every,
            ..declared.spec()
        };
        drop(declared);
        Counter::new(db, spec)
    }
}

/// One run's measurements.
pub(crate) struct Measured {
    pub(crate) run: Run,
    pub(crate) increments: u64,
    pub(crate) tasks_time: Duration,
    pub(crate) shutdown_time: Duration,
    pub(crate) cpu_ns: u64,
    pub(crate) delta: ServerCounters,
    pub(crate) sent: BTreeMap<String, u64>,
    pub(crate) stats: Option<CounterStats>,
    pub(crate) spec: Option<CounterSpec>,
    pub(crate) truth: Vec<u64>,
    pub(crate) stored: Vec<i64>,
    /// The documented relative standard error of each key's count.
    pub(crate) bound: Vec<f64>,
    /// Writes the mode's rules predict for these counts (see `expected`).
    pub(crate) expected_writes: f64,
}

impl Measured {
    pub(crate) fn total_time(&self) -> Duration {
        self.tasks_time + self.shutdown_time
    }

    pub(crate) fn rate(&self) -> f64 {
        self.increments as f64 / self.total_time().as_secs_f64()
    }

    /// Writes the server applied: `update` commands count in
    /// `opcounters.update`, `findAndModify` (geometric) in
    /// `opcounters.command` on mongod, which also counts the driver's
    /// background commands (a handful).
    pub(crate) fn server_writes(&self) -> i64 {
        if self.sent.contains_key("findAndModify") {
            self.delta.op_update + self.delta.op_command
        } else {
            self.delta.op_update
        }
    }

    pub(crate) fn per_write(&self) -> f64 {
        self.increments as f64 / self.server_writes().max(1) as f64
    }
}

pub(crate) async fn measure(
    args: &Args,
    db: &Database,
    tally: &Tally,
    baseline: ServerCounters,
    w: &Workload,
    run: Run,
    n: u64,
) -> BoxResult<Measured> {
    let coll: Collection<Document> = db.collection(COLLECTION);
    let counter = (run != Run::Exact).then(|| handle(db, run, args.every));
    let sink = match &counter {
        Some(c) => Sink::Counter(c.clone()),
        None => Sink::Exact(coll.clone()),
    };
    let done = Arc::new(AtomicU64::new(0));
    let progress = {
        let done = done.clone();
        let label = run.name();
        tokio::spawn(async move {
            let t = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(15)).await;
                let d = done.load(Ordering::Relaxed);
                eprintln!(
                    "  {label}: {} of {} increments, {:.0} s, {:.0}/s",
                    thousands(d),
                    thousands(n),
                    t.elapsed().as_secs_f64(),
                    d as f64 / t.elapsed().as_secs_f64()
                );
            }
        })
    };
    eprintln!("{}: {} increments", run.name(), thousands(n));

    let before = ServerCounters::read(db).await?;
    tally.reset();
    let cpu0 = cpu_ns();
    let t0 = Instant::now();
    let handles: Vec<_> = (0..args.tasks)
        .map(|t| {
            let draws = w.draws[t].clone();
            let ids = w.ids.clone();
            let sink = sink.clone();
            let done = done.clone();
            let count = share(n, args.tasks, t);
            tokio::spawn(async move {
                for chunk in draws[..count].chunks(1024) {
                    for &k in chunk {
                        sink.incr(&ids[k as usize]).await?;
                    }
                    done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for h in handles {
        h.await??;
    }
    let tasks_time = t0.elapsed();
    let t1 = Instant::now();
    if let Some(c) = &counter {
        c.shutdown().await?;
    }
    let shutdown_time = t1.elapsed();
    let cpu = cpu_ns() - cpu0;
    let sent = tally.snapshot();
    let after = ServerCounters::read(db).await?;
    progress.abort();
    drop(sink);

    // Every product read back in one `find`.
    let field = run.field();
    let docs: Vec<Document> = coll
        .find(doc! {})
        .projection(doc! {field: 1})
        .await?
        .try_collect()
        .await?;
    let index: HashMap<&str, usize> = w
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut stored = vec![0i64; w.ids.len()];
    for d in &docs {
        let Ok(id) = d.get_str("_id") else { continue };
        if let Some(&i) = index.get(id) {
            stored[i] = match d.get(field) {
                Some(Bson::Int32(v)) => i64::from(*v),
                Some(Bson::Int64(v)) => *v,
                Some(Bson::Double(v)) => v.round() as i64,
                _ => 0,
            };
        }
    }
    let truth = w.truth(n);
    let (stats, spec, bound) = match &counter {
        Some(c) => {
            // `estimate` of the hottest key agrees with the stored value
            // (nothing is pending after `shutdown`).
            let est = c.estimate(w.ids[0].as_str()).await?;
            if est != stored[0] {
                return Err(format!("estimate {est} ≠ stored {}", stored[0]).into());
            }
            let bound = truth.iter().map(|&t| c.relative_error(t)).collect();
            (Some(c.stats()), Some(c.spec()), bound)
        }
        None => (None, None, vec![0.0; truth.len()]),
    };
    let expected_writes = expected(run, args.every, &truth);
    let delta = after.minus(before).minus(baseline);
    eprintln!(
        "  {:.1} s + {:.2} s shutdown, Δ opcounters update {} command {}",
        tasks_time.as_secs_f64(),
        shutdown_time.as_secs_f64(),
        delta.op_update,
        delta.op_command
    );
    Ok(Measured {
        run,
        increments: n,
        tasks_time,
        shutdown_time,
        cpu_ns: cpu,
        delta,
        sent,
        stats,
        spec,
        truth,
        stored,
        bound,
        expected_writes,
    })
}

/// Writes each mode's rules predict for the final counts: sampled n/N;
/// buffered ⌊n_k/N⌋ per key plus one final flush of the remainder (a lower
/// bound: timed flushes add more); geometric Σ over c < n_k of 1/m(c),
/// m(c) = max(N, ⌊c/N⌋) (the value read back taken as current); exact n.
pub(crate) fn expected(run: Run, every: u32, truth: &[u64]) -> f64 {
    let n = u64::from(every);
    match run {
        Run::Sampled => truth.iter().sum::<u64>() as f64 / n as f64,
        Run::Buffered => truth
            .iter()
            .map(|&t| (t / n + u64::from(!t.is_multiple_of(n))) as f64)
            .sum(),
        Run::Geometric => truth
            .iter()
            .map(|&t| (0..t).map(|c| 1.0 / (c / n).max(n) as f64).sum::<f64>())
            .sum(),
        Run::Exact => truth.iter().sum::<u64>() as f64,
    }
}
