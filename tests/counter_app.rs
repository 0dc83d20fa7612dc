//! Counters inside an application: increments in a caller's session and
//! transaction (every mode), a first-increment race inside one, options as
//! command monitoring sees them, and tenants in collections of their own.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mongo_patterns::action::Options;
use mongo_patterns::bson::{doc, Bson, Document};
use mongo_patterns::mongodb::options::{
    Acknowledgment, ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, client, fresh_db, server_uri};

/// Every = 10 and `incr_by(.., 10)`: each mode writes exactly 10 at once,
/// so what a test sees does not depend on a draw.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "items")]
struct Item {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 10, upsert = true)]
    sampled: i64,
    #[approx_counter(every = 10, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    buffered: i64,
    #[approx_counter(every = 10, mode = "geometric", upsert = true)]
    geo: i64,
}

async fn raw(db: &Database, coll: &str, id: &str) -> Option<Document> {
    db.collection::<Document>(coll)
        .find_one(doc! {"_id": id})
        .await
        .unwrap()
}

async fn field(db: &Database, coll: &str, id: &str, f: &str) -> Option<i64> {
    raw(db, coll, id).await.and_then(|d| match d.get(f) {
        Some(Bson::Int32(i)) => Some(i64::from(*i)),
        Some(Bson::Int64(i)) => Some(*i),
        _ => None,
    })
}

/// A command's `maxTimeMS`, however the driver typed it.
fn ms(cmd: &Document) -> Option<i64> {
    match cmd.get("maxTimeMS") {
        Some(Bson::Int32(i)) => Some(i64::from(*i)),
        Some(Bson::Int64(i)) => Some(*i),
        _ => None,
    }
}

fn w0() -> WriteConcern {
    WriteConcern::builder().w(Acknowledgment::Nodes(0)).build()
}

/// The update-like commands sent (name, command), others left out.
fn writes(cmds: Vec<(String, Document)>) -> Vec<(String, Document)> {
    cmds.into_iter()
        .filter(|(n, _)| n == "update" || n == "findAndModify")
        .collect()
}

/// In a caller's transaction, each mode's `incr_by` writes in it (the
/// buffered one through at once): aborted, nothing stored; committed, all.
#[tokio::test]
async fn increments_in_a_callers_transaction() {
    let (db, _) = fresh_db("ctr_txn").await;
    let (s, b, g) = (
        Item::sampled_counter(&db),
        Item::buffered_counter(&db),
        Item::geo_counter(&db),
    );
    // The collection exists before a transaction writes to it.
    db.create_collection("items").await.unwrap();
    let mut session = db.client().start_session().await.unwrap();
    for commit in [false, true] {
        let key = if commit { "kept" } else { "dropped" };
        session.start_transaction().await.unwrap();
        bounded(20, async {
            // `maxTimeMS` sends the update through `run_command`: in the
            // transaction as well.
            s.incr_by(key, 10)
                .max_time(Duration::from_secs(10))
                .session(&mut session)
                .await
                .unwrap();
            b.incr_by(key, 10).session(&mut session).await.unwrap();
            g.incr_by(key, 10).session(&mut session).await.unwrap();
            // The transaction sees its own writes; the buffer holds nothing.
            assert_eq!(b.estimate(key).session(&mut session).await.unwrap(), 10);
            assert_eq!(b.stats().pending, 0);
        })
        .await;
        if commit {
            session.commit_transaction().await.unwrap();
        } else {
            session.abort_transaction().await.unwrap();
        }
        let d = raw(&db, "items", key).await;
        if commit {
            let d = d.expect("committed");
            for f in ["sampled", "buffered", "geo"] {
                assert_eq!(d.get_i64(f).unwrap(), 10, "{f}: {d:?}");
            }
        } else {
            assert_eq!(d, None, "aborted: nothing stored");
        }
    }
    // Outside a transaction a session's increments are written as well.
    b.incr_by("kept", 5).session(&mut session).await.unwrap();
    assert_eq!(field(&db, "items", "kept", "buffered").await, Some(15));
    assert_eq!(b.stats().pending, 0);
    assert_eq!(b.stats().increments, 25);
}

