//! A trading desk in one transaction of the application's own: its
//! `accounts.update_one`, a bucket push of the trade, the trader's score on
//! a rank board and the ticker's volume counter. Aborted, nothing is
//! stored; committed, all of it is; sixteen at once through the driver's
//! `and_run2` all commit, with the invariants checked by the raw driver.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use mongo_patterns::mongodb::ClientSession;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::{bounded, Commands};

/// A fresh database ([`mongo_patterns_testkit::fresh_db`]). In CI's mongos
/// job (`MP_SHARD_PATTERN_COLLECTIONS=1`) the desk's bucket, histogram and
/// counter collections are sharded on their declared keys through
/// `ensure` first ([`mongo_patterns_testkit::shard_declared`]).
async fn fresh_db(test: &str) -> (Database, Commands) {
    let (db, commands) = mongo_patterns_testkit::fresh_db(test).await;
    let declared = Trade::declared(&db)
        .into_iter()
        .chain(Trader::declared(&db))
        .chain(Ticker::declared(&db));
    mongo_patterns_testkit::shard_declared(&db, &commands, declared).await;
    (db, commands)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "trades")]
#[bucket(size = 4, key = "deskId", items = "trades")]
struct Trade {
    desk_id: i64,
    trader: i64,
    ticker: String,
    qty: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[model(collection = "traders")]
#[rank_histogram(board = "desk", score = "pnl")]
struct Trader {
    #[serde(rename = "_id")]
    id: i64,
    desk: i64,
    pnl: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "tickers")]
struct Ticker {
    #[serde(rename = "_id")]
    id: String,
    /// Buffered outside a transaction; inside one, written through.
    #[approx_counter(every = 100, mode = "buffered", max_delay_ms = 3600000, upsert = true)]
    volume: i64,
}

const DESK: i64 = 7;
const CASH: i64 = 1_000_000;

/// The desk's state, read with the raw driver: cash, the trades in the
/// buckets, the traders' scores, the histogram's counts and the volume.
struct Stored {
    cash: i64,
    trades: Vec<Document>,
    scores: Vec<i64>,
    histogram: i64,
    volume: i64,
}

async fn stored(db: &Database) -> Stored {
    let accounts = db.collection::<Document>("accounts");
    let cash = accounts
        .find_one(doc! {"_id": DESK})
        .await
        .unwrap()
        .map_or(0, |d| d.get_i64("cash").unwrap());
    let mut trades = Vec::new();
    let mut buckets: Vec<Document> = db
        .collection::<Document>("trades")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    buckets.sort_by_key(|b| b.get_document("_id").unwrap().get_i64("s").unwrap_or(0));
    for b in &buckets {
        let items = b.get_array("trades").unwrap();
        assert_eq!(
            b.get_i32("count")
                .map(i64::from)
                .or(b.get_i64("count"))
                .unwrap(),
            items.len() as i64,
            "a bucket's count is its array's length"
        );
        trades.extend(items.iter().map(|i| i.as_document().unwrap().clone()));
    }
    let scores: Vec<i64> = db
        .collection::<Document>("traders")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .iter()
        .map(|d| d.get_i64("pnl").unwrap())
        .collect();
    let ranks = Trader::ranks(db);
    let histogram = ranks
        .histogram(&DESK)
        .await
        .map_or(0, |h| h.iter().map(|c| c.count as i64).sum());
    let volume = db
        .collection::<Document>("tickers")
        .find_one(doc! {"_id": "MDB"})
        .await
        .unwrap()
        .map_or(0, |d| {
            d.get_i64("volume")
                .or(d.get_i32("volume").map(i64::from))
                .unwrap()
        });
    Stored {
        cash,
        trades,
        scores,
        histogram,
        volume,
    }
}

/// One trade, all four writes in `s`'s transaction.
async fn trade(
    db: &Database,
    s: &mut ClientSession,
    trader: i64,
    qty: i64,
) -> mongo_patterns::mongodb::error::Result<()> {
    db.collection::<Document>("accounts")
        .update_one(doc! {"_id": DESK}, doc! {"$inc": {"cash": -qty}})
        .session(&mut *s)
        .await?;
    Trade::buckets(db)
        .push(&Trade {
            desk_id: DESK,
            trader,
            ticker: "MDB".into(),
            qty,
        })
        .session(&mut *s)
        .await?;
    Trader::ranks(db)
        .update_score(doc! {"_id": trader}, qty)
        .session(&mut *s)
        .await?;
    Ticker::volume_counter(db)
        .incr("MDB")
        .session(&mut *s)
        .await?;
    Ok(())
}

