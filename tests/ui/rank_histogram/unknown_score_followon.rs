use mongo_patterns::prelude::*;

// A misspelt score: only that is reported, not a board left ambiguous by the
// integer field the score was meant to be.
#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(score = "pionts")]
struct ExamResult {
    exam: String,
    points: i32,
}

fn main() {}