/// Two first increments of a new key, one inside a caller's transaction
/// whose snapshot predates the other's insert: the transaction's upsert
/// loses, with a transient error; `and_run2` with `?` runs it again and
/// commits on top of the other's document.
#[tokio::test]
async fn first_increment_race_in_a_transaction_is_transient() {
    let (db, _) = fresh_db("ctr_race").await;
    let (other, _) = client(&server_uri()).await;
    let other = other.database(db.name()).collection::<Document>("items");
    db.create_collection("items").await.unwrap();
    let counters = [
        Item::sampled_counter(&db),
        Item::buffered_counter(&db),
        Item::geo_counter(&db),
    ];
    let mut session = db.client().start_session().await.unwrap();
    for (i, c) in counters.iter().enumerate() {
        let f = ["sampled", "buffered", "geo"][i];
        let key = format!("race-{f}");
        let coll = db.collection::<Document>("items");
        // Once by hand: the error the caller sees.
        session.start_transaction().await.unwrap();
        coll.find_one(doc! {"_id": "pin"})
            .session(&mut session)
            .await
            .unwrap();
        other
            .insert_one(doc! {"_id": &key, f: 1_i64})
            .await
            .unwrap();
        let err = bounded(
            20,
            c.incr_by(key.as_str(), 10)
                .session(&mut session)
                .into_future(),
        )
        .await
        .unwrap_err();
        assert!(err.is_transient(), "{f}: {err:?}");
        let _ = session.abort_transaction().await;
        assert_eq!(field(&db, "items", &key, f).await, Some(1));

        // Then through `and_run2`: the first attempt races, the second commits.
        let key = format!("retried-{f}");
        let attempts = AtomicUsize::new(0);
        bounded(
            30,
            session.start_transaction().and_run2(async |s| {
                coll.find_one(doc! {"_id": "pin"}).session(&mut *s).await?;
                if attempts.fetch_add(1, Ordering::Relaxed) == 0 {
                    other.insert_one(doc! {"_id": &key, f: 1_i64}).await?;
                }
                c.incr_by(key.as_str(), 10).session(s).await?;
                Ok(())
            }),
        )
        .await
        .unwrap();
        assert_eq!(attempts.load(Ordering::Relaxed), 2, "{f}");
        assert_eq!(field(&db, "items", &key, f).await, Some(11), "{f}");
    }
}

