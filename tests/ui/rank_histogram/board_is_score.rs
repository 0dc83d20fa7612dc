use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "points", score = "points")]
struct ExamResult {
    exam: String,
    points: i64,
}

fn main() {}
