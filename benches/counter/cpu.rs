//! Client CPU: `incr` on a sampled handle against a hand-written loop that
//! sends exactly the same writes.

use std::hint::black_box;
use std::time::Instant;

use mongo_patterns::approx_counter::{CounterSpec, Mode, MAX_EVERY};
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{cpu_ns, sort_median_f64, splitmix64, thousands, BoxResult};

use crate::by_hand::hand_sampled;
use crate::{Args, Product, COLLECTION, CPU_GEN_ID, CPU_HAND_ID};

pub(crate) async fn cpu_comparison(args: &Args, uri: &str, db: &Database) -> BoxResult<String> {
    eprintln!("client CPU: sampled `incr` vs hand-written");
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let coll: Collection<Document> = pdb.collection(COLLECTION);
    for id in [CPU_GEN_ID, CPU_HAND_ID] {
        coll.insert_one(doc! {"_id": id, "web_page_views": 0_i64})
            .await?;
    }
    let declared = Product::web_page_views_counter(&pdb).spec();
    let field = declared.field;
    let ops = args.cpu_ops;
    let mut out = format!(
        "### Client CPU: sampled `incr` vs hand-written, {} interleaved repetitions\n\n",
        args.cpu_reps,
    );
    out += "Generated: `Counter::incr(id)` on a sampled handle made with `.seeded(seed)`. Hand-written: draw from the same SplitMix64 stream, and when `r·N < 2⁶⁴` (one time in N) `update_one({_id}, {$inc: {field: N}})` — so both send exactly the same writes (checked). One task, one key each, a client without command monitoring, a new seed per repetition shared by both variants, order alternating. CPU: this process over all its threads (`/proc/self/task/*/schedstat`), the driver's included. Row N = 1,000,000: the path that does not write, alone (about one write in a million), timed by the wall clock because a loop that never waits does not move the scheduler's clock between ticks.\n\n";
    out += "| every | increments per repetition | measured as | writes per repetition (generated = hand, median) | µs per increment generated (median rep) | µs per increment hand (median rep) | generated ÷ hand (ratio of medians) | per-rep ratio median (min – max) |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | :---: |\n";
    // N as declared, and N = 10⁶: the path without writes alone.
    for every in [args.every, MAX_EVERY] {
        let spec = CounterSpec {
            every,
            mode: Mode::Sampled,
            ..declared
        };
        // Without writes the loop never leaves the thread, and the
        // scheduler's CPU clock only moves at ticks: wall time of 20× the
        // increments instead.
        let (ops, by_wall) = if every == args.every {
            (ops, false)
        } else {
            (ops * 20, true)
        };
        let took = |c0: u64, t0: Instant| -> f64 {
            let ns = if by_wall {
                t0.elapsed().as_nanos() as f64
            } else {
                (cpu_ns() - c0) as f64
            };
            ns / ops as f64 / 1e3
        };
        let mut gen = Vec::new();
        let mut hand = Vec::new();
        let mut writes = Vec::new();
        for rep in 0..args.cpu_reps {
            let seed = splitmix64(args.seed.wrapping_add(1000 + rep as u64));
            let mut per = [0.0f64; 2];
            let mut w = [0u64; 2];
            let order = if rep.is_multiple_of(2) {
                [0, 1]
            } else {
                [1, 0]
            };
            for v in order {
                if v == 0 {
                    let c = Counter::<Product>::new(&pdb, spec).seeded(seed);
                    let (c0, t0) = (cpu_ns(), Instant::now());
                    for _ in 0..ops {
                        c.incr(black_box(CPU_GEN_ID)).await?;
                    }
                    per[0] = took(c0, t0);
                    w[0] = c.stats().writes;
                } else {
                    let mut draws = 0u64;
                    let mut n = 0;
                    let (c0, t0) = (cpu_ns(), Instant::now());
                    for _ in 0..ops {
                        n += u64::from(
                            hand_sampled(
                                &coll,
                                field,
                                black_box(CPU_HAND_ID),
                                u64::from(every),
                                seed,
                                &mut draws,
                            )
                            .await?,
                        );
                    }
                    per[1] = took(c0, t0);
                    w[1] = n;
                }
            }
            if w[0] != w[1] {
                return Err(format!("writes differ: generated {} vs hand {}", w[0], w[1]).into());
            }
            gen.push(per[0]);
            hand.push(per[1]);
            writes.push(w[0] as f64);
        }
        let mut ratios: Vec<f64> = gen.iter().zip(&hand).map(|(g, h)| g / h).collect();
        let (gm, hm) = (sort_median_f64(&mut gen), sort_median_f64(&mut hand));
        let rm = sort_median_f64(&mut ratios);
        out += &format!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} ({:.3} – {:.3}) |\n",
            thousands(u64::from(every)),
            thousands(ops),
            if by_wall {
                "wall time (no I/O, one thread)"
            } else {
                "CPU, all threads"
            },
            thousands(sort_median_f64(&mut writes) as u64),
            gm,
            hm,
            gm / hm,
            rm,
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
    out += "\n";
    Ok(out)
}
