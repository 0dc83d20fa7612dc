//! Pushes of trades: `Buckets::push` against one document per trade.

use std::sync::Arc;

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::{Collection, IndexModel};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::BoxResult;

use crate::cell::op;
use crate::{Ctx, Row};

const HISTORY: &str = "history";
const NAIVE: &str = "trades_naive";
const FIRST_CUSTOMER: i64 = 1_000;

/// A trade, in buckets of 100 (small, so that a run crosses many
/// rollovers, where pushes race).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 100, key = "customerId", order = "date")]
pub(crate) struct Trade {
    customer_id: i64,
    ticker: String,
    qty: i32,
    date: DateTime,
}

/// The same trade kept in arrival order (no `order`): the server places
/// each push, in the bucket last seen open or the one opened ahead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "history")]
#[bucket(size = 100, key = "customerId")]
pub(crate) struct Arrival {
    customer_id: i64,
    ticker: String,
    qty: i32,
    date: DateTime,
}

impl From<Trade> for Arrival {
    fn from(t: Trade) -> Self {
        Arrival {
            customer_id: t.customer_id,
            ticker: t.ticker,
            qty: t.qty,
            date: t.date,
        }
    }
}

/// Trade `i`: to customer `i mod keys`, a second after trade `i - 1`.
fn trade(keys: u64, i: u64) -> Trade {
    Trade {
        customer_id: FIRST_CUSTOMER + (i % keys) as i64,
        ticker: ["MDB", "AAPL", "MSFT"][i as usize % 3].to_owned(),
        qty: 1 + (i % 500) as i32,
        date: DateTime::from_millis(1_767_225_600_000 + i as i64 * 1000),
    }
}

/// Both designs at each number of tasks, pushing to `keys` customers,
/// then from each of `instances` (clients standing in for processes, as
/// clients × tasks each).
pub(crate) async fn run(
    ctx: &Ctx,
    tasks: &[usize],
    keys: u64,
    instances: &[(usize, usize)],
) -> BoxResult<Vec<Row>> {
    let mut rows = Vec::new();
    let cells = tasks
        .iter()
        .map(|&n| (1, n))
        .chain(instances.iter().copied());
    for (clients, n) in cells {
        let dbs = ctx.instances(clients, n.max(10) as u32).await?;
        let arrival: Vec<_> = dbs.iter().map(|(db, _)| Arrival::buckets(db)).collect();
        let arrival = Arc::new(arrival);
        fresh(ctx).await?;
        let r = ctx
            .cell_of(
                "`Buckets::push`, arrival order (no `order`)",
                false,
                clients,
                n,
                op(move |t, i| {
                    let repo = arrival[t % arrival.len()].clone();
                    async move {
                        repo.push(&Arrival::from(trade(keys, i))).await?;
                        Ok(())
                    }
                }),
            )
            .await?;
        check(ctx, keys, r.ops).await?;
        rows.push(r);

        let ordered: Vec<_> = dbs.iter().map(|(db, _)| Trade::buckets(db)).collect();
        let ordered = Arc::new(ordered);
        fresh(ctx).await?;
        let r = ctx
            .cell_of(
                "`Buckets::push`, `order = \"date\"` (racing tasks make some pushes late)",
                false,
                clients,
                n,
                op(move |t, i| {
                    let repo = ordered[t % ordered.len()].clone();
                    async move {
                        repo.push(&trade(keys, i)).await?;
                        Ok(())
                    }
                }),
            )
            .await?;
        check(ctx, keys, r.ops).await?;
        rows.push(r);

        fresh(ctx).await?;
        let naive: Vec<Collection<Trade>> =
            dbs.iter().map(|(db, _)| db.collection(NAIVE)).collect();
        let naive = Arc::new(naive);
        rows.push(
            ctx.cell_of(
                "naive: `insert_one` of a document per trade",
                true,
                clients,
                n,
                op(move |t, i| {
                    let naive = naive[t % naive.len()].clone();
                    async move {
                        naive.insert_one(trade(keys, i)).await?;
                        Ok(())
                    }
                }),
            )
            .await?,
        );
    }
    Ok(rows)
}

/// Both designs' collections, empty, with their indexes.
async fn fresh(ctx: &Ctx) -> BoxResult<()> {
    ctx.clear().await?;
    let naive = ctx.db.collection::<Document>(NAIVE);
    Trade::buckets(&ctx.db).ensure().await?;
    Arrival::buckets(&ctx.db).ensure().await?;
    naive
        .create_index(
            IndexModel::builder()
                .keys(doc! {"customerId": 1, "date": 1})
                .build(),
        )
        .await?;
    Ok(())
}

/// Every push counted once: the buckets' counts add up to the pushes, and
/// their items too.
async fn check(ctx: &Ctx, keys: u64, pushes: u64) -> BoxResult<()> {
    let repo = Trade::buckets(&ctx.db);
    if keys == 1 {
        let total = repo.count(&FIRST_CUSTOMER).await?;
        if total != pushes {
            return Err(format!("{pushes} pushes, the key's total is {total}").into());
        }
    }
    let mut c = ctx
        .db
        .collection::<Document>(HISTORY)
        .aggregate(vec![doc! {"$group": {
            "_id": Bson::Null,
            "count": {"$sum": "$count"},
            "items": {"$sum": {"$size": "$items"}},
        }}])
        .await?;
    let (count, items) = match c.try_next().await? {
        Some(d) => (lossy(d.get("count")), lossy(d.get("items"))),
        None => (0, 0),
    };
    if count != pushes as i64 || items != pushes as i64 {
        return Err(format!("{pushes} pushes, buckets count {count} and hold {items}").into());
    }
    Ok(())
}

fn lossy(b: Option<&Bson>) -> i64 {
    match b {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Double(v)) => *v as i64,
        _ => -1,
    }
}
