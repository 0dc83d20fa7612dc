use mongo_patterns::prelude::*;

#[derive(Model)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
