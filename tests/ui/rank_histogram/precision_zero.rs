use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(precision = 0)]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
