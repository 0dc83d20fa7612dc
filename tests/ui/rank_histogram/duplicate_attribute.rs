use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam")]
#[rank_histogram(score = "points")]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
