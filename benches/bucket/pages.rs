//! Page reads: `Buckets::page` against the naive design's
//! `find().sort().skip().limit()`, by round trips, `explain`, bytes and
//! wall time.

use std::hint::black_box;
use std::time::Instant;

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{explain, median, ms, opt, thousands, BoxResult};
use mongo_patterns_testkit::{bsonc, Commands};

use crate::by_hand::range_pipeline;
use crate::{Args, Trade, BUCKETS, CUSTOMER, NAIVE};

/// Runs `cmd` (a find or aggregate that fits its first batch) and sums the
/// BSON sizes of the documents it returns.
async fn reply_bytes(db: &Database, cmd: Document) -> BoxResult<(u64, usize)> {
    let reply = db.run_command(cmd).await?;
    let cursor = reply.get_document("cursor")?;
    let batch = cursor.get_array("firstBatch")?;
    let mut bytes = 0u64;
    for d in batch {
        if let Bson::Document(d) = d {
            bytes += bsonc::to_vec(d)?.len() as u64;
        }
    }
    Ok((bytes, batch.len()))
}

struct PageCase {
    label: String,
    page: u32,
    per: u32,
    newest: bool,
}

pub(crate) async fn pages(
    args: &Args,
    db: &Database,
    repo: &Buckets<Trade>,
    naive: &Collection<Trade>,
    commands: &Commands,
) -> BoxResult<String> {
    let n = args.trades;
    let last = n.div_ceil(100) as u32;
    let mut cases = Vec::new();
    for p in [1u32, 100, 1000] {
        if p < last {
            cases.push(PageCase {
                label: format!("{p}"),
                page: p,
                per: 100,
                newest: false,
            });
        }
    }
    cases.push(PageCase {
        label: format!("{last} (last)"),
        page: last,
        per: 100,
        newest: false,
    });
    // Sizes 20 and 50 at the deep page whose first item is that of page
    // 1000 of 100 (or of the last page when there are fewer).
    let deep_item = (u64::from(1000.min(last)) - 1) * 100;
    for per in [20u32, 50] {
        let p = (deep_item / u64::from(per)) as u32 + 1;
        cases.push(PageCase {
            label: format!("{p} (item {})", thousands(deep_item)),
            page: p,
            per,
            newest: false,
        });
    }
    cases.push(PageCase {
        label: "1 newest first".into(),
        page: 1,
        per: 100,
        newest: true,
    });

    let mut out = String::new();
    out += "### Page reads: bucket `page()` vs naive `find({customerId}).sort({date: 1}).skip((p-1)*s).limit(s)`\n\n";
    out += "Round trips: commands seen by command monitoring around one call. Keys/docs examined: `explain` (`executionStats`) of the exact command (bucket: the aggregate from `page_pipeline`, which asks for s + 1 items to know whether another page follows; newest first, the one aggregate that reads the newest bucket by the `_id` range and looks up the page's buckets from its total). Bytes: sum of BSON sizes of the reply documents. Time: median of ";
    out += &format!(
        "{} fetches on the test server (ratios only).\n\n",
        args.reps
    );
    out += "| page (size) | round trips bucket / naive | keys examined bucket / naive | docs examined bucket / naive | bytes returned bucket / naive | ms per page bucket / naive | time naive ÷ bucket |\n| --- | :---: | :---: | :---: | :---: | :---: | ---: |\n";
    let coll = BUCKETS;
    for c in &cases {
        eprintln!("page {} of {}", c.label, c.per);
        let mut req = PageRequest::page(c.page).page_size(c.per);
        if c.newest {
            req = req.newest_first();
        }
        let per = i64::from(c.per);
        let skip = (i64::from(c.page) - 1) * per;
        let pipeline = repo.page_pipeline(&CUSTOMER, req)?;
        if !c.newest {
            assert_eq!(
                pipeline,
                range_pipeline(CUSTOMER, skip, per + 1),
                "pipeline shape"
            );
        }
        let sort = if c.newest {
            doc! {"date": -1}
        } else {
            doc! {"date": 1}
        };
        let find = |skip: i64| {
            let mut f =
                doc! {"find": NAIVE, "filter": {"customerId": CUSTOMER}, "sort": sort.clone()};
            if skip > 0 {
                f.insert("skip", skip);
            }
            f.insert("limit", per);
            f
        };
        let agg = doc! {"aggregate": coll, "pipeline": pipeline.clone(), "cursor": {}};

        // Correctness and round trips.
        commands.take();
        let bp = repo.page(&CUSTOMER, req).await?;
        let b_rt = commands.take_count();
        let np: Vec<Trade> = naive
            .find(doc! {"customerId": CUSTOMER})
            .sort(sort.clone())
            .skip(skip as u64)
            .limit(per)
            .await?
            .try_collect()
            .await?;
        let n_rt = commands.take_count();
        assert_eq!(bp.items, np, "both designs return the same page");

        let be = explain(db, agg.clone()).await?;
        let ne = explain(db, find(skip)).await?;
        let (bb, _) = reply_bytes(db, agg.clone()).await?;
        let (nb, _) = reply_bytes(db, find(skip)).await?;

        let mut bt = Vec::new();
        let mut nt = Vec::new();
        for _ in 0..args.reps {
            let t = Instant::now();
            black_box(repo.page(&CUSTOMER, req).await?);
            bt.push(t.elapsed());
            let t = Instant::now();
            let v: Vec<Trade> = naive
                .find(doc! {"customerId": CUSTOMER})
                .sort(sort.clone())
                .skip(skip as u64)
                .limit(per)
                .await?
                .try_collect()
                .await?;
            black_box(v);
            nt.push(t.elapsed());
        }
        commands.take();
        let (bm, nm) = (median(&mut bt), median(&mut nt));
        out += &format!(
            "| {} ({}) | {} / {} | {} / {} | {} / {} | {} / {} | {:.1} / {:.1} | {:.2}× |\n",
            c.label,
            c.per,
            b_rt,
            n_rt,
            opt(be.keys),
            opt(ne.keys),
            opt(be.docs),
            opt(ne.docs),
            thousands(bb),
            thousands(nb),
            ms(bm),
            ms(nm),
            nm.as_secs_f64() / bm.as_secs_f64()
        );
    }
    out += "\n";
    Ok(out)
}
