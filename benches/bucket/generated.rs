//! Generated against hand-written: the same commands, compared field by
//! field, then the client CPU each costs, and the page decoders alone.

use std::hint::black_box;

use futures::TryStreamExt;
use mongo_patterns::bson::{Bson, RawDocumentBuf};
use mongo_patterns::bucket::PageRequest;
use mongo_patterns::mongodb::{Client, Collection};
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{cpu_ticks, median_f64, BoxResult, Meter};
use mongo_patterns_testkit::Commands;

use crate::by_hand::{
    decode_like_runtime, decode_spliced, decode_typed, page_by_hand, page_by_hand_raw,
    push_by_hand, range_pipeline, Decoder,
};
use crate::cost::{self, Path};
use crate::{trade, Args, Sliced, Trade, BUCKETS, CUSTOMER, GEN_KEY, HAND_KEY, SIZE};

const VARIANT: [&str; 2] = ["generated", "hand"];

/// Strips the values out of a command, keeping its field names and types,
/// so that two commands for different keys and items can be compared.
fn shape(b: &Bson) -> String {
    match b {
        Bson::Document(d) => {
            let inner: Vec<String> = d
                .iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "lsid" | "$db" | "txnNumber" | "$clusterTime")
                })
                .map(|(k, v)| format!("{k}: {}", shape(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        Bson::Array(a) => format!("[{}]", a.iter().map(shape).collect::<Vec<_>>().join(", ")),
        other => format!("{:?}", other.element_type()),
    }
}

pub(crate) async fn generated_vs_hand(
    args: &Args,
    uri: &str,
    db: &Database,
    commands: &Commands,
) -> BoxResult<String> {
    eprintln!("generated vs hand-written");
    // Round trips and command shapes, on the monitored client.
    let repo = Trade::buckets(db);
    let raw: Collection<Document> = db.collection(BUCKETS);
    let typed: Collection<Sliced> = db.collection(BUCKETS);
    repo.push_many(&[trade(GEN_KEY, 0)]).await?;
    repo.push_many(&[trade(HAND_KEY, 0)]).await?;
    commands.take();
    repo.push(&trade(GEN_KEY, 1)).await?;
    let gen_cmds = commands.take();
    push_by_hand(&raw, &trade(HAND_KEY, 1), 0).await?;
    let hand_cmds = commands.take();
    let gen_shape: Vec<String> = gen_cmds
        .iter()
        .map(|(n, c)| format!("{n} {}", shape(&Bson::Document(c.clone()))))
        .collect();
    let hand_shape: Vec<String> = hand_cmds
        .iter()
        .map(|(n, c)| format!("{n} {}", shape(&Bson::Document(c.clone()))))
        .collect();
    let push_same = gen_shape == hand_shape;
    if !push_same {
        eprintln!("push commands differ:\n gen  {gen_shape:?}\n hand {hand_shape:?}");
    }
    let last = args.trades.div_ceil(100) as u32;
    let page = 500.min(last);
    let gp = repo
        .page(&CUSTOMER, PageRequest::page(page).page_size(100))
        .await?;
    let gen_page_cmds = commands.take();
    let hp = page_by_hand(&typed, CUSTOMER, page, 100).await?;
    let hand_page_cmds = commands.take();
    assert_eq!(gp.items, hp, "hand-written page equals the generated one");
    let strip = |v: &[(String, Document)]| -> Vec<(String, Document)> {
        v.iter()
            .map(|(n, c)| {
                let mut c = c.clone();
                for k in ["lsid", "$db", "$clusterTime"] {
                    c.remove(k);
                }
                (n.clone(), c)
            })
            .collect()
    };
    let page_same = strip(&gen_page_cmds) == strip(&hand_page_cmds);
    if !page_same {
        eprintln!("page commands differ:\n gen  {gen_page_cmds:?}\n hand {hand_page_cmds:?}");
    }
    // A cost compared over different commands says nothing: stop, as the
    // rank program does (a "NO" in the table went unnoticed for days).
    if !push_same || !page_same {
        return Err(
            "the hand-written commands differ from the generated ones: update by_hand.rs".into(),
        );
    }

    // CPU, on a client without monitoring.
    let plain = Client::with_uri_str(uri).await?;
    let pdb = plain.database(db.name());
    let prepo = Trade::buckets(&pdb);
    let praw: Collection<Document> = pdb.collection(BUCKETS);
    let ptyped: Collection<Sliced> = pdb.collection(BUCKETS);
    // Teach the fresh repository GEN_KEY's open bucket (seq 0): one push.
    prepo.push(&trade(GEN_KEY, 2)).await?;
    push_by_hand(&praw, &trade(HAND_KEY, 2), 0).await?;
    let ops = args.cpu_ops as u64;
    let meter = Meter::from_env()?;
    let mut next = 3u64;
    let mut cpu = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]]; // [push|page][gen|hand]
    let mut ticks = [[0u64; 2]; 2];
    for rep in 0..args.cpu_reps {
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for &v in &order {
            let t0 = cpu_ticks();
            let m = meter.start();
            for k in 0..ops {
                if v == 0 {
                    prepo.push(&trade(GEN_KEY, next + k)).await?;
                } else {
                    push_by_hand(&praw, &trade(HAND_KEY, next + k), 0).await?;
                }
            }
            let raw = meter.stop(m, &format!("push {} rep {rep}", VARIANT[v]))?;
            cpu[0][v].push(meter.per(raw, ops));
            ticks[0][v] += cpu_ticks() - t0;
        }
        next += ops;
    }
    // Pages take no room in a bucket: as many repetitions as asked.
    let page_ops = args.page_ops as u64;
    for rep in 0..args.page_reps {
        let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for &v in &order {
            let t0 = cpu_ticks();
            let m = meter.start();
            for k in 0..page_ops {
                let p = 1 + (page - 1 + k as u32) % last.max(1);
                if v == 0 {
                    black_box(
                        prepo
                            .page(&CUSTOMER, PageRequest::page(p).page_size(100))
                            .await?,
                    );
                } else {
                    black_box(page_by_hand(&ptyped, CUSTOMER, p, 100).await?);
                }
            }
            let raw = meter.stop(m, &format!("page {} rep {rep}", VARIANT[v]))?;
            cpu[1][v].push(meter.per(raw, page_ops));
            ticks[1][v] += cpu_ticks() - t0;
        }
    }
    let gen_total = repo.count(&GEN_KEY).await?;
    let hand_total = repo.count(&HAND_KEY).await?;
    assert_eq!(gen_total, hand_total, "both keys got the same pushes");
    assert!(
        gen_total <= SIZE as u64,
        "no bucket rollover in the CPU runs"
    );

    let mut out = format!(
        "### Generated vs hand-written: interleaved repetitions (push: {} of {} ops; page: {} of {} pages)\n\n",
        args.cpu_reps, ops, args.page_reps, page_ops
    );
    out += &format!(
        "Push: `Buckets::push` vs `update_one` by `_id: {{k, s}}` with the same filter and update (command shapes equal: {}). Page: `Buckets::page(page {page}.., 100)` vs the same aggregation through `Collection<Sliced>` deserialising `items` (commands equal: {}). Measured on a client without command monitoring. {}\n\n",
        if push_same { "yes" } else { "NO" },
        if page_same { "yes" } else { "NO" },
        meter.describe()
    );
    out += "| operation | round trips generated / hand | utime+stime ticks generated / hand |\n| --- | :---: | :---: |\n";
    let rts = [
        (gen_cmds.len(), hand_cmds.len()),
        (gen_page_cmds.len(), hand_page_cmds.len()),
    ];
    let names = ["bucket `push`", "bucket `page` (100 items)"];
    for (i, name) in names.iter().enumerate() {
        out += &format!(
            "| {name} | {} / {} | {} / {} |\n",
            rts[i].0, rts[i].1, ticks[i][0], ticks[i][1]
        );
    }
    out += "\n";
    let [push, page_cost] = cpu;
    let paths: Vec<Path> = [push, page_cost]
        .into_iter()
        .zip(names)
        .map(|([generated, hand], name)| Path {
            name: name.to_owned(),
            unit: meter.unit(if name.contains("push") {
                "push"
            } else {
                "page"
            }),
            generated,
            hand,
        })
        .collect();
    out += &cost::table(&paths);

    // The same page call by hand, but decoding as the runtime does: if this
    // costs what `Buckets::page` costs, the gap is the decoding.
    let rawc: Collection<RawDocumentBuf> = pdb.collection(BUCKETS);
    let mut three: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for rep in 0..args.cpu_reps {
        for i in 0..3 {
            let v = (i + rep) % 3;
            let m = meter.start();
            for k in 0..ops {
                let p = 1 + (page - 1 + k as u32) % last.max(1);
                match v {
                    0 => {
                        black_box(
                            prepo
                                .page(&CUSTOMER, PageRequest::page(p).page_size(100))
                                .await?,
                        );
                    }
                    1 => {
                        black_box(page_by_hand(&ptyped, CUSTOMER, p, 100).await?);
                    }
                    _ => {
                        black_box(page_by_hand_raw(&rawc, CUSTOMER, p, 100).await?);
                    }
                }
            }
            let raw = meter.stop(m, &format!("page three ways {v} rep {rep}"))?;
            three[v].push(meter.per(raw, ops));
        }
    }
    for v in &mut three {
        v.sort_by(f64::total_cmp);
    }
    let typed_m = median_f64(&three[1]);
    out += &format!(
        "Page calls, three ways, {} interleaved repetitions of {} pages (same command each):\n\n| variant | {} (median rep) | ÷ hand-written typed |\n| --- | ---: | ---: |\n",
        args.cpu_reps,
        ops,
        meter.unit("page")
    );
    for (v, label) in [
        "generated `Buckets::page`",
        "hand-written, typed `Collection<Sliced>`",
        "hand-written, `Collection<RawDocumentBuf>` + the runtime's per-item decoding",
    ]
    .iter()
    .enumerate()
    {
        let m = median_f64(&three[v]);
        out += &format!("| {label} | {m:.1} | {:.3} |\n", m / typed_m);
    }
    out += "\n";

    // Client-side decoding alone, no server: the reply of one page (the
    // sliced buckets, as raw documents) turned into `Vec<Trade>` three ways.
    let from = (i64::from(page) - 1) * 100;
    let replies: Vec<RawDocumentBuf> = praw
        .aggregate(range_pipeline(CUSTOMER, from, 101))
        .with_type::<RawDocumentBuf>()
        .await?
        .try_collect()
        .await?;
    let decoders: [(&str, Decoder); 3] = [
        ("copy each item into a `RawDocumentBuf`, append the key, `from_slice` (the runtime's decoding before)", decode_like_runtime),
        ("typed: `from_slice::<Sliced>` of each bucket, key set in Rust (the hand-written page)", decode_typed),
        ("proposed: one reused buffer, item bytes + pre-encoded key element, `from_slice`", decode_spliced),
    ];
    let expect = decode_typed(&replies, CUSTOMER)?;
    // Instructions do not vary: a few decodes tell what many would.
    let loops: u64 = if meter.is_instructions() { 20 } else { 2000 };
    let mut dec: Vec<Vec<f64>> = vec![Vec::new(); decoders.len()];
    for rep in 0..args.cpu_reps {
        for (d, (_, f)) in decoders.iter().enumerate() {
            assert_eq!(f(&replies, CUSTOMER)?, expect, "decoders agree");
            let m = meter.start();
            for _ in 0..loops {
                black_box(f(black_box(&replies), CUSTOMER)?);
            }
            let raw = meter.stop(m, &format!("decode {d} rep {rep}"))?;
            dec[d].push(meter.per(raw, loops));
        }
    }
    for v in &mut dec {
        v.sort_by(f64::total_cmp);
    }
    let base = median_f64(&dec[1]);
    out += &format!(
        "Decoding one page's reply ({} buckets, {} items) on the client only, {} decodes per repetition, median of {}:\n\n| decoder | {} | ÷ typed |\n| --- | ---: | ---: |\n",
        replies.len(),
        expect.len(),
        loops,
        args.cpu_reps,
        meter.unit("page")
    );
    for (d, (label, _)) in decoders.iter().enumerate() {
        let m = median_f64(&dec[d]);
        out += &format!("| {label} | {m:.1} | {:.2}× |\n", m / base);
    }
    out += "\n";
    Ok(out)
}
