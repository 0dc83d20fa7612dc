//! Ordered buckets written by several instances of a service at once:
//! clients stand in for processes (nothing in memory is shared between
//! them: each has its own pool, sessions and repository handles), on one
//! server and one key. Items are dated at the call, some further back (a
//! late trade), some calls are cut by a timeout, some run inside the
//! caller's transaction beside a driver insert, and some tasks make a
//! repository handle per call, as a web handler calling
//! `Trade::buckets(&db)` per request does.
//!
//! Every call must return within its bound, whatever the others do: a
//! bucket call retries lost races for at most 120 s and a transaction of
//! its own for at most 120 s more (the driver's convenient API), so no
//! call may take longer than `BOUND`. Afterwards an independent reader
//! (the raw driver) checks the stored key: every acknowledged push
//! exactly once, every cut or failed one at most once, a committed
//! transaction's trade and its order both stored and an aborted one's
//! neither, the items sorted by date across the buckets, `start` and
//! `count` consistent, and every page, oldest and newest first, exact.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::mongodb::{ClientSession, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, client, server_uri, with_pool};

/// Buckets of 20: a rollover every few pushes, where instances race.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 20, key = "customerId", order = "date")]
struct Trade {
    customer_id: i64,
    /// Which instance and task pushed it, and its number there.
    task: u32,
    seq: u32,
    date: DateTime,
}

/// The most a call may take: 120 s of retries of lost races, and 120 s
/// for a transaction of its own (see the module docs).
const BOUND: Duration = Duration::from_secs(240);
const KEY: i64 = 1;

/// How a run's calls are made.
#[derive(Clone, Copy, Debug)]
struct Load {
    clients: u32,
    tasks: u32,
    /// One push in `late` is dated up to 2 s back (0: none).
    late: u32,
    /// One call in `cut` is cut after 3 ms (0: none).
    cut: u32,
    /// One call in `txn` runs in a caller's transaction (0: none).
    txn: u32,
    /// Every task makes a repository handle per call.
    handle_per_call: bool,
    secs: u64,
}

/// What became of each push, by (task, seq).
#[derive(Default)]
struct Outcomes {
    /// Acknowledged: stored exactly once.
    ok: HashSet<(u32, u32)>,
    /// Committed in a caller's transaction, with its order.
    committed: HashSet<(u32, u32)>,
    /// Cut or failed (a caller's transaction that did not commit
    /// included): stored at most once, and a transaction's only whole.
    unsure: HashSet<(u32, u32)>,
    errors: Vec<String>,
    slowest: Duration,
}