/// 16 tasks' first increments of one new key, no transaction: the losers
/// of the upsert race are retried, every increment is stored once.
#[tokio::test]
async fn first_increments_race_outside_transactions() {
    let (db, _) = fresh_db("ctr_race16").await;
    for round in 0..5 {
        let key = format!("new-{round}");
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                // A handle of its own each (`Item::geo_counter(&db)` gives
                // the process's shared one): a geometric handle's write size
                // grows with what it read back, and 10 must stay at least
                // that size.
                let own = || Options::new();
                let s = Item::sampled_counter(&db).with_options(own());
                let g = Item::geo_counter(&db).with_options(own());
                let key = key.clone();
                tokio::spawn(async move {
                    s.incr_by(key.as_str(), 10).await.unwrap();
                    g.incr_by(key.as_str(), 10).await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            bounded(30, t).await.unwrap();
        }
        assert_eq!(field(&db, "items", &key, "sampled").await, Some(160));
        assert_eq!(field(&db, "items", &key, "geo").await, Some(160));
    }
}

/// Write concern, comment and `maxTimeMS` on each mode's writes, set on
/// the call or as repository defaults (a buffered flush's writes carry the
/// defaults); `w: 0` too. Read concern and read preference on `estimate`.
#[tokio::test]
async fn options_reach_the_commands() {
    let (db, cmds) = fresh_db("ctr_opts").await;
    let (s, b, g) = (
        Item::sampled_counter(&db),
        Item::buffered_counter(&db),
        Item::geo_counter(&db),
    );
    let modes = [("sampled", &s), ("buffered", &b), ("geo", &g)];
    let wc_of = |c: &Document| c.get_document("writeConcern").ok().cloned();
    bounded(60, async {
        for (f, c) in modes {
            let name = if f == "geo" {
                "findAndModify"
            } else {
                "update"
            };
            // On the call: majority (the driver's own command), then with
            // comment and maxTimeMS, then w: 0.
            cmds.take();
            c.incr_by("k", 10)
                .write_concern(WriteConcern::majority())
                .await
                .unwrap();
            let sent = writes(cmds.take());
            assert_eq!(sent.len(), 1, "{f}: {sent:?}");
            assert_eq!(sent[0].0, name);
            assert_eq!(wc_of(&sent[0].1), Some(doc! {"w": "majority"}), "{f}");
            // Buffered too: a write concern on the call writes it through.
            assert_eq!(c.stats().pending, 0, "{f}");

            c.incr_by("k", 10)
                .write_concern(WriteConcern::majority())
                .comment(format!("c-{f}"))
                .max_time(Duration::from_secs(7))
                .await
                .unwrap();
            let sent = writes(cmds.take());
            assert_eq!(sent.len(), 1, "{f}: {sent:?}");
            let cmd = &sent[0].1;
            assert_eq!(wc_of(cmd), Some(doc! {"w": "majority"}), "{f}");
            assert_eq!(cmd.get_str("comment").ok(), Some(format!("c-{f}").as_str()));
            assert_eq!(ms(cmd), Some(7000), "{f}");

            c.incr_by("k", 10).write_concern(w0()).await.unwrap();
            let sent = writes(cmds.take());
            assert_eq!(sent.len(), 1, "{f}: {sent:?}");
            assert_eq!(wc_of(&sent[0].1), Some(doc! {"w": 0}), "{f}");
            // Unacknowledged: it lands soon after.
            let mut v = None;
            for _ in 0..100 {
                v = field(&db, "items", "k", f).await;
                if v == Some(30) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(v, Some(30), "{f}");

            // Estimate: read concern and read preference.
            cmds.take();
            let got = c
                .estimate("k")
                .read_concern(ReadConcern::majority())
                .selection_criteria(SelectionCriteria::ReadPreference(
                    ReadPreference::PrimaryPreferred {
                        options: Default::default(),
                    },
                ))
                .comment("est")
                .await
                .unwrap();
            assert_eq!(got, 30);
            let find = cmds
                .take()
                .into_iter()
                .find(|(n, _)| n == "find")
                .expect("a find")
                .1;
            assert_eq!(
                find.get_document("readConcern").ok(),
                Some(&doc! {"level": "majority"})
            );
            assert_eq!(
                find.get_document("$readPreference")
                    .ok()
                    .and_then(|d| d.get_str("mode").ok()),
                Some("primaryPreferred"),
                "{find:?}"
            );
            assert_eq!(find.get_str("comment").ok(), Some("est"));
        }

        // Repository defaults: every mode's writes, the buffered flush's
        // included; then `w: 0` as a default.
        for (wc, want) in [
            (WriteConcern::majority(), doc! {"w": "majority"}),
            (w0(), doc! {"w": 0}),
        ] {
            let defaults = Options::new()
                .write_concern(wc)
                .comment("defaults")
                .max_time(Duration::from_secs(9));
            let s = Item::sampled_counter(&db).with_options(defaults.clone());
            let b = Item::buffered_counter(&db).with_options(defaults.clone());
            let g = Item::geo_counter(&db).with_options(defaults);
            cmds.take();
            s.incr_by("d", 10).await.unwrap();
            g.incr_by("d", 10).await.unwrap();
            b.incr_by("d", 3).await.unwrap();
            assert!(writes(cmds.take()).len() == 2);
            b.flush().await.unwrap();
            b.incr_by("d", 10).await.unwrap(); // a full key: its own write
            let sent = writes(cmds.take());
            assert_eq!(sent.len(), 2, "{sent:?}");
            for (name, cmd) in &sent {
                assert_eq!(wc_of(cmd).as_ref(), Some(&want), "{name}: {cmd:?}");
                assert_eq!(cmd.get_str("comment").ok(), Some("defaults"), "{cmd:?}");
                assert_eq!(ms(cmd), Some(9000));
            }
            // The call's own options win over the defaults.
            b.incr_by("d", 5).await.unwrap();
            b.flush().comment("mine").await.unwrap();
            let sent = writes(cmds.take());
            assert_eq!(sent.len(), 1);
            assert_eq!(sent[0].1.get_str("comment").ok(), Some("mine"));
            assert_eq!(wc_of(&sent[0].1).as_ref(), Some(&want));
        }
        // Both rounds landed (the second unacknowledged: wait for it).
        let mut got = (None, None, None);
        for _ in 0..100 {
            got = (
                field(&db, "items", "d", "sampled").await,
                field(&db, "items", "d", "buffered").await,
                field(&db, "items", "d", "geo").await,
            );
            if got == (Some(20), Some(36), Some(20)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(got, (Some(20), Some(36), Some(20)));
    })
    .await;
}

/// Two tenants with collections of their own: same keys, no cross-talk;
/// the compile-time collection stays untouched.
#[tokio::test]
async fn tenants_in_their_own_collections() {
    let (db, _) = fresh_db("ctr_tenants").await;
    bounded(30, async {
        for (tenant, n) in [("tenant_a", 10_u64), ("tenant_b", 30)] {
            let s = Item::sampled_counter(&db).with_collection(tenant);
            let b = Item::buffered_counter(&db).with_collection(tenant);
            let g = Item::geo_counter(&db).with_collection(tenant);
            assert_eq!(s.collection().name(), tenant);
            assert_eq!(b.declared()[0].collection, tenant);
            s.incr_by("p", n).await.unwrap();
            g.incr_by("p", n).await.unwrap();
            b.incr_by("p", n + 1).await.unwrap();
            b.flush().await.unwrap();
            assert_eq!(b.estimate("p").await.unwrap(), n as i64 + 1);
        }
        for (tenant, n) in [("tenant_a", 10_i64), ("tenant_b", 30)] {
            let d = raw(&db, tenant, "p").await.expect(tenant);
            assert_eq!(
                (
                    d.get_i64("sampled").ok(),
                    d.get_i64("buffered").ok(),
                    d.get_i64("geo").ok()
                ),
                (Some(n), Some(n + 1), Some(n)),
                "{tenant}: {d:?}"
            );
        }
        assert_eq!(raw(&db, "items", "p").await, None);
        // A handle made for the default collection still counts there.
        Item::sampled_counter(&db).incr_by("p", 10).await.unwrap();
        assert_eq!(field(&db, "items", "p", "sampled").await, Some(10));
        assert_eq!(field(&db, "tenant_a", "p", "sampled").await, Some(10));
    })
    .await;
}

/// `M::<field>_counter(&db)` called where a counter is needed (as a
/// request handler would) gives the one counter of the process while a
/// handle of it lives: one buffer, written once per `every` increments of
/// all the calls. Another database or field is another counter; a handle
/// of its own (`with_options`) keeps its own buffer.
#[tokio::test]
async fn the_natural_call_shares_one_counter_per_process() {
    let (db, commands) = fresh_db("ctr_shared").await;
    let (other_db, _) = fresh_db("ctr_shared_other").await;
    bounded(30, async {
        // The one the application keeps for the life of the process.
        let kept = Item::buffered_counter(&db);
        commands.take();
        for _ in 0..95 {
            // A handler's call: a handle made and dropped per request.
            Item::buffered_counter(&db).incr("p").await.unwrap();
        }
        let writes = writes(commands.take());
        assert_eq!(writes.len(), 9, "one write per 10 increments: {writes:?}");
        let s = kept.stats();
        assert_eq!((s.increments, s.writes, s.pending), (95, 9, 5));
        assert_eq!(Item::buffered_counter(&db).stats(), s);
        // Not shared: another field, another database, a handle of its own.
        assert_eq!(Item::geo_counter(&db).stats().increments, 0);
        assert_eq!(Item::buffered_counter(&other_db).stats().increments, 0);
        let own = Item::buffered_counter(&db).with_options(Options::new());
        assert_eq!(own.stats().increments, 0);
        kept.shutdown().await.unwrap();
        assert_eq!(field(&db, "items", "p", "buffered").await, Some(95));
        // After its last handle, a new counter.
        drop(kept);
        assert_eq!(Item::buffered_counter(&db).stats().increments, 0);
    })
    .await;
}

/// A web handler's future must be `Send`: so are the actions' futures,
/// with a session too.
#[allow(dead_code)]
fn actions_are_send(c: Counter<Item>, mut s: mongo_patterns::mongodb::ClientSession) {
    fn send<F: std::future::Future + Send>(_: F) {}
    send(async move {
        c.incr("k").session(&mut s).await?;
        c.incr_by(&"k".to_owned(), 2).comment("x").await?;
        c.estimate("k").session(&mut s).await?;
        c.flush().write_concern(WriteConcern::majority()).await?;
        c.shutdown().await
    });
}
