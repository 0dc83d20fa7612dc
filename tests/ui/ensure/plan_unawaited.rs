#![deny(unused_must_use)]
use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
struct Note {
    text: String,
}

// `plan` returns an action: without `.await` it reads nothing.
async fn check(db: &Database) {
    Note::plan(db);
}

fn main() {}
