use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", score = "name")]
struct ExamResult {
    exam: String,
    name: String,
    points: f64,
}

fn main() {}
