//! The hand-written baselines: exact counting, and a sampled counter as a
//! user of the driver would write it.
//!
//! They repeat what the runtime does on purpose, and share none of its
//! code: a baseline built on the runtime's helpers could not show what
//! those helpers cost. [`crate::cpu`] checks that both send the same
//! writes.

use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::BoxResult;

use crate::workload::seeded_draw;
use crate::EXACT_FIELD;

/// Exact counting: one `$inc: 1` by `_id` per view.
pub(crate) async fn exact_incr(coll: &Collection<Document>, id: &str) -> BoxResult<()> {
    let r = coll
        .update_one(doc! {"_id": id}, doc! {"$inc": {EXACT_FIELD: 1}})
        .await?;
    if r.matched_count != 1 {
        return Err(format!("no product {id}").into());
    }
    Ok(())
}

/// The hand-written sampled counter: one draw per view from the same stream
/// `Counter::seeded` uses, and one time in N `$inc: N` by `_id`.
pub(crate) async fn hand_sampled(
    coll: &Collection<Document>,
    field: &str,
    id: &str,
    every: u64,
    seed: u64,
    draws: &mut u64,
) -> BoxResult<bool> {
    let r = seeded_draw(seed, *draws);
    *draws += 1;
    if ((u128::from(r) * u128::from(every)) >> 64) == 0 {
        coll.update_one(doc! {"_id": id}, doc! {"$inc": {field: every as i64}})
            .await?;
        return Ok(true);
    }
    Ok(false)
}
