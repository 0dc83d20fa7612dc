//! A bounded scan, generated (`Keyset::stream()`) against a hand-written
//! driver loop that sends the same commands: round trips and client CPU.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use mongo_patterns::bson::spec::BinarySubtype;
use mongo_patterns::bson::{Binary, Bson};
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    bare, clock_ticks_per_second, median, ratios, thousands, BoxResult, Meter, Spread, Stopwatch,
};
use mongo_patterns_testkit::{bsonc, Commands};

use crate::cost::{self, Path};
use crate::{settle, Args, Visit};

struct Variant {
    name: &'static str,
    round_trips: usize,
    cpu: Vec<f64>,
    /// Per item, in the meter's unit (CPU µs, or instructions under callgrind).
    cost: Vec<f64>,
    ticks: u64,
    walls: Vec<Duration>,
    /// Of `cpu`, in nanoseconds per scan.
    cpu_spread: Spread,
    ticks_total_ms: u64,
    wall_median: Duration,
}

pub(crate) struct Scan {
    items: u64,
    meter: Meter,
    variants: Vec<Variant>,
    /// generated ÷ hand-written of the two scans of each repetition.
    paired: Spread,
}

/// What a scan saw, to check that both variants read the same items.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    items: u64,
    last: Option<ObjectId>,
    digest: u64,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            items: 0,
            last: None,
            digest: 0,
        }
    }

    /// The job's work per visit: look at the visitor and the time.
    fn visit(&mut self, v: &Visit) {
        let v = black_box(v);
        self.items += 1;
        self.last = Some(v.id);
        self.digest = self
            .digest
            .rotate_left(5)
            .wrapping_add(v.uuid.len() as u64 ^ v.init_time.timestamp_millis() as u64);
    }
}

/// The generated repository: `Keyset::stream()`, bounded to `limit` items.
async fn scan_generated(db: &Database, page: u32, limit: u64) -> BoxResult<Seen> {
    let mut seen = Seen::new();
    let mut items = std::pin::pin!(Visit::keyset(db)
        .page_size(page)
        .stream()
        .take(limit as usize));
    while let Some(v) = items.next().await {
        seen.visit(&v?);
    }
    Ok(seen)
}

/// The same job written by hand against the driver: sort by `_id`, take one
/// more than a page to learn whether another follows, and start each page
/// after the last `_id` seen. The boundary is the runtime's, so that both
/// send identical commands: every `_id` after `last` in BSON's sort order,
/// of whatever type, written as `$not: {$lte: last}` (which type bracketing
/// cannot narrow to ObjectIds) less the types that sort before ObjectIds.
/// The plain `{_id: {$gt: last}}` is compared with `explain` in the depth
/// table.
///
/// It repeats what the runtime does on purpose: a baseline that shared the
/// runtime's code could not show what that code costs.
async fn scan_by_hand(db: &Database, page: u32, limit: u64) -> BoxResult<Seen> {
    let visits = db.collection::<Visit>("visits");
    let mut seen = Seen::new();
    let mut last: Option<ObjectId> = None;
    loop {
        let filter = match last {
            None => doc! {},
            Some(id) => doc! {"$and": [
                {"_id": {"$not": {"$lte": id}, "$nin": [Bson::Null, f64::NAN]}},
                {"_id": {"$not": {"$gte": f64::NEG_INFINITY}}},
                {"_id": {"$not": {"$gte": ""}}},
                {"_id": {"$not": {"$gte": {}}}},
                {"_id": {"$not": {"$gte": Binary { subtype: BinarySubtype::Generic, bytes: Vec::new() }}}},
            ]},
        };
        let mut cursor = visits
            .find(filter)
            .sort(doc! {"_id": 1})
            .limit(i64::from(page) + 1)
            .batch_size(page + 1)
            .await?;
        let mut in_page = 0;
        let mut more = false;
        while let Some(v) = cursor.try_next().await? {
            if in_page == page {
                more = true; // the look-ahead item; it opens the next page
                continue;
            }
            in_page += 1;
            last = Some(v.id);
            seen.visit(&v);
            if seen.items == limit {
                return Ok(seen);
            }
        }
        if !more {
            return Ok(seen);
        }
    }
}

