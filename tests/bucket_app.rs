//! The bucket repository inside an application: pushes in a caller's
//! transaction (aborted, committed), a race there handed back for the
//! caller's `and_run2` to retry, options reaching the commands, borrowed
//! keys, a collection per tenant. Every invariant is checked with the raw
//! driver.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::action::Options;
use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::mongodb::options::{
    ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, fresh_db};

/// A ticker's daily closes, kept sorted by day across buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "ticks")]
#[bucket(size = 4, key = "sym", order = "day", items = "ticks")]
struct Tick {
    sym: String,
    day: i64,
    n: u32,
}

fn tick(sym: &str, day: i64, n: u32) -> Tick {
    Tick {
        sym: sym.to_owned(),
        day,
        n,
    }
}

/// An account's events, in arrival order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "events")]
#[bucket(size = 3, key = "acct", items = "events")]
struct Event {
    acct: String,
    task: u32,
    seq: u32,
}

/// Every bucket of `coll`, by `_id`.
async fn raw_buckets(db: &Database, coll: &str) -> Vec<Document> {
    db.collection::<Document>(coll)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// The items of `key` as stored, in bucket order, after checking each
/// bucket's `count` against its array and `start` against the items
/// before it.
fn stored(buckets: &[Document], key_field: &str, key: &str, items: &str) -> Vec<Document> {
    let num = |b: &Document, f: &str| {
        b.get(f)
            .and_then(|c| c.as_i64().or(c.as_i32().map(i64::from)))
            .unwrap()
    };
    let mut out = Vec::new();
    for b in buckets
        .iter()
        .filter(|b| b.get_str(key_field).ok() == Some(key))
    {
        let arr = b.get_array(items).unwrap();
        assert_eq!(num(b, "count"), arr.len() as i64, "count: {b}");
        assert_eq!(num(b, "start"), out.len() as i64, "start: {b}");
        out.extend(arr.iter().map(|d| d.as_document().unwrap().clone()));
    }
    out
}

fn days(items: &[Document]) -> Vec<i64> {
    items.iter().map(|d| d.get_i64("day").unwrap()).collect()
}

/// Pushes in a caller's transaction, one of which opens a new bucket:
/// aborted, nothing is stored; committed, each item is stored once. Late
/// items, near the end or further back, a removal and a reindex join the
/// transaction (and go with its abort). Keys are borrowed: a `String` key
/// takes `"s-1"`.
#[tokio::test]
async fn pushes_in_a_transaction_abort_to_nothing_and_commit_once() {
    let (db, _) = fresh_db("bucket_app_txn").await;
    let repo = Tick::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    let client = db.client().clone();
    let mut s = client.start_session().await.unwrap();

    // Aborted: five pushes (the fifth opens the second bucket).
    s.start_transaction().await.unwrap();
    for d in 1..=5 {
        bounded(
            30,
            repo.push(&tick("s-1", d * 10, d as u32)).session(&mut s),
        )
        .await
        .unwrap();
    }
    let inside = bounded(30, repo.count("s-1").session(&mut s))
        .await
        .unwrap();
    assert_eq!(inside, 5, "the transaction sees its own pushes");
    // A late item near the end (below the last bucket's days, in the
    // bucket before) joins the transaction.
    bounded(30, repo.push(&tick("s-1", 15, 99)).session(&mut s))
        .await
        .unwrap();
    let inside = bounded(30, repo.count("s-1").session(&mut s))
        .await
        .unwrap();
    assert_eq!(inside, 6, "the transaction sees the late item");
    // One further back (below the first bucket's first item) joins it too.
    bounded(30, repo.push(&tick("s-1", 5, 98)).session(&mut s))
        .await
        .unwrap();
    let first = bounded(
        30,
        repo.page("s-1", PageRequest::page(1).page_size(2))
            .session(&mut s),
    )
    .await
    .unwrap();
    let got: Vec<i64> = first.items.iter().map(|t| t.day).collect();
    assert_eq!(got, [5, 10], "the transaction sees the late item in order");
    s.abort_transaction().await.unwrap();
    assert!(
        raw_buckets(&db, "ticks").await.is_empty(),
        "aborted: nothing"
    );
    assert_eq!(bounded(30, repo.count("s-1")).await.unwrap(), 0);

    // Committed: the same five, and a push_many of two more.
    s.start_transaction().await.unwrap();
    for d in 1..=5 {
        bounded(
            30,
            repo.push(&tick("s-1", d * 10, d as u32)).session(&mut s),
        )
        .await
        .unwrap();
    }
    let more = [tick("s-1", 60, 6), tick("s-1", 70, 7)];
    bounded(30, repo.push_many(&more).session(&mut s))
        .await
        .unwrap();
    let matched = bounded(
        30,
        repo.replace("s-1", doc! {"n": 7}, &tick("s-1", 70, 70))
            .session(&mut s),
    )
    .await
    .unwrap();
    assert!(matched);
    // A stream in the session sees the transaction's own writes, which
    // no read outside it does yet.
    let inside: Vec<Tick> = bounded(
        30,
        repo.stream("s-1").session(&mut s).try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(
        inside.iter().map(|t| t.n).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6, 70]
    );
    let outside: Vec<Tick> = bounded(30, repo.stream("s-1").try_collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(outside.is_empty(), "{outside:?}");
    s.commit_transaction().await.unwrap();
    let buckets = raw_buckets(&db, "ticks").await;
    let items = stored(&buckets, "sym", "s-1", "ticks");
    assert_eq!(days(&items), [10, 20, 30, 40, 50, 60, 70]);
    assert_eq!(buckets.len(), 2, "{buckets:?}");
    assert_eq!(items[6].get_i64("n").unwrap(), 70);

    // Outside the transaction the late item goes in, in order.
    bounded(30, repo.push(&tick("s-1", 15, 99))).await.unwrap();
    let page = bounded(30, repo.page("s-1", PageRequest::page(1).page_size(3)))
        .await
        .unwrap();
    let got: Vec<i64> = page.items.iter().map(|t| t.day).collect();
    assert_eq!(got, [10, 15, 20]);
    assert_eq!(bounded(30, repo.count("s-1")).await.unwrap(), 8);
    // Removal and reindex join a transaction: aborted, nothing stays.
    s.start_transaction().await.unwrap();
    let r = bounded(30, repo.delete("s-1", doc! {"n": 99}).session(&mut s)).await;
    assert_eq!(r.unwrap(), 1);
    bounded(30, repo.reindex("s-1").session(&mut s))
        .await
        .unwrap();
    let inside = bounded(30, repo.count("s-1").session(&mut s))
        .await
        .unwrap();
    assert_eq!(inside, 7, "the transaction sees its removal");
    s.abort_transaction().await.unwrap();
    assert_eq!(bounded(30, repo.count("s-1")).await.unwrap(), 8, "aborted");
    assert_eq!(
        bounded(30, repo.delete("s-1", doc! {"n": 99}).session(&mut s))
            .await
            .unwrap(),
        1,
        "in a session without a transaction it runs"
    );
    let streamed: Vec<Tick> = bounded(30, repo.stream("s-1").try_collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        streamed.iter().map(|t| t.day).collect::<Vec<_>>(),
        [10, 20, 30, 40, 50, 60, 70]
    );
}

/// A push that loses a race inside a caller's transaction (another writer
/// opens the key's first bucket after the transaction's snapshot) returns
/// a transient error; `and_run2` with `?` runs the closure again, which
/// appends to the other writer's bucket and commits.
#[tokio::test]
async fn a_race_in_a_transaction_is_transient_and_and_run2_commits() {
    let (db, _) = fresh_db("bucket_app_race").await;
    let repo = Event::buckets(&db);
    let other = Event::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    let client = db.client().clone();
    let mut s = client.start_session().await.unwrap();
    let attempts = AtomicUsize::new(0);
    let first = std::sync::Mutex::new(None::<(Option<i32>, bool)>);
    let run = s.start_transaction().and_run2(async |s| {
        let n = attempts.fetch_add(1, Ordering::SeqCst);
        // The snapshot: no bucket yet.
        let before = repo.count("a-1").session(s).await?;
        if n == 0 {
            assert_eq!(before, 0);
            other
                .push(&Event {
                    acct: "a-1".into(),
                    task: 1,
                    seq: 0,
                })
                .await?;
        }
        let r = repo
            .push(&Event {
                acct: "a-1".into(),
                task: 0,
                seq: 0,
            })
            .session(s)
            .await;
        if let Err(e) = &r {
            *first.lock().unwrap() = Some((e.code(), e.is_transient()));
        }
        r?;
        Ok(())
    });
    bounded(60, run).await.unwrap();
    let first = *first.lock().unwrap();
    println!(
        "and_run2: {} attempts; the first push failed with (code, transient) {first:?}",
        attempts.load(Ordering::SeqCst)
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert!(first.is_some_and(|(_, transient)| transient), "{first:?}");
    let buckets = raw_buckets(&db, "events").await;
    assert_eq!(buckets.len(), 1);
    let items = stored(&buckets, "acct", "a-1", "events");
    let tasks: Vec<i64> = items
        .iter()
        .map(|d| {
            d.get("task")
                .and_then(Bson::as_i64)
                .unwrap_or_else(|| i64::from(d.get_i32("task").unwrap()))
        })
        .collect();
    assert_eq!(
        tasks,
        [1, 0],
        "the other writer's first, then ours, once each"
    );
}

/// 16 callers' transactions on one key at once, each pushing into a key
/// whose buckets hold 3 items (so bucket rollovers race), through
/// `and_run2` with `?`: all commit, every item is stored exactly once,
/// counts and `start` are exact, and pages give the stored order.
#[tokio::test]
async fn contention_sixteen_transactions_push_to_one_key() {
    let (db, _) = fresh_db("bucket_app_sixteen").await;
    let repo = Event::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    let attempts = AtomicUsize::new(0);
    let lost = std::sync::Mutex::new(Vec::new());
    const ROUNDS: u32 = 2;
    let tasks: Vec<_> = (0..16u32)
        .map(|task| {
            let (repo, client) = (&repo, db.client().clone());
            let (attempts, lost) = (&attempts, &lost);
            async move {
                let mut s = client.start_session().await?;
                for seq in 0..ROUNDS {
                    s.start_transaction()
                        .and_run2(async |s| {
                            attempts.fetch_add(1, Ordering::SeqCst);
                            let e = Event {
                                acct: "hot".into(),
                                task,
                                seq,
                            };
                            let r = repo.push(&e).session(s).await;
                            if let Err(e) = &r {
                                lost.lock().unwrap().push((e.code(), e.is_transient()));
                            }
                            r?;
                            Ok(())
                        })
                        .await?;
                }
                Ok::<_, mongo_patterns::mongodb::error::Error>(())
            }
        })
        .collect();
    // Concurrent on the server, polled on this task (an `and_run2`
    // closure that borrows is not `Send` for `tokio::spawn`).
    for r in bounded(120, futures::future::join_all(tasks)).await {
        r.unwrap();
    }
    let buckets = raw_buckets(&db, "events").await;
    let items = stored(&buckets, "acct", "hot", "events");
    let int = |d: &Document, f: &str| {
        d.get(f)
            .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
            .unwrap()
    };
    let mut seen: Vec<(i64, i64)> = items
        .iter()
        .map(|d| (int(d, "task"), int(d, "seq")))
        .collect();
    // Each task's items in its own order.
    for t in 0..16 {
        let mine: Vec<i64> = seen
            .iter()
            .filter(|(k, _)| *k == t)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(mine, (0..i64::from(ROUNDS)).collect::<Vec<_>>(), "task {t}");
    }
    assert!(buckets
        .iter()
        .all(|b| b.get_array("events").unwrap().len() <= 3));
    let paged: Vec<(i64, i64)> = {
        let mut out = Vec::new();
        for p in 1.. {
            let page = bounded(30, repo.page("hot", PageRequest::page(p).page_size(5)))
                .await
                .unwrap();
            out.extend(
                page.items
                    .iter()
                    .map(|e| (i64::from(e.task), i64::from(e.seq))),
            );
            if !page.has_more {
                break;
            }
        }
        out
    };
    assert_eq!(paged, seen, "pages give the stored order");
    assert_eq!(
        bounded(30, repo.count("hot")).await.unwrap(),
        16 * u64::from(ROUNDS)
    );
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 16 * ROUNDS as usize, "each item once");
    let lost = lost.lock().unwrap().clone();
    let mut codes: Vec<Option<i32>> = lost.iter().map(|(c, _)| *c).collect();
    codes.sort();
    codes.dedup();
    println!(
        "16 x {ROUNDS} transactions: {} attempts, {} pushes lost a race, codes {codes:?}, {} buckets",
        attempts.load(Ordering::SeqCst),
        lost.len(),
        buckets.len()
    );
    assert!(
        lost.iter().all(|(_, t)| *t),
        "every lost race is transient: {lost:?}"
    );
}

/// The write commands of every write path carry the write concern, and
/// comment where the driver has it; reads carry read concern, read
/// preference, comment and maxTimeMS; repository defaults apply under the
/// action's own.
#[tokio::test]
async fn options_reach_every_command() {
    let (db, commands) = fresh_db("bucket_app_opts").await;
    let repo = Tick::buckets(&db);
    bounded(30, repo.ensure()).await.unwrap();
    let ms = Duration::from_millis(5_000);
    let majority = || WriteConcern::majority();
    let check_writes = |sent: &[(String, Document)], want: &[&str], comment: bool| {
        let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
        for w in want {
            assert!(names.contains(w), "{w} sent: {names:?}");
        }
        for (name, cmd) in sent {
            let writes = match name.as_str() {
                "insert" | "update" | "delete" | "findAndModify" => true,
                "aggregate" => cmd.to_string().contains("$merge"),
                _ => false,
            };
            if writes {
                assert_eq!(
                    cmd.get_document("writeConcern").ok(),
                    Some(&doc! {"w": "majority"}),
                    "{name}: {cmd}"
                );
                if comment {
                    assert_eq!(cmd.get("comment"), Some(&Bson::from("w")), "{name}: {cmd}");
                }
            }
        }
        names.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };

    // In-order pushes: an insert (new key), updates, a rollover.
    commands.take();
    for d in 1..=5 {
        bounded(
            30,
            repo.push(&tick("s-1", d * 10, d as u32))
                .write_concern(majority())
                .comment("w")
                .max_time(ms),
        )
        .await
        .unwrap();
    }
    let names = check_writes(&commands.take(), &["insert", "update", "find"], true);
    println!("5 pushes: {names:?}");
    bounded(
        30,
        repo.push_many(&[tick("s-1", 60, 6), tick("s-1", 70, 7)])
            .write_concern(majority())
            .comment("w"),
    )
    .await
    .unwrap();
    check_writes(&commands.take(), &["update"], true);
    // findAndModify carries maxTimeMS too.
    bounded(
        30,
        repo.replace("s-1", doc! {"n": 6}, &tick("s-1", 60, 66))
            .write_concern(majority())
            .comment("w")
            .max_time(ms),
    )
    .await
    .unwrap();
    let sent = commands.take();
    check_writes(&sent, &["findAndModify"], true);
    assert!(sent[0].1.contains_key("maxTimeMS"), "{:?}", sent[0]);
    // A late push near the end (below the last bucket, into the one
    // before), one further back, removals and a reindex: each one
    // transaction of the call's own, whose commit carries the write
    // concern (the statements inside may not).
    let check_transaction = |sent: Vec<(String, Document)>, what: &str| {
        let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
        println!("{what}: {names:?}");
        assert!(names.contains(&"commitTransaction"), "{what}: {names:?}");
        for (name, cmd) in &sent {
            if name == "commitTransaction" {
                assert_eq!(
                    cmd.get_document("writeConcern").ok(),
                    Some(&doc! {"w": "majority"}),
                    "{what}: {cmd}"
                );
            } else if cmd.contains_key("autocommit") {
                // A statement of the transaction.
                assert!(!cmd.contains_key("writeConcern"), "{what}: {cmd}");
            } else if matches!(name.as_str(), "update" | "insert") {
                assert_eq!(
                    cmd.get_document("writeConcern").ok(),
                    Some(&doc! {"w": "majority"}),
                    "{what}: {cmd}"
                );
            }
        }
    };
    bounded(
        30,
        repo.push(&tick("s-1", 35, 98)).write_concern(majority()),
    )
    .await
    .unwrap();
    check_transaction(commands.take(), "late push near the end");
    bounded(30, repo.push(&tick("s-1", 5, 99)).write_concern(majority()))
        .await
        .unwrap();
    check_transaction(commands.take(), "late push further back");
    for n in [99, 98] {
        assert_eq!(
            bounded(
                30,
                repo.delete("s-1", doc! {"n": n}).write_concern(majority())
            )
            .await
            .unwrap(),
            1
        );
        check_transaction(commands.take(), "delete");
    }
    bounded(30, repo.reindex("s-1").write_concern(majority()))
        .await
        .unwrap();
    check_transaction(commands.take(), "reindex");

    // Reads.
    let pref = SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
        options: Default::default(),
    });
    let check_reads = |sent: Vec<(String, Document)>, want: &[&str]| {
        let names: Vec<&str> = sent.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, want);
        for (name, cmd) in &sent {
            assert_eq!(
                cmd.get_document("$readPreference").ok(),
                Some(&doc! {"mode": "secondaryPreferred"}),
                "{name}: {cmd}"
            );
            assert_eq!(
                cmd.get_document("readConcern").ok(),
                Some(&doc! {"level": "majority"}),
                "{name}: {cmd}"
            );
            assert_eq!(cmd.get("comment"), Some(&Bson::from("r")), "{name}: {cmd}");
            assert!(cmd.contains_key("maxTimeMS"), "{name}: {cmd}");
        }
    };
    let page = bounded(
        30,
        repo.page("s-1", PageRequest::page(1).page_size(3).newest_first())
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms),
    )
    .await
    .unwrap();
    assert_eq!(
        page.items.iter().map(|t| t.day).collect::<Vec<_>>(),
        [70, 60, 50]
    );
    check_reads(commands.take(), &["aggregate"]);
    let total = bounded(
        30,
        repo.count("s-1")
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms),
    )
    .await
    .unwrap();
    assert_eq!(total, 7);
    check_reads(commands.take(), &["find"]);
    let all: Vec<Tick> = bounded(
        30,
        repo.stream("s-1")
            .read_concern(ReadConcern::majority())
            .selection_criteria(pref.clone())
            .comment("r")
            .max_time(ms)
            .try_collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 7);
    check_reads(commands.take(), &["find"]);

    // Repository defaults, under the action's own comment.
    let tuned = repo
        .clone()
        .with_options(Options::new().write_concern(majority()).comment("default"));
    bounded(30, tuned.push(&tick("s-1", 80, 8)).into_future())
        .await
        .unwrap();
    bounded(30, tuned.push(&tick("s-1", 90, 9)).comment("w"))
        .await
        .unwrap();
    let sent = commands.take();
    let writes: Vec<&Document> = sent
        .iter()
        .filter(|(n, _)| n == "update" || n == "insert")
        .map(|(_, c)| c)
        .collect();
    assert!(writes.len() >= 2, "{sent:?}");
    for c in &writes {
        assert_eq!(
            c.get_document("writeConcern").ok(),
            Some(&doc! {"w": "majority"})
        );
    }
    assert_eq!(writes[0].get("comment"), Some(&Bson::from("default")));
    assert_eq!(
        writes.last().unwrap().get("comment"),
        Some(&Bson::from("w"))
    );
}

