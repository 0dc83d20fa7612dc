//! How a histogram batch goes out, and what its errors say: one ordered
//! `bulkWrite` through the driver's `Client::bulk_write`, the same
//! statements one by one through its `update_one` and `delete_one` (a
//! server without `bulkWrite`), or, inside a transaction, an `update`
//! command and a `delete` command. Outside a transaction the first two are
//! the driver's retryable writes: sent once more after a failover's error,
//! and de-duplicated by the server statement by statement.

use mongodb::bson::{doc, Bson, Document, RawArrayBuf, RawBson, RawDocumentBuf};
use mongodb::options::{BulkWriteOptions, UpdateModifications, WriteModel};
use mongodb::results::SummaryBulkWriteResult;
use mongodb::ClientSession;

use super::write::Statement;
use super::{RankHistogram, Ranks};
use crate::action::Options;
use crate::compat::{self, append};
use crate::error::{Error, Result};

/// The first statement of a batch that failed: its index in the batch and
/// the server's error for it (`None`: every statement was applied).
pub(super) type Failed = Option<(usize, mongodb::error::Error)>;

/// Remembers, for `r` and its clones, that the deployment refused
/// `bulkWrite`.
pub(super) fn learnt_no_bulk_write<T: RankHistogram>(r: &Ranks<T>) {
    crate::action::learnt(
        &r.no_bulk_write,
        "no_bulk_write",
        r.hist.name(),
        "the deployment refused bulkWrite (a server before 8.0): writes go as update and delete statements",
    );
}

/// `models` as one ordered `bulkWrite` (see [`send_bulk`]). The first
/// failed statement, as (index, the server's error for it); the call's
/// error otherwise, a write concern error included.
pub(super) async fn bulk_write<T: RankHistogram>(
    r: &Ranks<T>,
    models: Vec<WriteModel>,
    o: &Options,
    session: Option<&mut ClientSession>,
    in_txn: bool,
) -> mongodb::error::Result<Failed> {
    match send_bulk(r, models, o, session, in_txn).await {
        Ok(_) => Ok(None),
        Err(e) => first_failed(e).map(Some),
    }
}

/// `models` as one ordered `bulkWrite`, through the driver's
/// `Client::bulk_write`: outside a transaction a retryable write (every
/// statement names one document), with the write concern of the call, or
/// else of the histogram's collection (which has its database's and its
/// client's); inside one, the transaction's. The call's comment goes with
/// it. A repository told to send the command under another name (tests)
/// sends a command of that name instead, and meets the server's refusal.
pub(super) fn send_bulk<'a, T: RankHistogram>(
    r: &'a Ranks<T>,
    models: Vec<WriteModel>,
    o: &Options,
    session: Option<&'a mut ClientSession>,
    in_txn: bool,
) -> impl std::future::Future<Output = mongodb::error::Result<SummaryBulkWriteResult>> + Send + 'a {
    use futures::future::Either;
    use std::future::IntoFuture;
    if r.bulk_command != "bulkWrite" {
        return Either::Left(Box::pin(unknown_command(r, session)));
    }
    let write_concern = match in_txn {
        true => None,
        false => o
            .write_concern
            .clone()
            .or_else(|| r.hist.write_concern().cloned()),
    };
    let mut options = None;
    if write_concern.is_some() || o.comment.is_some() {
        let mut b = BulkWriteOptions::default();
        b.ordered = Some(true);
        b.write_concern = write_concern;
        b.comment = o.comment.clone();
        options = Some(b);
    }
    let action = r.db.client().bulk_write(models).with_options(options);
    Either::Right(match session {
        Some(s) => action.session(s).into_future(),
        None => action.into_future(),
    })
}

/// `bulkWrite` sent under the name a test gave (`Ranks::__bulk_write_command`):
/// the server's refusal of a command it does not know.
async fn unknown_command<T: RankHistogram>(
    r: &Ranks<T>,
    session: Option<&mut ClientSession>,
) -> mongodb::error::Result<SummaryBulkWriteResult> {
    let admin = r.db.client().database("admin");
    let command = doc! {r.bulk_command: 1};
    crate::action::run!(admin.run_command(command), session)?;
    Err(mongodb::error::Error::custom(format!(
        "the server accepted `{}` in place of bulkWrite",
        r.bulk_command
    )))
}

/// A `bulkWrite`'s error as the statement that failed (the first, by
/// index: the batch is ordered) and the server's error for it, with its
/// code; otherwise the call's error: a write concern error (the statements
/// were applied) as the driver reports one of a single write, anything
/// else as it is. An error labelled `TransientTransactionError` (inside
/// a transaction) stays whole, with its label.
pub(super) fn first_failed(
    e: mongodb::error::Error,
) -> mongodb::error::Result<(usize, mongodb::error::Error)> {
    use mongodb::error::{ErrorKind, WriteFailure};
    let ErrorKind::BulkWrite(b) = &*e.kind else {
        return Err(e);
    };
    if e.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR) {
        return Err(e);
    }
    if let Some((i, w)) = b.write_errors.iter().min_by_key(|(i, _)| **i) {
        let failed = ErrorKind::Write(WriteFailure::WriteError(w.clone()));
        return Ok((*i, failed.into()));
    }
    match b.write_concern_errors.first() {
        Some(w) => Err(ErrorKind::Write(WriteFailure::WriteConcernError(w.clone())).into()),
        None => Err(e),
    }
}

