//! What a failed write left behind, and so what its caller may do: the one
//! policy every write path follows after an election, a step-down, a lost
//! connection.
//!
//! Every acknowledged write the patterns send is one of the driver's
//! retryable writes (its CRUD helpers and its transactions): it carries a
//! session id and a transaction number, the driver sends it once more
//! after a failover's error, and the server de-duplicates the second
//! attempt (it answers with the first one's result if that was applied,
//! statement by statement in a batch). So one failover between a write's
//! send and its reply ends in `Ok`, with the effect stored once; the
//! patterns never send a write again themselves with a new transaction
//! number. An error that reaches a call is what is left after that retry
//! (two faults in a row, or a deployment that refuses retryable writes),
//! and this module says what it means:
//!
//! - [`Outcome::NotStored`]: the write never ran. No server was selected,
//!   the driver says no attempt wrote (`NoWritesPerformed`), or the server
//!   refused a command the driver sends once only (no transaction number)
//!   before running it (`NotWritablePrimary` and its like, 10107, 13435,
//!   13436). Sending it again stores it once. The same refusal of a
//!   retryable write (labelled `RetryableWriteError`) may answer the
//!   driver's second attempt, after a first that may be stored: unknown.
//! - [`Outcome::Unknown`]: it may be stored. The connection failed, or the
//!   pool was cleared, after the command may have been sent; the server
//!   interrupted it while it ran (11602, 11600, 50, 91, 189), which for a
//!   batch can leave some of its statements applied; `mongos` lost or
//!   timed out its shard (6, 7, 89, 9001, 262); the error is labelled
//!   `RetryableWriteError`, whatever its code (the driver's second
//!   attempt answered, after a first that may be stored); a write concern error
//!   came after it was applied; a commit's result is unknown
//!   (`UnknownTransactionCommitResult`). The call returns
//!   [`Error::OutcomeUnknown`]: read before writing again.
//! - [`Outcome::Failed`]: any other error is the answer itself.
//!
//! Inside a caller's transaction nothing of this applies: the server's
//! labels (`TransientTransactionError`, `UnknownTransactionCommitResult`)
//! tell the transaction's runner what to do, and its commit decides.

use crate::error::code::FAILOVER;
use crate::error::{server_codes, Error, Result};

/// What a failed write left behind: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    NotStored,
    Unknown,
    Failed,
}

/// The codes a server answers a command with before running it, because it
/// is not (or no longer) the primary: nothing was stored.
const REFUSED_BEFORE_RUNNING: [i32; 3] = [10107, 13435, 13436];

/// The codes `mongos` answers when it lost its connection to a shard or
/// timed out waiting for one (`HostUnreachable`, `HostNotFound`,
/// `NetworkTimeout`, `SocketException`, `ExceededTimeLimit`): the shard
/// may have run the write. The driver retries them as it retries an
/// election's.
const SHARD_UNREACHABLE: [i32; 5] = [6, 7, 89, 9001, 262];

/// [`Outcome`] of a write that failed with `e` (a write command's error,
/// its first write error, its write concern error, or a transaction's
/// commit).
pub(crate) fn outcome(e: &mongodb::error::Error) -> Outcome {
    use mongodb::error::{ErrorKind, WriteFailure};
    if e.contains_label(mongodb::error::UNKNOWN_TRANSACTION_COMMIT_RESULT) {
        return Outcome::Unknown;
    }
    match &*e.kind {
        ErrorKind::ServerSelection { .. } => Outcome::NotStored,
        // A command already on the wire fails this way when the driver
        // clears its pool (a heartbeat timed out), and the server may
        // still run it.
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => Outcome::Unknown,
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => Outcome::Unknown,
        ErrorKind::InsertMany(m) if m.write_concern_error.is_some() => Outcome::Unknown,
        _ if e.contains_label(mongodb::error::NO_WRITES_PERFORMED) => Outcome::NotStored,
        _ => {
            let codes = server_codes(e);
            // A refusal labelled `RetryableWriteError` answered a retryable
            // write, which the driver sent once more after its first
            // error: this may be the second attempt's answer, and the
            // first attempt (its connection lost, say) may be stored.
            let retried = e.contains_label(mongodb::error::RETRYABLE_WRITE_ERROR);
            if codes.iter().any(|c| REFUSED_BEFORE_RUNNING.contains(c)) && !retried {
                Outcome::NotStored
            } else if retried
                || codes.iter().any(|c| {
                    FAILOVER.contains(c) || SHARD_UNREACHABLE.contains(c) || *c == MAX_TIME_EXPIRED
                })
            {
                Outcome::Unknown
            } else {
                Outcome::Failed
            }
        }
    }
}

