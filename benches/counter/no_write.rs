//! The path that does not write: what an increment costs the client when
//! the handle keeps it, alone and with tasks meeting on the handle's locks.

use std::time::Instant;

use mongo_patterns::approx_counter::{CounterSpec, Mode, MAX_EVERY};
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{cpu_ns, sort_median_f64, thousands, BoxResult};

use crate::workload::{share, Workload};
use crate::{Args, Product};

/// Which keys a no-write-path case counts.
#[derive(Clone, Copy, PartialEq)]
enum Keys {
    Zipf,
    Hottest,
}

pub(crate) async fn no_write_path(
    args: &Args,
    uri: &str,
    db: &Database,
    w: &Workload,
) -> BoxResult<String> {
    eprintln!("the path that does not write");
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let n = args.path_ops;
    let mut out = format!(
        "### The path that does not write: per-increment cost and contention, {} increments per case, median of {}\n\n",
        thousands(n),
        args.path_reps
    );
    out += &format!(
        "Handles that (almost) never write: sampled and buffered with N = 1,000,000 (buffered also `max_delay_ms` = 1 h, so no timed flush; its pending counts are written by an untimed `shutdown()` after each case), geometric with N = 2 after one untimed `incr_by(id, 10⁹)` per key (m = 5·10⁸ from then on). One task counts the Zipf keys in the order drawn; {t} tasks each count their own Zipf sequence, or all the hottest key. The server is idle here, so the client has both cores; {t} tasks run on the runtime's {w} worker threads. Wall: ns per increment over the whole case; CPU: this process's CPU over all threads (`/proc/self/task/*/schedstat`) per increment. With more than one worker, CPU per increment above the one-task figure is time lost to the handle's shared state (locks, contended atomics).\n\n",
        t = args.tasks,
        w = args.threads.max(1)
    );
    out += "| mode | load | writes during the timed loop | wall ns per increment | CPU ns per increment | CPU ÷ one task, Zipf |\n| --- | --- | ---: | ---: | ---: | ---: |\n";
    for mode in [Mode::Sampled, Mode::Buffered, Mode::Geometric] {
        let (declared, name) = match mode {
            Mode::Sampled => (Product::web_page_views_counter(&pdb).spec(), "sampled"),
            Mode::Buffered => (Product::buffered_views_counter(&pdb).spec(), "buffered"),
            Mode::Geometric => (Product::geometric_views_counter(&pdb).spec(), "geometric"),
        };
        let spec = CounterSpec {
            every: if mode == Mode::Geometric {
                2
            } else {
                MAX_EVERY
            },
            max_delay_ms: 3_600_000,
            ..declared
        };
        let mut base = f64::NAN;
        for (load, tasks, keys) in [
            ("1 task, Zipf keys".to_owned(), 1, Keys::Zipf),
            (
                format!("{} tasks, Zipf keys", args.tasks),
                args.tasks,
                Keys::Zipf,
            ),
            (
                format!("{} tasks, hottest key only", args.tasks),
                args.tasks,
                Keys::Hottest,
            ),
        ] {
            eprintln!("  {name}: {load}");
            let mut wall = Vec::new();
            let mut cpu = Vec::new();
            let mut writes = 0;
            for _ in 0..args.path_reps {
                let c = Counter::<Product>::new(&pdb, spec);
                if mode == Mode::Geometric {
                    let ids: Vec<&String> = match keys {
                        Keys::Zipf => w.ids.iter().collect(),
                        Keys::Hottest => vec![&w.ids[0]],
                    };
                    for id in ids {
                        c.incr_by(id.as_str(), 1_000_000_000).await?;
                    }
                }
                let w0 = c.stats().writes;
                // One task: every task's sequence, one after the other.
                let seqs: Vec<Vec<u32>> = if tasks == 1 {
                    vec![w
                        .draws
                        .iter()
                        .flat_map(|d| d.iter().copied())
                        .chain(std::iter::repeat(0))
                        .take(n as usize)
                        .collect()]
                } else {
                    (0..tasks)
                        .map(|t| {
                            let k = share(n, tasks, t);
                            match keys {
                                Keys::Hottest => vec![0; k],
                                Keys::Zipf => w.draws[t]
                                    .iter()
                                    .copied()
                                    .chain(std::iter::repeat(0))
                                    .take(k)
                                    .collect(),
                            }
                        })
                        .collect()
                };
                let (c0, t0) = (cpu_ns(), Instant::now());
                let handles: Vec<_> = seqs
                    .into_iter()
                    .map(|seq| {
                        let c = c.clone();
                        let ids = w.ids.clone();
                        tokio::spawn(async move {
                            for k in seq {
                                c.incr(ids[k as usize].as_str()).await?;
                            }
                            Ok::<_, mongo_patterns::Error>(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.await??;
                }
                wall.push(t0.elapsed().as_nanos() as f64 / n as f64);
                cpu.push((cpu_ns() - c0) as f64 / n as f64);
                writes += c.stats().writes - w0;
                c.shutdown().await?;
            }
            let (wm, cm) = (sort_median_f64(&mut wall), sort_median_f64(&mut cpu));
            if base.is_nan() {
                base = cm;
            }
            out += &format!(
                "| {name} | {load} | {} | {wm:.0} | {cm:.0} | {:.2} |\n",
                writes / args.path_reps as u64,
                cm / base
            );
        }
    }
    out += "\n";
    Ok(out)
}
