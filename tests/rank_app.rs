//! The rank histogram inside an application: the caller's sessions and
//! transactions, options per operation and per repository, collection
//! names at run time. Every effect is checked with the raw driver.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::action::Options;
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::options::{
    ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongo_patterns::prelude::*;
use mongo_patterns::rank_histogram::{Layout, RankHistogram};
use mongo_patterns::Error;
use mongo_patterns_testkit::{bounded, fresh_db, Commands};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "app_scores")]
#[rank_histogram(precision = 0.5)]
struct ExamScore {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "app_scores_docs")]
#[rank_histogram(precision = 0.5, layout = "documents")]
struct ExamScoreDocs {
    #[serde(rename = "_id")]
    student: String,
    exam_id: String,
    score: f64,
}

trait Exam: RankHistogram<Board = String, Score = f64> + Clone {
    fn new(student: &str, exam: &str, score: f64) -> Self;
}

impl Exam for ExamScore {
    fn new(student: &str, exam: &str, score: f64) -> Self {
        ExamScore {
            student: student.into(),
            exam_id: exam.into(),
            score,
        }
    }
}

impl Exam for ExamScoreDocs {
    fn new(student: &str, exam: &str, score: f64) -> Self {
        ExamScoreDocs {
            student: student.into(),
            exam_id: exam.into(),
            score,
        }
    }
}

/// The board's counts as stored, read with the raw driver: score → count
/// (counts of 0 skipped).
async fn stored<T: Exam>(ranks: &Ranks<T>, board: &str) -> Vec<(f64, i64)> {
    let hist = ranks.histogram_collection();
    let mut out = Vec::new();
    match T::RANK.layout {
        Layout::Array => {
            if let Some(d) = hist.find_one(doc! {"_id": board}).await.unwrap() {
                for e in d.get_array("scores").unwrap() {
                    let e = e.as_document().unwrap();
                    out.push((e.get_f64("score").unwrap(), e.get_i64("count").unwrap()));
                }
            }
        }
        Layout::Documents => {
            let docs: Vec<Document> = hist
                .find(doc! {"_id.b": board})
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            for d in docs {
                let id = d.get_document("_id").unwrap();
                let c = d.get_i64("count").unwrap();
                if let (Some(Bson::Double(s)), true) = (id.get("s"), c != 0) {
                    out.push((*s, c));
                }
            }
        }
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out
}

/// A player's score as stored, with the raw driver.
async fn score_of<T: Exam>(ranks: &Ranks<T>, student: &str) -> Option<f64> {
    ranks
        .collection()
        .clone_with_type::<Document>()
        .find_one(doc! {"_id": student})
        .await
        .unwrap()
        .map(|d| d.get_f64("score").unwrap())
}

async fn caller_transaction<T: Exam>(name: &str, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    bounded(30, async {
        ranks.insert(&T::new("p1", "b", 10.0)).await.unwrap();
        let before = stored(&ranks, "b").await;
        assert_eq!(before, vec![(10.0, 1)]);

        // Aborted: neither the player nor the board changes.
        let mut s = db.client().start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        let hit = ranks
            .update_score(doc! {"_id": "p1"}, 20.0)
            .session(&mut s)
            .await
            .unwrap();
        assert!(hit);
        ranks.record("b", 30.0).session(&mut s).await.unwrap();
        ranks
            .insert(&T::new("p2", "b", 40.0))
            .session(&mut s)
            .await
            .unwrap();
        // Reads in the transaction see its writes; outside, nothing yet.
        let inside = ranks.rank("b", 20.0).session(&mut s).await.unwrap();
        assert_eq!((inside.rank, inside.total), (3, 3), "{inside:?}");
        assert_eq!(stored(&ranks, "b").await, before);
        s.abort_transaction().await.unwrap();
        assert_eq!(stored(&ranks, "b").await, before);
        assert_eq!(score_of(&ranks, "p1").await, Some(10.0));
        assert_eq!(score_of(&ranks, "p2").await, None);

        // Committed: all of it is stored.
        s.start_transaction().await.unwrap();
        ranks
            .update_score(doc! {"_id": "p1"}, 20.0)
            .session(&mut s)
            .await
            .unwrap();
        ranks.record("b", 30.0).session(&mut s).await.unwrap();
        ranks
            .insert(&T::new("p2", "b", 40.0))
            .session(&mut s)
            .await
            .unwrap();
        assert_eq!(stored(&ranks, "b").await, before);
        s.commit_transaction().await.unwrap();
        assert_eq!(
            stored(&ranks, "b").await,
            vec![(40.0, 1), (30.0, 1), (20.0, 1)]
        );
        assert_eq!(score_of(&ranks, "p1").await, Some(20.0));
        assert_eq!(score_of(&ranks, "p2").await, Some(40.0));

        // A session without a transaction: `update_score` runs its own in
        // it, and `delete` too; both are committed.
        assert!(ranks
            .delete(doc! {"_id": "p2"})
            .session(&mut s)
            .await
            .unwrap());
        assert_eq!(stored(&ranks, "b").await, vec![(30.0, 1), (20.0, 1)]);
        assert_eq!(score_of(&ranks, "p2").await, None);
    })
    .await;
}

#[tokio::test]
async fn caller_transaction_array() {
    caller_transaction::<ExamScore>("rank_app_txn_array", true).await;
}

#[tokio::test]
async fn caller_transaction_documents() {
    caller_transaction::<ExamScoreDocs>("rank_app_txn_docs", true).await;
}

#[tokio::test]
async fn caller_transaction_documents_fallback() {
    caller_transaction::<ExamScoreDocs>("rank_app_txn_docs_fb", false).await;
}

/// In a caller's transaction, `unrecord` or `change` of a score nobody
/// holds, or on a board never written, fails with `ScoreNotFound` or
/// `UnknownBoard` and leaves the transaction going: the caller's next
/// statement and its commit succeed, and what the transaction wrote is
/// stored.
async fn not_found_leaves_the_callers_transaction_going<T: Exam>(name: &str, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    let other = db.collection::<Document>("app_other");
    bounded(30, async {
        ranks.record("b", 1.0).await.unwrap();
        let mut s = db.client().start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        let e = ranks.unrecord("b", 7.0).session(&mut s).await.unwrap_err();
        assert!(matches!(e, Error::ScoreNotFound { .. }), "{e:?}");
        assert!(!e.is_transient(), "{e:?}");
        other
            .insert_one(doc! {"_id": 1})
            .session(&mut s)
            .await
            .expect("the transaction goes on after unrecord's ScoreNotFound");
        let e = ranks
            .change("b", 7.0, 8.0)
            .session(&mut s)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::ScoreNotFound { .. }), "{e:?}");
        let e = ranks
            .unrecord("never", 1.0)
            .session(&mut s)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::UnknownBoard { .. }), "{e:?}");
        ranks.change("b", 1.0, 2.0).session(&mut s).await.unwrap();
        other
            .insert_one(doc! {"_id": 2})
            .session(&mut s)
            .await
            .expect("the transaction goes on after change's ScoreNotFound");
        s.commit_transaction()
            .await
            .expect("the transaction commits");
        assert_eq!(other.count_documents(doc! {}).await.unwrap(), 2);
        assert_eq!(stored(&ranks, "b").await, vec![(2.0, 1)]);
    })
    .await;
}

