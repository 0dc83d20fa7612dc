#![deny(unused_must_use)]
use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "at")]
struct Visit {
    at: DateTime,
}

// `ensure` returns an action: without `.await` it sends nothing.
async fn deploy(db: &Database) {
    Visit::ensure(db).comment("deploy");
}

fn main() {}
