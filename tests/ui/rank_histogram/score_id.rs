use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", score = "_id")]
struct ExamResult {
    #[serde(rename = "_id")]
    id: i64,
    exam: String,
    points: f64,
}

fn main() {}
