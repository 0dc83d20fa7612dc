//! A call waiting in a board's group, as the queue holds it and the group
//! runs it, and the bytes boards and players are compared by.

use mongodb::bson::{Bson, Document};
use tokio::sync::oneshot;

use crate::action::Options;
use crate::error::Result;

/// A board's queue key: its BSON bytes, so that `1` and `1.0` (one value
/// to the server, and one histogram) share a queue only when they are
/// stored alike; two queues for one board cost only conflicts.
pub(super) fn key(board: &Bson) -> Vec<u8> {
    crate::compat::raw_document(&mongodb::bson::doc! {"b": board})
        .map(|d| d.as_bytes().to_vec())
        .unwrap_or_default()
}

/// An `_id` a group can look up and compare, as bytes: integers as
/// `i64`, so that `1` and `1i64` (one document to the server) are one
/// player.
pub(super) fn player_key(id: &Bson) -> Option<Vec<u8>> {
    match id {
        Bson::Int32(v) => Some(key(&Bson::Int64(i64::from(*v)))),
        Bson::Int64(_) | Bson::String(_) | Bson::ObjectId(_) | Bson::Binary(_) => Some(key(id)),
        _ => None,
    }
}

/// A call's write, as a group sends it.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Insert {
        player: Document,
        score: Bson,
    },
    Update {
        id: Bson,
        stored: Bson,
        number: Bson,
    },
    Delete {
        id: Bson,
    },
}

/// A call waiting in a board's group.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) id: u64,
    pub(super) op: Op,
    pub(super) opts: Options,
    pub(super) reply: oneshot::Sender<Reply>,
}

impl Pending {
    /// The player it writes, when known (an insert may have no `_id` yet).
    pub(super) fn player(&self) -> Option<Vec<u8>> {
        match &self.op {
            Op::Insert { player, .. } => player.get("_id").and_then(player_key),
            Op::Update { id, .. } | Op::Delete { id } => player_key(id),
        }
    }
}

/// What a group did with a call.
#[derive(Debug)]
pub(super) enum Reply {
    /// Run, committed or failed with the group's transaction.
    Done(Result<bool>),
    /// Not run: run it alone.
    Alone,
}
