//! Score changes on one board: the histogram against stored ranks.

use std::sync::Arc;

use mongo_patterns::mongodb::{Collection, IndexModel};
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::{RankHistogram, Ranks};
use mongo_patterns_testkit::bench::{splitmix64, BoxResult};
use tokio::sync::Mutex;

use crate::cell::{op, Op};
use crate::{Ctx, Row};

const EXAM: &str = "exam_001";
const NAIVE: &str = "students_naive";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "students")]
#[rank_histogram(board = "examId", score = "score", precision = 0.5)]
pub(crate) struct Student {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: f64,
}

/// The same students, on the documents layout (a document per score).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "students_docs")]
#[rank_histogram(
    board = "examId",
    score = "score",
    precision = 0.5,
    layout = "documents"
)]
pub(crate) struct StudentDoc {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: f64,
}

/// A score in half points, 0 to 100, from `x`.
fn score(x: u64) -> f64 {
    (splitmix64(x) % 201) as f64 / 2.0
}

/// Each student's current score, locked while it changes: two tasks never
/// move the same student at once, in either design.
type Scores = Arc<Vec<Mutex<f64>>>;

const UPDATE_ARRAY: &str =
    "`Ranks::update_score`, array layout (student + histogram, one transaction)";
const UPDATE_DOCS: &str =
    "`Ranks::update_score`, documents layout (student + histogram, one transaction)";

/// The three designs at each number of tasks, then `update_score` in each
/// layout from each of `instances` (clients standing in for processes, as
/// clients × tasks each). Operation `i` moves student `hash(i) mod
/// students` to a score drawn from `i`.
pub(crate) async fn run(
    ctx: &Ctx,
    tasks: &[usize],
    students: u64,
    instances: &[(usize, usize)],
) -> BoxResult<Vec<Row>> {
    let mut rows = Vec::new();
    let pick = move |i: u64| ((splitmix64(i ^ 0xbeef) % students) as usize, score(i ^ 7));
    for &n in tasks {
        let scores = load(ctx, students).await?;
        rows.push(
            ctx.cell(
                UPDATE_ARRAY,
                false,
                n,
                update_score(vec![Student::ranks(&ctx.db)], scores, pick),
            )
            .await?,
        );

        let scores = load_docs(ctx, students).await?;
        rows.push(
            ctx.cell(
                UPDATE_DOCS,
                false,
                n,
                update_score(vec![StudentDoc::ranks(&ctx.db)], scores, pick),
            )
            .await?,
        );

        let scores = load(ctx, students).await?;
        let ranks = Arc::new(Student::ranks(&ctx.db));
        rows.push(
            ctx.cell(
                "`Ranks::change` (histogram only)",
                false,
                n,
                op(move |_, i| {
                    let (ranks, scores) = (ranks.clone(), scores.clone());
                    async move {
                        let (s, new) = pick(i);
                        let mut cur = scores[s].lock().await;
                        let new = differ(new, *cur);
                        ranks.change(EXAM, *cur, new).await?;
                        *cur = new;
                        Ok(())
                    }
                }),
            )
            .await?,
        );

        let scores = load(ctx, students).await?;
        let naive: Arc<Collection<Document>> = Arc::new(ctx.db.collection(NAIVE));
        rows.push(
            ctx.cell(
                "naive: stored rank (count, `findAndModify`, `updateMany` of the passed)",
                true,
                n,
                op(move |_, i| {
                    let (naive, scores) = (naive.clone(), scores.clone());
                    async move {
                        let (s, new) = pick(i);
                        let mut cur = scores[s].lock().await;
                        let new = differ(new, *cur);
                        naive_change(&naive, s as i64, new).await?;
                        *cur = new;
                        Ok(())
                    }
                }),
            )
            .await?,
        );
    }
    for &(clients, n) in instances {
        let dbs = ctx.instances(clients, n.max(10) as u32).await?;
        let scores = load(ctx, students).await?;
        let repos = dbs.iter().map(|(db, _)| Student::ranks(db)).collect();
        let r = ctx
            .cell_of(
                UPDATE_ARRAY,
                false,
                clients,
                n,
                update_score(repos, scores, pick),
            )
            .await?;
        check(&Student::ranks(&ctx.db)).await?;
        rows.push(r);

        let scores = load_docs(ctx, students).await?;
        let repos = dbs.iter().map(|(db, _)| StudentDoc::ranks(db)).collect();
        let r = ctx
            .cell_of(
                UPDATE_DOCS,
                false,
                clients,
                n,
                update_score(repos, scores, pick),
            )
            .await?;
        check(&StudentDoc::ranks(&ctx.db)).await?;
        rows.push(r);
    }
    Ok(rows)
}

