//! Adopting a players collection that exists already: `rebuild_all` builds
//! the histogram of every board (more boards than one round of 1,000),
//! from documents another writer stored (the raw driver, as another
//! service would), skipping scores that are not numbers, and reports its
//! progress. Checked against the players with the raw driver, in both
//! layouts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use mongo_patterns::prelude::*;
use mongo_patterns::progress::Progress;
use mongo_patterns::rank_histogram::RankHistogram;
use mongo_patterns_testkit::{bounded, fresh_db};

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "players")]
#[rank_histogram(board = "examId", score = "score")]
struct Player {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "players")]
#[rank_histogram(
    board = "examId",
    score = "score",
    layout = "documents",
    histogram = "players_docs"
)]
struct PlayerDocs {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: i64,
}

/// `Player` after its `layout` changed to documents, on the same
/// histogram collection.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "players")]
#[rank_histogram(
    board = "examId",
    score = "score",
    layout = "documents",
    histogram = "players_ranks"
)]
struct PlayerMoved {
    #[serde(rename = "_id")]
    id: i64,
    exam_id: String,
    score: i64,
}

const BOARDS: i64 = 1_234;

/// Players stored by another writer: board `e{i}` holds `i % 3 + 1`
/// players; one player's score is a string (not counted).
async fn existing_players(db: &Database) -> BTreeMap<String, BTreeMap<i64, u64>> {
    let mut docs = Vec::new();
    let mut truth: BTreeMap<String, BTreeMap<i64, u64>> = BTreeMap::new();
    let mut id = 0;
    for b in 0..BOARDS {
        for p in 0..(b % 3 + 1) {
            let (board, score) = (format!("e{b}"), (b * 7 + p * 13) % 50);
            docs.push(doc! {"_id": id, "examId": &board, "score": score});
            *truth.entry(board).or_default().entry(score).or_default() += 1;
            id += 1;
        }
    }
    docs.push(doc! {"_id": id, "examId": "e1", "score": "ninety"});
    db.collection::<Document>("players")
        .insert_many(docs)
        .await
        .unwrap();
    truth
}

async fn check<T>(ranks: &Ranks<T>, truth: &BTreeMap<String, BTreeMap<i64, u64>>)
where
    T: RankHistogram<Board = String, Score = i64> + Send + Sync,
{
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let heard = seen.clone();
    let players = ranks
        .rebuild_all()
        .on_progress(move |p| heard.lock().unwrap().push(p))
        .await
        .unwrap();
    let want: u64 = truth.values().flat_map(|s| s.values()).sum();
    assert_eq!(players, want);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len() as i64, BOARDS);
    assert!(seen.iter().enumerate().all(|(i, p)| p.done == i as u64 + 1));
    assert!(seen.iter().all(|p| p.of == BOARDS as u64));
    // Every 97th board, and the first and the last, against the players.
    for (i, (board, scores)) in truth.iter().enumerate() {
        if i % 97 != 0 && i + 1 != truth.len() {
            continue;
        }
        let h = ranks.histogram(board).await.unwrap();
        let got: BTreeMap<i64, u64> = h.iter().map(|s| (s.score, s.count)).collect();
        assert_eq!(&got, scores, "board {board}");
    }
}

#[tokio::test]
async fn rebuild_all_adopts_every_board_in_both_layouts() {
    let (db, _) = fresh_db("rank_adopt").await;
    bounded(300, async {
        let truth = existing_players(&db).await;
        check(&Player::ranks(&db), &truth).await;
        check(&PlayerDocs::ranks(&db), &truth).await;
        // Again: the same histograms.
        check(&Player::ranks(&db), &truth).await;
    })
    .await;
}

/// `layout` changed from array to documents with histograms stored: the
/// new declaration's `rebuild_all` is the migration, after which every
/// call is exact again, writes included (what the array layout left is
/// never read by the documents layout).
#[tokio::test]
async fn layout_changed_then_rebuilt() {
    let (db, _) = fresh_db("rank_layout_change").await;
    bounded(300, async {
        let truth = existing_players(&db).await;
        let array = Player::ranks(&db);
        array.rebuild_all().await.unwrap();
        assert_eq!(
            Player::ranks(&db).histogram_collection().name(),
            PlayerMoved::ranks(&db).histogram_collection().name()
        );
        check(&PlayerMoved::ranks(&db), &truth).await;
        let moved = PlayerMoved::ranks(&db);
        // A write under the new layout, and the ranks it changes.
        let board = "e5";
        let before = moved.rank(board, 10).await.unwrap();
        moved
            .insert(&PlayerMoved {
                id: 1_000_000,
                exam_id: board.to_owned(),
                score: 49,
            })
            .await
            .unwrap();
        let after = moved.rank(board, 10).await.unwrap();
        assert_eq!(after.total, before.total + 1);
        assert_eq!(after.rank, before.rank + 1);
    })
    .await;
}
