use mongo_patterns::prelude::*;

// Every mistake is reported in one build, each at its own token.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[rank_histogram(
    board = "examID",
    score = "scor",
    order = "up",
    presicion = 0.5,
    layout = "document",
    histogram = ""
)]
struct ExamResult {
    exam_id: String,
    score: f64,
}

fn main() {}
