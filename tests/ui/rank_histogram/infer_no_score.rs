use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram]
struct ExamResult {
    exam: String,
    passed: bool,
}

fn main() {}
