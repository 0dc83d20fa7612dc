//! Score changes: the histogram's writes against the stored-rank design,
//! which rewrites the rank of every student a change passes.

use std::time::{Duration, Instant};

use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{
    median, ms, thousands, thousands_i, BoxResult, ServerCounters,
};
use mongo_patterns_testkit::Commands;

use crate::round_trips::warm;
use crate::{lossy_u64, names, Args, Picks, Student, StudentDocs, EXAM, NAIVE};

/// The stored-rank design's score change, done correctly: the mover's new
/// rank is counted (1 + the others strictly above the new score), its score
/// and rank are set (reading the old score back), then every student the
/// change passes gets ±1. Three round trips, no transaction.
async fn naive_change(coll: &Collection<Document>, id: i64, new: f64) -> BoxResult<u64> {
    let above = coll
        .count_documents(doc! {"examId": EXAM, "score": {"$gt": new}, "_id": {"$ne": id}})
        .await?;
    let before = coll
        .find_one_and_update(
            doc! {"_id": id},
            doc! {"$set": {"score": new, "rank": above as i64 + 1}},
        )
        .projection(doc! {"score": 1})
        .await?
        .ok_or("no such student")?;
    let old = before.get_f64("score")?;
    // Down: those in [new, old) had the mover above them and no longer do.
    // Up: those in [old, new) now have the mover above them.
    let (range, by) = if new < old {
        (doc! {"$gte": new, "$lt": old}, -1_i64)
    } else if new > old {
        (doc! {"$gte": old, "$lt": new}, 1_i64)
    } else {
        return Ok(0);
    };
    let r = coll
        .update_many(
            doc! {"examId": EXAM, "score": range, "_id": {"$ne": id}},
            doc! {"$inc": {"rank": by}},
        )
        .await?;
    Ok(r.modified_count)
}

/// The stored ranks at some scores (and the mover's) equal the histogram's.
pub(crate) async fn check_naive(
    naive: &Collection<Document>,
    ranks: &Ranks<Student>,
    mover: i64,
) -> BoxResult<usize> {
    let mut checked = 0;
    for s in [0.0, 0.5, 35.0, 50.0, 69.5, 70.0, 70.5, 90.0, 99.5, 100.0] {
        let Some(d) = naive.find_one(doc! {"examId": EXAM, "score": s}).await? else {
            continue;
        };
        let stored = lossy_u64(d.get("rank")).ok_or("no stored rank")?;
        let want = ranks.rank(EXAM, s).await?.rank;
        if stored != want {
            return Err(format!(
                "stored rank {stored} at {s} (student {}), the histogram says {want}",
                d.get("_id").map_or("?".into(), |b| b.to_string())
            )
            .into());
        }
        checked += 1;
    }
    let d = naive
        .find_one(doc! {"_id": mover})
        .await?
        .ok_or("no mover")?;
    let s = d.get_f64("score")?;
    let stored = lossy_u64(d.get("rank")).ok_or("no stored rank")?;
    let want = ranks.rank(EXAM, s).await?.rank;
    if stored != want {
        return Err(
            format!("the mover's stored rank is {stored}, the histogram says {want}").into(),
        );
    }
    Ok(checked + 1)
}

struct ChangeRow {
    scenario: String,
    design: String,
    round_trips: usize,
    commands: String,
    /// Players' documents written, from the results.
    players: u64,
    /// Histogram documents written (from the server's counters).
    delta: ServerCounters,
    times: Vec<Duration>,
}

/// Runs `f` once with command monitoring and `serverStatus` around it.
async fn measured<F, Fut>(
    db: &Database,
    commands: &Commands,
    baseline: ServerCounters,
    f: F,
) -> BoxResult<(u64, Vec<(String, Document)>, ServerCounters, Duration)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = BoxResult<u64>>,
{
    let before = ServerCounters::read(db).await?;
    commands.take();
    let t = Instant::now();
    let players = f().await?;
    let took = t.elapsed();
    let sent = commands.take();
    let after = ServerCounters::read(db).await?;
    commands.take();
    Ok((players, sent, after.minus(before).minus(baseline), took))
}

fn add_row(
    rows: &mut Vec<ChangeRow>,
    scenario: &str,
    design: &str,
    (players, sent, delta, took): (u64, Vec<(String, Document)>, ServerCounters, Duration),
) {
    if let Some(r) = rows
        .iter_mut()
        .find(|r| r.scenario == scenario && r.design == design)
    {
        r.times.push(took);
        return;
    }
    rows.push(ChangeRow {
        scenario: scenario.to_owned(),
        design: design.to_owned(),
        round_trips: sent.len(),
        commands: names(&sent),
        players,
        delta,
        times: vec![took],
    });
}

