//! Generated against hand-written: the same commands, compared field by
//! field, then the client CPU each costs.

use std::hint::black_box;

use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{bare, cpu_ns, cpu_ticks, ratios, BoxResult, Spread};
use mongo_patterns_testkit::Commands;

use crate::by_hand::{
    array_change_by_hand, array_rank_by_hand, docs_change_by_hand, docs_rank_by_hand, rank_by_hand,
    HandRank,
};
use crate::cost::{self, Path};
use crate::{Args, Student, StudentDocs, EXAM};

struct Ctx {
    db: Database,
    array: Ranks<Student>,
    docs: Ranks<StudentDocs>,
    array_hist: Collection<Document>,
    docs_hist: Collection<Document>,
}

impl Ctx {
    fn new(db: &Database) -> Ctx {
        let array = Student::ranks(db);
        let docs = StudentDocs::ranks(db);
        Ctx {
            db: db.clone(),
            array_hist: array.histogram_collection().clone(),
            docs_hist: docs.histogram_collection().clone(),
            array,
            docs,
        }
    }

    /// Operation `op` (rank array, rank documents, change array, change
    /// documents), generated or by hand; changes alternate 70 → 70.5 and back
    /// by `k`.
    async fn run(&self, op: usize, hand: bool, k: u64) -> BoxResult<()> {
        let (from, to) = if k.is_multiple_of(2) {
            (70.0, 70.5)
        } else {
            (70.5, 70.0)
        };
        match (op, hand) {
            (0, false) => {
                black_box(self.array.rank(EXAM, 70.0).await?);
            }
            (0, true) => {
                black_box(rank_by_hand(&self.array_hist, array_rank_by_hand(70.0)).await?);
            }
            (1, false) => {
                black_box(self.docs.rank(EXAM, 70.0).await?);
            }
            (1, true) => {
                black_box(rank_by_hand(&self.docs_hist, docs_rank_by_hand(70.0)).await?);
            }
            (2, false) => self.array.change(EXAM, from, to).await?,
            (2, true) => array_change_by_hand(&self.array_hist, from, to).await?,
            (3, false) => self.docs.change(EXAM, from, to).await?,
            _ => docs_change_by_hand(&self.db, from, to).await?,
        }
        Ok(())
    }
}

const HAND_OPS: [&str; 4] = [
    "`rank`, array (aggregate `$match` + board check + `$project`)",
    "`rank`, documents (aggregate `$match` + `$group`)",
    "`change` 70 ⇄ 70.5, array (pipeline `updateOne`)",
    "`change` 70 ⇄ 70.5, documents (`bulkWrite` of 5 statements)",
];

