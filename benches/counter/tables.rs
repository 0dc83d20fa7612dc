//! The runs' tables: writes, throughput, the targets, and the error at
//! the end.

use mongo_patterns_testkit::bench::thousands;

use crate::runs::{expected, Measured};
use crate::workload::Workload;
use crate::{Args, Run};

fn exact_of(runs: &[Measured]) -> Option<&Measured> {
    runs.iter().find(|r| r.run == Run::Exact)
}

fn label(args: &Args, r: &Measured) -> String {
    if r.run == Run::Exact && r.increments != args.increments {
        format!(
            "{} — {} increments only (`--exact-increments`)",
            r.run.name(),
            thousands(r.increments)
        )
    } else {
        r.run.name().to_owned()
    }
}

fn sent_names(r: &Measured) -> String {
    if r.sent.is_empty() {
        return "—".into();
    }
    r.sent
        .iter()
        .map(|(n, c)| format!("{} `{n}`", thousands(*c)))
        .collect::<Vec<_>>()
        .join(" + ")
}

pub(crate) fn writes_table(args: &Args, runs: &[Measured]) -> String {
    let exact = exact_of(runs);
    let mut out = String::from("### Writes\n\n");
    out += "Server writes: `serverStatus` after minus before, less what two `serverStatus` calls count: Δ`opcounters.update`, plus Δ`opcounters.command` for the run that sends `findAndModify` (geometric: mongod counts it under `command`, as does the surrogate; `command` also counts a few background commands of the driver, which is why it moves by a handful in the other runs) — Δ`metrics.document.updated` beside it. Commands sent: command monitoring. Handle: `stats().writes`. Expected: what the mode's rules give for these exact per-key counts (sampled n/N; buffered ⌊n_k/N⌋ + 1 final flush per key with a remainder, before timed flushes; geometric Σ_k Σ_{c<n_k} 1/max(N, ⌊c/N⌋)). Writes ÷ exact: the exact run's writes per increment × this run's increments ÷ this run's server writes.\n\n";
    out += "| counting | increments | server writes | Δ `opcounters.update` / `.command` | Δ `metrics.document.updated` | commands sent | handle `stats().writes` | expected writes | increments per write | writes ÷ exact |\n| --- | ---: | ---: | :---: | ---: | --- | ---: | ---: | ---: | ---: |\n";
    for r in runs {
        let vs = exact.map_or("—".to_owned(), |e| {
            let per = e.server_writes() as f64 / e.increments as f64;
            format!(
                "{:.1}×",
                per * r.increments as f64 / r.server_writes().max(1) as f64
            )
        });
        out += &format!(
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {:.1} | {} |\n",
            label(args, r),
            thousands(r.increments),
            thousands(r.server_writes().max(0) as u64),
            r.delta.op_update,
            r.delta.op_command,
            r.delta.updated,
            sent_names(r),
            r.stats.map_or("—".to_owned(), |s| thousands(s.writes)),
            thousands(r.expected_writes.round() as u64),
            r.per_write(),
            vs
        );
    }
    out += "\n";
    let every = u64::from(args.every);
    for r in runs {
        match r.run {
            Run::Buffered => {
                out += &format!(
                    "Buffered: {} server writes against the rules' floor of {} — the difference is about the number of timed flushes (`max_delay_ms` = {} ms, checked every {} ms, over a {:.1} s run): each writes a key's pending count before it reaches N.\n\n",
                    thousands(r.server_writes().max(0) as u64),
                    thousands(r.expected_writes.round() as u64),
                    r.spec.map_or(0, |s| s.max_delay_ms),
                    r.spec.map_or(0, |s| s.max_delay_ms / 2),
                    r.total_time().as_secs_f64()
                );
            }
            Run::Geometric => {
                let knee = every * every;
                let below = r.truth.iter().filter(|&&t| t <= knee).count();
                let one = expected(Run::Geometric, args.every, &[r.increments]);
                out += &format!(
                    "Geometric: m = max(N, ⌊E/N⌋) is N, as sampled, until a key's value passes N² = {}; {} of the {} keys stay below it and are sampled one in N. For one key counted {} times the same rules give {} writes (n/N up to N², then about N·ln(n/N²)).\n\n",
                    thousands(knee),
                    below,
                    thousands(r.truth.len() as u64),
                    thousands(r.increments),
                    thousands(one.round() as u64),
                );
            }
            _ => {}
        }
    }
    out
}

