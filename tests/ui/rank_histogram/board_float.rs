use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "weight", score = "points")]
struct ExamResult {
    weight: f64,
    points: f64,
}

fn main() {}
