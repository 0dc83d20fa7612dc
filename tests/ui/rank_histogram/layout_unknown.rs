use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(layout = "document")]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
