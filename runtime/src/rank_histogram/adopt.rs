//! `rebuild_all`: the histogram of every board of a players collection
//! that exists already, one board at a time.

use std::time::Instant;

use mongodb::bson::{doc, Bson, Document};

use super::{RankHistogram, Ranks};
use crate::action::{Call, Options};
use crate::error::Result;
use crate::progress::{OnProgress, Progress};

/// Boards one read of `rebuild_all` takes: memory holds no more.
const BOARDS_A_ROUND: i64 = 1_000;

impl<T: RankHistogram> Ranks<T> {
    /// [`Ranks::rebuild_all`], in `cx`: counts the boards (one
    /// aggregation), then takes them in rounds of [`BOARDS_A_ROUND`], in
    /// BSON order (one aggregation each, resuming after the last board by
    /// an expression, which compares across types as the sort does), and
    /// rebuilds each as [`Ranks::rebuild`] does, reporting after each.
    pub(super) async fn run_rebuild_all(
        &self,
        mut progress: Option<OnProgress>,
        cx: Call<'_>,
    ) -> Result<u64> {
        let (o, mut session) = (cx.opts, cx.session);
        let started = Instant::now();
        // Which boards there are decides the writes: the primary's.
        let reads = Options {
            write_concern: None,
            selection_criteria: Some(crate::util::primary()),
            ..(*o).clone()
        };
        let players = self.source.clone_with_type::<Document>();
        let has_board = doc! {"$match": {self.spec.board: {"$exists": true}}};
        let boards = doc! {"$group": {"_id": format!("${}", self.spec.board)}};
        let count = vec![has_board.clone(), boards.clone(), doc! {"$count": "n"}];
        let aggregate = players.aggregate(count).with_options(reads.driver());
        let counted: Vec<Document> = all_of!(aggregate, session.as_deref_mut());
        let of = counted
            .first()
            .and_then(|d| d.get("n"))
            .and_then(crate::util::int)
            .map_or(0, |n| n.max(0) as u64);
        let (mut done, mut players_counted) = (0, 0);
        let mut last: Option<Bson> = None;
        loop {
            let mut pipeline = vec![has_board.clone(), boards.clone()];
            if let Some(l) = &last {
                pipeline.push(doc! {"$match": {"$expr": {"$gt": ["$_id", {"$literal": l}]}}});
            }
            pipeline.push(doc! {"$sort": {"_id": 1}});
            pipeline.push(doc! {"$limit": BOARDS_A_ROUND});
            let aggregate = players.aggregate(pipeline).with_options(reads.driver());
            let round: Vec<Document> = all_of!(aggregate, session.as_deref_mut());
            if round.is_empty() {
                return Ok(players_counted);
            }
            for g in round {
                let board = g.get("_id").cloned().unwrap_or(Bson::Null);
                let rebuilt = self.rebuild_board(&board, &o, session.as_deref_mut());
                players_counted += Box::pin(rebuilt).await?;
                done += 1;
                if let Some(f) = progress.as_mut() {
                    f(Progress::new(done, of.max(done), started.elapsed()));
                }
                last = Some(board);
            }
        }
    }
}
