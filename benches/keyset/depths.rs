//! A page at each depth: `skip(d).limit(n)` against keyset `after(token)`,
//! by round trips, `explain` and wall time.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongo_patterns::bson::Bson;
use mongo_patterns::mongodb::Collection;
use mongo_patterns::prelude::*;
use mongo_patterns_testkit::bench::{self, median, ms, thousands, BoxResult};
use mongo_patterns_testkit::Commands;

use crate::{settle, Args, Visit};

/// What the server examined for one command, and its winning plan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Explained {
    keys: u64,
    docs: u64,
    plan: String,
}

pub(crate) struct Measured {
    round_trips: usize,
    explain: Explained,
    time: Duration,
}

pub(crate) struct DepthRow {
    depth: u64,
    skip: Measured,
    keyset: Measured,
    /// The keyset page's boundary written plainly, `{_id: {$gt: last}}`.
    plain: Option<Explained>,
}

async fn skip_page(visits: &Collection<Visit>, depth: u64, n: u32) -> BoxResult<Vec<Visit>> {
    Ok(visits
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .skip(depth)
        .limit(i64::from(n))
        .await?
        .try_collect()
        .await?)
}

pub(crate) async fn depths(
    args: &Args,
    db: &Database,
    commands: &Commands,
) -> BoxResult<Vec<DepthRow>> {
    let visits = Visit::collection(db);
    let n = args.page_size;
    let mut rows = Vec::new();
    for &depth in &args.depths {
        eprintln!("depth {}:", thousands(depth));
        // Setup, untimed: the token that marks item `depth - 1`.
        let query = Visit::keyset(db).page_size(n);
        let (query, last_id) = if depth == 0 {
            (query, None)
        } else {
            let before = skip_page(&visits, depth - 1, 1).await?;
            let id = before.first().ok_or("no item before the depth")?.id;
            let marker = Visit::keyset(db)
                .filter(doc! {"_id": {"$gte": id}})
                .page_size(1)
                .page()
                .await?;
            if marker.items.first().map(|v| v.id) != Some(id) {
                return Err("the marker page does not start at the item".into());
            }
            let token = marker.next.ok_or("no token after the item")?;
            (query.after(&token), Some(id))
        };

        // Round trips (and a warm-up, and a check that both agree).
        commands.take();
        let by_skip = skip_page(&visits, depth, n).await?;
        settle().await;
        let skip_rt = commands.take_count();
        let by_keyset = query.page().await?;
        settle().await;
        let keyset_rt = commands.take_count();
        let ids = |v: &[Visit]| v.iter().map(|v| v.id).collect::<Vec<_>>();
        if ids(&by_skip) != ids(&by_keyset.items) {
            return Err(format!("depth {depth}: skip and keyset pages differ").into());
        }

        // Server work, from `explain` of the exact commands.
        let skip_explain = explain(
            db,
            doc! {"find": "visits", "filter": {}, "sort": {"_id": 1}, "skip": depth as i64, "limit": i64::from(n)},
        )
        .await?;
        let (filter, sort, limit) = query.command()?;
        let keyset_explain = explain(
            db,
            doc! {"find": "visits", "filter": filter, "sort": sort.clone(), "limit": limit},
        )
        .await?;
        let plain = match last_id {
            Some(id) => Some(
                explain(
                    db,
                    doc! {"find": "visits", "filter": {"_id": {"$gt": id}}, "sort": sort, "limit": limit},
                )
                .await?,
            ),
            None => None,
        };
        commands.take();

        // Wall time, interleaved.
        let mut skip_times = Vec::new();
        let mut keyset_times = Vec::new();
        for _ in 0..args.reps {
            let t = Instant::now();
            black_box(skip_page(&visits, depth, n).await?);
            skip_times.push(t.elapsed());
            let t = Instant::now();
            black_box(query.page().await?);
            keyset_times.push(t.elapsed());
        }
        commands.take();
        let row = DepthRow {
            depth,
            skip: Measured {
                round_trips: skip_rt,
                explain: skip_explain,
                time: median(&mut skip_times),
            },
            keyset: Measured {
                round_trips: keyset_rt,
                explain: keyset_explain,
                time: median(&mut keyset_times),
            },
            plain,
        };
        eprintln!(
            "  skip: {} rt, {} keys, {} docs, {:.1} ms; keyset: {} rt, {} keys, {} docs, {:.1} ms",
            row.skip.round_trips,
            row.skip.explain.keys,
            row.skip.explain.docs,
            ms(row.skip.time),
            row.keyset.round_trips,
            row.keyset.explain.keys,
            row.keyset.explain.docs,
            ms(row.keyset.time)
        );
        rows.push(row);
    }
    Ok(rows)
}

