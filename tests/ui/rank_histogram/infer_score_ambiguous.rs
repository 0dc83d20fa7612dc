use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam")]
struct ExamResult {
    exam: String,
    points: f64,
    bonus: f64,
}

fn main() {}
