use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", score = "points")]
struct ExamResult {
    exam: Vec<u8>,
    points: f64,
}

fn main() {}