pub(crate) async fn changes(
    args: &Args,
    db: &Database,
    commands: &Commands,
    picks: &Picks,
) -> BoxResult<String> {
    let array = Student::ranks(db);
    let docs = StudentDocs::ranks(db);
    let naive: Collection<Document> = db.collection(NAIVE);
    warm(&array, commands).await?;
    warm(&docs, commands).await?;
    // What two `serverStatus` calls in a row count, to subtract.
    let baseline = ServerCounters::baseline(db).await?;
    let mut rows: Vec<ChangeRow> = Vec::new();
    let mut checks = 0;
    checks += check_naive(&naive, &array, 0).await?;

    let scenarios = [
        (
            "the top student drops to 0",
            "… and is restored to 100",
            0_i64,
            100.0,
            0.0,
            args.change_reps,
        ),
        (
            "a typical change: 70 → 70.5",
            "… and back: 70.5 → 70",
            picks.middle,
            70.0,
            70.5,
            args.small_reps,
        ),
    ];
    for (there, back, id, old, new, reps) in scenarios {
        for rep in 0..reps {
            eprintln!("{there} (rep {})", rep + 1);
            for (scenario, from, to) in [(there, old, new), (back, new, old)] {
                // Histogram only, both layouts, there and back (the
                // students' documents are not touched).
                let m = measured(db, commands, baseline, || async {
                    array.change(EXAM, from, to).await?;
                    Ok(0)
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "histogram only, array: `Ranks::change`",
                    m,
                );
                let m = measured(db, commands, baseline, || async {
                    docs.change(EXAM, from, to).await?;
                    Ok(0)
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "histogram only, documents: `Ranks::change`",
                    m,
                );
            }
            // Then the student itself moves there and back, in each design.
            for (scenario, to) in [(there, new), (back, old)] {
                let m = measured(db, commands, baseline, || async {
                    let hit = array.update_score(doc! {"_id": id}, to).await?;
                    Ok(u64::from(hit))
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "student + histogram, array: `Ranks::update_score`",
                    m,
                );
                let m = measured(db, commands, baseline, || async {
                    let hit = docs.update_score(doc! {"_id": id}, to).await?;
                    Ok(u64::from(hit))
                })
                .await?;
                add_row(
                    &mut rows,
                    scenario,
                    "student + histogram, documents: `Ranks::update_score`",
                    m,
                );
                let m = measured(db, commands, baseline, || async {
                    let passed = naive_change(&naive, id, to).await?;
                    Ok(1 + passed)
                })
                .await?;
                eprintln!(
                    "  {scenario}: naive wrote {} students in {:.1} s",
                    thousands(m.0),
                    m.3.as_secs_f64()
                );
                add_row(
                    &mut rows,
                    scenario,
                    "stored rank (naive): count + `findAndModify` + `updateMany`",
                    m,
                );
                checks += check_naive(&naive, &array, id).await?;
            }
        }
    }
    // Both layouts still agree with the players' documents.
    let h = array.histogram(EXAM).await?;
    assert_eq!(h, docs.histogram(EXAM).await?);
    assert_eq!(array.rebuild(EXAM).await?, args.students);
    assert_eq!(h, array.histogram(EXAM).await?, "no drift (array)");
    docs.rebuild(EXAM).await?;
    assert_eq!(h, docs.histogram(EXAM).await?, "no drift (documents)");
    commands.take();

    let mut out = String::new();
    out += "### Score changes: histogram vs stored rank\n\n";
    out += &format!(
        "`Ranks::update_score({{_id}}, new)` sets the student's score and moves it on the histogram in one transaction (the surrogate reports a replica set). `Ranks::change(old, new)` is the histogram write alone. The stored-rank design (each student document holds its `rank`) must count the mover's new rank, set its score and rank, and `$inc` the rank of every student between the old and the new score (`updateMany({{examId, score: {{$gte: lo, $lt: hi}}, _id: {{$ne: id}}}})`); it runs without a transaction here. Students' documents written: the results (`update_score`'s match, `findAndModify` + the `updateMany`'s `modifiedCount`). Server Δ: `serverStatus` `metrics.document` (updated / inserted / deleted) and `opcounters.update`, before minus after, less what two `serverStatus` calls count. Stored ranks were checked against the histogram's after every change ({checks} checks, all equal); both histograms were checked against `rebuild` at the end. Time: median of {} (top student) / {} (70 → 70.5) repetitions.\n\n",
        args.change_reps, args.small_reps
    );
    out += "| change | design | round trips | commands | students' documents written | server Δ documents updated / inserted / deleted | server Δ `opcounters.update` | ms (median) | time ÷ `update_score` array |\n| --- | --- | ---: | --- | ---: | :---: | ---: | ---: | ---: |\n";
    let scenarios: Vec<String> = {
        let mut s: Vec<String> = Vec::new();
        for r in &rows {
            if !s.contains(&r.scenario) {
                s.push(r.scenario.clone());
            }
        }
        s
    };
    for sc in &scenarios {
        let base = rows
            .iter()
            .find(|r| {
                &r.scenario == sc && r.design.contains("update_score") && r.design.contains("array")
            })
            .map(|r| median(&mut r.times.clone()))
            .unwrap_or(Duration::from_nanos(1));
        for r in rows.iter_mut().filter(|r| &r.scenario == sc) {
            let m = median(&mut r.times);
            out += &format!(
                "| {} | {} | {} | {} | {} | {} / {} / {} | {} | {:.2} | {:.2}× |\n",
                r.scenario,
                r.design,
                r.round_trips,
                r.commands,
                thousands(r.players),
                thousands_i(r.delta.updated),
                thousands_i(r.delta.inserted),
                thousands_i(r.delta.deleted),
                r.delta.op_update,
                ms(m),
                m.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
    out += "\n";
    Ok(out)
}
