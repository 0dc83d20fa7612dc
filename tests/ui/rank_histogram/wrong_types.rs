use mongo_patterns::prelude::*;

// Every wrongly typed value is reported at once, each at its own token,
// and no board or score is inferred on top.
#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = exam_id, score = 1, order = true, precision = "0.5", layout, histogram = ranks)]
struct ExamResult {
    exam_id: String,
    score: f64,
}

fn main() {}
