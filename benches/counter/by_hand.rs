//! The hand-written baselines: exact counting, and a sampled counter as a
//! user of the driver would write it.
//!
//! They repeat what the runtime does on purpose, and share none of its
//! code: a baseline built on the runtime's helpers could not show what
//! those helpers cost. [`crate::cpu`] checks that both send the same
//! writes.

use std::sync::atomic::{AtomicU64, Ordering};

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
/// `Counter::seeded` uses, and one time in N `$inc: N` by `_id`. The
/// stream is shared by every task counting with it, as a seeded handle's
/// is by its clones, so each draw claims its number with an atomic add.
pub(crate) async fn hand_sampled(
    coll: &Collection<Document>,
    field: &str,
    id: &str,
    every: u64,
    seed: u64,
    draws: &AtomicU64,
) -> BoxResult<bool> {
    let r = seeded_draw(seed, draws.fetch_add(1, Ordering::Relaxed));
    if ((u128::from(r) * u128::from(every)) >> 64) == 0 {
        coll.update_one(doc! {"_id": id}, doc! {"$inc": {field: every as i64}})
            .await?;
        return Ok(true);
    }
    Ok(false)
}

thread_local! {
    /// The hand-written counter's random state: xorshift64* per thread, as
    /// a user without a seeded stream would write it.
    static RNG: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Seeds this thread's hand-written random state (never 0).
pub(crate) fn seed_hand_rng(seed: u64) {
    RNG.with(|s| s.set(seed | 1));
}

/// The hand-written sampled counter on a per-thread random source: one draw
/// per view, and one time in N `$inc: N` by `_id`.
pub(crate) async fn hand_sampled_thread(
    coll: &Collection<Document>,
    field: &str,
    id: &str,
    every: u64,
) -> BoxResult<bool> {
    let r = RNG.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    });
    if ((u128::from(r) * u128::from(every)) >> 64) == 0 {
        coll.update_one(doc! {"_id": id}, doc! {"$inc": {field: every as i64}})
            .await?;
        return Ok(true);
    }
    Ok(false)
}