#[tokio::test]
async fn not_found_leaves_the_callers_transaction_going_array() {
    not_found_leaves_the_callers_transaction_going::<ExamScore>("rank_app_nf_array", true).await;
}

#[tokio::test]
async fn not_found_leaves_the_callers_transaction_going_documents() {
    not_found_leaves_the_callers_transaction_going::<ExamScoreDocs>("rank_app_nf_docs", true).await;
}

#[tokio::test]
async fn not_found_leaves_the_callers_transaction_going_documents_fallback() {
    not_found_leaves_the_callers_transaction_going::<ExamScoreDocs>("rank_app_nf_docs_fb", false)
        .await;
}

/// A second session's open transaction writes the same board: the caller's
/// write conflicts, the error is transient, and the caller's `and_run2`
/// (with `?` on the pattern's calls) runs the transaction again and commits.
async fn write_conflict_is_retried<T: Exam>(name: &str, bulk: bool) {
    let (db, _) = fresh_db(name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    bounded(60, async {
        ranks.insert(&T::new("p1", "b", 10.0)).await.unwrap();

        // The conflict itself, seen by the caller.
        let mut a = db.client().start_session().await.unwrap();
        let mut b = db.client().start_session().await.unwrap();
        b.start_transaction().await.unwrap();
        ranks.record("b", 10.0).session(&mut b).await.unwrap();
        a.start_transaction().await.unwrap();
        let err = ranks
            .update_score(doc! {"_id": "p1"}, 12.0)
            .session(&mut a)
            .await
            .unwrap_err();
        assert!(err.is_transient(), "{err:?}");
        let _ = a.abort_transaction().await;
        b.abort_transaction().await.unwrap();
        let err = {
            b.start_transaction().await.unwrap();
            ranks.record("b", 10.0).session(&mut b).await.unwrap();
            a.start_transaction().await.unwrap();
            ranks.record("b", 10.0).session(&mut a).await.unwrap_err()
        };
        assert!(err.is_transient(), "record: {err:?}");
        let _ = a.abort_transaction().await;
        b.abort_transaction().await.unwrap();
        assert_eq!(stored(&ranks, "b").await, vec![(10.0, 1)]);

        // The caller's retry loop.
        let attempts = AtomicUsize::new(0);
        let b = tokio::sync::Mutex::new(b);
        a.start_transaction()
            .and_run2(async |s| {
                let n = attempts.fetch_add(1, Ordering::SeqCst);
                let mut other = b.lock().await;
                if n == 0 {
                    other.start_transaction().await?;
                    // What the caller's transaction is about to write.
                    ranks.record("b", 12.0).session(&mut other).await?;
                } else if n == 1 {
                    other.commit_transaction().await?;
                }
                drop(other);
                ranks
                    .update_score(doc! {"_id": "p1"}, 12.0)
                    .session(s)
                    .await?;
                ranks.record("b", 60.0).session(s).await?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        assert_eq!(stored(&ranks, "b").await, vec![(60.0, 1), (12.0, 2)]);
        assert_eq!(score_of(&ranks, "p1").await, Some(12.0));
    })
    .await;
}

#[tokio::test]
async fn write_conflict_is_retried_array() {
    write_conflict_is_retried::<ExamScore>("rank_app_conflict_array", true).await;
}

#[tokio::test]
async fn write_conflict_is_retried_documents() {
    write_conflict_is_retried::<ExamScoreDocs>("rank_app_conflict_docs", true).await;
}

#[tokio::test]
async fn write_conflict_is_retried_documents_fallback() {
    write_conflict_is_retried::<ExamScoreDocs>("rank_app_conflict_docs_fb", false).await;
}

/// The write commands `commands` saw, by name, without the session's own.
fn writes(commands: &Commands) -> Vec<(String, Document)> {
    commands
        .take()
        .into_iter()
        .filter(|(n, _)| {
            ["update", "delete", "insert", "bulkWrite", "findAndModify"].contains(&n.as_str())
        })
        .collect()
}

fn int(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        _ => None,
    }
}

fn w_of(cmd: &Document) -> Option<Bson> {
    cmd.get_document("writeConcern")
        .ok()
        .and_then(|wc| wc.get("w").cloned())
}

/// Names of the commands of a write of `layout` (`bulk` or not), outside
/// a transaction: `call` is `"record"`, `"change"` (to a new score) or
/// `"unrecord"`. Without `bulkWrite`, a statement each: `change` checks
/// the new score, takes one off the old, removes it if emptied and adds
/// one at the new; `unrecord` takes one off, keeps the board's marker and
/// removes an emptied score.
fn histogram_write(layout: Layout, bulk: bool, call: &str) -> Vec<&'static str> {
    match (layout, bulk, call) {
        (Layout::Array, _, _) => vec!["update"],
        (Layout::Documents, true, _) => vec!["bulkWrite"],
        (Layout::Documents, false, "change") => vec!["update", "update", "delete", "update"],
        (Layout::Documents, false, "unrecord") => vec!["update", "update", "delete"],
        (Layout::Documents, false, _) => vec!["update"],
    }
}

async fn options_reach_commands<T: Exam>(name: &str, bulk: bool) {
    let (db, commands) = fresh_db(name).await;
    // A server before 8.0 refuses `bulkWrite`: there the repository is
    // built without it, and the commands are the fallback's.
    let bulk = bulk && mongo_patterns_testkit::takes_bulk_write(db.client(), name).await;
    let ranks = T::ranks(&db).bulk_write(bulk);
    let layout = T::RANK.layout;
    bounded(60, async {
        ranks.record("b", 1.0).await.unwrap();
        commands.take();

        // w: "majority", comment and maxTimeMS on every histogram write.
        let t = Duration::from_millis(4_321);
        for (i, call) in ["record", "change", "unrecord"].into_iter().enumerate() {
            let r = match i {
                0 => {
                    ranks
                        .record("b", 2.0)
                        .write_concern(WriteConcern::majority())
                        .comment("c")
                        .max_time(t)
                        .await
                }
                1 => {
                    ranks
                        .change("b", 2.0, 3.0)
                        .write_concern(WriteConcern::majority())
                        .comment("c")
                        .max_time(t)
                        .await
                }
                _ => {
                    ranks
                        .unrecord("b", 3.0)
                        .write_concern(WriteConcern::majority())
                        .comment("c")
                        .max_time(t)
                        .await
                }
            };
            r.unwrap();
            let sent = writes(&commands);
            let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, histogram_write(layout, bulk, call), "{call}");
            for (n, cmd) in &sent {
                assert_eq!(
                    w_of(cmd),
                    Some(Bson::String("majority".into())),
                    "{n}: {cmd}"
                );
                assert_eq!(cmd.get_str("comment").ok(), Some("c"), "{n}: {cmd}");
                // The driver's retryable writes carry no `maxTimeMS`.
                assert!(cmd.get("maxTimeMS").is_none(), "{n}: {cmd}");
            }
        }
        assert_eq!(stored(&ranks, "b").await, vec![(1.0, 1)]);

        // w: 0: the driver refuses an unacknowledged write concern on the
        // writes it sends itself, as every histogram write is, before
        // sending anything.
        let refused = [
            ranks
                .record("b", 5.0)
                .write_concern(WriteConcern::nodes(0))
                .await,
            ranks
                .change("b", 1.0, 6.0)
                .write_concern(WriteConcern::nodes(0))
                .await,
        ];
        for r in refused {
            let e = r.unwrap_err();
            assert!(
                format!("{e:?}").to_lowercase().contains("unacknowledged"),
                "{e:?}"
            );
        }
        let sent = writes(&commands);
        assert!(sent.is_empty(), "{sent:?}");
        assert_eq!(stored(&ranks, "b").await, vec![(1.0, 1)]);
        commands.take();

        // Reads: read concern, read preference, comment, maxTimeMS.
        let pref =
            SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred { options: None });
        for i in 0..3 {
            let rc = ReadConcern::majority();
            let ok = match i {
                0 => ranks
                    .rank("b", 1.0)
                    .read_concern(rc)
                    .selection_criteria(pref.clone())
                    .comment("r")
                    .max_time(t)
                    .await
                    .is_ok(),
                1 => ranks
                    .top("b", 2)
                    .read_concern(rc)
                    .selection_criteria(pref.clone())
                    .comment("r")
                    .max_time(t)
                    .await
                    .is_ok(),
                _ => ranks
                    .histogram("b")
                    .read_concern(rc)
                    .selection_criteria(pref.clone())
                    .comment("r")
                    .max_time(t)
                    .await
                    .is_ok(),
            };
            assert!(ok);
            let sent = commands.take();
            let (n, cmd) = &sent[0];
            assert!(n == "aggregate" || n == "find", "{n}");
            assert_eq!(
                cmd.get_document("$readPreference")
                    .ok()
                    .and_then(|p| p.get_str("mode").ok()),
                Some("secondaryPreferred"),
                "{n}: {cmd}"
            );
            assert_eq!(
                cmd.get_document("readConcern")
                    .ok()
                    .and_then(|p| p.get_str("level").ok()),
                Some("majority"),
                "{n}: {cmd}"
            );
            assert_eq!(cmd.get_str("comment").ok(), Some("r"), "{n}: {cmd}");
            assert_eq!(
                cmd.get("maxTimeMS").and_then(int),
                Some(4_321),
                "{n}: {cmd}"
            );
        }

        // The transactional writes: the write concern goes with the commit,
        // comment and the bound with the player's command.
        let p = T::new("p1", "b", 7.0);
        ranks
            .insert(&p)
            .write_concern(WriteConcern::majority())
            .comment("t")
            .await
            .unwrap();
        let sent = commands.take();
        let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
        // One cross-collection `bulkWrite` carries both writes when allowed.
        let mut expect = vec!["bulkWrite"];
        if !bulk {
            expect = vec!["insert"];
            expect.extend(histogram_write(layout, bulk, "record"));
        }
        expect.push("commitTransaction");
        assert_eq!(names, expect);
        for (n, cmd) in &sent {
            if n == "commitTransaction" {
                assert_eq!(w_of(cmd), Some(Bson::String("majority".into())), "{cmd}");
            } else {
                assert!(cmd.get("writeConcern").is_none(), "{n}: {cmd}");
                assert_eq!(cmd.get_str("comment").ok(), Some("t"), "{n}: {cmd}");
            }
        }
        ranks
            .update_score(doc! {"_id": "p1"}, 8.0)
            .max_time(t)
            .await
            .unwrap();
        let sent = commands.take();
        let fam = sent.iter().find(|(n, _)| n == "findAndModify").unwrap();
        assert_eq!(
            fam.1.get("maxTimeMS").and_then(int),
            Some(4_321),
            "{}",
            fam.1
        );
        let commit = sent.iter().find(|(n, _)| n == "commitTransaction").unwrap();
        assert_eq!(
            commit.1.get("maxTimeMS").and_then(int),
            Some(4_321),
            "{}",
            commit.1
        );
        // A transaction with w: 0 is refused by the driver: nothing stored.
        let e = ranks
            .update_score(doc! {"_id": "p1"}, 9.0)
            .write_concern(WriteConcern::nodes(0))
            .await
            .unwrap_err();
        assert!(
            format!("{e:?}").to_lowercase().contains("unacknowledged"),
            "{e:?}"
        );
        assert_eq!(score_of(&ranks, "p1").await, Some(8.0));
        let stored_now = stored(&ranks, "b").await;
        assert!(stored_now.contains(&(8.0, 1)), "{stored_now:?}");
        assert!(!stored_now.contains(&(9.0, 1)), "{stored_now:?}");
        commands.take();

        // Repository defaults, overridden field by field by the action.
        let d = ranks.clone().with_options(
            Options::new()
                .write_concern(WriteConcern::majority())
                .comment("default"),
        );
        d.record("b", 1.0).await.unwrap();
        d.record("b", 1.0).comment("own").await.unwrap();
        let sent = writes(&commands);
        assert_eq!(
            sent.len(),
            2 * histogram_write(layout, bulk, "record").len()
        );
        let first = &sent[0].1;
        let last = &sent[sent.len() - 1].1;
        assert_eq!(first.get_str("comment").ok(), Some("default"), "{first}");
        assert_eq!(last.get_str("comment").ok(), Some("own"), "{last}");
        for (_, cmd) in &sent {
            assert_eq!(w_of(cmd), Some(Bson::String("majority".into())), "{cmd}");
        }
        // Without options, a `run_command` write sends the database's
        // write concern, which it would not inherit.
        let db_w = db.client().database_with_options(
            db.name(),
            mongo_patterns::mongodb::options::DatabaseOptions::builder()
                .write_concern(WriteConcern::majority())
                .build(),
        );
        let inherit = T::ranks(&db_w).bulk_write(bulk);
        inherit.record("b", 1.0).await.unwrap();
        let sent = writes(&commands);
        for (n, cmd) in &sent {
            assert_eq!(
                w_of(cmd),
                Some(Bson::String("majority".into())),
                "{n}: {cmd}"
            );
        }
        // Inside a caller's transaction no write concern is sent; a
        // session's own transaction (no transaction open) commits with it.
        let mut s = db.client().start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        d.record("b", 1.0).session(&mut s).await.unwrap();
        s.commit_transaction().await.unwrap();
        for (n, cmd) in writes(&commands) {
            assert!(cmd.get("writeConcern").is_none(), "{n}: {cmd}");
            assert!(cmd.get("txnNumber").is_some(), "{n}: {cmd}");
        }
        d.update_score(doc! {"_id": "p1"}, 7.5)
            .session(&mut s)
            .await
            .unwrap();
        let sent = commands.take();
        let commit = sent.iter().find(|(n, _)| n == "commitTransaction").unwrap();
        assert_eq!(w_of(&commit.1), Some(Bson::String("majority".into())));
        assert_eq!(commit.1.get_document("lsid").ok(), Some(s.id()));
    })
    .await;
}

