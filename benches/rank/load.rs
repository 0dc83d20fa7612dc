//! Loading: the same students into both histogram layouts and the
//! stored-rank design, then `rebuild`.

use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::mongodb::{Collection, IndexModel};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{thousands, BoxResult};
use mongo_patterns_testkit::{bsonc, Commands};

use crate::{half_points, score_of, Args, Exam, RankedStudent, Student, StudentDocs, EXAM, NAIVE};

async fn load_students<T: Exam>(args: &Args, db: &Database) -> BoxResult<Duration> {
    let ranks = T::ranks(db);
    ranks.ensure().await?;
    let coll = T::collection(db);
    let t = Instant::now();
    let mut i = 0;
    let mut next_report = 200_000;
    while i < args.students {
        let end = (i + args.batch as u64).min(args.students);
        let chunk: Vec<T> = (i..end).map(|j| T::new(j as i64, score_of(j))).collect();
        coll.insert_many(&chunk).await?;
        i = end;
        if i >= next_report {
            eprintln!(
                "  {}: {} loaded, {:.1} s",
                T::COLLECTION,
                thousands(i),
                t.elapsed().as_secs_f64()
            );
            next_report += 200_000;
        }
    }
    Ok(t.elapsed())
}

/// The load table, and how long each layout's `rebuild` took.
pub(crate) async fn load(
    args: &Args,
    db: &Database,
    commands: &Commands,
) -> BoxResult<(String, [Duration; 2])> {
    let n = args.students;
    let mut counts = [0u64; 201];
    for i in 0..n {
        counts[half_points(i) as usize] += 1;
    }
    let distinct = counts.iter().filter(|&&c| c > 0).count();
    // above[h]: students strictly above h half points.
    let mut above = [0u64; 201];
    let mut acc = 0;
    for h in (0..201).rev() {
        above[h] = acc;
        acc += counts[h];
    }

    eprintln!("loading {} students into each design", thousands(n));
    commands.take();
    let array_load = load_students::<Student>(args, db).await?;
    let array_load_rt = commands.take_count();
    let t = Instant::now();
    let counted = Student::ranks(db).rebuild(EXAM).await?;
    let array_rebuild = t.elapsed();
    let array_rebuild_rt = commands.take();
    assert_eq!(counted, n, "rebuild counted every student");
    eprintln!(
        "  array: load {:.1} s, rebuild {:.1} s",
        array_load.as_secs_f64(),
        array_rebuild.as_secs_f64()
    );

    let docs_load = load_students::<StudentDocs>(args, db).await?;
    let docs_load_rt = commands.take_count();
    let t = Instant::now();
    let counted = StudentDocs::ranks(db).rebuild(EXAM).await?;
    let docs_rebuild = t.elapsed();
    let docs_rebuild_rt = commands.take();
    assert_eq!(counted, n, "rebuild counted every student");
    eprintln!(
        "  documents: load {:.1} s, rebuild {:.1} s",
        docs_load.as_secs_f64(),
        docs_rebuild.as_secs_f64()
    );

    let naive: Collection<RankedStudent> = db.collection(NAIVE);
    naive
        .create_index(
            IndexModel::builder()
                .keys(doc! {"examId": 1, "score": -1})
                .build(),
        )
        .await?;
    commands.take();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + args.batch as u64).min(n);
        let chunk: Vec<RankedStudent> = (i..end)
            .map(|j| RankedStudent {
                id: j as i64,
                exam_id: EXAM.to_owned(),
                score: score_of(j),
                rank: above[half_points(j) as usize] as i64 + 1,
            })
            .collect();
        naive.insert_many(&chunk).await?;
        i = end;
    }
    let naive_load = t.elapsed();
    let naive_load_rt = commands.take_count();
    eprintln!("  naive: load {:.1} s", naive_load.as_secs_f64());

    // The histograms agree with the counts loaded.
    let h = Student::ranks(db).histogram(EXAM).await?;
    let hd = StudentDocs::ranks(db).histogram(EXAM).await?;
    assert_eq!(h, hd, "both layouts hold the same histogram");
    assert_eq!(h.len(), distinct);
    for s in &h {
        assert_eq!(s.count, counts[(s.score * 2.0) as usize]);
        assert_eq!(s.rank, above[(s.score * 2.0) as usize] + 1);
    }
    let array_doc = Student::ranks(db)
        .histogram_collection()
        .find_one(doc! {"_id": EXAM})
        .await?
        .ok_or("no array histogram")?;
    let array_bytes = bsonc::to_vec(&array_doc)?.len();
    let docs: Vec<Document> = StudentDocs::ranks(db)
        .histogram_collection()
        .find(doc! {})
        .await?
        .try_collect()
        .await?;
    let docs_bytes: usize = docs
        .iter()
        .map(|d| bsonc::to_vec(d).map_or(0, |v| v.len()))
        .sum();
    commands.take();

    let names = |v: &[(String, Document)]| {
        v.iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let mut out = format!(
        "### Load\n\n{} students, {} distinct scores (half points, 0 to 100; one student alone at 100). Histogram size: array layout 1 document of {} bytes; documents layout {} documents, {} bytes in all.\n\n",
        thousands(n),
        distinct,
        thousands(array_bytes as u64),
        docs.len(),
        thousands(docs_bytes as u64)
    );
    out += "| step | round trips | seconds | students/s |\n| --- | ---: | ---: | ---: |\n";
    let batch = thousands(args.batch as u64);
    for (label, rt, d) in [
        (
            format!("`students` (array layout): `insert_many` in batches of {batch}, index `{{examId: 1, score: -1}}`"),
            array_load_rt.to_string(),
            array_load,
        ),
        (
            format!("… `Ranks::rebuild` (array): {}", names(&array_rebuild_rt)),
            array_rebuild_rt.len().to_string(),
            array_rebuild,
        ),
        (
            format!("`students_docs` (documents layout): `insert_many` in batches of {batch}, same index"),
            docs_load_rt.to_string(),
            docs_load,
        ),
        (
            format!("… `Ranks::rebuild` (documents): {}", names(&docs_rebuild_rt)),
            docs_rebuild_rt.len().to_string(),
            docs_rebuild,
        ),
        (
            format!("`students_naive` (stored rank, computed while loading): `insert_many` in batches of {batch}, same index"),
            naive_load_rt.to_string(),
            naive_load,
        ),
    ] {
        out += &format!(
            "| {label} | {rt} | {:.1} | {:.0} |\n",
            d.as_secs_f64(),
            n as f64 / d.as_secs_f64()
        );
    }
    out += "\n";
    Ok((out, [array_rebuild, docs_rebuild]))
}
