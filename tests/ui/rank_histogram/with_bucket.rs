use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[bucket(size = 1000, key = "exam")]
#[rank_histogram(board = "exam", score = "points")]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
