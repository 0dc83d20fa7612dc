//! Loading the same trades into both designs: buckets by `push_many`, the
//! naive design (a document per trade) by `insert_many`.

use std::time::Instant;

use mongo_patterns::mongodb::{Collection, IndexModel};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{thousands, BoxResult};
use mongo_patterns_testkit::Commands;

use crate::{trade, Args, Trade, BUCKETS, CUSTOMER};

/// Loads both designs; the load table.
pub(crate) async fn load(
    args: &Args,
    db: &Database,
    repo: &Buckets<Trade>,
    naive: &Collection<Trade>,
    commands: &Commands,
) -> BoxResult<String> {
    repo.ensure().await?;
    naive
        .create_index(
            IndexModel::builder()
                .keys(doc! {"customerId": 1, "date": 1})
                .build(),
        )
        .await?;
    let n = args.trades;
    commands.take();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + args.batch as u64).min(n);
        let chunk: Vec<Trade> = (i..end).map(|j| trade(CUSTOMER, j)).collect();
        repo.push_many(&chunk).await?;
        i = end;
    }
    let bucket_load = t.elapsed();
    let bucket_rt = commands.take_count();
    eprintln!("bucket load {:.1} s", bucket_load.as_secs_f64());
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + args.batch as u64).min(n);
        let chunk: Vec<Trade> = (i..end).map(|j| trade(CUSTOMER, j)).collect();
        naive.insert_many(&chunk).await?;
        i = end;
    }
    let naive_load = t.elapsed();
    let naive_rt = commands.take_count();
    eprintln!("naive load {:.1} s", naive_load.as_secs_f64());
    let buckets_n = db
        .collection::<Document>(BUCKETS)
        .count_documents(doc! {})
        .await?;
    let naive_n = naive.count_documents(doc! {}).await?;
    assert_eq!(repo.count(&CUSTOMER).await?, n);
    let mut out = String::from("### Load\n\n| design | documents | round trips | seconds | trades/s | time naive ÷ bucket |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    out += &format!(
        "| bucket: `push_many` in chunks of {} | {} | {} | {:.1} | {:.0} | — |\n",
        thousands(args.batch as u64),
        thousands(buckets_n),
        bucket_rt,
        bucket_load.as_secs_f64(),
        n as f64 / bucket_load.as_secs_f64()
    );
    out += &format!(
        "| naive: `insert_many` in batches of {} (+ index `{{customerId: 1, date: 1}}`) | {} | {} | {:.1} | {:.0} | {:.2}× |\n\n",
        thousands(args.batch as u64),
        thousands(naive_n),
        naive_rt,
        naive_load.as_secs_f64(),
        n as f64 / naive_load.as_secs_f64(),
        naive_load.as_secs_f64() / bucket_load.as_secs_f64()
    );
    Ok(out)
}
