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

/// The designs at each number of tasks; the generated handle is shared by
/// the tasks, as an application shares it.
pub(crate) async fn run(ctx: &Ctx, tasks: &[usize]) -> BoxResult<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in tasks {
        fresh(ctx).await?;
        let counter = Arc::new(Product::views_counter(&ctx.db));
        rows.push(
            ctx.cell(
                "sampled `incr` (every = 100)",
                false,
                n,
                op(move |_, _| {
                    let counter = counter.clone();
                    async move {
                        counter.incr(HOT).await?;
                        Ok(())
                    }
                }),
            )
            .await?,
        );

        fresh(ctx).await?;
        let counter = Arc::new(BufferedProduct::views_counter(&ctx.db));
        let counting = counter.clone();
        let row = ctx
            .cell(
                "buffered `incr` (every = 100; a key holds at most 99 acknowledged)",
                false,
                n,
                op(move |_, _| {
                    let counter = counting.clone();
                    async move {
                        counter.incr(HOT).await?;
                        Ok(())
                    }
                }),
            )
            .await?;
        // Exact once shut down: every increment the cell counted, once.
        counter.shutdown().await?;
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
        rows.push(row);

        fresh(ctx).await?;
        let coll: Arc<Collection<Document>> = Arc::new(ctx.db.collection("products"));
        rows.push(
            ctx.cell(
                "naive: exact `$inc` per increment",
                true,
                n,
                op(move |_, _| {
                    let coll = coll.clone();
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
