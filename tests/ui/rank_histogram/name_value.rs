use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram = "exam"]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
