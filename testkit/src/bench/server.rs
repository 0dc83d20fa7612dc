//! What the server says about its own work: `explain` statistics and the
//! counters of `serverStatus`.

use mongo_patterns::bson::{doc, Bson, Document};
use mongo_patterns::mongodb::Database;

use super::BoxResult;

/// A count from `explain`'s `executionStats` (`totalKeysExamined`, ...),
/// whichever numeric type the server sent it as.
pub fn stat_u64(stats: &Document, k: &str) -> Option<u64> {
    match stats.get(k)? {
        Bson::Int32(v) => Some(*v as u64),
        Bson::Int64(v) => Some(*v as u64),
        Bson::Double(v) => Some(*v as u64),
        _ => None,
    }
}

/// What the server examined for one command.
#[derive(Debug, Clone, Default)]
pub struct Explained {
    /// `totalKeysExamined` (summed over the shards through mongos).
    pub keys: Option<u64>,
    /// `totalDocsExamined` (summed over the shards through mongos).
    pub docs: Option<u64>,
    /// The winning plan's root stage, in either engine's shape made one
    /// (the first shard's through mongos): see [`crate::Explain`].
    pub plan: Option<Document>,
}

/// `explain` with `executionStats` of `command` (a `find` or an
/// `aggregate`, as sent: see [`bare`]), read by [`crate::Explain`].
pub async fn explain(db: &Database, command: Document) -> BoxResult<Explained> {
    let reply = db
        .run_command(doc! {"explain": command, "verbosity": "executionStats"})
        .await?;
    let e = crate::Explain::of(&reply);
    Ok(Explained {
        keys: e.keys_examined,
        docs: e.docs_examined,
        plan: e.plans.into_iter().next(),
    })
}

/// A command as command monitoring saw it, without what the driver adds
/// per session and transaction: what two ways of sending the same command
/// must agree on, and what `explain` accepts.
pub fn bare(cmd: &Document) -> Document {
    let mut c = cmd.clone();
    for k in [
        "lsid",
        "$clusterTime",
        "$db",
        "txnNumber",
        "$readPreference",
        "autocommit",
        "startTransaction",
    ] {
        c.remove(k);
    }
    c
}

/// The server's own counts of the documents and operations it handled
/// (`serverStatus`: `metrics.document` and `opcounters`); -1 where the
/// server does not report one.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerCounters {
    pub updated: i64,
    pub inserted: i64,
    pub deleted: i64,
    pub op_update: i64,
    pub op_insert: i64,
    pub op_delete: i64,
    pub op_query: i64,
    pub op_command: i64,
}

impl ServerCounters {
    /// Sends `serverStatus` to `db`'s deployment.
    pub async fn read(db: &Database) -> BoxResult<ServerCounters> {
        let s = db
            .client()
            .database("admin")
            .run_command(doc! {"serverStatus": 1})
            .await?;
        let get = |d: Option<&Document>, k: &str| -> i64 {
            d.and_then(|d| d.get(k))
                .and_then(|v| match v {
                    Bson::Int32(i) => Some(i64::from(*i)),
                    Bson::Int64(i) => Some(*i),
                    Bson::Double(f) => Some(*f as i64),
                    _ => None,
                })
                .unwrap_or(-1)
        };
        let docs = s
            .get_document("metrics")
            .ok()
            .and_then(|m| m.get_document("document").ok());
        let ops = s.get_document("opcounters").ok();
        Ok(ServerCounters {
            updated: get(docs, "updated"),
            inserted: get(docs, "inserted"),
            deleted: get(docs, "deleted"),
            op_update: get(ops, "update"),
            op_insert: get(ops, "insert"),
            op_delete: get(ops, "delete"),
            op_query: get(ops, "query"),
            op_command: get(ops, "command"),
        })
    }

    /// What two reads in a row count (the reads themselves are commands):
    /// to subtract from a difference of two reads around a measurement.
    pub async fn baseline(db: &Database) -> BoxResult<ServerCounters> {
        let a = ServerCounters::read(db).await?;
        let b = ServerCounters::read(db).await?;
        Ok(b.minus(a))
    }

    /// `self - o`, counter by counter.
    pub fn minus(self, o: ServerCounters) -> ServerCounters {
        ServerCounters {
            updated: self.updated - o.updated,
            inserted: self.inserted - o.inserted,
            deleted: self.deleted - o.deleted,
            op_update: self.op_update - o.op_update,
            op_insert: self.op_insert - o.op_insert,
            op_delete: self.op_delete - o.op_delete,
            op_query: self.op_query - o.op_query,
            op_command: self.op_command - o.op_command,
        }
    }
}