pub(crate) async fn scan(
    args: &Args,
    uri: &str,
    db: &Database,
    commands: &Commands,
) -> BoxResult<Scan> {
    let (page, limit) = (args.scan_page, args.scan);
    eprintln!(
        "scan of {} items in pages of {}:",
        thousands(limit),
        thousands(u64::from(page))
    );

    // Round trips and commands, on the monitored client (also a warm-up).
    commands.take();
    let generated = scan_generated(db, page, limit).await?;
    settle().await;
    let generated_cmds = commands.take();
    let by_hand = scan_by_hand(db, page, limit).await?;
    settle().await;
    let hand_cmds = commands.take();
    if generated != by_hand {
        return Err(format!("the scans differ: {generated:?} vs {by_hand:?}").into());
    }
    if generated.items != limit {
        return Err(format!("the scan read {} items, not {limit}", generated.items).into());
    }
    let strip = |cmds: &[(String, Document)]| -> Vec<(String, Document)> {
        cmds.iter()
            .map(|(name, c)| (name.clone(), bare(c)))
            .collect()
    };
    let (g, h) = (strip(&generated_cmds), strip(&hand_cmds));
    // Compared as bytes: the boundary holds a NaN, which no `==` equals.
    let bytes = |cmds: &[(String, Document)]| -> BoxResult<Vec<(String, Vec<u8>)>> {
        cmds.iter()
            .map(|(n, c)| Ok((n.clone(), bsonc::to_vec(c)?)))
            .collect()
    };
    if bytes(&g)? != bytes(&h)? {
        return Err(
            format!("the scans sent different commands:\ngenerated {g:?}\nby hand {h:?}").into(),
        );
    }
    eprintln!(
        "  both sent {} identical commands ({})",
        g.len(),
        g.first().map_or("", |(n, _)| n.as_str())
    );

    // CPU, on a client without command monitoring.
    let plain = Client::with_uri_str(uri).await?;
    let db = plain.database(db.name());
    // Warm the new client's connection (one small page each).
    black_box(scan_generated(&db, page.min(100), 1).await?);
    black_box(scan_by_hand(&db, page.min(100), 1).await?);
    let mut variants = vec![
        Variant::new("generated: `Keyset::stream()`", generated_cmds.len()),
        Variant::new("hand-written driver loop", hand_cmds.len()),
    ];
    let meter = Meter::from_env()?;
    for rep in 0..args.cpu_reps {
        // Alternate which goes first.
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let m = meter.start();
            let watch = Stopwatch::start();
            let seen = if i == 0 {
                scan_generated(&db, page, limit).await?
            } else {
                scan_by_hand(&db, page, limit).await?
            };
            let lap = watch.lap();
            let raw = meter.stop(m, &format!("scan {i} rep {rep}"))?;
            let (wall, cpu, ticks) = (lap.wall, lap.cpu_ns, lap.ticks);
            if seen != generated {
                return Err("a timed scan read different items".into());
            }
            let v = &mut variants[i];
            v.cpu.push(cpu as f64);
            v.cost.push(meter.per(raw, limit));
            v.ticks += ticks;
            v.walls.push(wall);
            eprintln!(
                "  rep {rep}: {:<32} cpu {:>8.1} ms, wall {:.2} s",
                v.name,
                cpu as f64 / 1e6,
                wall.as_secs_f64()
            );
        }
    }
    let paired = Spread::of(&ratios(&variants[0].cpu, &variants[1].cpu));
    let tick_ms = 1000 / clock_ticks_per_second();
    for v in &mut variants {
        v.cpu_spread = Spread::of(&v.cpu);
        v.ticks_total_ms = v.ticks * tick_ms;
        v.wall_median = median(&mut v.walls);
    }
    plain.shutdown().await;
    Ok(Scan {
        items: limit,
        meter,
        paired,
        variants,
    })
}

