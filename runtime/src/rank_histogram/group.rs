//! Group commit: the calls of one handle that wait for a board's turn run
//! together, as one transaction, when the turn comes.
//!
//! Within a process the board's queue (see `queue`) lets one transaction
//! of a call's own run at a time. Processes share no queue: theirs meet on
//! the server, where two transactions that write the board's histogram
//! conflict and one of them is rerun. So when a call finds its board's
//! turn taken, it does not wait to run alone: it leaves its write in the
//! board's group and waits for a reply. The next call to get the turn
//! takes every call waiting there with the same options (each on a player
//! of its own) and runs them as one transaction, in a task of its own that
//! no caller can cut:
//!
//! 1. one `find` of the players by `_id` (on the primary, outside the
//!    transaction: inserts need none);
//! 2. one ordered `bulkWrite` (MongoDB 8.0+, the transaction's first
//!    command): the histogram's write of each score's net change (array
//!    layout: one rewrite of the board; documents layout: one update per
//!    score, the board's marker and the removal of emptied scores), then
//!    each player's write, guarded by the board and score the `find` read
//!    (`{_id, board, score}`);
//! 3. `commitTransaction`.
//!
//! Three round trips for the group however many calls it holds, and the
//! histogram is held (written, not yet committed) for one round trip
//! only: a transaction of another process that meets it then fails at its
//! first command, having written nothing, and is rerun after the driver's
//! backoff, instead of conflicting at its second command after its
//! snapshot went stale. A guard that matches nothing (the player changed
//! between the `find` and the transaction) reruns the transaction with a
//! new `find`; a histogram write conflict reruns it with the same one
//! (the guards check it).
//!
//! Each call gets its own result: `false` when no player matched its
//! filter (at the `find`), `true` once the transaction committed. A
//! statement that fails for one call (a score the histogram lacks, a
//! duplicate `_id`, a damaged board), a player that is on another board
//! than the one its filter's hint named, or a server without `bulkWrite`,
//! aborts the group's transaction (nothing of it is stored) and sends
//! each call back to run alone, as it would have without a group: its
//! error is then exactly the one it would have met. An error of the
//! transaction itself (`Contended`, `OutcomeUnknown` after a lost commit,
//! `Unavailable`) is every call's: the group is never run again call by
//! call after its commit was sent, so an unknown outcome is not doubled.
//!
//! A call dropped while it waits leaves the group (nothing of it is
//! written); once a turn took it, it is written with the group or not at
//! all, whether or not its caller still waits. The turn's own caller may
//! be dropped too: the group runs on.
//!
//! Which calls group: `insert`, and `update_score` and `delete` whose
//! filter is `{_id: value}` (a string, an integer, an `ObjectId`, binary)
//! with a known board (see `queue`'s hints), in a session of the call's
//! own, where `bulkWrite` may be a transaction's first command. Others
//! wait for the turn and run alone, as before.

use std::collections::HashMap;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{
    BulkWriteOptions, DeleteOneModel, InsertOneModel, UpdateModifications, UpdateOneModel,
    WriteModel,
};
use mongodb::results::VerboseBulkWriteResult;
use mongodb::ClientSession;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::documents::group_statements;
use super::pending::{key, player_key, Op, Pending, Reply};
use super::queue::{Joined, Turn, Waiting};
use super::send::{first_failed, learnt_no_bulk_write, refused_bulk_write};
use super::write::Statement;
use super::{array, Layout, RankHistogram, Ranks};
use crate::action::Options;
use crate::error::code::{DUPLICATE_KEY, WRITE_CONFLICT};
use crate::error::{server_codes, Error, Result};
use crate::transaction::{options, to_driver};

/// The most calls one group runs.
const MOST: usize = 256;
/// Reruns after a guard found its player changed, before the group's calls
/// run alone.
const STALE: usize = 4;

/// A grouped call's outcome, for `txn`.
pub(super) enum Grouped {
    Done(Result<bool>),
    /// The board was free: run alone, with its turn.
    Turn(Turn),
    /// Run alone, waiting for the turn.
    Alone,
}

/// The `_id` of a filter that is `{_id: value}` alone, with a value a group
/// can look up.
pub(super) fn only_id(filter: &Document) -> Option<&Bson> {
    match (filter.len(), filter.get("_id")) {
        (1, Some(id)) if player_key(id).is_some() => Some(id),
        _ => None,
    }
}

/// What the attempts of a group's transaction share.
#[derive(Default)]
struct State {
    /// The players the last `find` read, by `_id`.
    read: Option<HashMap<Vec<u8>, Document>>,
    stashed: Option<Error>,
    /// The calls must run alone (nothing of the group stored).
    alone: bool,
    stale: usize,
    count: usize,
    /// When the last attempt started.
    started: Option<std::time::Instant>,
}

