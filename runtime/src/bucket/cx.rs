//! One call's context: its effective options and the caller's session
//! ([`Cx`]), the item a push prepares once ([`Pushed`]), and how a race
//! lost inside a caller's transaction is handed back.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Bson, Document};
use mongodb::ClientSession;

use super::Buckets;
use crate::action::{Effective, Given, Options};
use crate::error::{Error, Result};

/// One operation's effective options and the caller's session.
pub(super) struct Cx<'s> {
    pub(super) opts: Effective<'s>,
    pub(super) session: Option<&'s mut ClientSession>,
    /// The session has a transaction open: nothing is retried here, and
    /// write and read concern are the transaction's.
    pub(super) txn: bool,
    /// A read for the caller (a page, a total): it follows the caller's
    /// read preference. Everything else reads the primary.
    pub(super) for_caller: bool,
}

impl<'s> Cx<'s> {
    pub(super) async fn new<T>(
        repo: &'s Buckets<T>,
        options: Given,
        mut session: Option<&'s mut ClientSession>,
        for_caller: bool,
    ) -> Cx<'s> {
        // Boxed: only a call given a session asks, and inline the question
        // would take room in every operation's future.
        let txn = match session.as_deref_mut() {
            Some(s) => Box::pin(crate::action::in_transaction(s)).await,
            None => false,
        };
        let mut opts = options.over(&repo.defaults);
        if txn {
            opts = opts.in_transaction();
        }
        Cx {
            opts,
            session,
            txn,
            for_caller,
        }
    }

    /// No options, no session: for the internals of the operations that
    /// run on a [`Buckets::scoped`] repository.
    pub(super) fn plain() -> Cx<'static> {
        Cx {
            opts: Effective::Defaults(Options::none()),
            session: None,
            txn: false,
            for_caller: false,
        }
    }

    /// Refuses an operation that moves items' positions inside a caller's
    /// transaction (see [`Buckets::delete`]): `what` is `"delete"`,
    /// `"reindex"`, `"a late push"` or `"repairing positions a removal
    /// left"`.
    pub(super) fn outside_transaction(&self, what: &'static str) -> Result<()> {
        if !self.txn {
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
