use mongo_patterns::ensure::{EnsureAction, Ensured, Plan};
use mongo_patterns::mongodb::options::{ReadPreference, SelectionCriteria, WriteConcern};
use mongo_patterns::prelude::*;

// Each pattern's declarations reach `Model::declared`, which `ensure` and
// `plan` use; a model with none declares its collection.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
#[keyset(sort = ["initTime", "uuid"], order = "desc")]
struct Visit {
    #[serde(rename = "_id")]
    id: String,
    uuid: String,
    init_time: DateTime,
    #[approx_counter(every = 10, mode = "buffered")]
    views: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[bucket(size = 50, key = "customerId")]
struct Trade {
    customer_id: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "game", score = "points", histogram = "ranks")]
struct Player {
    game: String,
    points: i64,
}

#[derive(Serialize, Deserialize, Model)]
#[shard_key(hashed = "_id")]
struct Session {
    #[serde(rename = "_id")]
    id: String,
}

#[derive(Serialize, Deserialize, Model)]
struct Note {
    text: String,
}

#[allow(dead_code)]
async fn deploy(db: Database, s: &mut mongo_patterns::mongodb::ClientSession) -> mongo_patterns::Result<()> {
    let _: Ensured = Visit::ensure(&db)
        .write_concern(WriteConcern::majority())
        .comment("deploy")
        .max_time(std::time::Duration::from_secs(5))
        .await?;
    let _: Plan = Trade::plan(&db)
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .session(s)
        .await?;
    let _: Ensured = EnsureAction::new(&db, Player::declared(&db))
        .and(Session::declared(&db))
        .and(Note::declared(&db))
        .await?;
    Ok(())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // No operation runs, so nothing connects (port 1 refuses).
        let client = Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100")
            .await
            .unwrap();
        let db = client.database("never_used");
        let names = |d: Vec<mongo_patterns::ensure::Declared>| -> Vec<(String, Vec<String>, bool)> {
            d.into_iter()
                .map(|d| {
                    let ix = d
                        .indexes
                        .iter()
                        .map(|i| i.options.as_ref().unwrap().name.clone().unwrap())
                        .collect();
                    (d.collection, ix, d.shard_key.is_some())
                })
                .collect()
        };
        let s = |v: &str| v.to_owned();
        assert_eq!(
            names(Visit::declared(&db)),
            [
                (s("visits"), vec![s("mp_keyset_initTime_uuid")], false),
                (s("visits"), vec![], true),
            ]
        );
        assert_eq!(
            names(Trade::declared(&db)),
            [
                (s("trade"), vec![], false),
                (s("trade"), vec![s("mp_bucket_customerId_start")], true),
            ]
        );
        assert_eq!(
            names(Player::declared(&db)),
            [
                (s("player"), vec![], false),
                (s("player"), vec![s("mp_rank_game_points")], false),
                (s("ranks"), vec![], true),
            ]
        );
        assert_eq!(
            names(Session::declared(&db)),
            [
                (s("session"), vec![], false),
                (s("session"), vec![s("mp_shard__id")], true),
            ]
        );
        assert_eq!(names(Note::declared(&db)), [(s("note"), vec![], false)]);
    });
}