pub(crate) fn throughput_table(args: &Args, runs: &[Measured]) -> String {
    let exact = exact_of(runs);
    let mut out = String::from("### Throughput\n\n");
    out += &format!(
        "Wall time: from spawning the {} tasks until all have finished (\"tasks\"), then the handle's `shutdown()` (for buffered, the final flush of what is pending; for the others it only marks the handle closed); increments per second count both. Client CPU: this process over all its threads (the server is another process). Throughput × exact: increments per second ÷ the exact run's.\n\n",
        args.tasks
    );
    out += "| counting | increments | tasks s | `shutdown()` s | increments/s (tasks + shutdown) | increments/s (tasks only) | throughput × exact | client CPU µs per increment |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for r in runs {
        let vs = exact.map_or("—".to_owned(), |e| format!("{:.1}×", r.rate() / e.rate()));
        out += &format!(
            "| {} | {} | {:.2} | {:.3} | {} | {} | {} | {:.2} |\n",
            label(args, r),
            thousands(r.increments),
            r.tasks_time.as_secs_f64(),
            r.shutdown_time.as_secs_f64(),
            thousands(r.rate().round() as u64),
            thousands((r.increments as f64 / r.tasks_time.as_secs_f64()).round() as u64),
            vs,
            r.cpu_ns as f64 / r.increments as f64 / 1e3
        );
    }
    out += "\n";
    out
}

pub(crate) fn verdict_table(runs: &[Measured]) -> String {
    let Some(exact) = exact_of(runs) else {
        return "No exact run (`--modes` left it out): the 50× / 10× targets cannot be judged.\n\n"
            .into();
    };
    let per = exact.server_writes() as f64 / exact.increments as f64;
    let mut out = String::from(
        "### The targets: at least 50× fewer writes and 10× the throughput of exact counting\n\n",
    );
    if exact.increments != runs.iter().map(|r| r.increments).max().unwrap_or(0) {
        out += &format!(
            "The exact run counted {} increments, not the modes' {}: its writes per increment ({:.3}) and its increments per second are what the ratios use.\n\n",
            thousands(exact.increments),
            thousands(runs.iter().map(|r| r.increments).max().unwrap_or(0)),
            per
        );
    }
    out += "| mode | writes ÷ exact | ≥ 50×? | throughput × exact | ≥ 10×? | both? |\n| --- | ---: | :---: | ---: | :---: | :---: |\n";
    for r in runs.iter().filter(|r| r.run != Run::Exact) {
        let fewer = per * r.increments as f64 / r.server_writes().max(1) as f64;
        let faster = r.rate() / exact.rate();
        let yes = |b: bool| if b { "yes" } else { "**no**" };
        out += &format!(
            "| {} | {:.1}× | {} | {:.1}× | {} | {} |\n",
            r.run.name(),
            fewer,
            yes(fewer >= 50.0),
            faster,
            yes(faster >= 10.0),
            yes(fewer >= 50.0 && faster >= 10.0)
        );
    }
    out += "\n";
    out
}

fn pct(x: f64) -> String {
    format!("{:+.3}%", 100.0 * x)
}

