use mongo_patterns::prelude::*;

// An `Option` of a sort key is a sort key: null and missing sort together.
#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = ["closed_at", "priority"], order = "desc")]
struct Ticket {
    title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    closed_at: Option<DateTime>,
    priority: Option<Box<i32>>,
}

fn main() {
    assert_eq!(Ticket::KEYSET.sort, ["closed_at", "priority"]);
    assert!(Ticket::KEYSET.descending);
}
