//! The rank of a score: the histogram (both layouts) against counting the
//! students above it and against `$setWindowFields`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    bare, explain, median, ms, opt, thousands, BoxResult, Explained,
};
use mongo_patterns_testkit::Commands;

use crate::{lossy_u64, names, Args, Picks, Student, StudentDocs, EXAM};

/// One way of reading a rank.
struct ReadVariant {
    name: &'static str,
    round_trips: usize,
    commands: String,
    explained: Explained,
    times: Vec<Duration>,
    rank: u64,
}

fn window_pipeline(student: i64) -> Vec<Document> {
    vec![
        doc! {"$match": {"examId": EXAM}},
        doc! {"$setWindowFields": {
            "partitionBy": "$examId",
            "sortBy": {"score": -1},
            "output": {"rank": {"$rank": {}}},
        }},
        doc! {"$match": {"_id": student}},
        doc! {"$project": {"_id": 1, "score": 1, "rank": 1}},
    ]
}

async fn window_rank(coll: &Collection<Document>, student: i64) -> BoxResult<u64> {
    let rows: Vec<Document> = coll
        .aggregate(window_pipeline(student))
        .allow_disk_use(true)
        .await?
        .try_collect()
        .await?;
    let row = rows.first().ok_or("the window found no such student")?;
    Ok(lossy_u64(row.get("rank")).ok_or("no rank in the window's reply")?)
}

async fn count_rank(coll: &Collection<Document>, score: f64) -> BoxResult<u64> {
    let above = coll
        .count_documents(doc! {"examId": EXAM, "score": {"$gt": score}})
        .await?;
    Ok(above + 1)
}

pub(crate) async fn reads(
    args: &Args,
    db: &Database,
    commands: &Commands,
    picks: &Picks,
) -> BoxResult<String> {
    let array = Student::ranks(db);
    let docs = StudentDocs::ranks(db);
    let students: Collection<Document> = db.collection(Student::COLLECTION);
    let cases = [
        ("top", 100.0, 0_i64),
        ("middle", 70.0, picks.middle),
        ("bottom", 0.0, picks.bottom),
    ];
    let mut rows = Vec::new();
    let mut window_explained: Option<Explained> = None;
    for (label, score, student) in cases {
        eprintln!("rank of {score} ({label})");
        let mut vs: Vec<ReadVariant> = Vec::new();
        // Round trips, the commands sent, and a first (timed) call each.
        for v in 0..4 {
            if v == 3 && !args.window {
                continue;
            }
            commands.take();
            let t = Instant::now();
            let rank = match v {
                0 => array.rank(EXAM, score).await?.rank,
                1 => docs.rank(EXAM, score).await?.rank,
                2 => count_rank(&students, score).await?,
                _ => window_rank(&students, student).await?,
            };
            let took = t.elapsed();
            let sent = commands.take();
            let main = sent
                .iter()
                .find(|(n, _)| n == "aggregate")
                .map(|(_, c)| c.clone())
                .ok_or("no aggregate sent")?;
            // `$setWindowFields` examines the whole exam at every score:
            // explained once (it runs the sort again).
            let explained = if v == 3 {
                match &window_explained {
                    Some(e) => e.clone(),
                    None => {
                        let e = explain(db, bare(&main)).await?;
                        window_explained = Some(e.clone());
                        e
                    }
                }
            } else {
                explain(db, bare(&main)).await?
            };
            commands.take();
            vs.push(ReadVariant {
                name: [
                    "histogram, array: `Ranks::rank`",
                    "histogram, documents: `Ranks::rank`",
                    "`countDocuments({examId, score: {$gt: s}})` + 1",
                    "`$setWindowFields` `$rank`, `$match` the student",
                ][v],
                round_trips: sent.len(),
                commands: names(&sent),
                explained,
                // The window's first call is one of its timed runs.
                times: if v == 3 { vec![took] } else { Vec::new() },
                rank,
            });
        }
        for w in &vs[1..] {
            if w.rank != vs[0].rank {
                return Err(format!(
                    "rank of {score}: {} says {}, {} says {}",
                    vs[0].name, vs[0].rank, w.name, w.rank
                )
                .into());
            }
        }
        // Wall time, interleaved.
        for _ in 0..args.reps {
            for (v, variant) in vs.iter_mut().enumerate().take(3) {
                let t = Instant::now();
                match v {
                    0 => {
                        black_box(array.rank(EXAM, score).await?);
                    }
                    1 => {
                        black_box(docs.rank(EXAM, score).await?);
                    }
                    _ => {
                        black_box(count_rank(&students, score).await?);
                    }
                }
                variant.times.push(t.elapsed());
            }
        }
        if args.window {
            for _ in 1..args.window_reps {
                let t = Instant::now();
                black_box(window_rank(&students, student).await?);
                vs[3].times.push(t.elapsed());
            }
        }
        commands.take();
        eprintln!(
            "  {}",
            vs.iter()
                .map(|v| format!("{:.1} ms", ms(median(&mut v.times.clone()))))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push((label, score, vs));
    }

    let mut out = String::new();
    out += "### Rank of a score: histogram vs counting vs `$setWindowFields`\n\n";
    out += &format!(
        "The rank is 1 + the students with a better score (ties share it). Round trips: commands seen by command monitoring around one call. Keys/docs examined: `explain` (`executionStats`) of the exact aggregate each sent (`countDocuments` is the driver's `$match` + `$group` aggregate; the students' index is `{{examId: 1, score: -1}}`). `$setWindowFields` sorts the whole exam at every score, so it is explained once (at the top score) and timed {} time(s) per score (its first, monitored call included); the others are timed {} times each, interleaved, median reported. `Ranks::rank` also returns the dense rank, the ties and the total in the same reply; counting gives the rank only.\n\n",
        args.window_reps, args.reps
    );
    out += "| score | design | rank | round trips | commands | keys examined | docs examined | ms (median) | time ÷ histogram array |\n| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n";
    for (label, score, vs) in &mut rows {
        let base = median(&mut vs[0].times.clone());
        for v in vs.iter_mut() {
            let m = median(&mut v.times);
            out += &format!(
                "| {score} ({label}) | {} | {} | {} | {} | {} | {} | {:.2} | {:.1}× |\n",
                v.name,
                thousands(v.rank),
                v.round_trips,
                v.commands,
                opt(v.explained.keys),
                opt(v.explained.docs),
                ms(m),
                m.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
    if !args.window {
        out += "\n`$setWindowFields` skipped (`--no-window`).\n";
    }
    out += "\n";
    Ok(out)
}
