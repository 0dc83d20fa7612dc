use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", presicion = 0.5)]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
