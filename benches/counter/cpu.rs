//! Client cost: `incr` on a sampled handle against a hand-written loop that
//! sends the same writes, on the path that writes one time in N and on the
//! path that does not write.

use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use mongo_patterns::approx_counter::{CounterSpec, Mode, MAX_EVERY};
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{splitmix64, thousands, BoxResult, Mark, Meter};

use crate::by_hand::{hand_sampled, hand_sampled_thread, seed_hand_rng};
use crate::cost::{self, Path};
use crate::workload::seeded_draw;
use crate::{Args, Product, COLLECTION, CPU_GEN_ID, CPU_HAND_ID};

/// The three paths compared.
#[derive(Clone, Copy, PartialEq)]
enum Case {
    /// N as declared, seeded: both send exactly the same writes.
    Writing,
    /// N = 10⁶, seeded, on a stretch of the stream without a hit: no write.
    SeededNoWrite,
    /// N = 10⁶, the per-thread random source on both sides.
    ThreadNoWrite,
}

/// A seed whose stream has no hit at N in its first `ops` draws, so that
/// neither variant writes.
fn quiet_seed(from: u64, ops: u64, every: u64) -> u64 {
    (from..)
        .map(splitmix64)
        .find(|&s| {
            (0..ops).all(|i| ((u128::from(seeded_draw(s, i)) * u128::from(every)) >> 64) != 0)
        })
        .expect("a seed")
}

pub(crate) async fn cpu_comparison(args: &Args, uri: &str, db: &Database) -> BoxResult<String> {
    eprintln!("client cost: sampled `incr` vs hand-written");
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let coll: Collection<Document> = pdb.collection(COLLECTION);
    for id in [CPU_GEN_ID, CPU_HAND_ID] {
        coll.insert_one(doc! {"_id": id, "web_page_views": 0_i64})
            .await?;
    }
    let declared = Product::web_page_views_counter(&pdb).spec();
    let meter = Meter::from_env()?;
    let field = declared.field;
    let mut out = format!(
        "### Client cost: sampled `incr` vs hand-written, {} interleaved repetitions\n\n",
        args.cpu_reps,
    );
    out += &format!("Writing path: `Counter::incr(id)` on a sampled handle made with `.seeded(seed)` (every = {}), against a hand-written loop drawing from the same SplitMix64 stream that, when `r·N < 2⁶⁴`, sends `update_one({{_id}}, {{$inc: {{field: N}}}})`: both send exactly the same writes (checked); {} increments per repetition, this process's CPU over all its threads (`/proc/self/task/*/schedstat`), the driver's included. The path that does not write (N = 1,000,000, {} increments per repetition, wall time: a loop that never waits does not move the scheduler's clock between ticks): seeded, on a stretch of each repetition's stream without a hit (no write on either side; a seeded handle's stream is shared by its clones, and the hand-written stream by its tasks, so both claim each number with one atomic add), and unseeded, the handle's stream (SplitMix64 over its per-thread count of increments) against xorshift64* written by hand in a thread-local (writes counted, not equal). One task, one key each, a client without command monitoring, a new seed per repetition, order alternating.\n\n", args.every, thousands(args.cpu_ops), thousands(args.cpu_ops * 20));
    if meter.is_instructions() {
        out += &format!(
            "This run: {} Every path, the one that does not write too, is counted in instructions.\n\n",
            meter.describe()
        );
    }
    out += "| path | writes per repetition, generated / hand (median) |\n| --- | :---: |\n";
    let mut paths = Vec::new();
    for case in [Case::Writing, Case::SeededNoWrite, Case::ThreadNoWrite] {
        let every = match case {
            Case::Writing => args.every,
            _ => MAX_EVERY,
        };
        let spec = CounterSpec {
            every,
            mode: Mode::Sampled,
            ..declared
        };
        let (ops, by_wall) = match case {
            Case::Writing => (args.cpu_ops, false),
            _ => (args.cpu_ops * 20, true),
        };
        // Under callgrind every path counts instructions; otherwise a loop
        // that never waits is timed by the wall clock (it does not move
        // the scheduler's clock between ticks).
        let by_wall = by_wall && !meter.is_instructions();
        let took = |m: Mark, t0: Instant, label: &str| -> BoxResult<f64> {
            let raw = meter.stop(m, label)?;
            Ok(if by_wall {
                t0.elapsed().as_nanos() as f64 / ops as f64
            } else {
                meter.per(raw, ops)
            })
        };
        let mut gen = Vec::new();
        let mut hand = Vec::new();
        let mut writes = [Vec::new(), Vec::new()];
        for rep in 0..args.cpu_reps {
            let base = args.seed.wrapping_add(1000 + 7919 * rep as u64);
            let seed = match case {
                Case::SeededNoWrite => quiet_seed(base, ops, u64::from(every)),
                _ => splitmix64(base),
            };
            let mut per = [0.0f64; 2];
            let mut w = [0u64; 2];
            let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
            for v in order {
                if v == 0 {
                    let c = Counter::<Product>::new(&pdb, spec);
                    let c = if case == Case::ThreadNoWrite {
                        c
                    } else {
                        c.seeded(seed)
                    };
                    let (m, t0) = (meter.start(), Instant::now());
                    for _ in 0..ops {
                        c.incr(black_box(CPU_GEN_ID)).await?;
                    }
                    per[0] = took(m, t0, &format!("incr generated rep {rep}"))?;
                    w[0] = c.stats().writes;
                } else {
                    let draws = AtomicU64::new(0);
                    let mut n = 0;
                    seed_hand_rng(seed);
                    let (m, t0) = (meter.start(), Instant::now());
                    if case == Case::ThreadNoWrite {
                        for _ in 0..ops {
                            n += u64::from(
                                hand_sampled_thread(
                                    &coll,
                                    field,
                                    black_box(CPU_HAND_ID),
                                    u64::from(every),
                                )
                                .await?,
                            );
                        }
                    } else {
                        for _ in 0..ops {
                            n += u64::from(
                                hand_sampled(
                                    &coll,
                                    field,
                                    black_box(CPU_HAND_ID),
                                    u64::from(every),
                                    seed,
                                    &draws,
                                )
                                .await?,
                            );
                        }
                    }
                    per[1] = took(m, t0, &format!("incr hand rep {rep}"))?;
                    w[1] = n;
                }
            }
            if case != Case::ThreadNoWrite && w[0] != w[1] {
                return Err(format!("writes differ: generated {} vs hand {}", w[0], w[1]).into());
            }
            gen.push(per[0]);
            hand.push(per[1]);
            writes[0].push(w[0]);
            writes[1].push(w[1]);
        }
        let name = match case {
            Case::Writing => {
                format!("counter `incr`, sampled, every = {every}, writing one time in N (seeded)")
            }
            Case::SeededNoWrite => {
                "counter `incr`, sampled, the path that does not write (seeded)".to_owned()
            }
            Case::ThreadNoWrite => {
                "counter `incr`, sampled, the path that does not write (per-thread random source)"
                    .to_owned()
            }
        };
        let med = |v: &mut Vec<u64>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        out += &format!(
            "| {name} | {} / {} |\n",
            thousands(med(&mut writes[0])),
            thousands(med(&mut writes[1]))
        );
        paths.push(Path {
            name,
            unit: if by_wall {
                "wall ns per increment".to_owned()
            } else {
                meter.unit("increment")
            },
            generated: gen,
            hand,
        });
    }
    out += "\n";
    out += &cost::table(&paths);
    Ok(out)
}
