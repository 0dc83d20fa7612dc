//! The histogram's writes: the retries around each layout's write, and
//! `rebuild`.

use mongodb::bson;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{DeleteOneModel, UpdateModifications, UpdateOneModel, WriteModel};
use mongodb::{ClientSession, Namespace};

use super::rounding::rounded;
use super::{RankHistogram, Ranks};
use crate::action::{Call, Options};
use crate::error::{Error, Result};

/// Whether a histogram write runs in a transaction, and whose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Txn {
    /// None: races are retried here.
    No,
    /// After the player's write in the same transaction.
    AfterPlayer,
    /// The caller's, perhaps as its first command.
    Callers,
}

/// A write to a histogram: `-1` at `dec`, then `+1` at `inc`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Delta<'a> {
    pub(super) dec: Option<&'a Bson>,
    pub(super) inc: Option<&'a Bson>,
}

/// What `record`, `change` and `unrecord` write, boxed in their actions.
pub(super) struct WriteArgs {
    pub(super) board: Bson,
    pub(super) dec: Option<Bson>,
    pub(super) inc: Option<Bson>,
}

impl<T: RankHistogram> Ranks<T> {
    pub(super) async fn run_write(&self, args: &WriteArgs, cx: Call<'_>) -> Result<()> {
        let (b, delta) = (
            &args.board,
            Delta {
                dec: args.dec.as_ref(),
                inc: args.inc.as_ref(),
            },
        );
        let o = cx.opts;
        match cx.session {
            None => self.write(b, delta, &o, None, Txn::No).await,
            Some(s) if cx.txn => {
                // The caller's transaction: a call cut before its reply
                // has the session killed on the server (see `crate::cut`).
                // Boxed: a path only transactions take.
                let write = |s| self.write(b, delta, &o, Some(s), Txn::Callers);
                Box::pin(crate::cut::guarded(s, write)).await
            }
            Some(s) => self.write(b, delta, &o, Some(s), Txn::No).await,
        }
    }

    /// Applies `delta` to `board`'s histogram. Outside a transaction a lost
    /// upsert race is retried here, after a jittered backoff, for up to
    /// 120 s; inside one (`txn`) the whole transaction is, by whoever
    /// owns it: the error carries `TransientTransactionError`.
    pub(super) async fn write(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        o: &Options,
        mut session: Option<&mut ClientSession>,
        txn: Txn,
    ) -> Result<()> {
        if txn != Txn::No {
            return match self
                .store()
                .write(self, board, delta, o, session, txn)
                .await
            {
                Err(Error::Raced(e)) => Err(crate::action::raced_in_transaction(e)),
                other => other,
            };
        }
        let mut retry = crate::retry::Retry::new("rank write");
        loop {
            match self
                .store()
                .write(self, board, delta, o, session.as_deref_mut(), Txn::No)
                .await
            {
                Err(Error::Raced(_)) => retry.pause().await?,
                other => return other,
            }
        }
    }

    /// Why a write matched nothing on a board that shows no damage: `found`
    /// is the look for any document of the board.
    pub(super) fn not_written(
        &self,
        board: &Bson,
        delta: Delta<'_>,
        found: mongodb::error::Result<Option<Document>>,
    ) -> Error {
        match found {
            Err(e) => e.into(),
            Ok(None) => self.unknown_board(board),
            Ok(Some(_)) => Error::ScoreNotFound {
                board: Box::new(board.clone()),
                score: Box::new(delta.dec.cloned().unwrap_or(Bson::Null)),
            },
        }
    }

    pub(super) async fn run_rebuild(&self, board: Result<Bson>, cx: Call<'_>) -> Result<u64> {
        self.rebuild_board(&board?, &cx.opts, cx.session).await
    }

    /// [`Ranks::rebuild`] of board `b`, with options `o`, in `session`.
    pub(super) async fn rebuild_board(
        &self,
        b: &Bson,
        o: &Options,
        mut session: Option<&mut mongodb::ClientSession>,
    ) -> Result<u64> {
        let score = format!("${}", self.spec.score);
        let key = rounded(score, self.spec.precision);
        let dir = if self.spec.descending { -1 } else { 1 };
        let pipeline = vec![
            doc! {"$match": {
                self.spec.board: b,
                self.spec.score: {"$type": "number", "$gt": f64::NEG_INFINITY, "$lt": f64::INFINITY},
            }},
            doc! {"$group": {"_id": key, "count": {"$sum": 1}}},
            // A score that rounding would take past the largest double.
            doc! {"$match": {"_id": {"$gt": f64::NEG_INFINITY, "$lt": f64::INFINITY}}},
            doc! {"$sort": {"_id": dir}},
        ];
        // The histogram is written from what this reads: the primary's
        // players, whatever the call's or the client's read preference.
        let reads = Options {
            write_concern: None,
            selection_criteria: Some(crate::util::primary()),
            ..(*o).clone()
        };
        let players = self.source.clone_with_type::<Document>();
        let aggregate = players.aggregate(pipeline).with_options(reads.driver());
        let groups: Vec<Document> = all_of!(aggregate, session.as_deref_mut());
        let mut total = 0;
        let mut scores = Vec::with_capacity(groups.len());
        for g in &groups {
            let s = g.get("_id").cloned().unwrap_or(Bson::Null);
            let n = g
                .get("count")
                .and_then(crate::util::int)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or_default();
            total += n;
            scores.push((self.normalize(s), n));
        }
        let writes = Options {
            read_concern: None,
            selection_criteria: None,
            ..(*o).clone()
        };
        self.store()
            .replace(self, b, scores, writes, session)
            .await?;
        Ok(total)
    }
}

/// An expression that fails (ConversionFailure), so that a pipeline update
/// writes nothing: not a constant, so the server cannot fold it away.
pub(super) fn refuse() -> Bson {
    bson::bson!({"$toLong": {"$concat": ["refused by the rank histogram: ", {"$toString": {"$type": "$_id"}}]}})
}

/// One statement of a histogram write: an update of one document (an
/// upsert when `upsert`) or the delete of one. The driver's write models
/// for `Client::bulk_write` and its helpers are made from it, and so are
/// the statements of an `update` or `delete` command.
pub(super) enum Statement {
    Update {
        filter: Document,
        update: UpdateModifications,
        upsert: bool,
    },
    Delete {
        filter: Document,
    },
}

impl Statement {
    /// The statement as a model of `Client::bulk_write`, on `ns`.
    pub(super) fn model(self, ns: &Namespace) -> WriteModel {
        match self {
            Statement::Update {
                filter,
                update,
                upsert,
            } => UpdateOneModel::builder()
                .namespace(ns.clone())
                .filter(filter)
                .update(update)
                .upsert(upsert)
                .build()
                .into(),
            Statement::Delete { filter } => DeleteOneModel::builder()
                .namespace(ns.clone())
                .filter(filter)
                .build()
                .into(),
        }
    }
}