/// `w: 0` reaches every write path: the driver (3.x) refuses an
/// unacknowledged write concern on every operation before sending it, so
/// each write fails with the driver's own error and nothing changes. Had
/// the repository dropped the option, the write would succeed.
#[tokio::test]
async fn unacknowledged_write_concern_reaches_the_driver() {
    let (db, _) = fresh_db("bucket_app_w0").await;
    let repo = Tick::buckets(&db);
    for d in 1..=4 {
        bounded(30, repo.push(&tick("s-1", d * 10, d as u32)))
            .await
            .unwrap();
    }
    let before = raw_buckets(&db, "ticks").await;
    let w0 = || WriteConcern::nodes(0);
    fn refused<X: std::fmt::Debug>(r: mongo_patterns::Result<X>, what: &str) {
        match r {
            Err(e) => {
                let driver = e.mongo().unwrap_or_else(|| panic!("{what}: {e:?}"));
                // The driver's own refusal: of `w: 0` with a session, or (a
                // transaction of the call's own) in a transaction.
                use mongo_patterns::mongodb::error::ErrorKind;
                assert!(
                    matches!(&*driver.kind, ErrorKind::InvalidArgument { message, .. }
                        if message.contains("Unacknowledged"))
                        || matches!(&*driver.kind, ErrorKind::Transaction { message, .. }
                        if message.contains("unacknowledged")),
                    "{what}: {driver:?}"
                );
            }
            Ok(x) => panic!("{what}: w: 0 was dropped ({x:?})"),
        }
    }
    // In order (an update), a new key (an insert), a rollover.
    refused(
        bounded(30, repo.push(&tick("s-1", 50, 5)).write_concern(w0())).await,
        "push",
    );
    refused(
        bounded(30, repo.push(&tick("s-2", 50, 5)).write_concern(w0())).await,
        "push new key",
    );
    refused(
        bounded(
            30,
            repo.push_many(&[tick("s-1", 60, 6)]).write_concern(w0()),
        )
        .await,
        "push_many",
    );
    refused(
        bounded(30, repo.push(&tick("s-1", 15, 9)).write_concern(w0())).await,
        "late push",
    );
    refused(
        bounded(
            30,
            repo.replace("s-1", doc! {"n": 1}, &tick("s-1", 10, 11))
                .write_concern(w0()),
        )
        .await,
        "replace",
    );
    refused(
        bounded(30, repo.delete("s-1", doc! {"n": 1}).write_concern(w0())).await,
        "delete",
    );
    refused(
        bounded(30, repo.reindex("s-1").write_concern(w0())).await,
        "reindex",
    );
    assert_eq!(raw_buckets(&db, "ticks").await, before, "nothing changed");
}