/// Fresh collections, the students also on the documents layout.
async fn load_docs(ctx: &Ctx, students: u64) -> BoxResult<Scores> {
    let scores = load(ctx, students).await?;
    let docs = StudentDoc::ranks(&ctx.db);
    docs.ensure().await?;
    let moved: Vec<StudentDoc> = (0..students)
        .map(|id| StudentDoc {
            id: id as i64,
            exam_id: EXAM.to_owned(),
            score: score(id),
        })
        .collect();
    StudentDoc::collection(&ctx.db).insert_many(&moved).await?;
    docs.rebuild(EXAM).await?;
    Ok(scores)
}

/// The board's histogram equals its students regrouped (what `rebuild`
/// would write).
async fn check<M>(ranks: &Ranks<M>) -> BoxResult<()>
where
    M: RankHistogram<Score = f64, Board = String> + Send + Sync + 'static,
{
    let before: Vec<(f64, u64)> = ranks
        .histogram(EXAM)
        .await?
        .into_iter()
        .map(|s| (s.score, s.count))
        .collect();
    ranks.rebuild(EXAM).await?;
    let after: Vec<(f64, u64)> = ranks
        .histogram(EXAM)
        .await?
        .into_iter()
        .map(|s| (s.score, s.count))
        .collect();
    if before != after {
        return Err(
            format!("the histogram drifted from the students: {before:?} != {after:?}").into(),
        );
    }
    Ok(())
}

/// Operation `i` of a layout's `update_score` cell: moves student
/// `pick(i)` to its new score, the student locked meanwhile, through
/// `ranks[task % ranks.len()]` (one repository per client).
fn update_score<M>(
    ranks: Vec<Ranks<M>>,
    scores: Scores,
    pick: impl Fn(u64) -> (usize, f64) + Copy + Send + Sync + 'static,
) -> Op
where
    M: RankHistogram<Score = f64> + Send + Sync + 'static,
{
    let ranks = Arc::new(ranks);
    op(move |t, i| {
        let (ranks, scores) = (ranks.clone(), scores.clone());
        async move {
            let (s, new) = pick(i);
            let mut cur = scores[s].lock().await;
            let new = differ(new, *cur);
            let ranks = &ranks[t % ranks.len()];
            if !ranks.update_score(doc! {"_id": s as i64}, new).await? {
                return Err(format!("no student {s}").into());
            }
            *cur = new;
            Ok(())
        }
    })
}

/// `new`, or the next score when it equals `old`: every change moves.
fn differ(new: f64, old: f64) -> f64 {
    match new {
        n if n != old => n,
        n if n >= 100.0 => 0.0,
        n => n + 0.5,
    }
}

/// Fresh collections: the students (histogram rebuilt from them) and the
/// stored-rank design, ranks computed here.
async fn load(ctx: &Ctx, students: u64) -> BoxResult<Scores> {
    ctx.clear().await?;
    let ranks = Student::ranks(&ctx.db);
    ranks.ensure().await?;
    let all: Vec<Student> = (0..students)
        .map(|id| Student {
            id: id as i64,
            exam_id: EXAM.to_owned(),
            score: score(id),
        })
        .collect();
    Student::collection(&ctx.db).insert_many(&all).await?;
    ranks.rebuild(EXAM).await?;
    let naive = ctx.db.collection::<Document>(NAIVE);
    naive
        .create_index(
            IndexModel::builder()
                .keys(doc! {"examId": 1, "score": -1})
                .build(),
        )
        .await?;
    let ranked: Vec<Document> = all
        .iter()
        .map(|s| {
            let above = all.iter().filter(|o| o.score > s.score).count() as i64;
            doc! {"_id": s.id, "examId": EXAM, "score": s.score, "rank": above + 1}
        })
        .collect();
    naive.insert_many(&ranked).await?;
    Ok(Arc::new(all.iter().map(|s| Mutex::new(s.score)).collect()))
}

/// The stored-rank design's score change: the mover's new rank is counted,
/// its score and rank set (reading the old score back), then every student
/// the change passes gets ±1. Three round trips, no transaction.
async fn naive_change(coll: &Collection<Document>, id: i64, new: f64) -> BoxResult<()> {
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
    let (range, by) = if new < old {
        (doc! {"$gte": new, "$lt": old}, -1_i64)
    } else if new > old {
        (doc! {"$gte": old, "$lt": new}, 1_i64)
    } else {
        return Ok(());
    };
    coll.update_many(
        doc! {"examId": EXAM, "score": range, "_id": {"$ne": id}},
        doc! {"$inc": {"rank": by}},
    )
    .await?;
    Ok(())
}
