use mongo_patterns::prelude::*;

#[derive(Serialize, Deserialize)]
struct Device {
    os: String,
    version: u32,
}

#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = "device")]
struct Visit {
    uuid: String,
    device: Device,
}

fn main() {}
