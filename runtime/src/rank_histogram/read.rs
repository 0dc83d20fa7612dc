//! The reads every layout shares: `rank`, `top` and `histogram` around
//! each layout's own query.

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document};
use mongodb::{ClientSession, Collection};

use super::{Rank, RankHistogram, Ranks, ScoreCount};
use crate::action::{Call, Effective};
use crate::error::{Error, Result};

impl<T: RankHistogram> Ranks<T> {
    pub(super) async fn run_rank(&self, b: &Bson, s: &Bson, cx: Call<'_>) -> Result<Rank> {
        let pipeline = self.rank_pipeline(b, s);
        let Some(d) = first_of(&self.hist, pipeline, cx.opts, cx.session).await? else {
            return Err(self.unknown_board(b));
        };
        if let Some(e) = self.store().rank_damage(self, b, &d).await {
            return Err(e);
        }
        let get = |f: &str| self.reply_count(&d, f, b);
        let (above, distinct_above, ties, total) = (
            get("above")?,
            get("distinctAbove")?,
            get("ties")?,
            get("total")?,
        );
        Ok(Rank {
            rank: above + 1,
            dense: distinct_above + 1,
            above,
            ties,
            total,
        })
    }

    pub(super) async fn run_top(
        &self,
        args: Result<(Bson, u32)>,
        cx: Call<'_>,
    ) -> Result<Vec<ScoreCount<T::Score>>> {
        let (b, places) = args?;
        if places == 0 {
            return Ok(Vec::new());
        }
        let mut all = self.read(&b, Some(places), cx).await?;
        all.retain(|s| s.rank <= u64::from(places));
        Ok(all)
    }

    pub(super) async fn run_histogram(
        &self,
        board: Result<Bson>,
        cx: Call<'_>,
    ) -> Result<Vec<ScoreCount<T::Score>>> {
        self.read(&board?, None, cx).await
    }

    /// A board's scores best first, with ranks; at most `limit` scores.
    async fn read(
        &self,
        board: &Bson,
        limit: Option<u32>,
        cx: Call<'_>,
    ) -> Result<Vec<ScoreCount<T::Score>>> {
        let rows = self
            .store()
            .rows(self, board, limit, cx.opts, cx.session)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        let mut above = 0;
        for (id, row) in rows {
            let n = self.reply_count(&row, "count", &id)?;
            let s = row.get("score").cloned().unwrap_or(Bson::Null);
            let score = crate::compat::from_bson::<T::Score>(s.clone()).map_err(|e| {
                Error::UnexpectedDocument {
                    collection: self.hist.name().to_owned(),
                    id: Box::new(id.clone()),
                    source: e,
                }
            })?;
            out.push(ScoreCount {
                score,
                count: n,
                rank: above + 1,
            });
            above += n;
        }
        Ok(out)
    }

    /// A count in a reply about document `id`.
    fn reply_count(&self, d: &Document, field: &str, id: &Bson) -> Result<u64> {
        d.get(field)
            .and_then(crate::util::int)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| {
                let found = d.get(field).map_or("nothing".to_owned(), Bson::to_string);
                Error::damaged(
                    self.hist.name(),
                    id.clone(),
                    "count",
                    format!("sums to {found}, not a count"),
                )
            })
    }
}

/// The first document `pipeline` gives on `coll`, read with `o` (a
/// [`Call`]'s: inside a transaction without a read concern), in `session`
/// when there is one.
pub(super) async fn first_of(
    coll: &Collection<Document>,
    pipeline: Vec<Document>,
    o: Effective<'_>,
    session: Option<&mut ClientSession>,
) -> Result<Option<Document>> {
    let aggregate = coll.aggregate(pipeline).with_options(o.driver());
    // The cursor is boxed: held across an `.await`, it would make every
    // read's future too large for a small allocation.
    Ok(match session {
        None => Box::new(aggregate.await?).try_next().await?,
        Some(s) => {
            let mut cursor = Box::new(aggregate.session(&mut *s).await?);
            cursor.next(s).await.transpose()?
        }
    })
}