#[tokio::test]
async fn options_reach_commands_array() {
    options_reach_commands::<ExamScore>("rank_app_opts_array", true).await;
}

#[tokio::test]
async fn options_reach_commands_documents() {
    options_reach_commands::<ExamScoreDocs>("rank_app_opts_docs", true).await;
}

#[tokio::test]
async fn options_reach_commands_documents_fallback() {
    options_reach_commands::<ExamScoreDocs>("rank_app_opts_docs_fb", false).await;
}

/// A `writeConcernError` is an error with the server's code, not a
/// success, and says the outcome is unknown: the write was applied, but
/// not as durably as asked, so it may not stay.
#[tokio::test]
async fn write_concern_errors_are_read() {
    for bulk in [true, false] {
        let (db, _) = fresh_db(&format!("rank_app_wce_{bulk}")).await;
        let ranks = ExamScoreDocs::ranks(&db).bulk_write(bulk);
        bounded(30, async {
            ranks.record("b", 1.0).await.unwrap();
            // One node cannot acknowledge w: 5.
            let wc = WriteConcern::builder()
                .w(mongo_patterns::mongodb::options::Acknowledgment::Nodes(5))
                .w_timeout(Duration::from_millis(100))
                .build();
            let e = ranks.record("b", 2.0).write_concern(wc).await.unwrap_err();
            use mongo_patterns::mongodb::error::{ErrorKind, WriteFailure};
            let kind = e.mongo().map(|m| &*m.kind);
            assert!(
                matches!(kind, Some(ErrorKind::Write(WriteFailure::WriteConcernError(w))) if w.code == 100),
                "bulk {bulk}: {e:?}"
            );
            // Applied, but not as durable as asked: it may not stay.
            assert!(
                matches!(e, Error::OutcomeUnknown { .. }) && !e.is_retryable(),
                "bulk {bulk}: {e:?}"
            );
            assert_eq!(e.code(), Some(100), "the driver's error kept");
            // The write itself was applied: w: 5 failed only to wait.
            let counts = stored(&ranks, "b").await;
            assert_eq!(counts, vec![(2.0, 1), (1.0, 1)], "bulk {bulk}");
        })
        .await;
    }
}