/// Where each statement of the group's `bulkWrite` comes from.
enum Sent {
    /// A histogram statement: must match (array layout) or not.
    Histogram {
        must_match: bool,
    },
    /// A player's update or delete: must match one document.
    Player,
    Insert,
}

impl<T: RankHistogram> Ranks<T> {
    /// Whether a call of `o` can be grouped: `bulkWrite` usable as a
    /// transaction's first command.
    pub(super) fn groups(&self, o: &Options) -> bool {
        self.bulk_command == "bulkWrite" && self.combines(o)
    }

    /// `op` (of options `o`) on `board`: the board's turn when it is free,
    /// otherwise run with the others waiting when the turn comes.
    pub(super) async fn grouped(&self, board: &Bson, op: Op, o: &Options) -> Grouped {
        let name = match op {
            Op::Insert { .. } => "insert",
            Op::Update { .. } => "update_score",
            Op::Delete { .. } => "delete",
        };
        let (tx, mut rx) = oneshot::channel();
        let entry = |id| Pending {
            id,
            op,
            opts: o.clone(),
            reply: tx,
        };
        let reply = match self.queues.join(board, entry) {
            Joined::Free(turn) => return Grouped::Turn(turn),
            Joined::Lead(turn, waiting) => {
                self.start_group(board, &waiting, turn);
                let r = rx.await;
                drop(waiting);
                r
            }
            Joined::Wait(waiting) => {
                let r = tokio::select! {
                    biased;
                    r = &mut rx => r,
                    turn = waiting.turn() => {
                        self.start_group(board, &waiting, turn);
                        rx.await
                    }
                };
                drop(waiting);
                r
            }
        };
        match reply {
            Ok(Reply::Done(r)) => Grouped::Done(r),
            Ok(Reply::Alone) => Grouped::Alone,
            // The group's task ended without a reply: the runtime shut down.
            Err(_) => Grouped::Done(Err(crate::task::shut_down(name))),
        }
    }

    /// With the board's `turn`, runs the group `waiting` is in, as a task of
    /// its own, unless another turn took it already.
    fn start_group(&self, board: &Bson, waiting: &Waiting, turn: Turn) {
        match waiting.take(MOST) {
            Some(group) => {
                let (this, board) = (self.clone(), board.clone());
                tokio::spawn(this.lead(board, group, turn).in_current_span());
            }
            // Another turn took this call: its reply is on the way.
            None => drop(turn),
        }
    }

    /// Runs `group` on `board` in one transaction, holding `turn`, and
    /// replies to each call.
    async fn lead(self, board: Bson, group: Vec<Pending>, turn: Turn) {
        let o = group[0].opts.clone();
        let outcome = self.run_group(&board, &group, &o).await;
        if let Ok(Some(done)) = &outcome {
            // The next call with one of these filters joins this board's
            // group without reading the player's board first.
            for (p, d) in group.iter().zip(done) {
                let id = match &p.op {
                    Op::Insert { player, .. } => player.get("_id"),
                    Op::Update { id, .. } => Some(id),
                    Op::Delete { .. } => None,
                };
                if let (Some(id), Some(true)) = (id, d) {
                    self.queues.learn(&doc! {"_id": id.clone()}, &board);
                }
            }
        }
        for (i, p) in group.into_iter().enumerate() {
            let reply = match &outcome {
                Ok(Some(done)) => match done[i] {
                    Some(found) => Reply::Done(Ok(found)),
                    None => Reply::Alone,
                },
                Ok(None) => Reply::Alone,
                Err(e) => Reply::Done(Err(e.clone())),
            };
            // A caller that stopped waiting gets nothing.
            let _ = p.reply.send(reply);
        }
        drop(turn);
    }

    /// The group's transaction, through the driver's `and_run` (its
    /// reruns, backoff, commit retries and 120 s bound): each call's
    /// result (`None`: run it alone), or `None` when every call must run
    /// alone (nothing was stored), or the transaction's error.
    async fn run_group(
        &self,
        board: &Bson,
        group: &[Pending],
        o: &Options,
    ) -> Result<Option<Vec<Option<bool>>>> {
        let mut session = self
            .db
            .client()
            .start_session()
            .causal_consistency(false)
            .await?;
        let inside = o.clone().in_transaction();
        let mut state = State::default();
        let result = session
            .start_transaction()
            .with_options(options(o))
            .and_run(
                (self, board, group, &inside, &mut state),
                |s, (this, board, group, inside, state)| {
                    Box::pin(this.group_attempt(board, group, inside, s, state))
                },
            )
            .await;
        if let (Ok(_), Some(started)) = (&result, state.started) {
            self.queues.won(started.elapsed());
        }
        if state.alone && result.is_err() {
            return Ok(None);
        }
        let name = match group[0].op {
            Op::Insert { .. } => "insert",
            Op::Update { .. } => "update_score",
            Op::Delete { .. } => "delete",
        };
        crate::transaction::outcome(result, state.stashed, state.count, name).map(Some)
    }

