//! Errors as a caller meets them through the driver: a call refused
//! inside a transaction (not retried by `and_run2`), bucket removals that
//! join the caller's transaction, a
//! server's size refusal with the driver's code and labels kept, and our
//! error carried through `and_run2`'s driver error and back with its text.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::TryStreamExt;
use mongo_patterns::mongodb;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, client, fresh_db, FaultServer};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "err_ticks")]
#[bucket(size = 4, key = "sym")]
struct Tick {
    sym: String,
    n: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "err_logs")]
#[shard_key(coarse = "month", from = "ts", search = "type")]
struct Log {
    #[serde(rename = "_id")]
    id: i64,
    #[serde(rename = "type")]
    kind: String,
    ts: i64,
    msg: String,
}

fn tick(n: u32) -> Tick {
    Tick { sym: "s".into(), n }
}

/// A bucket `delete` inside `and_run2` with a filter it cannot translate:
/// refused with `InvalidArgument` before anything is sent, not retryable,
/// so `and_run2` gives up after one attempt instead of looping; the
/// driver's error it returns converts back to ours, whose text names the
/// operator.
#[tokio::test]
async fn a_refused_filter_in_a_transaction_is_not_retried() {
    let (db, _) = fresh_db("errors_more_remove").await;
    let repo = Tick::buckets(&db);
    bounded(30, Tick::ensure(&db)).await.unwrap();
    bounded(30, repo.push(&tick(1))).await.unwrap();
    let mut s = db.client().start_session().await.unwrap();
    let attempts = AtomicUsize::new(0);
    let run = s.start_transaction().and_run2(async |s| {
        attempts.fetch_add(1, Ordering::SeqCst);
        let matching = doc! {"n": {"$regex": "1"}};
        repo.delete("s", matching).session(s).await?;
        Ok(())
    });
    let driver = bounded(30, run).await.expect_err("refused");
    assert_eq!(attempts.load(Ordering::SeqCst), 1, "and_run2 ran it again");
    println!("the driver's error: {driver}");
    assert!(driver.get_custom::<Error>().is_some(), "{driver:?}");
    let ours = Error::from(driver);
    println!("converted back: {ours}");
    assert!(matches!(ours, Error::InvalidArgument { .. }), "{ours:?}");
    assert!(!ours.is_retryable());
    assert!(!ours.is_transient());
    assert_eq!(ours.code(), None);
    assert!(ours.to_string().contains("$regex"), "{ours}");
    // Nothing was removed.
    assert_eq!(bounded(30, repo.count("s")).await.unwrap(), 1);
}

/// `delete` and `reindex` in a transaction of the caller's own join it:
/// aborted, the removal goes with it; committed, it stays, with the push
/// made beside it.
#[tokio::test]
async fn a_removal_and_a_reindex_join_the_callers_transaction() {
    let (db, _) = fresh_db("errors_more_reindex").await;
    let repo = Tick::buckets(&db);
    bounded(30, Tick::ensure(&db)).await.unwrap();
    for n in 1..=5 {
        bounded(30, repo.push(&tick(n))).await.unwrap();
    }
    let mut s = db.client().start_session().await.unwrap();
    for commit in [false, true] {
        s.start_transaction().await.unwrap();
        let removed = bounded(30, repo.delete("s", doc! {"n": 2}).session(&mut s))
            .await
            .unwrap();
        assert_eq!(removed, 1);
        bounded(30, repo.reindex("s").session(&mut s))
            .await
            .unwrap();
        bounded(30, repo.push(&tick(6)).session(&mut s))
            .await
            .unwrap();
        if commit {
            bounded(30, s.commit_transaction()).await.unwrap();
        } else {
            bounded(30, s.abort_transaction()).await.unwrap();
        }
        let all: Vec<u32> = bounded(30, repo.stream("s").try_collect::<Vec<_>>())
            .await
            .unwrap()
            .iter()
            .map(|t| t.n)
            .collect();
        let want: &[u32] = if commit {
            &[1, 3, 4, 5, 6]
        } else {
            &[1, 2, 3, 4, 5]
        };
        assert_eq!(all, want, "committed: {commit}");
    }
}

/// A write the server refuses for its size (`BSONObjectTooLarge`, 10334,
/// with a label) is `DocumentTooLarge` that keeps the driver's error:
/// `code()`, `contains_label()` and `source()` read it, and converting to
/// the driver's error gives it back, label included.
#[tokio::test]
async fn document_too_large_keeps_the_drivers_error() {
    let server = FaultServer::start("document_too_large_keeps_the_drivers_error").await;
    let (c, _) = client(server.uri()).await;
    let db = c.database(&server.db_name("errors_more_large"));
    let logs = Log::sharded(&db);
    server
        .fail(
            &c,
            Some(1),
            doc! {"failCommands": ["insert"], "errorCode": 10334, "errorLabels": ["MpTestLabel"]},
        )
        .await;
    let log = Log {
        id: 1,
        kind: "a".into(),
        ts: 1_635_132_899,
        msg: "m".into(),
    };
    let e = bounded(30, logs.insert(&log)).await.expect_err("refused");
    println!("{e}");
    match &e {
        Error::DocumentTooLarge { bytes: None, .. } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(e.code(), Some(10334));
    assert!(e.contains_label("MpTestLabel"), "{e:?}");
    assert!(std::error::Error::source(&e).is_some());
    assert!(e.to_string().contains("code 10334"), "{e}");
    assert!(!e.is_retryable());
    let driver = mongodb::error::Error::from(e);
    assert!(driver.contains_label("MpTestLabel"), "{driver:?}");
    assert!(matches!(
        Error::from(driver),
        Error::DocumentTooLarge { bytes: None, .. }
    ));
}

/// A transaction run from a spawned task (as a web handler's is), in the
/// form the guide shows: the driver's `and_run` with a context tuple and
/// a boxed `async move` block, as `and_run2`'s async closure does not
/// compile there (rust-lang/rust#96865).
#[tokio::test]
async fn a_transaction_in_a_spawned_task() {
    let (db, _) = fresh_db("errors_more_spawn").await;
    bounded(30, Tick::ensure(&db)).await.unwrap();
    let repo = Tick::buckets(&db);
    let client = db.client().clone();
    let task = tokio::spawn(async move {
        let mut s = client.start_session().await?;
        s.start_transaction()
            .and_run((&repo, &tick(7)), |s, (repo, t)| {
                Box::pin(async move {
                    repo.push(*t).session(s).await?;
                    Ok(())
                })
            })
            .await
    });
    bounded(30, task).await.unwrap().unwrap();
    assert_eq!(bounded(30, Tick::buckets(&db).count("s")).await.unwrap(), 1);
}
