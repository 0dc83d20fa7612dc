//! Single writes: `push` against the naive `insert_one`, and where a
//! push's time goes.

use std::time::Instant;

use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::MAX_BUCKET_BYTES;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{median, ms, thousands, BoxResult};
use mongo_patterns_testkit::bsonc;
use mongo_patterns_testkit::Commands;

use crate::by_hand::push_by_hand;
use crate::{trade, Args, Item, Trade, BUCKETS, CUSTOMER, SIZE};

pub(crate) async fn writes(
    args: &Args,
    db: &Database,
    repo: &Buckets<Trade>,
    naive: &Collection<Trade>,
    commands: &Commands,
) -> BoxResult<String> {
    eprintln!("writes");
    let n = args.trades;
    let mut bt = Vec::with_capacity(args.writes);
    let mut nt = Vec::with_capacity(args.writes);
    let mut b_rt = 0;
    let mut n_rt = 0;
    let mut b_max = 0;
    commands.take();
    for k in 0..args.writes as u64 {
        let t1 = trade(CUSTOMER, n + k);
        let t = Instant::now();
        repo.push(&t1).await?;
        bt.push(t.elapsed());
        let c = commands.take_count();
        b_rt += c;
        b_max = b_max.max(c);
        let t = Instant::now();
        naive.insert_one(&t1).await?;
        nt.push(t.elapsed());
        n_rt += commands.take_count();
    }
    assert_eq!(repo.count(&CUSTOMER).await?, n + args.writes as u64);
    commands.take();
    // Where a push's time goes: the same `update_one` by `_id` by hand, then
    // without `$sort`, then changing no array at all, each on a key of its
    // own (one bucket, filled from 1 to at most 1000 items).
    let raw: Collection<Document> = db.collection(BUCKETS);
    let ops = args.writes.min(SIZE as usize - 1) as u64;
    let mut parts = Vec::new();
    for (v, label) in [
        "hand-written push (same `update_one`)",
        "simpler: `_id` and room checks only, `$push` of the item",
        "same simple filter, `$inc` only (array untouched)",
    ]
    .iter()
    .enumerate()
    {
        let key = 7_100_000 + v as i64;
        repo.push_many(&[trade(key, 0)]).await?;
        commands.take();
        let mut ts = Vec::new();
        for k in 1..=ops {
            let t = Instant::now();
            write_variant(&raw, &trade(key, k), v).await?;
            ts.push(t.elapsed());
        }
        let rt = commands.take_count();
        parts.push((label.to_string(), rt as f64 / ops as f64, median(&mut ts)));
    }
    let (bm, nm) = (median(&mut bt), median(&mut nt));
    let w = args.writes as f64;
    let mut out = format!(
        "### Single writes: {} interleaved ops each\n\n`push` appends to the open bucket (one `updateOne` by `_id`); every 1000th push opens the next bucket (failed update + point read + upsert).\n\n",
        thousands(args.writes as u64)
    );
    out += "| design | round trips per op (mean) | max | ms per op (median) | time ÷ bucket |\n| --- | ---: | ---: | ---: | ---: |\n";
    out += &format!(
        "| bucket `push` | {:.3} | {} | {:.3} | 1.00× |\n",
        b_rt as f64 / w,
        b_max,
        ms(bm)
    );
    out += &format!(
        "| naive `insert_one` | {:.3} | 1 | {:.3} | {:.2}× |\n\n",
        n_rt as f64 / w,
        ms(nm),
        nm.as_secs_f64() / bm.as_secs_f64()
    );
    out += &format!(
        "Where a push's time goes ({} ops each on a fresh key, one bucket):\n\n| variant | round trips per op | ms per op (median) | time ÷ bucket `push` |\n| --- | ---: | ---: | ---: |\n",
        thousands(ops)
    );
    for (label, rt, m) in parts {
        out += &format!(
            "| {label} | {rt:.3} | {:.3} | {:.2}× |\n",
            ms(m),
            m.as_secs_f64() / bm.as_secs_f64()
        );
    }
    out += "\n";
    Ok(out)
}

/// Variants of the push command: 0 = the hand-written push (the runtime's
/// command), 1 = a plain `$push` behind a filter without the damage and
/// order checks, 2 = the same filter with `$inc` only. Written out by hand,
/// like the baselines in [`crate::by_hand`], and for the same reason.
async fn write_variant(coll: &Collection<Document>, t: &Trade, v: usize) -> BoxResult<()> {
    if v == 0 {
        return push_by_hand(coll, t, 0).await;
    }
    let item = bsonc::to_document(&Item {
        kind: t.kind.clone(),
        ticker: t.ticker.clone(),
        qty: t.qty,
        date: t.date,
    })?;
    let len = bsonc::to_vec(&item)?.len() as i64 + 8;
    let filter = doc! {
        "_id": {"k": t.customer_id, "s": 0_i64},
        "customerId": t.customer_id,
        "sealed": Bson::Null,
        "count": {"$lte": SIZE - 1},
        "bytes": {"$lte": MAX_BUCKET_BYTES - len},
    };
    let update = if v == 1 {
        doc! {
            "$push": {"items": {"$each": [item]}},
            "$inc": {"count": 1_i64, "bytes": len},
        }
    } else {
        doc! {"$inc": {"count": 1_i64, "bytes": len}}
    };
    let r = coll.update_one(filter, update).upsert(false).await?;
    if r.matched_count != 1 {
        return Err("write variant matched no open bucket".into());
    }
    Ok(())
}
