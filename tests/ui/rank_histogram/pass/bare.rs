use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::Layout;

// Exam results, bare: the board is the one String (or integer, ObjectId,
// Uuid) field besides `_id` and the score, the score the one number; skipped
// fields are not candidates. `RANK` holds the stored (BSON) names.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[rank_histogram]
struct ExamResult {
    #[serde(rename = "_id")]
    id: ObjectId,
    exam_id: String,
    score: f64,
    #[serde(skip)]
    cached_rank: u64,
}

// The associated types are the fields' types.
fn board_of(r: &ExamResult) -> &String {
    <ExamResult as RankHistogram>::board(r)
}
fn score_of(r: &ExamResult) -> f64 {
    <ExamResult as RankHistogram>::score(r)
}

#[allow(dead_code)]
async fn f(db: Database, r: ExamResult) {
    let ranks = ExamResult::ranks(&db);
    let _ = ranks.insert(&r).await;
    let _ = ranks.rank("algebra-1", 87.5).await;
    let _ = ranks.change("algebra-1", 87.5, 91.0).await;
    let _: mongo_patterns::Result<Vec<ScoreCount<f64>>> = ranks.top("algebra-1", 10).await;
    let _ = ranks.update_score(doc! {"_id": r.id}, 60.0).await;
}

// A web handler's future must be `Send`.
#[allow(dead_code)]
fn send<F: std::future::Future + Send>(_: F) {}

#[allow(dead_code)]
fn handler_futures_are_send(db: Database, r: ExamResult) {
    send(f(db, r));
}

fn main() {
    assert_eq!(ExamResult::COLLECTION, "exam_result");
    let spec = <ExamResult as mongo_patterns::rank_histogram::RankHistogram>::RANK;
    assert_eq!(spec.board, "examId");
    assert_eq!(spec.score, "score");
    assert!(spec.descending);
    assert_eq!(spec.precision, None);
    assert_eq!(spec.layout, Layout::Array);
    assert_eq!(spec.histogram, "exam_result_ranks");

    let r = ExamResult {
        id: ObjectId::new(),
        exam_id: "algebra-1".to_owned(),
        score: 87.5,
        cached_rank: 3,
    };
    assert_eq!(board_of(&r), "algebra-1");
    assert_eq!(score_of(&r), 87.5);
    let _ = r.cached_rank;
}