pub(crate) async fn generated_vs_hand(
    args: &Args,
    uri: &str,
    db: &Database,
    commands: &Commands,
) -> BoxResult<String> {
    eprintln!("generated vs hand-written");
    // The hand-written pipelines are the ones `rank_pipeline` gives.
    let (b, s) = (Bson::String(EXAM.into()), Bson::Double(70.0));
    assert_eq!(
        Student::ranks(db).rank_pipeline(&b, &s),
        array_rank_by_hand(70.0)
    );
    assert_eq!(
        StudentDocs::ranks(db).rank_pipeline(&b, &s),
        docs_rank_by_hand(70.0)
    );
    // Same commands, same answers, on the monitored client.
    let ctx = Ctx::new(db);
    let want = ctx.array.rank(EXAM, 70.0).await?;
    for (op, name) in HAND_OPS.iter().enumerate() {
        let mut sent = [Vec::new(), Vec::new()];
        for k in 0..2 {
            for (v, hand) in [false, true].into_iter().enumerate() {
                commands.take();
                ctx.run(op, hand, k).await?;
                let mut c = commands.take();
                sent[v].append(&mut c);
            }
        }
        let strip = |v: &[(String, Document)]| -> Vec<(String, Document)> {
            v.iter().map(|(n, c)| (n.clone(), bare(c))).collect()
        };
        if strip(&sent[0]) != strip(&sent[1]) {
            return Err(format!(
                "{name}: the commands differ:\n generated {:?}\n by hand   {:?}",
                strip(&sent[0]),
                strip(&sent[1])
            )
            .into());
        }
    }
    let hand = rank_by_hand(&ctx.array_hist, array_rank_by_hand(70.0)).await?;
    let gen = HandRank {
        rank: want.rank,
        dense: want.dense,
        ties: want.ties,
        total: want.total,
    };
    assert_eq!(hand, gen, "hand-written rank equals the generated one");
    assert_eq!(
        rank_by_hand(&ctx.docs_hist, docs_rank_by_hand(70.0)).await?,
        gen
    );
    let rts: Vec<usize> = {
        let mut v = Vec::new();
        for op in 0..4 {
            commands.take();
            ctx.run(op, false, 0).await?;
            v.push(commands.take_count());
            ctx.run(op, true, 1).await?;
            commands.take();
        }
        v
    };

    // CPU, on a client without command monitoring.
    let plain = Client::with_uri_str(uri).await?;
    let pctx = Ctx::new(&plain.database(db.name()));
    for op in 0..4 {
        for hand in [false, true] {
            pctx.run(op, hand, 0).await?;
            pctx.run(op, hand, 1).await?;
        }
    }
    let ops = args.cpu_ops as u64;
    // [op][generated | hand]
    let mut cpu: Vec<[Vec<f64>; 2]> = (0..4).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut ticks = [[0u64; 2]; 4];
    for rep in 0..args.cpu_reps {
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for op in 0..4 {
            for &v in &order {
                let (c0, t0) = (cpu_ns(), cpu_ticks());
                for k in 0..ops {
                    pctx.run(op, v == 1, k).await?;
                }
                cpu[op][v].push((cpu_ns() - c0) as f64);
                ticks[op][v] += cpu_ticks() - t0;
            }
        }
    }
    plain.shutdown().await;
    assert_eq!(
        ctx.array.rank(EXAM, 70.0).await?,
        want,
        "the changes went there and back"
    );

    let mut out = format!(
        "### Generated vs hand-written: client CPU, {} interleaved repetitions of {} calls\n\n",
        args.cpu_reps, ops
    );
    out += "Hand-written: the same commands through a `Collection<Document>` (the rank pipelines written out by hand and checked equal to `rank_pipeline`; the `change` filter and pipeline update reproduced from the source); every command of both was checked equal, field by field, on the monitored client. Client CPU is this process's on-CPU time over its threads (`/proc/self/task/*/schedstat`), on a client without command monitoring; the server's CPU is not included. Changes alternate 70 → 70.5 and back.\n\n";
    out += "| call | round trips generated / hand | µs CPU per call generated (median rep) | µs CPU per call hand (median rep) | CPU generated ÷ hand (ratio of medians) | per-rep ratio median (min – max) | utime+stime ticks generated / hand |\n| --- | :---: | ---: | ---: | ---: | :---: | :---: |\n";
    for (op, name) in HAND_OPS.iter().enumerate() {
        let per_rep = Spread::of(&ratios(&cpu[op][0], &cpu[op][1]));
        let (gm, hm) = (
            Spread::of(&cpu[op][0]).median,
            Spread::of(&cpu[op][1]).median,
        );
        out += &format!(
            "| {name} | {} / {} | {:.1} | {:.1} | {:.3} | {:.3} ({:.3} – {:.3}) | {} / {} |\n",
            rts[op],
            rts[op],
            gm / ops as f64 / 1e3,
            hm / ops as f64 / 1e3,
            gm / hm,
            per_rep.median,
            per_rep.min,
            per_rep.max,
            ticks[op][0],
            ticks[op][1]
        );
    }
    out += "\n";
    let per_call = |v: &[f64]| v.iter().map(|ns| ns / ops as f64 / 1e3).collect();
    let paths: Vec<Path> = HAND_OPS
        .iter()
        .enumerate()
        .map(|(op, name)| Path {
            name: format!("rank histogram {name}"),
            unit: "CPU µs per call",
            generated: per_call(&cpu[op][0]),
            hand: per_call(&cpu[op][1]),
        })
        .collect();
    out += &cost::table(&paths);
    Ok(out)
}
