//! The writes every mode sends: one `update` or `findAndModify` of a
//! document's counter field, through the driver's helpers, which send
//! them as retryable writes (a session id and a transaction number the
//! server de-duplicates on: one failover between the send and the reply
//! stores the increment once, and the call returns `Ok`). With
//! `maxTimeMS`, which the driver's `update` has no option for, the
//! `update` is a `findAndModify` (retryable too). Only `w: 0`, which the
//! driver's helpers refuse, goes through `run_command`: it asks for no
//! reply, so there is no outcome to lose.

use std::sync::atomic::Ordering;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{
    FindOneAndUpdateOptions, ReturnDocument, UpdateModifications, UpdateOptions,
};
use mongodb::ClientSession;

use super::Inner;
use crate::action::Options;
use crate::error::{Error, Found, Result};

impl Inner {
    /// Whether writes with `opts` go unacknowledged (`w: 0`, the call's,
    /// the handle's or the collection's), which the driver's own write
    /// helpers refuse to send. Never inside a transaction.
    fn unacknowledged(&self, opts: &Options, txn: bool) -> bool {
        !txn && opts.unacknowledged(self.coll.write_concern())
    }

    /// One `update` of a document: the driver's `update_one`; with
    /// `maxTimeMS`, its `find_one_and_update` (both retryable writes);
    /// with `w: 0`, the same `update` command through `run_command`, with
    /// the effective write concern written into it.
    pub(super) async fn update(
        &self,
        filter: Document,
        update: UpdateModifications,
        opts: &Options,
        txn: bool,
        session: Option<&mut ClientSession>,
    ) -> Result<Updated> {
        let upsert = self.spec.upsert;
        if opts.max_time.is_none() && !self.unacknowledged(opts, txn) {
            let mut action = self
                .coll
                .update_one(filter, update)
                .with_options(opts.driver::<UpdateOptions>());
            if upsert {
                // Off is the server's default: said only when on, so that
                // a call without options hands the driver none to encode.
                action = action.upsert(true);
            }
            let r = crate::action::run!(action, session)?;
            return Ok(Updated {
                matched: r.matched_count,
                upserted: r.upserted_id.is_some(),
                acknowledged: true,
            });
        }
        if !self.unacknowledged(opts, txn) {
            // `maxTimeMS`: a `findAndModify`, which carries it. The
            // document before (only its `_id`): none means it was inserted
            // (with `upsert`) or matched nothing.
            let action = self
                .coll
                .find_one_and_update(filter, update)
                .with_options(opts.driver::<FindOneAndUpdateOptions>())
                .upsert(upsert)
                .return_document(ReturnDocument::Before)
                .projection(doc! {"_id": 1});
            let before = crate::action::run!(action, session)?;
            return Ok(Updated {
                matched: u64::from(before.is_some()),
                upserted: before.is_none() && upsert,
                acknowledged: true,
            });
        }
        let mut cmd = doc! {
            "update": self.coll.name(),
            "updates": [{"q": filter, "u": crate::compat::to_bson(&update)?, "upsert": upsert}],
        };
        let inherited = if txn { None } else { self.coll.write_concern() };
        opts.command_fields(&mut cmd, inherited, true)?;
        // `w: 0`: nothing comes back to tell an outcome by.
        let reply = crate::action::run!(self.db.run_command(cmd), session)?;
        let upserted = reply.get_array("upserted").map_or(0, |a| a.len() as u64);
        Ok(match reply.get("n").and_then(bson_count) {
            Some(n) => Updated {
                matched: n.saturating_sub(upserted),
                upserted: upserted > 0,
                acknowledged: true,
            },
            // Unacknowledged: no counts in the reply.
            None => Updated {
                matched: 0,
                upserted: false,
                acknowledged: false,
            },
        })
    }

    /// An `$inc` of `amount` on `id`: sampled and geometric writes, all
    /// writes after `shutdown` but buffered mode's (which keeps its flush
    /// ids), and a buffered counter's write-through.
    ///
    /// In the caller's transaction, a call cut before its reply has the
    /// session killed on the server (see [`Counter::incr_by`]).
    ///
    /// [`Counter::incr_by`]: super::Counter::incr_by
    pub(super) async fn write(
        &self,
        id: &Bson,
        amount: u64,
        opts: &Options,
        txn: bool,
        session: Option<&mut ClientSession>,
    ) -> Result<()> {
        match session {
            Some(s) if txn => {
                let write = |s| self.write_in(id, amount, opts, true, Some(s));
                Box::pin(crate::cut::guarded(s, write)).await
            }
            session => self.write_in(id, amount, opts, txn, session).await,
        }
    }

