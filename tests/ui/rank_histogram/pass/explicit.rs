use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::Layout;

// Every option. `board` and `score` take a field by its Rust name or by the
// name serde stores it under; `RANK` holds the stored (BSON) names.
#[derive(Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "race_results")]
#[rank_histogram(
    board = "season_id",
    score = "finishTime",
    order = "asc",
    precision = 0.01,
    layout = "documents",
    histogram = "race_ranks"
)]
struct RaceResult {
    runner: String,
    season_id: i32,
    finish_time: f64,
    laps: u32,
}

// A board of ObjectIds and an integer score, ranked best first by default.
#[derive(Serialize, Deserialize, Model)]
#[rank_histogram(board = "league", score = "points", order = "desc", layout = "array")]
struct Standing {
    team: String,
    league: ObjectId,
    points: u16,
}

// The associated types are the fields' types.
fn season_of(r: &RaceResult) -> &i32 {
    <RaceResult as RankHistogram>::board(r)
}
fn time_of(r: &RaceResult) -> f64 {
    <RaceResult as RankHistogram>::score(r)
}
fn points_of(s: &Standing) -> u16 {
    <Standing as RankHistogram>::score(s)
}

#[allow(dead_code)]
async fn f(db: Database, league: ObjectId) {
    let _ = RaceResult::ranks(&db).rank(&2024, 301.25).await;
    let _ = RaceResult::ranks(&db).rebuild(&2024).await;
    let _: mongo_patterns::Result<Vec<ScoreCount<u16>>> =
        Standing::ranks(&db).histogram(&league).await;
    let _ = Standing::ranks(&db).record(&league, 3).await;
}

fn main() {
    let spec = <RaceResult as mongo_patterns::rank_histogram::RankHistogram>::RANK;
    assert_eq!(spec.board, "seasonId");
    assert_eq!(spec.score, "finishTime");
    assert!(!spec.descending);
    assert_eq!(spec.precision, Some(0.01));
    assert_eq!(spec.layout, Layout::Documents);
    assert_eq!(spec.histogram, "race_ranks");
    assert_eq!(RaceResult::COLLECTION, "race_results");

    let spec = <Standing as mongo_patterns::rank_histogram::RankHistogram>::RANK;
    assert_eq!((spec.board, spec.score), ("league", "points"));
    assert!(spec.descending);
    assert_eq!(spec.precision, None);
    assert_eq!(spec.layout, Layout::Array);
    assert_eq!(spec.histogram, "standing_ranks");

    let r = RaceResult {
        runner: "Ada".to_owned(),
        season_id: 2024,
        finish_time: 301.25,
        laps: 12,
    };
    assert_eq!((season_of(&r), time_of(&r)), (&2024, 301.25));
    let _ = (&r.runner, r.laps);
    let s = Standing {
        team: "Owls".to_owned(),
        league: ObjectId::new(),
        points: 7,
    };
    assert_eq!(points_of(&s), 7);
    let _ = &s.team;
}