async fn setup(db: &Database, traders: i64) {
    db.collection::<Document>("accounts")
        .insert_one(doc! {"_id": DESK, "cash": CASH})
        .await
        .unwrap();
    let ranks = Trader::ranks(db);
    for id in 0..traders {
        ranks
            .insert(&Trader {
                id,
                desk: DESK,
                pnl: 0,
            })
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn an_aborted_trade_stores_nothing_and_a_committed_one_all() {
    bounded(60, async {
        let (db, _) = fresh_db("trading_one").await;
        setup(&db, 1).await;
        let mut s = db.client().start_session().await.unwrap();

        s.start_transaction().await.unwrap();
        trade(&db, &mut s, 0, 5).await.unwrap();
        s.abort_transaction().await.unwrap();
        let after = stored(&db).await;
        assert_eq!(after.cash, CASH, "aborted: cash untouched");
        assert!(after.trades.is_empty(), "aborted: no trade stored");
        assert_eq!(after.scores, vec![0], "aborted: score untouched");
        assert_eq!(after.histogram, 1, "aborted: one trader on the board");
        assert_eq!(after.volume, 0, "aborted: no volume");

        s.start_transaction().await.unwrap();
        trade(&db, &mut s, 0, 5).await.unwrap();
        s.commit_transaction().await.unwrap();
        let after = stored(&db).await;
        assert_eq!(after.cash, CASH - 5);
        assert_eq!(after.trades.len(), 1);
        assert_eq!(after.trades[0].get_i64("qty").unwrap(), 5);
        assert_eq!(after.scores, vec![5]);
        assert_eq!(after.histogram, 1);
        let rank = Trader::ranks(&db).rank(&DESK, 5).await.unwrap();
        assert_eq!(rank.rank, 1);
        assert_eq!(after.volume, 1);
    })
    .await;
}

/// Sixteen traders trade at once on one desk: every transaction writes the
/// same account and bucket key, so they conflict and race; `and_run2`
/// retries them and all commit, exactly once each.
#[tokio::test]
async fn sixteen_concurrent_trades_all_commit_exactly_once() {
    bounded(150, async {
        let (db, _) = fresh_db("trading_sixteen").await;
        const N: i64 = 16;
        setup(&db, N).await;
        // One task: `tokio::spawn` cannot take an `and_run2` future whose
        // callback borrows (its `Send` is not general enough), so the sixteen
        // interleave at their awaits.
        let attempts = AtomicUsize::new(0);
        let runs = (0..N).map(|trader| {
            let (db, attempts) = (db.clone(), &attempts);
            async move {
                let mut s = db.client().start_session().await?;
                let qty = trader + 1;
                s.start_transaction()
                    .and_run2(async |s| {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        trade(&db, s, trader, qty).await
                    })
                    .await
            }
        });
        let results =
            tokio::time::timeout(Duration::from_secs(140), futures::future::join_all(runs))
                .await
                .expect("the transactions finished in time");
        for r in results {
            r.expect("committed");
        }
        let attempts = attempts.into_inner();
        eprintln!("16 transactions committed in {attempts} attempts");
        assert!(
            attempts > N as usize,
            "the transactions conflicted and were retried ({attempts} attempts)"
        );
        let after = stored(&db).await;
        let total: i64 = (1..=N).sum();
        assert_eq!(after.cash, CASH - total, "every debit once");
        let mut traders: Vec<i64> = after
            .trades
            .iter()
            .map(|t| t.get_i64("trader").unwrap())
            .collect();
        traders.sort();
        assert_eq!(traders, (0..N).collect::<Vec<_>>(), "every trade once");
        let mut scores = after.scores.clone();
        scores.sort();
        assert_eq!(scores, (1..=N).collect::<Vec<_>>());
        assert_eq!(after.histogram, N, "the board counts every trader once");
        for (i, score) in (1..=N).rev().enumerate() {
            let r = Trader::ranks(&db).rank(&DESK, score).await.unwrap();
            assert_eq!(r.rank, i as u64 + 1, "rank of score {score}");
        }
        assert_eq!(after.volume, N, "the volume counts every trade once");
        assert_eq!(Trade::buckets(&db).count(&DESK).await.unwrap(), N as u64);
    })
    .await;
}
