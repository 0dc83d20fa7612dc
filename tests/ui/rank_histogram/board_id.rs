use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "id")]
struct ExamResult {
    #[serde(rename = "_id")]
    id: ObjectId,
    exam: String,
    points: f64,
}

fn main() {}
