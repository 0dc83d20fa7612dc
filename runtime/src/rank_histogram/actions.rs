//! The actions [`Ranks`] returns: configured by chained setters, run by
//! `.await`.

use std::future::IntoFuture;

use futures::future::BoxFuture;
use mongodb::bson::{Bson, Document};
use mongodb::ClientSession;

use super::score::AnyScore;
use super::write::WriteArgs;
use super::{Rank, RankHistogram, Ranks, ScoreCount, SourceOp};
use crate::action::Given;
use crate::error::Result;

macro_rules! actions {
    ($(
        $(#[$doc:meta])*
        $name:ident [$kind:ident] $op:literal -> $out:ty { $($field:ident: $ty:ty),* }
        |$repo:ident, $o:ident, $s:ident| $body:expr;
    )*) => {$(
        $(#[$doc])*
        #[must_use = "does nothing unless awaited"]
        pub struct $name<'a, T: Send + Sync> {
            repo: &'a Ranks<T>,
            $($field: $ty,)*
            options: Given,
            session: Option<&'a mut ClientSession>,
        }

        impl<'a, T: RankHistogram> $name<'a, T> {
            pub(super) fn new(repo: &'a Ranks<T>, $($field: $ty),*) -> Self {
                $name { repo, $($field,)* options: Given::default(), session: None }
            }

            crate::action::setters!('a; $kind);
        }

        impl<'a, T: RankHistogram> IntoFuture for $name<'a, T> {
            type Output = Result<$out>;
            type IntoFuture = BoxFuture<'a, Result<$out>>;

            fn into_future(self) -> Self::IntoFuture {
                let $name { repo: $repo, $($field,)* options, session: $s } = self;
                let span = crate::action::span("rank_histogram", $op, $repo.hist.name());
                crate::action::boxed_in(async move {
                    let $o = options.over(&$repo.defaults);
                    $body
                }, span)
            }
        }
    )*};
}

actions! {
    /// [`Ranks::record`]: a write.
    Record[write] "record" -> () { args: Result<Box<WriteArgs>> }
    |repo, o, s| repo.run_write(&*args?, o, s).await;

    /// [`Ranks::change`]: a write.
    Change[write] "change" -> () { args: Result<Box<WriteArgs>> }
    |repo, o, s| repo.run_write(&*args?, o, s).await;

    /// [`Ranks::unrecord`]: a write.
    Unrecord[write] "unrecord" -> () { args: Result<Box<WriteArgs>> }
    |repo, o, s| repo.run_write(&*args?, o, s).await;

    /// [`Ranks::rank`]: a read.
    RankOf[read] "rank" -> Rank { args: Result<Box<(Bson, Bson)>> }
    |repo, o, s| {
        let args = args?;
        repo.run_rank(&args.0, &args.1, o, s).await
    };

    /// [`Ranks::top`]: a read.
    Top[read] "top" -> Vec<ScoreCount<T::Score>> { args: Result<(Bson, u32)> }
    |repo, o, s| repo.run_top(args, o, s).await;

    /// [`Ranks::histogram`]: a read.
    Histogram[read] "histogram" -> Vec<ScoreCount<T::Score>> { board: Result<Bson> }
    |repo, o, s| repo.run_histogram(board, o, s).await;

    /// [`Ranks::insert`]: writes in a transaction.
    Insert[write] "insert" -> () { doc: &'a T }
    |repo, o, s| repo.run_atomically(SourceOp::Insert(doc), o, s).await.map(drop);

    /// [`Ranks::update_score`]: writes in a transaction.
    UpdateScore[write] "update_score" -> bool { args: (Document, Box<dyn AnyScore>) }
    |repo, o, s| repo.run_atomically(SourceOp::Update(args.0, args.1), o, s).await;

    /// [`Ranks::delete`]: writes in a transaction.
    Delete[write] "delete" -> bool { filter: Document }
    |repo, o, s| repo.run_atomically(SourceOp::Delete(filter), o, s).await;

    /// [`Ranks::rebuild`]: reads the players, writes the histogram.
    Rebuild[both] "rebuild" -> u64 { board: Result<Bson> }
    |repo, o, s| repo.run_rebuild(board, o, s).await;
}