impl Variant {
    fn new(name: &'static str, round_trips: usize) -> Variant {
        Variant {
            name,
            round_trips,
            cpu: Vec::new(),
            cost: Vec::new(),
            ticks: 0,
            walls: Vec::new(),
            cpu_spread: Spread {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            },
            ticks_total_ms: 0,
            wall_median: Duration::ZERO,
        }
    }
}

/// The scan's table, and the ratios of the two variants' CPU.
pub(crate) fn report(out: &mut String, args: &Args, scan: &Scan) -> std::fmt::Result {
    writeln!(
        out,
        "### Generated vs hand-written: the first {} visits, pages of {}\n",
        thousands(args.scan),
        thousands(u64::from(args.scan_page))
    )?;
    writeln!(out, "Both send the same `find` commands (filter, sort, limit {} = page + 1, batchSize {}; checked command by command). Client CPU is this process's on-CPU time (all threads, `/proc/self/task/*/schedstat`), median of {} interleaved scans each, on a client without command monitoring; the server's CPU is not included.\n",
        args.scan_page + 1, args.scan_page + 1, args.cpu_reps)?;
    writeln!(out, "| variant | round trips | client CPU ms per scan (median) | min – max | µs CPU per item | CPU ÷ hand-written | wall s per scan (median) |")?;
    writeln!(out, "| --- | ---: | ---: | :---: | ---: | ---: | ---: |")?;
    let hand_cpu = scan.variants.last().map_or(1.0, |v| v.cpu_spread.median);
    for v in &scan.variants {
        writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} – {:.1} | {:.2} | {:.3} | {:.2} |",
            v.name,
            v.round_trips,
            v.cpu_spread.median / 1e6,
            v.cpu_spread.min / 1e6,
            v.cpu_spread.max / 1e6,
            v.cpu_spread.median / 1e3 / scan.items as f64,
            v.cpu_spread.median / hand_cpu,
            v.wall_median.as_secs_f64(),
        )?;
    }
    writeln!(out)?;
    let (generated, by_hand) = (&scan.variants[0].cpu_spread, &scan.variants[1].cpu_spread);
    writeln!(
        out,
        "Generated ÷ hand-written CPU: ratio of medians {:.3}, of minimums {:.3}; per repetition (the two scans back to back) median {:.3}, range {:.3} – {:.3}.\n",
        generated.median / by_hand.median,
        generated.min / by_hand.min,
        scan.paired.median,
        scan.paired.min,
        scan.paired.max
    )?;
    writeln!(out, "Cross-check from `/proc/self/stat` (utime+stime, 10 ms ticks), total over all measured scans: {}.\n",
        scan.variants
            .iter()
            .map(|v| format!("{} {} ms", v.name, v.ticks_total_ms))
            .collect::<Vec<_>>()
            .join(", "))?;
    write!(out, "{}", cost_table(args, scan))
}

/// The client-cost table of the scan: per item, in the meter's unit.
pub(crate) fn cost_table(args: &Args, scan: &Scan) -> String {
    let mut out = String::new();
    if scan.meter.is_instructions() {
        out += &format!(
            "### Generated vs hand-written: the first {} visits, pages of {}, {} interleaved scans each\n\n{}\n\n",
            thousands(args.scan),
            thousands(u64::from(args.scan_page)),
            args.cpu_reps,
            scan.meter.describe()
        );
    }
    out + &cost::table(&[Path {
        name: format!(
            "keyset pages of {}, {} items (`stream()`)",
            thousands(u64::from(args.scan_page)),
            thousands(scan.items)
        ),
        unit: scan.meter.unit("item"),
        generated: scan.variants[0].cost.clone(),
        hand: scan.variants[1].cost.clone(),
    }])
}