async fn tenants<T: Exam>(name: &str) {
    let (db, _) = fresh_db(name).await;
    let a = T::ranks(&db)
        .with_collection("tenant_a_players")
        .with_histogram_collection("tenant_a_ranks");
    let b = T::ranks(&db)
        .with_collection("tenant_b_players")
        .with_histogram_collection("tenant_b_ranks");
    assert_eq!(a.collection().name(), "tenant_a_players");
    assert_eq!(b.histogram_collection().name(), "tenant_b_ranks");
    let declared: Vec<String> = a.declared().iter().map(|d| format!("{d:?}")).collect();
    assert!(
        declared.iter().any(|d| d.contains("tenant_a_players")),
        "{declared:?}"
    );
    assert!(
        declared.iter().any(|d| d.contains("tenant_a_ranks")),
        "{declared:?}"
    );
    bounded(30, async {
        a.insert(&T::new("s1", "exam", 90.0)).await.unwrap();
        a.insert(&T::new("s2", "exam", 80.0)).await.unwrap();
        b.insert(&T::new("s1", "exam", 10.0)).await.unwrap();
        a.record("exam", 70.0).await.unwrap();
        assert_eq!(a.rank("exam", 80.0).await.unwrap().rank, 2);
        assert_eq!(a.rank("exam", 80.0).await.unwrap().total, 3);
        assert_eq!(b.rank("exam", 80.0).await.unwrap().rank, 1);
        assert_eq!(b.rank("exam", 80.0).await.unwrap().total, 1);
        assert!(b.update_score(doc! {"_id": "s1"}, 20.0).await.unwrap());
        assert_eq!(score_of(&a, "s1").await, Some(90.0));
        assert_eq!(score_of(&b, "s1").await, Some(20.0));
        assert_eq!(
            stored(&a, "exam").await,
            vec![(90.0, 1), (80.0, 1), (70.0, 1)]
        );
        assert_eq!(stored(&b, "exam").await, vec![(20.0, 1)]);
        assert_eq!(b.rebuild("exam").await.unwrap(), 1);
        assert_eq!(a.rebuild("exam").await.unwrap(), 2);
        assert_eq!(stored(&b, "exam").await, vec![(20.0, 1)]);
        // Nothing in the model's own collections.
        let names = db.list_collection_names().await.unwrap();
        assert!(!names.contains(&T::COLLECTION.to_string()), "{names:?}");
        assert!(!names.contains(&T::RANK.histogram.to_string()), "{names:?}");
    })
    .await;
}

#[tokio::test]
async fn tenants_array() {
    tenants::<ExamScore>("rank_app_tenants_array").await;
}

#[tokio::test]
async fn tenants_documents() {
    tenants::<ExamScoreDocs>("rank_app_tenants_docs").await;
}
