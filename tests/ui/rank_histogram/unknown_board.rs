use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[rank_histogram(board = "examID", score = "score")]
struct ExamResult {
    exam_id: String,
    score: f64,
}

fn main() {}
