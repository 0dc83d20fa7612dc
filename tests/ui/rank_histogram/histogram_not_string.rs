use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(histogram = exam_ranks)]
struct ExamResult {
    exam: String,
    points: f64,
}

fn main() {}
