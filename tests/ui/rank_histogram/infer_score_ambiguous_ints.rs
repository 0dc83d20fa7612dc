use mongo_patterns::prelude::*;

// The score is ambiguous between two integers; the board, a String, is not:
// only the score is reported, not a board that depends on it.
#[derive(Serialize, Deserialize, Model)]
#[rank_histogram]
struct ExamResult {
    exam: String,
    points: i32,
    attempts: i32,
}

fn main() {}
