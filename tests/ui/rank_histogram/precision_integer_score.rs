use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", score = "points", precision = 0.5)]
struct ExamResult {
    exam: String,
    points: i32,
}

fn main() {}