    async fn write_in(
        &self,
        id: &Bson,
        amount: u64,
        opts: &Options,
        txn: bool,
        mut session: Option<&mut ClientSession>,
    ) -> Result<()> {
        let field = self.spec.field;
        let by = amount_bson(amount)?;
        let mut retried = false;
        loop {
            // Built for each attempt: a retry is rare, a copy kept for it
            // would cost every write.
            let res = self
                .update(
                    doc! {"_id": id},
                    doc! {"$inc": {field: by.clone()}}.into(),
                    opts,
                    txn,
                    session.as_deref_mut(),
                )
                .await;
            match res {
                Ok(u) => {
                    if u.acknowledged {
                        self.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                Err(e) => match self.upsert_race(e, txn, &mut retried) {
                    None => continue,
                    Some(e) => return Err(self.refused(id, amount, e).await),
                },
            }
        }
    }

    /// Writes and reads the new value back (geometric mode): one
    /// `findAndModify`; with `w: 0` through `run_command` (then nothing
    /// may come back).
    /// Guarded as [`Inner::write`].
    pub(super) async fn write_returning(
        &self,
        id: &Bson,
        amount: u64,
        opts: &Options,
        txn: bool,
        session: Option<&mut ClientSession>,
    ) -> Result<Option<i64>> {
        match session {
            Some(s) if txn => {
                let write = |s| self.write_returning_in(id, amount, opts, true, Some(s));
                Box::pin(crate::cut::guarded(s, write)).await
            }
            session => {
                self.write_returning_in(id, amount, opts, txn, session)
                    .await
            }
        }
    }

    async fn write_returning_in(
        &self,
        id: &Bson,
        amount: u64,
        opts: &Options,
        txn: bool,
        mut session: Option<&mut ClientSession>,
    ) -> Result<Option<i64>> {
        let field = self.spec.field;
        let inc = doc! {"$inc": {field: amount_bson(amount)?}};
        let mut retried = false;
        loop {
            let res = self
                .find_and_inc(id, &inc, opts, txn, session.as_deref_mut())
                .await;
            match res {
                Ok((after, acknowledged)) => {
                    if acknowledged {
                        self.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    return after
                        .map(|d| number(&d, field, self.coll.name()))
                        .transpose();
                }
                Err(e) => match self.upsert_race(e, txn, &mut retried) {
                    None => continue,
                    Some(e) => return Err(self.refused(id, amount, e).await),
                },
            }
        }
    }

    async fn find_and_inc(
        &self,
        id: &Bson,
        inc: &Document,
        opts: &Options,
        txn: bool,
        session: Option<&mut ClientSession>,
    ) -> Result<(Option<Document>, bool)> {
        let field = self.spec.field;
        if !self.unacknowledged(opts, txn) {
            let action = self
                .coll
                .find_one_and_update(doc! {"_id": id}, inc.clone())
                .with_options(opts.driver::<FindOneAndUpdateOptions>())
                .upsert(self.spec.upsert)
                .return_document(ReturnDocument::After)
                .projection(doc! {field: 1});
            return Ok((crate::action::run!(action, session)?, true));
        }
        let mut cmd = doc! {
            "findAndModify": self.coll.name(),
            "query": {"_id": id},
            "update": inc.clone(),
            "upsert": self.spec.upsert,
            "new": true,
            "fields": {field: 1},
        };
        opts.command_fields(&mut cmd, self.coll.write_concern(), true)?;
        let reply = crate::action::run!(self.db.run_command(cmd), session)?;
        crate::action::command_write_errors(&reply)?;
        let acknowledged = reply.contains_key("lastErrorObject");
        Ok((reply.get_document("value").ok().cloned(), acknowledged))
    }

    /// Two first increments of one missing document (`upsert` on) both try
    /// to insert it, and one gets a duplicate key. `None`: try again, as an
    /// update now (once). Inside a caller's transaction, which the server
    /// has aborted, the error carries `TransientTransactionError` instead.
    fn upsert_race(&self, e: Error, txn: bool, retried: &mut bool) -> Option<Error> {
        if !self.spec.upsert || !e.is_duplicate_key() {
            return Some(e);
        }
        match e {
            Error::Database(m) | Error::Raced(m) if txn => {
                Some(crate::action::raced_in_transaction(m))
            }
            Error::Database(m) | Error::Raced(m) if *retried => Some(Error::Raced(m)),
            _ => {
                *retried = true;
                None
            }
        }
    }

    /// A failed `$inc` as the caller should see it: `UnsupportedValue`
    /// naming the document when the server refused its field (the write's
    /// `amount` is then dropped), the error as it came otherwise.
    async fn refused(&self, id: &Bson, amount: u64, e: Error) -> Error {
        if !e.is_type_mismatch() {
            return e;
        }
        let field = self.spec.field;
        let found = self
            .coll
            .find_one(doc! {"_id": id})
            .projection(doc! {field: 1})
            .await;
        match found.map(|d| d.map(|d| number(&d, field, self.coll.name()))) {
            Ok(Some(Err(Error::UnsupportedValue {
                collection,
                id,
                field,
                found,
                why,
                ..
            }))) => Error::UnsupportedValue {
                collection,
                id,
                field,
                found,
                why,
                dropped: Some(amount),
            },
            // Fixed (or deleted) since: the original error stands.
            _ => e,
        }
    }
}

/// What an `update` did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Updated {
    pub(super) matched: u64,
    pub(super) upserted: bool,
    /// False for `w: 0`: the reply says nothing.
    pub(super) acknowledged: bool,
}

fn bson_count(v: &Bson) -> Option<u64> {
    match v {
        Bson::Int32(i) => u64::try_from(*i).ok(),
        Bson::Int64(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

pub(super) fn amount_bson(amount: u64) -> Result<Bson> {
    i64::try_from(amount)
        .map(Bson::Int64)
        .map_err(|_| Error::invalid("n", format!("{amount} is past i64::MAX")))
}

/// A counter field's value as an integer.
pub(super) fn number(d: &Document, field: &str, collection: &str) -> Result<i64> {
    let value = d.get(field);
    if let Some(n) = value.and_then(crate::util::int) {
        return Ok(n);
    }
    match value {
        None | Some(Bson::Null) => Ok(0),
        // A double another client added to: counted to the nearest unit.
        Some(Bson::Double(f)) if f.is_finite() => Ok(f.round() as i64),
        Some(other) => Err(Error::UnsupportedValue {
            collection: collection.to_owned(),
            id: Box::new(d.get("_id").cloned().unwrap_or(Bson::Null)),
            field: field.to_owned(),
            found: Found::Type(other.element_type()),
            why: "counted",
            dropped: None,
        }),
    }
}