/// Runs `load` against a fresh database; returns the outcomes, the
/// database and a repository on it.
async fn run(name: &str, load: Load) -> (Outcomes, Database) {
    let uri = with_pool(&server_uri(), load.tasks + 4);
    let db_name = format!("mp_{name}_{}", std::process::id());
    let mut dbs = Vec::new();
    for _ in 0..load.clients {
        dbs.push(client(&uri).await.0.database(&db_name));
    }
    bounded(30, dbs[0].drop()).await.unwrap();
    bounded(30, Trade::buckets(&dbs[0]).ensure()).await.unwrap();
    // Collections are not created inside a transaction.
    bounded(30, dbs[0].create_collection("orders"))
        .await
        .unwrap();
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let pushed = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(load.secs);
    let mut tasks = Vec::new();
    for (c, db) in dbs.iter().enumerate() {
        // One handle per instance, shared by its tasks (unless per call).
        let shared = Trade::buckets(db);
        for t in 0..load.tasks {
            let task = c as u32 * 1000 + t;
            let (db, shared) = (db.clone(), shared.clone());
            let (outcomes, pushed) = (outcomes.clone(), pushed.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = db.client().start_session().await.unwrap();
                let orders = db.collection::<Document>("orders");
                let mut seq = 0;
                while Instant::now() < until {
                    let repo = match load.handle_per_call {
                        true => Trade::buckets(&db),
                        false => shared.clone(),
                    };
                    let one = Call {
                        trade: trade(load, task, seq),
                        in_txn: load.txn > 0 && seq % load.txn == 1,
                        cut: load.cut > 0 && seq % load.cut == 2,
                    };
                    one.run(&repo, &mut s, &orders, &outcomes).await;
                    pushed.fetch_add(1, Ordering::Relaxed);
                    seq += 1;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let outcomes = Arc::into_inner(outcomes).unwrap().into_inner().unwrap();
    println!(
        "{name}: {} pushes from {} instances x {} tasks in {} s ({} acknowledged, {} committed \
         in a caller's transaction, {} cut or failed); slowest call {:?}",
        pushed.load(Ordering::Relaxed),
        load.clients,
        load.tasks,
        load.secs,
        outcomes.ok.len(),
        outcomes.committed.len(),
        outcomes.unsure.len(),
        outcomes.slowest,
    );
    (outcomes, dbs.swap_remove(0))
}

/// Push `seq` of `task`, dated now, or (one in `late`) up to 2 s back.
fn trade(load: Load, task: u32, seq: u32) -> Trade {
    let mut date = DateTime::now();
    if load.late > 0 && seq % load.late == load.late - 1 {
        let back = i64::from((seq * 37 + task * 101) % 2000);
        date = DateTime::from_millis(date.timestamp_millis() - back);
    }
    Trade {
        customer_id: KEY,
        task,
        seq,
        date,
    }
}

/// One call of a task.
struct Call {
    trade: Trade,
    in_txn: bool,
    cut: bool,
}

impl Call {
    async fn run(
        self,
        repo: &Buckets<Trade>,
        s: &mut ClientSession,
        orders: &Collection<Document>,
        outcomes: &Mutex<Outcomes>,
    ) {
        let id = (self.trade.task, self.trade.seq);
        let started = Instant::now();
        let call = async {
            if self.in_txn {
                in_transaction(repo, &self.trade, s, orders).await
            } else {
                repo.push(&self.trade).await
            }
        };
        let limit = if self.cut {
            Duration::from_millis(3)
        } else {
            BOUND
        };
        let r = tokio::time::timeout(limit, call).await;
        let took = started.elapsed();
        let mut o = outcomes.lock().unwrap();
        o.slowest = o.slowest.max(took);
        match r {
            Ok(Ok(())) if self.in_txn => drop(o.committed.insert(id)),
            Ok(Ok(())) => drop(o.ok.insert(id)),
            Ok(Err(e)) => {
                o.errors
                    .push(format!("{id:?} (in a transaction: {}): {e}", self.in_txn));
                o.unsure.insert(id);
            }
            Err(_) if self.cut => drop(o.unsure.insert(id)),
            Err(_) => panic!(
                "call {id:?} (in a transaction: {}) outlived {BOUND:?}",
                self.in_txn
            ),
        }
    }
}

/// The README's trading example: the trade pushed and its order inserted
/// in one caller's transaction, run again on a transient error and its
/// commit retried, as `and_run2` does (written out: its closure is not
/// `Send`, which a spawned task needs).
async fn in_transaction(
    repo: &Buckets<Trade>,
    trade: &Trade,
    s: &mut ClientSession,
    orders: &Collection<Document>,
) -> mongo_patterns::Result<()> {
    let started = Instant::now();
    'run: loop {
        s.start_transaction().await?;
        let r: mongo_patterns::Result<()> = async {
            repo.push(trade).session(&mut *s).await?;
            let order = doc! {"task": trade.task, "seq": trade.seq};
            orders.insert_one(order).session(&mut *s).await?;
            Ok(())
        }
        .await;
        if let Err(e) = r {
            let _ = s.abort_transaction().await;
            if e.is_transient() && started.elapsed() < Duration::from_secs(120) {
                continue 'run;
            }
            return Err(e);
        }
        loop {
            match s.commit_transaction().await {
                Ok(()) => return Ok(()),
                Err(e) if e.contains_label("UnknownTransactionCommitResult") => continue,
                Err(e) if e.contains_label("TransientTransactionError") => continue 'run,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The key's buckets, checked by the raw driver: `count` the array's
/// length (at most twice `size`), `start` the items before, the dates
/// sorted across all buckets. The items in stored order as (task, seq).
async fn stored(db: &Database) -> Vec<(u32, u32)> {
    let buckets: Vec<Document> = bounded(60, async {
        let trades = db.collection::<Document>("trades");
        let find = trades.find(doc! {"customerId": KEY}).sort(doc! {"_id": 1});
        find.await.unwrap().try_collect().await.unwrap()
    })
    .await;
    let mut out = Vec::new();
    let mut last_date = i64::MIN;
    let mut open = 0;
    for b in &buckets {
        let id = b.get("_id").unwrap();
        let items = b.get_array("items").unwrap();
        assert_eq!(
            int(b.get("count")),
            items.len() as i64,
            "bucket {id}: count"
        );
        assert!(items.len() <= 40, "bucket {id}: {} items", items.len());
        assert_eq!(int(b.get("start")), out.len() as i64, "bucket {id}: start");
        if !b.get_bool("sealed").unwrap_or(false) && !items.is_empty() {
            open += 1;
        }
        for t in items {
            let t = t.as_document().unwrap();
            let date = t.get_datetime("date").unwrap().timestamp_millis();
            assert!(date >= last_date, "bucket {id}: dates out of order");
            last_date = date;
            out.push((int(t.get("task")) as u32, int(t.get("seq")) as u32));
        }
    }
    assert!(open <= 1, "{open} buckets with items open to pushes");
    out
}

/// A stored integer, as an `int` or a `long`.
fn int(v: Option<&Bson>) -> i64 {
    match v {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// The invariants after a run (see the module docs).
async fn check(db: &Database, o: &Outcomes) {
    let stored = stored(db).await;
    let mut times: HashMap<(u32, u32), usize> = HashMap::new();
    for id in &stored {
        *times.entry(*id).or_default() += 1;
    }
    let orders: Vec<Document> = bounded(60, async {
        let orders = db.collection::<Document>("orders");
        orders
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let ordered: HashSet<(u32, u32)> = orders
        .iter()
        .map(|d| (int(d.get("task")) as u32, int(d.get("seq")) as u32))
        .collect();
    assert_eq!(ordered.len(), orders.len(), "an order stored twice");
    for id in o.ok.iter().chain(&o.committed) {
        assert_eq!(
            times.get(id),
            Some(&1),
            "acknowledged push {id:?} stored once"
        );
    }
    for id in &o.committed {
        assert!(
            ordered.contains(id),
            "committed transaction {id:?}: its order"
        );
    }
    for (id, n) in &times {
        assert!(*n == 1, "push {id:?} stored {n} times");
        assert!(
            o.ok.contains(id) || o.committed.contains(id) || o.unsure.contains(id),
            "{id:?} stored but never pushed"
        );
    }
    for id in &ordered {
        assert!(
            times.contains_key(id),
            "order {id:?} committed without its trade"
        );
    }
    // Every page, both ways, lists the stored items.
    let repo = Trade::buckets(db);
    for newest in [false, true] {
        let mut got = Vec::new();
        for page in 1.. {
            let mut req = PageRequest::page(page).page_size(7);
            if newest {
                req = req.newest_first();
            }
            let p = bounded(30, repo.page(&KEY, req)).await.unwrap();
            got.extend(p.items.iter().map(|t| (t.task, t.seq)));
            if !p.has_more {
                break;
            }
        }
        if newest {
            got.reverse();
        }
        assert_eq!(got, stored, "pages of 7, newest first: {newest}");
    }
}

/// Two instances with 8 tasks each push to one key, one item in five
/// dated up to 2 s back: before, five runs in nine stalled for good
/// (a transaction of one instance and a marking write of the other each
/// waiting on the server for a bucket the other held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_push_late_items_to_one_key() {
    let load = Load {
        clients: 2,
        tasks: 8,
        late: 5,
        cut: 0,
        txn: 0,
        handle_per_call: false,
        secs: 4,
    };
    let (o, db) = run("instances_late", load).await;
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    check(&db, &o).await;
    bounded(30, db.drop()).await.unwrap();
}

/// Everything at once: three instances with 8 tasks each, late items,
/// calls cut by a timeout and calls inside the caller's transaction; half
/// the tasks make a handle per call. No call outlives its bound, no
/// transaction fails but by a transient error run again, and the stored
/// key is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_late_items_cuts_and_transactions() {
    for handle_per_call in [false, true] {
        let load = Load {
            clients: 3,
            tasks: 8,
            late: 5,
            cut: 10,
            txn: 10,
            handle_per_call,
            secs: 5,
        };
        let (o, db) = run("instances_all", load).await;
        assert!(o.errors.is_empty(), "{:?}", o.errors);
        assert!(!o.committed.is_empty(), "transactions committed");
        check(&db, &o).await;
        bounded(30, db.drop()).await.unwrap();
    }
}

/// Four instances with 16 tasks each, every item dated now: before, about
/// 5,000 pushes in, every task waited for minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_of_sixteen_tasks_on_one_key() {
    let load = Load {
        clients: 4,
        tasks: 16,
        late: 0,
        cut: 0,
        txn: 0,
        handle_per_call: false,
        secs: 8,
    };
    let (o, db) = run("instances_four", load).await;
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    check(&db, &o).await;
    bounded(30, db.drop()).await.unwrap();
}

/// The guide's trading example under concurrency: a trade dated at the
/// call pushed with `order` inside the caller's transaction beside a
/// driver insert, through `and_run2`, by 16 tasks over two instances.
/// Before, some transactions failed for good: a late push "cannot run
/// inside a transaction" (the only lateness was time spent queued), and
/// "repairing the positions a removal left" though nothing had been
/// removed. Every transaction commits now, each trade stored once with
/// its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_callers_over_two_instances_commit_every_transaction() {
    const EACH: u32 = 15;
    let uri = with_pool(&server_uri(), 12);
    let name = format!("mp_instances_txn_{}", std::process::id());
    let mut dbs = Vec::new();
    for _ in 0..2 {
        dbs.push(client(&uri).await.0.database(&name));
    }
    bounded(30, dbs[0].drop()).await.unwrap();
    bounded(30, Trade::buckets(&dbs[0]).ensure()).await.unwrap();
    bounded(30, dbs[0].create_collection("orders"))
        .await
        .unwrap();
    let attempts = AtomicU64::new(0);
    let callers = (0..16_u32).map(|t| {
        let db = &dbs[t as usize % 2];
        let (repo, attempts) = (Trade::buckets(db), &attempts);
        let orders = db.collection::<Document>("orders");
        async move {
            let mut s = db.client().start_session().await?;
            for seq in 0..EACH {
                s.start_transaction()
                    .and_run2(async |s| {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        let trade = Trade {
                            customer_id: KEY,
                            task: t,
                            seq,
                            date: DateTime::now(),
                        };
                        repo.push(&trade).session(&mut *s).await?;
                        let order = doc! {"task": t, "seq": seq};
                        orders.insert_one(order).session(s).await?;
                        Ok(())
                    })
                    .await?;
            }
            Ok::<_, mongo_patterns::mongodb::error::Error>(())
        }
    });
    // Concurrent on the server, polled on this task (an `and_run2` closure
    // that borrows is not `Send` for `tokio::spawn`).
    let results = bounded(BOUND.as_secs(), futures::future::join_all(callers)).await;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    assert!(failed.is_empty(), "transactions failed: {failed:?}");
    let o = Outcomes {
        committed: (0..16)
            .flat_map(|t| (0..EACH).map(move |s| (t, s)))
            .collect(),
        ..Outcomes::default()
    };
    println!(
        "16 callers x {EACH} transactions over 2 instances: {} attempts",
        attempts.load(Ordering::Relaxed)
    );
    check(&dbs[0], &o).await;
    bounded(30, dbs[0].drop()).await.unwrap();
}

/// Kept in arrival order: a full bucket is closed by its count, not by a
/// seal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "arrivals")]
#[bucket(size = 4, key = "acct")]
struct Arrival {
    acct: i64,
    n: u32,
}

/// An instance whose handle last saw a bucket that other instances have
/// filled and gone past since pushes inside the caller's transaction. The
/// transaction commits at its first or second run. Before, the handle
/// took the full bucket it remembered for the key's last, opened the
/// next one, which existed (a duplicate key, labelled transient), and the
/// caller's rerun did the same for as long as the handle remembered it:
/// in a fault campaign (tests/campaign.rs) every task of one instance
/// retried for 120 s.
#[tokio::test]
async fn a_handle_behind_other_instances_pushes_in_a_transaction() {
    let uri = server_uri();
    let (a, _) = client(&uri).await;
    let (b, _) = client(&uri).await;
    let name = format!("mp_behind_{}", std::process::id());
    let (a, b) = (a.database(&name), b.database(&name));
    bounded(30, a.drop()).await.unwrap();
    let (behind, others) = (Arrival::buckets(&a), Arrival::buckets(&b));
    bounded(30, behind.ensure()).await.unwrap();
    bounded(10, behind.push(&Arrival { acct: 1, n: 0 }))
        .await
        .unwrap();
    // Another instance fills bucket 0 and the next.
    for n in 1..8 {
        bounded(10, others.push(&Arrival { acct: 1, n }))
            .await
            .unwrap();
    }
    let mut s = a.client().start_session().await.unwrap();
    for n in 8..11 {
        let item = Arrival { acct: 1, n };
        let mut runs = 0;
        loop {
            runs += 1;
            assert!(runs <= 2, "push {n}: still racing at run {runs}");
            s.start_transaction().await.unwrap();
            match bounded(10, behind.push(&item).session(&mut s)).await {
                Ok(()) => {
                    bounded(10, s.commit_transaction()).await.unwrap();
                    break;
                }
                Err(e) if e.is_transient() => {
                    let _ = s.abort_transaction().await;
                }
                Err(e) => panic!("push {n}: {e}"),
            }
        }
    }
    let stored: Vec<u32> = bounded(10, behind.stream(&1).try_collect::<Vec<_>>())
        .await
        .unwrap()
        .iter()
        .map(|a| a.n)
        .collect();
    assert_eq!(stored, (0..11).collect::<Vec<_>>());
    bounded(30, a.drop()).await.unwrap();
}

/// A batch of queued pushes that the bucket this handle remembers has no
/// room for (another instance filled it meanwhile) costs the read that
/// says how much room is left, not an update that matches nothing before
/// it; and the push that then goes alone, told by that read that the
/// bucket is full, goes straight to the one-command push. Before, the
/// three pushes below cost 8 commands (an update that matched nothing,
/// the read, an update of the full bucket that matched nothing, then the
/// findAndModify, the insert opening the bucket after it, the read that
/// checks its start, and an update for the last item), 6 now.
#[tokio::test]
async fn a_batch_a_full_bucket_cannot_take_is_not_sent() {
    let uri = server_uri();
    let (a, commands) = client(&uri).await;
    let (b, _) = client(&uri).await;
    let name = format!("mp_no_room_{}", std::process::id());
    let (a, b) = (a.database(&name), b.database(&name));
    bounded(30, a.drop()).await.unwrap();
    let (mine, others) = (Arrival::buckets(&a), Arrival::buckets(&b));
    bounded(30, mine.ensure()).await.unwrap();
    // Bucket 0 holds 2, as this handle knows (the second push opened
    // bucket 1 ahead, at half of the key's first bucket).
    for n in 0..2 {
        bounded(10, mine.push(&Arrival { acct: 1, n }))
            .await
            .unwrap();
    }
    // Another instance adds a third.
    bounded(10, others.push(&Arrival { acct: 1, n: 2 }))
        .await
        .unwrap();
    commands.take();
    // The first goes alone and fills bucket 0 (one update); the other two
    // queue meanwhile, and the handle knows bucket 0 held 3 at least.
    let mine = &mine;
    let pushes = (3..6).map(|n| async move { mine.push(&Arrival { acct: 1, n }).await });
    for r in bounded(10, futures::future::join_all(pushes)).await {
        r.unwrap();
    }
    let sent: Vec<String> = commands.take().into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        sent,
        [
            "update",
            "find",
            "findAndModify",
            "insert",
            "find",
            "update"
        ],
        "one update fills bucket 0; then one read, the item that finds it \
         full lands in bucket 1 (which opens bucket 2 ahead and checks its \
         start), and the last item is one update"
    );
    let stored: Vec<u32> = bounded(10, mine.stream(&1).try_collect::<Vec<_>>())
        .await
        .unwrap()
        .iter()
        .map(|a| a.n)
        .collect();
    assert_eq!(stored, (0..6).collect::<Vec<_>>());
    bounded(30, a.drop()).await.unwrap();
}
