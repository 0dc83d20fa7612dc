use mongo_patterns::prelude::*;

// A wrongly typed value does not stop the reading: the misspelt option
// after it is reported too.
#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(score = score, ordr = "asc")]
struct ExamResult {
    exam_id: String,
    score: f64,
}

fn main() {}
