use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", score = "points", board = "student")]
struct ExamResult {
    student: String,
    exam: String,
    points: f64,
}

fn main() {}
