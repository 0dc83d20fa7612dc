//! Pages walked from the start: keyset `after(token)` against
//! `skip(p·100).limit(100)`.

use std::sync::Arc;

use futures::TryStreamExt;
use mongo_patterns::keyset::PageToken;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::BoxResult;
use tokio::sync::Mutex;

use crate::cell::op;
use crate::{Ctx, Row};

const PAGE: u32 = 100;

#[derive(Debug, Clone, Serialize, Deserialize, Model)]
#[serde(rename_all = "camelCase")]
#[model(collection = "visits")]
pub(crate) struct Visit {
    #[serde(rename = "_id")]
    id: ObjectId,
    visitor: i64,
    init_time: DateTime,
}

/// Both designs at each number of tasks; each task walks the collection
/// page by page and starts again after the last.
pub(crate) async fn run(ctx: &Ctx, tasks: &[usize], visits: u64) -> BoxResult<Vec<Row>> {
    load(ctx, visits).await?;
    let pages = visits.div_ceil(u64::from(PAGE));
    let mut rows = Vec::new();
    for &n in tasks {
        let db = ctx.db.clone();
        let at: Arc<Vec<Mutex<Option<PageToken>>>> =
            Arc::new((0..n).map(|_| Mutex::new(None)).collect());
        rows.push(
            ctx.cell(
                "keyset `after(token).page()`",
                false,
                n,
                op(move |task, _| {
                    let (db, at) = (db.clone(), at.clone());
                    async move {
                        let mut token = at[task].lock().await;
                        let query = Visit::keyset(&db).page_size(PAGE);
                        let page = match token.as_ref() {
                            Some(t) => query.after(t).page().await?,
                            None => query.page().await?,
                        };
                        if page.items.is_empty() {
                            return Err("an empty page".into());
                        }
                        *token = page.next;
                        Ok(())
                    }
                }),
            )
            .await?,
        );

        let coll: Arc<Collection<Visit>> = Arc::new(Visit::collection(&ctx.db));
        let at: Arc<Vec<Mutex<u64>>> = Arc::new((0..n).map(|_| Mutex::new(0)).collect());
        rows.push(
            ctx.cell(
                "naive: `find().sort({_id: 1}).skip(p·100).limit(100)`",
                true,
                n,
                op(move |task, _| {
                    let (coll, at) = (coll.clone(), at.clone());
                    async move {
                        let mut p = at[task].lock().await;
                        let items: Vec<Visit> = coll
                            .find(doc! {})
                            .sort(doc! {"_id": 1})
                            .skip(*p * u64::from(PAGE))
                            .limit(i64::from(PAGE))
                            .await?
                            .try_collect()
                            .await?;
                        if items.is_empty() {
                            return Err("an empty page".into());
                        }
                        *p = (*p + 1) % pages;
                        Ok(())
                    }
                }),
            )
            .await?,
        );
    }
    Ok(rows)
}

/// `visits` visits, by `insert_many`; no index but `_id`'s.
async fn load(ctx: &Ctx, visits: u64) -> BoxResult<()> {
    ctx.clear().await?;
    let coll = Visit::collection(&ctx.db);
    let base = 1_704_067_200_000_i64;
    let all: Vec<Visit> = (0..visits)
        .map(|i| Visit {
            id: ObjectId::new(),
            visitor: (i % 1000) as i64,
            init_time: DateTime::from_millis(base + i as i64 * 300),
        })
        .collect();
    for chunk in all.chunks(10_000) {
        coll.insert_many(chunk).await?;
    }
    Ok(())
}
