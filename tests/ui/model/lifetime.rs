use mongo_patterns::prelude::*;

#[derive(Serialize, Model)]
struct Visit<'a> {
    uuid: &'a str,
    init_time: DateTime,
}

fn main() {}
