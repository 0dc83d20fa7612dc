use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam")]
struct ExamResult {
    #[serde(skip)]
    exam: String,
    student: ObjectId,
    points: f64,
}

fn main() {}
