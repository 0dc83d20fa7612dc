use mongo_patterns::keyset::MAX_PAGE_SIZE;
use mongo_patterns::prelude::*;

// The largest page the macro accepts is the runtime's `MAX_PAGE_SIZE`.
#[derive(Serialize, Deserialize, Model)]
#[keyset(sort = ["day", "score"], order = "desc", page_size = 10000)]
struct Score {
    day: i32,
    score: f64,
    player: String,
}

#[allow(dead_code)]
async fn pages(db: Database, token: Option<PageToken>) -> mongo_patterns::Result<()> {
    let mut q = Score::keyset(&db).filter(doc! {"player": "p-1"});
    if let Some(t) = &token {
        q = q.after(t);
    }
    let page: Page<Score> = q.page().await?;
    let _ = page.next;
    Ok(())
}

fn main() {
    assert_eq!(Score::COLLECTION, "score");
    assert_eq!(Score::KEYSET.sort, ["day", "score"]);
    assert!(Score::KEYSET.descending);
    assert_eq!(Score::KEYSET.page_size, MAX_PAGE_SIZE);
}
