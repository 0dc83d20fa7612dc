//! Generated against hand-written: the same commands, compared field by
//! field, then the client CPU each costs.

use std::hint::black_box;

use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{bare, cpu_ticks, BoxResult, Meter};
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
    "`change` 70 ⇄ 70.5, documents (`bulkWrite` of 4 statements)",
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
    let meter = Meter::from_env()?;
    // [op][generated | hand]
    let mut cpu: Vec<[Vec<f64>; 2]> = (0..4).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut ticks = [[0u64; 2]; 4];
    for rep in 0..args.cpu_reps {
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for op in 0..4 {
            for &v in &order {
                let t0 = cpu_ticks();
                let m = meter.start();
                for k in 0..ops {
                    pctx.run(op, v == 1, k).await?;
                }
                let raw = meter.stop(
                    m,
                    &format!("rank {op} {} rep {rep}", ["generated", "hand"][v]),
                )?;
                cpu[op][v].push(meter.per(raw, ops));
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
        "### Generated vs hand-written: {} interleaved repetitions of {} calls\n\n",
        args.cpu_reps, ops
    );
    out += "Hand-written: the same commands through a `Collection<Document>` (the rank pipelines written out by hand and checked equal to `rank_pipeline`; the `change` filter and pipeline update reproduced from the source); every command of both was checked equal, field by field, on the monitored client. Measured on a client without command monitoring; changes alternate 70 → 70.5 and back. ";
    out += meter.describe();
    out += "\n\n| call | round trips generated / hand | utime+stime ticks generated / hand |\n| --- | :---: | :---: |\n";
    for (op, name) in HAND_OPS.iter().enumerate() {
        out += &format!(
            "| {name} | {} / {} | {} / {} |\n",
            rts[op], rts[op], ticks[op][0], ticks[op][1]
        );
    }
    out += "\n";
    let paths: Vec<Path> = HAND_OPS
        .iter()
        .enumerate()
        .map(|(op, name)| Path {
            name: format!("rank histogram {name}"),
            unit: meter.unit("call"),
            generated: cpu[op][0].clone(),
            hand: cpu[op][1].clone(),
        })
        .collect();
    out += &cost::table(&paths);
    Ok(out)
}