async fn explain(db: &Database, find: Document) -> BoxResult<Explained> {
    let e = bench::explain(db, find).await?;
    if e.keys.is_none() && e.docs.is_none() {
        return Err("explain returned no executionStats".into());
    }
    Ok(Explained {
        keys: e.keys.unwrap_or(0),
        docs: e.docs.unwrap_or(0),
        plan: e.plan.as_ref().map_or_else(|| "?".into(), describe_plan),
    })
}

/// `LIMIT ← FETCH ← IXSCAN _id (bounds)`, outermost first.
fn describe_plan(stage: &Document) -> String {
    let mut parts = Vec::new();
    let mut cur = Some(stage);
    while let Some(s) = cur {
        let mut name = s.get_str("stage").unwrap_or("?").to_owned();
        if let Ok(bounds) = s.get_document("indexBounds") {
            let b: Vec<String> = bounds
                .iter()
                .map(|(k, v)| match v {
                    Bson::Array(a) => format!(
                        "{k} {}",
                        a.iter()
                            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                            .collect::<Vec<_>>()
                            .join(" ∪ ")
                    ),
                    other => format!("{k} {other}"),
                })
                .collect();
            name = format!("{name} `{}`", shorten_oids(&b.join(", ")));
        }
        parts.push(name);
        cur = s.get_document("inputStage").ok().or_else(|| {
            // Several children (an `OR`): follow the first, mark the rest.
            s.get_array("inputStages")
                .ok()
                .and_then(|a| a.first())
                .and_then(Bson::as_document)
        });
        if let Ok(a) = s.get_array("inputStages") {
            if a.len() > 1 {
                parts.push(format!("({} inputs)", a.len()));
            }
        }
    }
    parts.join(" ← ")
}

/// Bounds print whole ObjectIds; keep the table narrow.
fn shorten_oids(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("ObjectId('") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "ObjectId('".len()..];
        match after.find("')") {
            Some(j) => {
                out.push_str("oid");
                rest = &after[j + 2..];
            }
            None => {
                rest = &rest[i..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The two tables: the figures per depth, then the plans.
pub(crate) fn report(out: &mut String, args: &Args, depth_rows: &[DepthRow]) -> std::fmt::Result {
    writeln!(
        out,
        "### A page of {} at depth d: `skip(d).limit({})` vs keyset `after(token)`\n",
        args.page_size, args.page_size
    )?;
    writeln!(out, "Round trips are commands seen by command monitoring for one page; keys/docs examined are the server's `explain` (`executionStats`) of the exact command; time is the median of {} fetches on the test server (compare as ratios only).\n", args.reps)?;
    writeln!(out, "| depth d | round trips skip / keyset | keys examined skip / keyset | docs examined skip / keyset | ms per page skip / keyset | time skip ÷ keyset | keys examined skip ÷ keyset | docs examined skip ÷ keyset |")?;
    writeln!(
        out,
        "| ---: | :---: | :---: | :---: | :---: | ---: | ---: | ---: |"
    )?;
    for r in depth_rows {
        writeln!(
            out,
            "| {} | {} / {} | {} / {} | {} / {} | {:.1} / {:.1} | {:.2}× | {:.1}× | {:.2}× |",
            thousands(r.depth),
            r.skip.round_trips,
            r.keyset.round_trips,
            thousands(r.skip.explain.keys),
            thousands(r.keyset.explain.keys),
            thousands(r.skip.explain.docs),
            thousands(r.keyset.explain.docs),
            ms(r.skip.time),
            ms(r.keyset.time),
            r.skip.time.as_secs_f64() / r.keyset.time.as_secs_f64(),
            r.skip.explain.keys as f64 / r.keyset.explain.keys.max(1) as f64,
            r.skip.explain.docs as f64 / r.keyset.explain.docs.max(1) as f64,
        )?;
    }
    writeln!(out)?;
    writeln!(out, "Winning plans and the keyset boundary: the runtime sends a boundary that keeps every `_id` after `last` in BSON's sort order, whatever its type (`{{_id: {{$not: {{$lte: last}}}}}}`, less the types that sort before ObjectIds); the plain `{{_id: {{$gt: last}}}}` is what one writes by hand.\n")?;
    writeln!(out, "| depth d | skip plan | keyset plan | keyset keys / docs | plain `{{_id: {{$gt: last}}}}` plan | plain keys / docs |")?;
    writeln!(out, "| ---: | --- | --- | :---: | --- | :---: |")?;
    for r in depth_rows {
        writeln!(
            out,
            "| {} | {} | {} | {} / {} | {} | {} |",
            thousands(r.depth),
            r.skip.explain.plan,
            r.keyset.explain.plan,
            thousands(r.keyset.explain.keys),
            thousands(r.keyset.explain.docs),
            r.plain.as_ref().map_or("—".into(), |e| e.plan.clone()),
            r.plain.as_ref().map_or("—".into(), |e| format!(
                "{} / {}",
                thousands(e.keys),
                thousands(e.docs)
            )),
        )?;
    }
    writeln!(out)
}
