//! What a bucket call adds to its context ([`Call`], shared by every
//! pattern): which operations it refuses inside a caller's transaction,
//! the item a push prepares once ([`Pushed`]), and how a race lost inside
//! a caller's transaction is handed back.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Bson, Document};

#[cfg(doc)]
use super::Buckets;
use crate::action::Call;
use crate::error::{Error, Result};

/// Refuses an operation that moves items' positions inside a caller's
/// transaction (see [`Buckets::delete`]): `what` is `"delete"`,
/// `"reindex"`, `"a late push"` or `"repairing positions a removal
/// left"`.
pub(super) fn outside_transaction(cx: &Call<'_>, what: &'static str) -> Result<()> {
    if !cx.txn {
        return Ok(());
    }
    const OUTSIDE: &str = "call it without the transaction's session (before \
        `start_transaction` or after the commit); given a session with no transaction \
        open, it runs as without one";
    let (operation, instead) = match what {
        "delete" => ("`delete`", OUTSIDE),
        "reindex" => ("`reindex`", OUTSIDE),
        "a late push" => (
            "a late `push` (an item further back than the key's last two buckets)",
            "push it without the transaction's session, or push items in `order` inside \
             the transaction",
        ),
        _ => (
            "repairing the positions a removal left",
            "call `reindex(key)` outside the transaction, then run the transaction again",
        ),
    };
    Err(Error::NotSupportedInTransaction {
        operation,
        why: "it moves items' positions under the key's lease, which a transaction \
              cannot hold until it commits",
        instead,
    })
}

/// A push's item, prepared once for every attempt.
#[derive(Debug)]
pub(super) struct Pushed {
    pub(super) key: Bson,
    pub(super) doc: Document,
    pub(super) len: i64,
    /// The key's slot in what the repository remembers.
    pub(super) slot: Vec<u8>,
    /// The push's write id: once one attempt is applied, no other can be.
    pub(super) op: ObjectId,
}

/// A race lost inside a caller's transaction, labelled for its `and_run2`.
pub(super) fn raced(e: Error) -> Error {
    match e {
        Error::Database(e) => crate::action::raced_in_transaction(e),
        other => {
            crate::action::raced_in_transaction(mongodb::error::Error::custom(other.to_string()))
        }
    }
}

/// `Contended` after `attempts` in a caller's transaction, which a push
/// retries a few times only (see `push_general`), then leaves to the caller.
pub(super) fn contended(operation: &'static str, attempts: usize) -> Error {
    Error::Contended {
        operation,
        attempts,
    }
}
