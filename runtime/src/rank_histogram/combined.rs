//! `insert` in one command: the player's insert and the histogram's `+1`
//! as one ordered cross-collection `bulkWrite` (MongoDB 8.0+, the driver's
//! `Client::bulk_write`), so that a transaction of the call's own costs two
//! round trips (that command and the commit) instead of three. It is only
//! ever sent inside that transaction, whose commit covers it.
//!
//! Only `insert` knows both writes before sending anything. `update_score`
//! and `delete` find the old score in the player's document, and no
//! statement of a `bulkWrite` can read what another one found: each update
//! sees only its own document, its pipeline cannot `$lookup`, and `let`
//! holds constants sent by the client.

use std::sync::atomic::Ordering;

use mongodb::options::{InsertOneModel, WriteModel};
use mongodb::ClientSession;

use super::documents::statements;
use super::send::{first_failed, learnt_no_bulk_write, refused_bulk_write, send_bulk};
use super::write::Delta;
use super::{array, Layout, RankHistogram, Ranks};
use crate::action::Options;
use crate::error::code::WRITE_CONFLICT;
use crate::error::Result;

impl<T: RankHistogram> Ranks<T> {
    /// Whether `insert` may send its two writes as one `bulkWrite` in a
    /// transaction of its own, given the call's options `o`. The first
    /// command of a transaction carries `readConcern` when one applies,
    /// which some servers refuse on `bulkWrite`: then it does not.
    pub(super) fn combines(&self, o: &Options) -> bool {
        self.bulk_write
            && !self.no_bulk_write.load(Ordering::Relaxed)
            && !self.no_bulk_in_transaction.load(Ordering::Relaxed)
            && (self.bulk_with_read_concern
                || o.read_concern.is_none() && self.db.client().read_concern().is_none())
    }

    /// Inserts `player` and counts its score with one `bulkWrite` (the
    /// driver's `Client::bulk_write`), in `session`'s transaction. `Some`
    /// when the transaction must be rerun, with nothing written: the
    /// server refused the command (remembered), or the histogram's
    /// statement failed (the separate commands then say why).
    pub(super) async fn insert_combined(
        &self,
        player: &T,
        o: &Options,
        session: &mut ClientSession,
    ) -> Result<Option<mongodb::error::Error>> {
        let models = self.combined_models(player)?;
        let e = match send_bulk(self, models, o, Some(session), true).await {
            Ok(done)
                if done.inserted_count == 1 && done.matched_count + done.upserted_count >= 1 =>
            {
                return Ok(None)
            }
            Ok(done) => {
                let e = format!("bulkWrite wrote only part of an insert: {done:?}");
                return Ok(Some(mongodb::error::Error::custom(e)));
            }
            Err(e) => e,
        };
        if refused_bulk_write(&e) {
            learnt_no_bulk_write(self);
            return Ok(Some(e));
        }
        if refused_field(&e) {
            crate::action::learnt(
                &self.no_bulk_in_transaction,
                "no_bulk_in_transaction",
                self.hist.name(),
                "the deployment refused bulkWrite as a transaction's first command: insert sends two commands",
            );
            return Ok(Some(e));
        }
        match first_failed(e) {
            // The player's insert: the caller's error (a duplicate `_id`),
            // or a conflict with a concurrent transaction (rerun).
            Ok((0, e)) if crate::error::server_codes(&e).contains(&WRITE_CONFLICT) => Ok(Some(e)),
            Ok((0, e)) => Err(e.into()),
            Ok((_, e)) => Ok(Some(e)),
            Err(e) => Err(e.into()),
        }
    }

    /// The models of [`insert_combined`](Self::insert_combined): the
    /// player's insert (the driver adds an `_id` when it has none, as its
    /// `insert_one` does), then the histogram's statements, ordered.
    fn combined_models(&self, player: &T) -> Result<Vec<WriteModel>> {
        let board = self.board_bson(player.board())?;
        let score = self.score_bson(player.score())?;
        let delta = Delta {
            dec: None,
            inc: Some(&score),
        };
        let hist = match self.spec.layout {
            Layout::Array => vec![array::statement(&board, delta, self.spec.descending)],
            Layout::Documents => statements(&board, delta, None),
        };
        let insert = InsertOneModel::builder()
            .namespace(self.source.namespace())
            .document(crate::compat::to_document(player)?)
            .build();
        let ns = self.hist.namespace();
        let mut models = vec![insert.into()];
        models.extend(hist.into_iter().map(|s| s.model(&ns)));
        Ok(models)
    }
}

/// Whether the server refused `readConcern` on `bulkWrite` (40415), as a
/// server that runs the command, but not as a transaction's first, does.
fn refused_field(e: &mongodb::error::Error) -> bool {
    crate::error::code::refuses_read_concern(e, "bulkWrite")
}
