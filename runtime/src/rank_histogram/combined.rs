//! `insert` in one command: the player's insert and the histogram's `+1`
//! as one ordered cross-collection `bulkWrite` (MongoDB 8.0+), so that a
//! transaction of the call's own costs two round trips (that command and
//! the commit) instead of three.
//!
//! Only `insert` knows both writes before sending anything. `update_score`
//! and `delete` find the old score in the player's document, and no
//! statement of a `bulkWrite` can read what another one found: each update
//! sees only its own document, its pipeline cannot `$lookup`, and `let`
//! holds constants sent by the client.

use std::sync::atomic::Ordering;

use mongodb::bson::{doc, oid::ObjectId, RawArrayBuf, RawBson, RawDocumentBuf};
use mongodb::ClientSession;

use super::documents::{
    command_options, first_bulk_error, ns_info, refused_bulk_write, statements,
};
use super::write::Delta;
use super::{array, Layout, RankHistogram, Ranks};
use crate::action::Options;
use crate::compat::{self, append};
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

    /// Inserts `player` and counts its score with one `bulkWrite`, in
    /// `session`'s transaction. `Some` when the transaction must be rerun,
    /// with nothing written: the server refused the command (remembered),
    /// or the histogram's statement failed (the separate commands then
    /// say why).
    pub(super) async fn insert_combined(
        &self,
        player: &T,
        o: &Options,
        session: &mut ClientSession,
    ) -> Result<Option<mongodb::error::Error>> {
        let command = self.combined_command(player, o)?;
        let admin = self.db.client().database("admin");
        let reply = match admin.run_raw_command(command).session(session).await {
            Ok(reply) => reply,
            Err(e) if refused_bulk_write(&e) => {
                crate::action::learnt(
                    &self.no_bulk_write,
                    "no_bulk_write",
                    self.hist.name(),
                    "the deployment refused bulkWrite (a server before 8.0): writes go as update and delete commands",
                );
                return Ok(Some(e));
            }
            Err(e) if refused_field(&e) => {
                crate::action::learnt(
                    &self.no_bulk_in_transaction,
                    "no_bulk_in_transaction",
                    self.hist.name(),
                    "the deployment refused bulkWrite as a transaction's first command: insert sends two commands",
                );
                return Ok(Some(e));
            }
            Err(e) => return Err(e.into()),
        };
        match first_bulk_error(&reply) {
            // The player's insert: the caller's error (a duplicate `_id`),
            // or a conflict with a concurrent transaction (rerun).
            Some((0, e)) if crate::error::server_codes(&e).contains(&WRITE_CONFLICT) => Ok(Some(e)),
            Some((0, e)) => Err(e.into()),
            Some((_, e)) => Ok(Some(e)),
            None => {
                let n = |f: &str| reply.get(f).and_then(crate::util::int).unwrap_or(0);
                if n("nInserted") == 1 && n("nMatched") + n("nUpserted") >= 1 {
                    Ok(None)
                } else {
                    let e = mongodb::error::Error::custom(format!(
                        "bulkWrite wrote only part of an insert: {reply}"
                    ));
                    Ok(Some(e))
                }
            }
        }
    }

    /// The `bulkWrite` of [`insert_combined`](Self::insert_combined): the
    /// player's insert (its `_id` added when it has none), then the
    /// histogram's statements, ordered.
    fn combined_command(&self, player: &T, o: &Options) -> Result<RawDocumentBuf> {
        let board = self.board_bson(player.board())?;
        let score = self.score_bson(player.score())?;
        let mut document = crate::compat::to_document(player)?;
        if !document.contains_key("_id") {
            // As the driver's `insert_one` does.
            let mut with_id = doc! {"_id": ObjectId::new()};
            with_id.extend(document);
            document = with_id;
        }
        let delta = Delta {
            dec: None,
            inc: Some(&score),
        };
        let hist = match self.spec.layout {
            Layout::Array => vec![array::statement(&board, delta, self.spec.descending)?],
            Layout::Documents => statements(&board, delta)?,
        };
        let mut insert = RawDocumentBuf::new();
        append(&mut insert, "insert", RawBson::Int32(0));
        append(
            &mut insert,
            "document",
            RawBson::Document(compat::raw_document(&document)?),
        );
        let mut ops = RawArrayBuf::new();
        ops.push(RawBson::Document(insert));
        for s in hist {
            ops.push(RawBson::Document(s.into_bulk_op(1)));
        }
        let mut command = RawDocumentBuf::new();
        append(&mut command, self.bulk_command, RawBson::Int32(1));
        append(&mut command, "ops", RawBson::Array(ops));
        let names = [self.source.name(), self.hist.name()];
        append(&mut command, "nsInfo", ns_info(self.db.name(), &names));
        append(&mut command, "ordered", RawBson::Boolean(true));
        append(&mut command, "errorsOnly", RawBson::Boolean(true));
        command_options(self, &mut command, o, true)?;
        Ok(command)
    }
}

/// Whether the server refused `readConcern` on `bulkWrite` (40415), as a
/// server that runs the command, but not as a transaction's first, does.
fn refused_field(e: &mongodb::error::Error) -> bool {
    crate::error::code::refuses_read_concern(e, "bulkWrite")
}
