use mongo_patterns::prelude::*;

// Two fields could be the board: the derive lists them instead of guessing.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[rank_histogram]
struct ExamResult {
    student_id: String,
    exam_id: String,
    score: f64,
}

fn main() {}