/// Two tenants, one collection each: the same key holds different items
/// in each, every read sees its own, and each repository declares its own
/// collection.
#[tokio::test]
async fn tenants_have_their_own_collections() {
    let (db, _) = fresh_db("bucket_app_tenants").await;
    let base = Tick::buckets(&db);
    let a = base.clone().with_collection("ticks_a");
    let b = base.clone().with_collection("ticks_b");
    assert_eq!(a.collection().name(), "ticks_a");
    assert_eq!(a.declared()[0].collection, "ticks_a");
    bounded(30, a.ensure()).await.unwrap();
    bounded(30, b.ensure()).await.unwrap();
    for d in 1..=6 {
        bounded(30, a.push(&tick("s-1", d, d as u32)))
            .await
            .unwrap();
    }
    // `b` shares `base`'s memory of nothing: it starts at its own first
    // bucket.
    for d in 1..=2 {
        bounded(30, b.push(&tick("s-1", 100 + d, 100 + d as u32)))
            .await
            .unwrap();
    }
    // A late push and a removal in one tenant leave the other alone.
    bounded(30, a.push(&tick("s-1", 0, 0))).await.unwrap();
    assert_eq!(
        bounded(30, b.delete("s-1", doc! {"n": 101})).await.unwrap(),
        1
    );
    assert_eq!(bounded(30, a.count("s-1")).await.unwrap(), 7);
    assert_eq!(bounded(30, b.count("s-1")).await.unwrap(), 1);
    let a_items = stored(&raw_buckets(&db, "ticks_a").await, "sym", "s-1", "ticks");
    let b_items = stored(&raw_buckets(&db, "ticks_b").await, "sym", "s-1", "ticks");
    assert_eq!(days(&a_items), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(days(&b_items), [102]);
    assert!(raw_buckets(&db, "ticks").await.is_empty());
    let page = bounded(30, b.page("s-1", PageRequest::page(1).page_size(10)))
        .await
        .unwrap();
    assert_eq!(page.items, [tick("s-1", 102, 102)]);
}
