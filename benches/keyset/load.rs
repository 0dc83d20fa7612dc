//! Loading: the visits, in batches, with no index but `_id`'s.

use std::time::{Duration, Instant};

use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{splitmix64, thousands, BoxResult};

use crate::{Args, Visit};

pub(crate) async fn load(args: &Args, db: &Database) -> BoxResult<Duration> {
    let visits = Visit::collection(db);
    let visitors = (args.docs / 4).max(1);
    let base = 1_704_067_200_000_i64; // 2024-01-01T00:00:00Z
    eprintln!("loading {} visits...", args.docs);
    let t = Instant::now();
    let mut batch = Vec::with_capacity(args.batch);
    let mut next_report = 100_000;
    for i in 0..args.docs {
        let who = splitmix64(i) % visitors;
        let h = splitmix64(who ^ 0x5eed);
        let g = splitmix64(h);
        batch.push(Visit {
            id: ObjectId::new(),
            uuid: format!(
                "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                h >> 32,
                (h >> 16) & 0xffff,
                h & 0xfff,
                0x8000 | (g >> 48) & 0x3fff,
                g & 0xffff_ffff_ffff
            ),
            init_time: DateTime::from_millis(base + i as i64 * 300),
        });
        if batch.len() == args.batch || i + 1 == args.docs {
            visits.insert_many(&batch).await?;
            batch.clear();
            if i + 1 >= next_report {
                eprintln!(
                    "  {} loaded, {:.1} s",
                    thousands(i + 1),
                    t.elapsed().as_secs_f64()
                );
                next_report += 100_000;
            }
        }
    }
    let took = t.elapsed();
    let n = visits.estimated_document_count().await?;
    if n != args.docs {
        return Err(format!("loaded {n} visits, expected {}", args.docs).into());
    }
    Ok(took)
}
