//! Round trips per call, for every call of `Ranks` on both layouts.

use std::hint::black_box;
use std::time::{Duration, Instant};

use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{median, ms, thousands, BoxResult};
use mongo_patterns_testkit::Commands;

use crate::{names, Args, Exam, Student, StudentDocs, EXAM, SCRATCH_ID};

struct OpStats {
    name: &'static str,
    /// [array, documents]
    rts: [Vec<usize>; 2],
    cmds: [String; 2],
    times: [Vec<Duration>; 2],
}

async fn one_op<T: Exam>(ranks: &Ranks<T>, op: usize, k: i64) -> BoxResult<()> {
    let id = SCRATCH_ID + k;
    match op {
        0 => ranks.record(EXAM, 42.5).await?,
        1 => ranks.change(EXAM, 42.5, 43.0).await?,
        2 => ranks.unrecord(EXAM, 43.0).await?,
        3 => {
            black_box(ranks.rank(EXAM, 70.0).await?);
        }
        4 => {
            black_box(ranks.top(EXAM, 10).await?);
        }
        5 => {
            black_box(ranks.histogram(EXAM).await?);
        }
        6 => ranks.insert(&T::new(id, 55.0)).await?,
        7 => {
            if !ranks.update_score(doc! {"_id": id}, 56.0).await? {
                return Err("update_score matched nothing".into());
            }
        }
        _ => {
            if !ranks.delete(doc! {"_id": id}).await? {
                return Err("delete matched nothing".into());
            }
        }
    }
    Ok(())
}

/// Inserts and deletes a scratch student, so that the repository has asked
/// whether the deployment runs transactions; returns the insert's commands.
pub(crate) async fn warm<T: Exam>(
    ranks: &Ranks<T>,
    commands: &Commands,
) -> BoxResult<Vec<(String, Document)>> {
    commands.take();
    ranks.insert(&T::new(SCRATCH_ID - 1, 50.0)).await?;
    let sent = commands.take();
    if !ranks.delete(doc! {"_id": SCRATCH_ID - 1}).await? {
        return Err("the scratch student is gone".into());
    }
    commands.take();
    Ok(sent)
}

const OPS: [&str; 9] = [
    "`record(exam, 42.5)`",
    "`change(exam, 42.5, 43)`",
    "`remove(exam, 43)`",
    "`rank(exam, 70)`",
    "`top(exam, 10)`",
    "`histogram(exam)` (all scores)",
    "`insert(student)` (student + histogram)",
    "`update_score({_id}, 56)` (student + histogram)",
    "`delete({_id})` (student + histogram)",
];

pub(crate) async fn round_trips(
    args: &Args,
    db: &Database,
    commands: &Commands,
    rebuilt: [Duration; 2],
) -> BoxResult<String> {
    eprintln!("round trips per call ({} each)", args.ops);
    let array = Student::ranks(db);
    let docs = StudentDocs::ranks(db);
    let mut stats: Vec<OpStats> = OPS
        .iter()
        .map(|&name| OpStats {
            name,
            rts: [Vec::new(), Vec::new()],
            cmds: [String::new(), String::new()],
            times: [Vec::new(), Vec::new()],
        })
        .collect();
    // The first student write of a repository value sends `hello` (does
    // the deployment run transactions?): seen here, then warm.
    let first_insert = warm(&array, commands).await?;
    warm(&docs, commands).await?;
    let before = array.histogram(EXAM).await?;
    for k in 0..args.ops as i64 {
        for (op, st) in stats.iter_mut().enumerate() {
            for layout in 0..2 {
                commands.take();
                let t = Instant::now();
                if layout == 0 {
                    one_op(&array, op, k).await?;
                } else {
                    one_op(&docs, op, k).await?;
                }
                st.times[layout].push(t.elapsed());
                let sent = commands.take();
                st.rts[layout].push(sent.len());
                if k == 0 {
                    st.cmds[layout] = names(&sent);
                }
            }
        }
    }
    assert_eq!(before, array.histogram(EXAM).await?, "net zero (array)");
    assert_eq!(before, docs.histogram(EXAM).await?, "net zero (documents)");
    commands.take();

    let mut out = format!(
        "### Round trips per call, both layouts ({} calls each)\n\nOn exam_001 (its {} distinct scores, {} students), interleaved: `record` + `change` + `remove` (net zero), the reads, then `insert` + `update_score` + `delete` of a new student (net zero). Round trips: commands seen by command monitoring per call (mean and max over the calls); commands: those of the first call. The student writes run in a transaction (the surrogate reports a replica set). Time: median, surrogate, ratio to `rank` of the same layout.\n\n",
        args.ops,
        before.len(),
        thousands(args.students)
    );
    out += "| call | round trips array (mean / max) | commands array | round trips documents (mean / max) | commands documents | ms array / documents (median) | time ÷ `rank` array / documents |\n| --- | :---: | --- | :---: | --- | :---: | :---: |\n";
    let rank_m = [
        median(&mut stats[3].times[0].clone()),
        median(&mut stats[3].times[1].clone()),
    ];
    for st in &mut stats {
        let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len() as f64;
        let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        let (ma, md) = (median(&mut st.times[0]), median(&mut st.times[1]));
        out += &format!(
            "| {} | {:.2} / {} | {} | {:.2} / {} | {} | {:.2} / {:.2} | {:.1}× / {:.1}× |\n",
            st.name,
            mean(&st.rts[0]),
            max(&st.rts[0]),
            st.cmds[0],
            mean(&st.rts[1]),
            max(&st.rts[1]),
            st.cmds[1],
            ms(ma),
            ms(md),
            ma.as_secs_f64() / rank_m[0].as_secs_f64(),
            md.as_secs_f64() / rank_m[1].as_secs_f64(),
        );
    }
    out += "\n";
    let n = args.students as f64;
    let (ra, rd) = (
        median(&mut stats[0].times[0].clone()),
        median(&mut stats[0].times[1].clone()),
    );
    out += &format!(
        "The first student write of a new `Ranks` value sent {}: nothing is asked first (a deployment without transactions refuses the first write before writing, and the repository and its clones remember it). The calls above ran on warmed repositories.\n\n",
        names(&first_insert)
    );
    out += &format!(
        "Loading the histogram by `record`, one call per student, would take about {} × the median `record` above: {:.0} s (array) / {:.0} s (documents) for {} round trips, where `rebuild` took {:.1} s / {:.1} s.\n\n",
        thousands(args.students),
        n * ra.as_secs_f64(),
        n * rd.as_secs_f64(),
        thousands(args.students),
        rebuilt[0].as_secs_f64(),
        rebuilt[1].as_secs_f64()
    );
    Ok(out)
}
