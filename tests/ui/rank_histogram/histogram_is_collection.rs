use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "results")]
#[rank_histogram(histogram = "results")]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