/// `ops` one by one through the driver's `update_one` and `delete_one`,
/// each a retryable write, in order, stopping at the first that fails, as
/// the ordered batch does: the statements of a server without `bulkWrite`,
/// a round trip each.
pub(super) async fn one_by_one<T: RankHistogram>(
    r: &Ranks<T>,
    ops: Vec<Statement>,
    o: &Options,
    mut session: Option<&mut ClientSession>,
) -> Result<Failed> {
    use mongodb::error::{ErrorKind, WriteFailure};
    for (i, op) in ops.into_iter().enumerate() {
        let sent = match op {
            Statement::Update {
                filter,
                update,
                upsert,
            } => {
                let update = r
                    .hist
                    .update_one(filter, update)
                    .with_options(o.driver())
                    .upsert(upsert);
                crate::action::run!(update, session.as_deref_mut()).map(drop)
            }
            Statement::Delete { filter } => {
                let delete = r.hist.delete_one(filter).with_options(o.driver());
                crate::action::run!(delete, session.as_deref_mut()).map(drop)
            }
        };
        match sent {
            Ok(()) => {}
            Err(e) if matches!(&*e.kind, ErrorKind::Write(WriteFailure::WriteError(_))) => {
                return Ok(Some((i, e)));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// `ops` inside a transaction as the commands every server takes: one
/// ordered `update` command with the updates, then one `delete` command
/// with the removal, if any (a `+1` that lands before it leaves its count
/// above 0, so it removes the same scores). Built as bytes: the driver
/// has no `Document` to serialize. The server's error for the first
/// statement that failed, if any.
pub(super) async fn commands<T: RankHistogram>(
    r: &Ranks<T>,
    ops: Vec<Statement>,
    o: &Options,
    session: &mut ClientSession,
) -> Result<Option<mongodb::error::Error>> {
    let (mut updates, mut deletes) = (RawArrayBuf::new(), RawArrayBuf::new());
    for op in ops {
        let mut stmt = RawDocumentBuf::new();
        match op {
            Statement::Update {
                filter,
                update,
                upsert,
            } => {
                let u = match update {
                    UpdateModifications::Document(d) => Bson::Document(d),
                    UpdateModifications::Pipeline(p) => p.into(),
                    _ => return Err(Error::invalid("update", "not a document or a pipeline")),
                };
                append(
                    &mut stmt,
                    "q",
                    RawBson::Document(compat::raw_document(&filter)?),
                );
                append(&mut stmt, "u", compat::raw(&u)?);
                append(&mut stmt, "upsert", RawBson::Boolean(upsert));
                append(&mut stmt, "multi", RawBson::Boolean(false));
                updates.push(RawBson::Document(stmt));
            }
            Statement::Delete { filter } => {
                append(
                    &mut stmt,
                    "q",
                    RawBson::Document(compat::raw_document(&filter)?),
                );
                append(&mut stmt, "limit", RawBson::Int32(1));
                deletes.push(RawBson::Document(stmt));
            }
        }
    }
    let mut fields = Document::new();
    o.command_fields(&mut fields, None, true)?;
    let sent = [
        ("update", "updates", updates),
        ("delete", "deletes", deletes),
    ];
    for (name, list, stmts) in sent {
        if stmts.is_empty() {
            continue;
        }
        let mut command = RawDocumentBuf::new();
        append(
            &mut command,
            name,
            RawBson::String(r.hist.name().to_owned()),
        );
        append(&mut command, list, RawBson::Array(stmts));
        append(&mut command, "ordered", RawBson::Boolean(true));
        for (k, v) in &fields {
            append(&mut command, k, compat::raw(v)?);
        }
        let reply = r.db.run_raw_command(command).session(&mut *session).await?;
        if let Some((_, e)) = crate::action::first_write_error(&reply) {
            return Ok(Some(e));
        }
        crate::action::command_write_errors(&reply)?;
    }
    Ok(None)
}

/// Whether the server cannot run `bulkWrite` (nothing was written):
/// 6.0 does not know it (59), 7.0 refuses 8.0's fields (40415),
/// DocumentDB and the documentdb engine do not support it (303, 115); or
/// the driver refused to send it to a server whose wire version is before
/// 8.0's.
pub(super) fn refused_bulk_write(e: &mongodb::error::Error) -> bool {
    crate::error::code::lacks_command(e, "bulkWrite")
        || matches!(
            &*e.kind,
            mongodb::error::ErrorKind::IncompatibleServer { .. }
        )
}
