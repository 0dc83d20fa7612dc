//! The actions [`Ranks`] returns: configured by chained setters, run by
//! `.await`.

use mongodb::bson::{Bson, Document};

use super::score::AnyScore;
use super::write::WriteArgs;
use super::{Rank, RankHistogram, Ranks, ScoreCount, SourceOp};
use crate::action::action;
use crate::error::Result;
use crate::progress::{OnProgress, Progress};

impl<T: Send + Sync> crate::action::Repository for Ranks<T> {
    const PATTERN: &'static str = "rank_histogram";

    fn defaults(&self) -> &crate::action::Options {
        &self.defaults
    }

    fn collection_name(&self) -> &str {
        self.hist.name()
    }
}

action! {
    /// [`Ranks::record`]: a write.
    Record<'a, T: RankHistogram> on Ranks, "record", write;
    { args: Result<Box<WriteArgs>> } -> ();
    |this, cx| this.repo.run_write(&*this.args?, cx).await
}

action! {
    /// [`Ranks::change`]: a write.
    Change<'a, T: RankHistogram> on Ranks, "change", write;
    { args: Result<Box<WriteArgs>> } -> ();
    |this, cx| this.repo.run_write(&*this.args?, cx).await
}

action! {
    /// [`Ranks::unrecord`]: a write.
    Unrecord<'a, T: RankHistogram> on Ranks, "unrecord", write;
    { args: Result<Box<WriteArgs>> } -> ();
    |this, cx| this.repo.run_write(&*this.args?, cx).await
}

action! {
    /// [`Ranks::rank`]: a read.
    RankOf<'a, T: RankHistogram> on Ranks, "rank", read;
    { args: Result<Box<(Bson, Bson)>> } -> Rank;
    |this, cx| {
        let args = this.args?;
        this.repo.run_rank(&args.0, &args.1, cx).await
    }
}

action! {
    /// [`Ranks::top`]: a read.
    Top<'a, T: RankHistogram> on Ranks, "top", read;
    { args: Result<(Bson, u32)> } -> Vec<ScoreCount<T::Score>>;
    |this, cx| this.repo.run_top(this.args, cx).await
}

action! {
    /// [`Ranks::histogram`]: a read.
    Histogram<'a, T: RankHistogram> on Ranks, "histogram", read;
    { board: Result<Bson> } -> Vec<ScoreCount<T::Score>>;
    |this, cx| this.repo.run_histogram(this.board, cx).await
}

action! {
    /// [`Ranks::insert`]: writes in a transaction.
    Insert<'a, T: RankHistogram> on Ranks, "insert", write;
    { doc: &'a T } -> ();
    |this, cx| this.repo.run_atomically(SourceOp::Insert(this.doc), cx).await.map(drop)
}

action! {
    /// [`Ranks::update_score`]: writes in a transaction.
    UpdateScore<'a, T: RankHistogram> on Ranks, "update_score", write;
    { args: (Document, Box<dyn AnyScore>) } -> bool;
    |this, cx| this.repo.run_atomically(SourceOp::Update(this.args.0, this.args.1), cx).await
}

action! {
    /// [`Ranks::delete`]: writes in a transaction.
    Delete<'a, T: RankHistogram> on Ranks, "delete", write;
    { filter: Document } -> bool;
    |this, cx| this.repo.run_atomically(SourceOp::Delete(this.filter), cx).await
}

action! {
    /// [`Ranks::rebuild`]: reads the players, writes the histogram.
    Rebuild<'a, T: RankHistogram> on Ranks, "rebuild", both;
    { board: Result<Bson> } -> u64;
    |this, cx| this.repo.run_rebuild(this.board, cx).await
}

action! {
    /// [`Ranks::rebuild_all`]: every board, one at a time.
    RebuildAll<'a, T: RankHistogram> on Ranks, "rebuild_all", both;
    { progress: Option<OnProgress> } -> u64;
    |this, cx| this.repo.run_rebuild_all(this.progress, cx).await
}

impl<'a, T: RankHistogram + Send + Sync + 'a> RebuildAll<'a, T> {
    /// Called after each board with the boards done, of how many, and the
    /// time so far: for a log line or a progress bar.
    pub fn on_progress(mut self, f: impl FnMut(Progress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }
}