pub(crate) fn error_tables(args: &Args, w: &Workload, runs: &[Measured]) -> String {
    let mut out = String::from("### Error at the end\n\n");
    out += "Every product read back with one `find` after the run (and `shutdown()`). Truth: the increments issued, per key. σ: the documented relative standard error, `relative_error(n_k)` of the key's true count n_k (sampled √((N−1)/n_k), geometric the same up to N² and then levelling off towards 1/√(2N), buffered 0 once flushed); σ of the total: √(Σ_k (σ_k·n_k)²) ÷ n, the keys' errors being independent. z: the error in units of σ (one run: one draw per key).\n\n";
    out += "| counting | truth (total) | stored (total) | error of the total | documented σ of the total | z of the total | keys within 2σ / 3σ | RMS z over keys with σ > 0 | largest key error | keys exact |\n| --- | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: |\n";
    for r in runs {
        let truth: u64 = r.truth.iter().sum();
        let stored: i64 = r.stored.iter().sum();
        let err = (stored - truth as i64) as f64 / truth.max(1) as f64;
        let var: f64 = r
            .truth
            .iter()
            .zip(&r.bound)
            .map(|(&t, &b)| (b * t as f64).powi(2))
            .sum();
        let sigma = var.sqrt() / truth.max(1) as f64;
        let z = if sigma > 0.0 { err / sigma } else { f64::NAN };
        let mut within = [0usize; 2];
        let mut zsq = 0.0;
        let mut zn = 0usize;
        let mut largest = 0.0f64;
        let mut exact_keys = 0;
        for ((&t, &s), &b) in r.truth.iter().zip(&r.stored).zip(&r.bound) {
            let d = (s - t as i64) as f64;
            if d == 0.0 {
                exact_keys += 1;
            }
            if t > 0 {
                largest = largest.max((d / t as f64).abs());
            }
            let sd = b * t as f64;
            if sd > 0.0 {
                let zk = d / sd;
                zsq += zk * zk;
                zn += 1;
                within[0] += usize::from(zk.abs() <= 2.0);
                within[1] += usize::from(zk.abs() <= 3.0);
            } else {
                within[0] += usize::from(d == 0.0);
                within[1] += usize::from(d == 0.0);
            }
        }
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} of {} | {} | {:.2}% | {} of {} |\n",
            label(args, r),
            thousands(truth),
            thousands(stored.max(0) as u64),
            pct(err),
            if sigma > 0.0 {
                format!("{:.3}%", 100.0 * sigma)
            } else {
                "0".into()
            },
            if z.is_finite() {
                format!("{z:+.2}")
            } else {
                "—".into()
            },
            within[0],
            within[1],
            r.truth.len(),
            if zn > 0 {
                format!("{:.2}", (zsq / zn as f64).sqrt())
            } else {
                "—".into()
            },
            100.0 * largest,
            exact_keys,
            r.truth.len()
        );
    }
    out += "\n";

    // Per key: the hottest, a few warm ones, the coldest.
    let mut picks: Vec<usize> = [0usize, 9, 99, args.keys / 2, args.keys - 1]
        .into_iter()
        .filter(|&k| k < args.keys)
        .collect();
    picks.dedup();
    out += "Per key (product k = k-th hottest; truth from each run's own increments, so the exact run's are smaller when it counted fewer):\n\n";
    out += "| counting | product | truth | stored | error | documented σ | z |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for r in runs {
        for &k in &picks {
            let t = r.truth[k];
            let s = r.stored[k];
            let d = (s - t as i64) as f64;
            let rel = d / t.max(1) as f64;
            let sd = r.bound[k];
            out += &format!(
                "| {} | {} ({}) | {} | {} | {} | {} | {} |\n",
                r.run.name(),
                k + 1,
                match k {
                    0 => "hottest".to_owned(),
                    k if k == args.keys - 1 => "coldest".to_owned(),
                    _ => format!("{:.3}% of views", 100.0 * w.p[k]),
                },
                thousands(t),
                thousands(s.max(0) as u64),
                pct(rel),
                if sd > 0.0 {
                    format!("{:.2}%", 100.0 * sd)
                } else {
                    "0".into()
                },
                if sd > 0.0 && t > 0 {
                    format!("{:+.2}", rel / sd)
                } else {
                    "—".into()
                }
            );
        }
    }
    out += "\n";
    let specs: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            let s = r.spec?;
            Some(format!(
                "{} {{every: {}, mode: {:?}, max_delay_ms: {}, max_keys: {}, upsert: {}}}",
                r.run.name(),
                s.every,
                s.mode,
                s.max_delay_ms,
                s.max_keys,
                s.upsert
            ))
        })
        .collect();
    if !specs.is_empty() {
        out += &format!("Specs of the handles: {}.\n\n", specs.join("; "));
    }
    out
}
