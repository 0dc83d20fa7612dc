//! Increments of one hot key: a sampled and a buffered counter against an
//! exact `$inc`.

use std::sync::Arc;

use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::BoxResult;

use crate::cell::op;
use crate::{Ctx, Row};

const HOT: &str = "p00001";

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "products")]
pub(crate) struct Product {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100)]
    views: i64,
    /// Counted by hand, one `$inc: 1` per view.
    exact_views: i64,
}

/// The same views, counted in memory and written 100 at a time.
#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[model(collection = "products")]
pub(crate) struct BufferedProduct {
    #[serde(rename = "_id")]
    id: String,
    #[approx_counter(every = 100, mode = "buffered", max_delay_ms = 3600000)]
    views: i64,
}

/// The designs at each number of tasks, then from each of `instances`
/// (clients standing in for processes, clients × tasks each, each client
/// with counter handles of its own, as each process of a service has:
/// `with_options`, since the natural call gives one counter per database
/// name within a process).
pub(crate) async fn run(
    ctx: &Ctx,
    tasks: &[usize],
    instances: &[(usize, usize)],
) -> BoxResult<Vec<Row>> {
    let mut rows = Vec::new();
    let cells = tasks
        .iter()
        .map(|&n| (1, n))
        .chain(instances.iter().copied());
    for (clients, n) in cells {
        let dbs = ctx.instances(clients, n.max(10) as u32).await?;
        fresh(ctx).await?;
        let sampled: Arc<Vec<_>> = Arc::new(
            dbs.iter()
                .map(|(db, _)| Product::views_counter(db).with_options(Options::new()))
                .collect(),
        );
        rows.push(
            ctx.cell_of(
                "sampled `incr` (every = 100)",
                false,
                clients,
                n,
                op(move |t, _| {
                    let counter = sampled[t % sampled.len()].clone();
                    async move {
                        counter.incr(HOT).await?;
                        Ok(())
                    }
                }),
            )
            .await?,
        );

        fresh(ctx).await?;
        let buffered: Arc<Vec<_>> = Arc::new(
            dbs.iter()
                .map(|(db, _)| BufferedProduct::views_counter(db).with_options(Options::new()))
                .collect(),
        );
        let counting = buffered.clone();
        let row = ctx
            .cell_of(
                "buffered `incr` (every = 100; a key holds at most 99 acknowledged per process)",
                false,
                clients,
                n,
                op(move |t, _| {
                    let counter = counting[t % counting.len()].clone();
                    async move {
                        counter.incr(HOT).await?;
                        Ok(())
                    }
                }),
            )
            .await?;
        // Exact once every process's handle is shut down: every increment
        // the cell counted, once; and each handle wrote once per 100.
        let mut writes = 0;
        for counter in buffered.iter() {
            writes += counter.stats().writes;
            counter.shutdown().await?;
        }
        let stored = ctx
            .db
            .collection::<Document>("products")
            .find_one(doc! {"_id": HOT})
            .await?
            .and_then(|d| d.get_i64("views").ok())
            .unwrap_or(0);
        if stored != row.ops as i64 {
            return Err(format!("buffered: {stored} stored for {} increments", row.ops).into());
        }
        if writes > row.ops / 100 + clients as u64 {
            return Err(format!("buffered: {writes} writes for {} increments", row.ops).into());
        }
        rows.push(row);

        fresh(ctx).await?;
        let naive: Arc<Vec<Collection<Document>>> = Arc::new(
            dbs.iter()
                .map(|(db, _)| db.collection("products"))
                .collect(),
        );
        rows.push(
            ctx.cell_of(
                "naive: exact `$inc` per increment",
                true,
                clients,
                n,
                op(move |t, _| {
                    let coll = naive[t % naive.len()].clone();
                    async move {
                        let r = coll
                            .update_one(doc! {"_id": HOT}, doc! {"$inc": {"exact_views": 1}})
                            .await?;
                        if r.matched_count != 1 {
                            return Err("no hot product".into());
                        }
                        Ok(())
                    }
                }),
            )
            .await?,
        );
    }
    Ok(rows)
}

/// The hot product, every counter at 0.
async fn fresh(ctx: &Ctx) -> BoxResult<()> {
    ctx.clear().await?;
    Product::collection(&ctx.db)
        .insert_one(Product {
            id: HOT.to_owned(),
            views: 0,
            exact_views: 0,
        })
        .await?;
    Ok(())
}