/// `MaxTimeMSExpired`: the server stopped the command at its time bound,
/// perhaps after some of it ran.
const MAX_TIME_EXPIRED: i32 = 50;

/// A write call's result as its caller gets it: outside a transaction, an
/// error that leaves the call's writes perhaps stored is
/// [`Error::OutcomeUnknown`] for `operation` (the error underneath kept);
/// anything else as it is.
pub(crate) fn settle<T>(operation: &'static str, txn: bool, r: Result<T>) -> Result<T> {
    r.map_err(|e| unknown(operation, txn, e))
}

/// `e` as [`settle`] gives it.
pub(crate) fn unknown(operation: &'static str, txn: bool, e: Error) -> Error {
    if txn || !e.mongo().is_some_and(|m| outcome(m) == Outcome::Unknown) {
        return e;
    }
    match e {
        Error::Database(source) | Error::Unavailable(source) | Error::Raced(source) => {
            Error::OutcomeUnknown { operation, source }
        }
        other => other,
    }
}

/// Whether sending the call that failed with `e` again, as it is, cannot
/// store anything twice (see [`Error::is_retryable`]).
pub(crate) fn safe_to_resend(e: &mongodb::error::Error) -> bool {
    e.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR)
        || outcome(e) == Outcome::NotStored
        || server_codes(e).contains(&crate::error::code::WRITE_CONFLICT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code::command_error;

    #[test]
    fn refusals_before_running_are_not_stored_interruptions_are_unknown() {
        for code in REFUSED_BEFORE_RUNNING {
            let e = command_error(code);
            assert_eq!(outcome(e.mongo().unwrap()), Outcome::NotStored, "{code}");
        }
        for code in [11602, 11600, 189, 91, 50, 6, 7, 89, 9001, 262] {
            let e = command_error(code);
            assert_eq!(outcome(e.mongo().unwrap()), Outcome::Unknown, "{code}");
            let settled = settle::<()>("push", false, Err(e.clone()));
            assert!(
                matches!(settled, Err(Error::OutcomeUnknown { .. })),
                "{code}"
            );
            let inside = settle::<()>("push", true, Err(e));
            assert!(matches!(inside, Err(Error::Database(_))), "{code}");
        }
        let e = command_error(crate::error::code::DUPLICATE_KEY);
        assert_eq!(outcome(e.mongo().unwrap()), Outcome::Failed);
        let e = command_error(crate::error::code::WRITE_CONFLICT);
        assert_eq!(outcome(e.mongo().unwrap()), Outcome::Failed);
    }

    /// A write concern error (any code: the write was applied first) and a
    /// lost connection leave the write perhaps stored.
    #[test]
    fn write_concern_errors_and_lost_connections_are_unknown() {
        use mongodb::error::{ErrorKind, WriteConcernError, WriteFailure};
        for code in FAILOVER.into_iter().chain([64, 100]) {
            let wce: WriteConcernError = crate::compat::from_document(
                mongodb::bson::doc! {"code": code, "codeName": "X", "errmsg": "stepped down"},
            )
            .unwrap();
            let wce =
                mongodb::error::Error::from(ErrorKind::Write(WriteFailure::WriteConcernError(wce)));
            assert_eq!(outcome(&wce), Outcome::Unknown, "{code}");
        }
        let io =
            mongodb::error::Error::from(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        assert_eq!(outcome(&io), Outcome::Unknown);
        assert!(!Error::OutcomeUnknown {
            operation: "push",
            source: io,
        }
        .is_retryable());
    }
}