    /// One attempt of the group's transaction in `s`; errors as the
    /// driver's, for `and_run` to read their labels.
    async fn group_attempt(
        &self,
        board: &Bson,
        group: &[Pending],
        inside: &Options,
        s: &mut ClientSession,
        state: &mut State,
    ) -> mongodb::error::Result<Vec<Option<bool>>> {
        state.count += 1;
        if let Some(pause) = self.queues.pause(state.count) {
            tokio::time::sleep(pause).await;
        }
        state.started = Some(std::time::Instant::now());
        self.group_once(board, group, inside, s, state)
            .await
            .map_err(|e| {
                if conflict(&e) {
                    self.queues.conflicted();
                    self.queues.lost();
                }
                to_driver(e, &mut state.stashed)
            })
    }

    async fn group_once(
        &self,
        board: &Bson,
        group: &[Pending],
        o: &Options,
        s: &mut ClientSession,
        state: &mut State,
    ) -> Result<Vec<Option<bool>>> {
        // The players are read once per group, whatever the reruns.
        let read = match state.read.take() {
            Some(read) => read,
            None => self.read_players(group, o).await?,
        };
        let read = &*state.read.insert(read);
        let mut done = Vec::with_capacity(group.len());
        let mut hist: Vec<Statement> = Vec::new();
        let mut players: Vec<WriteModel> = Vec::new();
        let mut sent: Vec<Sent> = Vec::new();
        let mut player_sent: Vec<Sent> = Vec::new();
        // The net change of each score, in order of first mention.
        let mut nets: Vec<(Bson, i64)> = Vec::new();
        let source = self.source.namespace();
        for p in group {
            let (dec, inc, model) = match &p.op {
                Op::Insert { player, score } => {
                    let insert = InsertOneModel::builder()
                        .namespace(source.clone())
                        .document(player.clone())
                        .build();
                    (None, Some(score.clone()), (insert.into(), Sent::Insert))
                }
                Op::Update { id, .. } | Op::Delete { id } => {
                    let found = player_key(id).and_then(|k| read.get(&k));
                    let Some(found) = found else {
                        done.push(Some(false));
                        continue;
                    };
                    let Some((guard, dec)) = self.guard(found, board) else {
                        done.push(None);
                        continue;
                    };
                    let (inc, model) = match &p.op {
                        Op::Update { stored, number, .. } => {
                            let set = doc! {"$set": {self.spec.score: stored.clone()}};
                            let update = UpdateOneModel::builder()
                                .namespace(source.clone())
                                .filter(guard)
                                .update(UpdateModifications::Document(set))
                                .build();
                            (Some(number.clone()), update.into())
                        }
                        _ => {
                            let delete = DeleteOneModel::builder()
                                .namespace(source.clone())
                                .filter(guard)
                                .build();
                            (None, delete.into())
                        }
                    };
                    (Some(dec), inc, (model, Sent::Player))
                }
            };
            for (s, by) in [(dec, -1), (inc, 1)] {
                if let Some(s) = s {
                    net(&mut nets, s, by);
                }
            }
            players.push(model.0);
            player_sent.push(model.1);
            done.push(Some(true));
        }
        if players.is_empty() {
            // Nothing to write: the transaction commits nothing.
            return Ok(done);
        }
        nets.retain(|(_, by)| *by != 0);
        match self.spec.layout {
            Layout::Array if !nets.is_empty() => {
                hist.push(array::group_statement(board, &nets, self.spec.descending));
                sent.push(Sent::Histogram { must_match: true });
            }
            Layout::Array => {}
            Layout::Documents => {
                for st in group_statements(board, &nets) {
                    hist.push(st);
                    sent.push(Sent::Histogram { must_match: false });
                }
            }
        }
        let ns = self.hist.namespace();
        let mut models: Vec<WriteModel> = hist.into_iter().map(|st| st.model(&ns)).collect();
        models.extend(players);
        sent.extend(player_sent);
        let mut b = BulkWriteOptions::default();
        b.ordered = Some(true);
        b.comment = o.comment.clone();
        let written = self
            .db
            .client()
            .bulk_write(models)
            .with_options(b)
            .verbose_results()
            .session(&mut *s)
            .await;
        match written {
            Ok(r) => self.check_group(&r, &sent, state).map(|()| done),
            Err(e) if refused_bulk_write(&e) => {
                learnt_no_bulk_write(self);
                Err(alone(state))
            }
            Err(e) => match first_failed(e) {
                Ok((i, e)) => {
                    let code = server_codes(&e).first().copied().unwrap_or_default();
                    let histogram = matches!(sent.get(i), Some(Sent::Histogram { .. }));
                    if code == WRITE_CONFLICT {
                        // Another transaction holds what this one writes.
                        Err(Error::Raced(e))
                    } else if code == DUPLICATE_KEY && histogram && state.stale + 1 < STALE {
                        // A lost upsert race (or a full array board, which
                        // the calls alone then report).
                        state.stale += 1;
                        Err(Error::Raced(e))
                    } else {
                        // Concerns one call (a score the histogram lacks, a
                        // damaged board, a duplicate player).
                        Err(alone(state))
                    }
                }
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Whether every statement of the group did what it must: a histogram
    /// statement of the array layout matched the board (otherwise a score
    /// is missing: the calls run alone to say which), a player's guard
    /// matched (otherwise the player changed since it was read: run again
    /// after another read).
    fn check_group(
        &self,
        r: &VerboseBulkWriteResult,
        sent: &[Sent],
        state: &mut State,
    ) -> Result<()> {
        for (i, s) in sent.iter().enumerate() {
            let ok = match s {
                Sent::Histogram { must_match: false } | Sent::Insert => true,
                Sent::Histogram { must_match: true } => r
                    .update_results
                    .get(&i)
                    .is_some_and(|u| u.matched_count > 0 || u.upserted_id.is_some()),
                Sent::Player => {
                    r.update_results
                        .get(&i)
                        .is_some_and(|u| u.matched_count == 1)
                        || r.delete_results
                            .get(&i)
                            .is_some_and(|d| d.deleted_count == 1)
                }
            };
            if ok {
                continue;
            }
            if matches!(s, Sent::Player) {
                state.read = None;
                state.stale += 1;
                if state.stale < STALE {
                    return Err(Error::Raced(mongodb::error::Error::custom(
                        "a player changed since the group read it",
                    )));
                }
            }
            return Err(alone(state));
        }
        Ok(())
    }

    /// The guard of a player's write: its `_id`, board and score as read;
    /// and its score on the histogram. `None` when it is on another board
    /// than `board`, or cannot be read as a player.
    fn guard(&self, found: &Document, board: &Bson) -> Option<(Document, Bson)> {
        let player: T = crate::compat::from_document(found.clone()).ok()?;
        let on = self.board_bson(player.board()).ok()?;
        if key(&on) != key(board) {
            return None;
        }
        let dec = self.score_bson(player.score()).ok()?;
        let guard = doc! {
            "_id": found.get("_id")?.clone(),
            self.spec.board: found.get(self.spec.board)?.clone(),
            self.spec.score: found.get(self.spec.score)?.clone(),
        };
        Some((guard, dec))
    }

    /// The players the group's updates and deletes name, by `_id`: one
    /// `find` on the primary (none when there are only inserts).
    async fn read_players(
        &self,
        group: &[Pending],
        o: &Options,
    ) -> Result<HashMap<Vec<u8>, Document>> {
        let ids: Vec<Bson> = group
            .iter()
            .filter_map(|p| match &p.op {
                Op::Update { id, .. } | Op::Delete { id } => Some(id.clone()),
                Op::Insert { .. } => None,
            })
            .collect();
        let mut found = HashMap::new();
        if ids.is_empty() {
            return Ok(found);
        }
        let players = self.source.clone_with_type::<Document>();
        let find = players
            .find(doc! {"_id": {"$in": ids}})
            .with_options(o.deciding::<mongodb::options::FindOptions>());
        let docs: Vec<Document> = find.await?.try_collect().await?;
        for d in docs {
            if let Some(k) = d.get("_id").and_then(player_key) {
                found.insert(k, d);
            }
        }
        Ok(found)
    }
}

/// Whether `e` is a write conflict with another transaction.
pub(super) fn conflict(e: &Error) -> bool {
    match e {
        Error::Raced(m) | Error::Database(m) | Error::Unavailable(m) => {
            server_codes(m).contains(&WRITE_CONFLICT)
        }
        _ => false,
    }
}

/// Adds `by` to `score`'s net change.
fn net(nets: &mut Vec<(Bson, i64)>, score: Bson, by: i64) {
    match nets.iter_mut().find(|(s, _)| *s == score) {
        Some((_, n)) => *n += by,
        None => nets.push((score, by)),
    }
}

/// The group's calls run alone: its transaction is aborted.
fn alone(state: &mut State) -> Error {
    state.alone = true;
    Error::invalid("group", "a call of the group runs alone")
}
