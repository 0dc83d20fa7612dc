use mongo_patterns::ensure::Validation;
use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[model(validate = "strict")]
#[bucket(size = 100, key = "customer")]
struct Strict {
    customer: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[model(collection = "logged", validate = "warn")]
struct Logged {
    at: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "exam", score = "score")]
struct Default {
    exam: String,
    score: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[model(validate = "off")]
#[bucket(size = 100, key = "customer")]
struct Off {
    customer: i64,
}

fn main() {
    assert_eq!(Strict::VALIDATION, Validation::Strict);
    assert_eq!(Logged::VALIDATION, Validation::Warn);
    assert_eq!(Default::VALIDATION, Validation::Moderate);
    assert_eq!(Off::VALIDATION, Validation::Off);
}
