//! The bucket lease between application hosts whose clocks disagree, and
//! under a call cut while it holds the lease.
//!
//! A test cannot move the machine's clock, so a skewed host is a
//! repository made with the runtime's test seam `__skew_clock`, which adds
//! an offset to that client's clock. The lease must not depend on it: two
//! hosts with skewed clocks must never hold a key's lease at once.

use std::time::{Duration, Instant};

use mongo_patterns::bucket::Buckets;
use mongo_patterns::mongodb::Client;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, client, fail_command, OwnServer, ServerOptions};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 5, key = "customerId", items = "trades")]
struct Trade {
    customer_id: i64,
    seq: u32,
}

/// A server of its own with test commands, and key 1 holding items 0 to 9
/// in database `name` (two buckets of 5).
async fn ten_items(name: &str) -> (OwnServer, Client, Database, Buckets<Trade>) {
    let server = OwnServer::start(ServerOptions {
        test_commands: true,
        ..ServerOptions::default()
    });
    let (c, _) = client(server.uri()).await;
    let db = c.database(name);
    let repo = Trade::buckets(&db);
    let items: Vec<Trade> = (0..10)
        .map(|seq| Trade {
            customer_id: 1,
            seq,
        })
        .collect();
    bounded(30, repo.push_many(&items)).await.unwrap();
    (server, c, db, repo)
}

/// How long the server holds host `a`'s first command under the lease.
const HELD: Duration = Duration::from_secs(3);

/// Host `a` (its clock `skew_a` ms off) removes an item of key 1 under the
/// key's lease, while the server holds the first command it sends under the
/// lease (`delete` reads the key's buckets with an `aggregate`) for
/// [`HELD`]. While `a` holds the lease, host `b` (its clock `skew_b` ms off)
/// removes another item of the key. `b` must wait for `a` to give the lease
/// back: it cannot finish before the server lets `a`'s command go.
async fn skewed_holders(skew_a: i64, skew_b: i64) {
    let (_server, c, db, repo) = ten_items("lease").await;
    let a = repo.clone().__skew_clock(skew_a);
    let b = repo.clone().__skew_clock(skew_b);
    let hold = doc! {
        "failCommands": ["aggregate"],
        "blockConnection": true,
        "blockTimeMS": HELD.as_millis() as i64,
    };
    fail_command(&c, Some(1), hold).await;
    let held_at = Instant::now();
    let a_task = tokio::spawn(bounded(
        30,
        async move { a.delete(&1, doc! {"seq": 1}).await },
    ));
    // `a` holds the lease once its document is there (a `find`: an
    // `aggregate` would take the held slot).
    let locks = db.collection::<Document>("trades.mp_locks");
    bounded(10, async {
        while locks.find_one(doc! {"_id": 1_i64}).await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let removed_b = bounded(30, b.delete(&1, doc! {"seq": 2})).await.unwrap();
    let b_after = held_at.elapsed();
    let removed_a = a_task.await.unwrap().unwrap();
    assert_eq!((removed_a, removed_b), (1, 1));
    assert!(
        b_after >= HELD,
        "host b (clock {skew_b} ms off) finished {b_after:?} after host a (clock {skew_a} ms \
         off) started, while the server still held a's command: both held the lease"
    );
    assert!(
        b_after < HELD + Duration::from_secs(5),
        "host b took {b_after:?}: it waited for the lease to end rather than for a to give it back"
    );
    assert_eq!(bounded(10, repo.total(&1)).await.unwrap(), 8);
    let left = bounded(10, locks.count_documents(doc! {})).await.unwrap();
    assert_eq!(left, 0, "every lease given back");
}

/// The control: hosts whose clocks agree take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_whose_clocks_agree_take_turns() {
    bounded(90, skewed_holders(0, 0)).await;
}

/// A host whose clock runs 30 s behind: on the client's clock, the lease it
/// takes ends 20 s before it began for everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_behind_does_not_share_its_lease() {
    bounded(90, skewed_holders(-30_000, 0)).await;
}

/// A host whose clock runs 30 s ahead: on the client's clock, every lease
/// another host holds has already ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_ahead_does_not_take_over_a_held_lease() {
    bounded(90, skewed_holders(0, 30_000)).await;
}

/// How long the server holds the first `find` a read sends under the lease
/// in [`a_read_cut_under_the_lease_ends_it_at_once`].
const FIND_HELD: Duration = Duration::from_secs(4);

/// A page read that meets a removal's mark repairs positions under the
/// key's lease. A caller that stops waiting inside that repair (a request
/// timeout) must not leave the lease held until it runs out (10 s), which
/// would keep every other write and read of the key waiting: the cut
/// call's lease ends about a second later, and the next writer takes it
/// over and finishes the repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_cut_under_the_lease_ends_it_at_once() {
    bounded(90, async {
        let (_server, c, db, repo) = ten_items("lease_cut").await;
        // A removal cut after its mark: every bucket of the key stale.
        let raw = db.collection::<Document>("trades");
        raw.update_many(
            doc! {"customerId": 1_i64},
            doc! {"$set": {"mp_stale": true}},
        )
        .await
        .unwrap();
        // The repair's first read (finish the moves a split left) waits
        // on the server; the caller gives up before it returns.
        let hold = doc! {
            "failCommands": ["find"],
            "blockConnection": true,
            "blockTimeMS": FIND_HELD.as_millis() as i64,
        };
        fail_command(&c, Some(1), hold).await;
        let cut = tokio::time::timeout(
            Duration::from_millis(1500),
            repo.page(&1, PageRequest::page(1).per_page(5)),
        )
        .await;
        assert!(
            cut.is_err(),
            "the page returned before the held find: {cut:?}"
        );
        let cut_at = Instant::now();
        let locks = db.collection::<Document>("trades.mp_locks");
        assert!(
            locks.find_one(doc! {"_id": 1_i64}).await.unwrap().is_some(),
            "the cut read did not hold the lease: the test cut it elsewhere"
        );
        // Another writer of the key: it waits for the lease, which the cut
        // call's guard ends a second after the cut, not 10 s.
        let removed = repo.delete(&1, doc! {"seq": 3}).await.unwrap();
        let waited = cut_at.elapsed();
        assert_eq!(removed, 1);
        assert!(
            waited < Duration::from_secs(5),
            "the next writer waited {waited:?} after the cut: the cut call's lease was left \
             to run out"
        );
        let page = repo
            .page(&1, PageRequest::page(2).per_page(5))
            .await
            .unwrap();
        let seqs: Vec<u32> = page.items.iter().map(|t| t.seq).collect();
        assert_eq!(seqs, [6, 7, 8, 9]);
        assert_eq!(repo.total(&1).await.unwrap(), 9);
        let left = locks.count_documents(doc! {}).await.unwrap();
        assert_eq!(left, 0, "every lease given back");
    })
    .await;
}
