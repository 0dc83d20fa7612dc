use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram]
struct ExamResult {
    tags: Vec<String>,
    points: i32,
}

fn main() {}
