//! A shard key analyser that runs on any deployment: a `$sample` of the
//! collection, and the figures MongoDB 7.0's `analyzeShardKey` reports
//! under `keyCharacteristics`: distinct values, the most common values with
//! their frequency, and monotonicity.
//!
//! Monotonicity is the rank correlation (Spearman's) between the key's
//! order and insertion order, which here is `_id` order for ObjectId
//! `_id`s (an ObjectId starts with its creation second). MongoDB correlates
//! with the record id and calls a key monotonic at a coefficient of 0.7 or
//! more; so does this. Figures come from the sample, so they are estimates:
//! a key with more distinct values than the sample has documents shows as
//! many distinct values as documents.

use mongodb::bson;
use std::cmp::Ordering;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::AggregateOptions;
use mongodb::{ClientSession, Collection};

use crate::action::Options;
use crate::error::{Error, Result};

/// MongoDB's threshold for a monotonic key.
pub const MONOTONIC: f64 = 0.7;
/// Fewer distinct values than this in the sample: low cardinality.
pub const LOW_CARDINALITY: u64 = 100;
/// A value holding more than this share of the sample is a hot spot.
pub const HOT_VALUE: f64 = 0.25;
/// The most common values reported.
const MOST_COMMON: usize = 5;

/// What [`analyze`] found about a candidate key.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KeyAnalysis {
    /// The key's fields, in order.
    pub key: Vec<String>,
    /// Documents sampled.
    pub sampled: u64,
    /// Distinct key values in the sample (`numDistinctShardKeyValues`).
    pub distinct: u64,
    /// The most common values, most common first, with their count and
    /// share of the sample (`mostCommonValues`).
    pub most_common: Vec<(Document, u64, f64)>,
    /// Spearman's correlation of key order with insertion order, in
    /// -1..=1; `None` when insertion order is unknown (no ObjectId `_id`s)
    /// or the sample is too small.
    pub correlation: Option<f64>,
    /// For a key of two fields or more: distinct values of the prefix (every
    /// field but the last) in the sample.
    pub prefix_distinct: Option<u64>,
    /// For a key of two fields or more: Spearman's correlation of the last
    /// field's order with insertion order among documents that share a
    /// prefix value, averaged over prefix values weighted by their
    /// documents. Near 1 for `{type, ts}`: each type is one ascending
    /// stream, though the whole key is not monotonic. `None` as for
    /// `correlation`, or when no prefix value has 3 documents.
    pub prefix_correlation: Option<f64>,
    /// What the figures mean, in words.
    pub verdict: Vec<String>,
}

impl KeyAnalysis {
    /// `|correlation| ≥ 0.7`, as MongoDB decides it.
    pub fn monotonic(&self) -> Option<bool> {
        self.correlation.map(|c| c.abs() >= MONOTONIC)
    }

    /// Fewer than [`LOW_CARDINALITY`] distinct values in the sample.
    pub fn low_cardinality(&self) -> bool {
        self.distinct < LOW_CARDINALITY
    }
}

/// Samples up to `sample` documents of `coll` and analyses `key` (BSON field
/// names, dotted paths allowed). One aggregation.
pub async fn analyze(
    coll: &Collection<Document>,
    key: &[&str],
    sample: u32,
) -> Result<KeyAnalysis> {
    analyze_with(coll, key, sample, &Options::default(), None).await
}

/// [`analyze`] with read options, in `session` when there is one.
pub(crate) async fn analyze_with(
    coll: &Collection<Document>,
    key: &[&str],
    sample: u32,
    options: &Options,
    session: Option<&mut ClientSession>,
) -> Result<KeyAnalysis> {
    if key.is_empty() {
        return Err(Error::invalid("key", "a shard key has at least one field"));
    }
    if sample < 2 {
        return Err(Error::invalid("sample", "sample at least 2 documents"));
    }
    let mut project = doc! {"_id": 1};
    for (i, f) in key.iter().enumerate() {
        project.insert(format!("k{i}"), format!("${f}"));
    }
    let aggregate = coll
        .aggregate(vec![
            doc! {"$sample": {"size": i64::from(sample)}},
            doc! {"$project": project},
        ])
        .with_options(options.driver::<AggregateOptions>());
    let rows: Vec<Document> = match session {
        None => aggregate.await?.try_collect().await?,
        Some(s) => {
            let mut cursor = aggregate.session(&mut *s).await?;
            cursor.stream(s).try_collect().await?
        }
    };
    let values: Vec<(Vec<Bson>, Bson)> = rows
        .into_iter()
        .map(|mut d| {
            // A missing field sorts and counts as null, as in a shard key.
            let k = (0..key.len())
                .map(|i| d.remove(format!("k{i}")).unwrap_or(Bson::Null))
                .collect();
            (k, d.remove("_id").unwrap_or(Bson::Null))
        })
        .collect();
    Ok(characteristics(key, &values))
}

/// The analysis of sampled `(key value, _id)` pairs.
pub fn characteristics(key: &[&str], values: &[(Vec<Bson>, Bson)]) -> KeyAnalysis {
    let n = values.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| cmp_tuple(&values[a].0, &values[b].0));
    // Runs of equal values: distinct count, frequencies, tied ranks.
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (start in `order`, length)
    for (i, &idx) in order.iter().enumerate() {
        match runs.last_mut() {
            Some((start, len))
                if cmp_tuple(&values[order[*start]].0, &values[idx].0) == Ordering::Equal =>
            {
                *len += 1
            }
            _ => runs.push((i, 1)),
        }
    }
    let mut by_count = runs.clone();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let most_common = by_count
        .iter()
        .take(MOST_COMMON)
        .map(|&(start, len)| {
            let v = &values[order[start]].0;
            let d: Document = key
                .iter()
                .zip(v)
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            (d, len as u64, len as f64 / n.max(1) as f64)
        })
        .collect();
    let mut key_rank = vec![0.0; n];
    for &(start, len) in &runs {
        let r = start as f64 + (len as f64 - 1.0) / 2.0;
        for &idx in &order[start..start + len] {
            key_rank[idx] = r;
        }
    }
    let insertion = insertion_ranks(values);
    let correlation = insertion.as_ref().and_then(|ins| spearman(&key_rank, ins));
    let (prefix_distinct, prefix_correlation) = match key.len() {
        0 | 1 => (None, None),
        len => {
            let (distinct, c) = per_prefix(values, &order, len - 1, insertion.as_deref());
            (Some(distinct), c)
        }
    };
    let mut a = KeyAnalysis {
        key: key.iter().map(|k| k.to_string()).collect(),
        sampled: n as u64,
        distinct: runs.len() as u64,
        most_common,
        correlation,
        prefix_distinct,
        prefix_correlation,
        verdict: Vec::new(),
    };
    a.verdict = verdict(&a);
    a
}

/// The prefix's distinct values (the first `prefix` fields), and the
/// correlation of the rest of the key with insertion order within each
/// prefix value, weighted by the value's documents. `order` sorts `values`
/// by key, so each prefix value is one run of it, sorted by the rest.
fn per_prefix(
    values: &[(Vec<Bson>, Bson)],
    order: &[usize],
    prefix: usize,
    insertion: Option<&[f64]>,
) -> (u64, Option<f64>) {
    let mut groups: Vec<&[usize]> = Vec::new();
    let mut start = 0;
    for i in 1..=order.len() {
        let split = i == order.len()
            || cmp_tuple(
                &values[order[start]].0[..prefix],
                &values[order[i]].0[..prefix],
            )
            .is_ne();
        if split {
            groups.push(&order[start..i]);
            start = i;
        }
    }
    let Some(ins) = insertion else {
        return (groups.len() as u64, None);
    };
    let (mut sum, mut weight) = (0.0, 0.0);
    for g in groups.iter().filter(|g| g.len() >= 3) {
        // Within the group, `g` is in key order; tied key values share a
        // rank, as in the whole key's correlation.
        let mut key_rank = vec![0.0; g.len()];
        let mut i = 0;
        while i < g.len() {
            let mut j = i + 1;
            while j < g.len() && cmp_tuple(&values[g[i]].0, &values[g[j]].0).is_eq() {
                j += 1;
            }
            for r in &mut key_rank[i..j] {
                *r = (i + j - 1) as f64 / 2.0;
            }
            i = j;
        }
        let ins_rank: Vec<f64> = g.iter().map(|&idx| ins[idx]).collect();
        if let Some(c) = spearman(&key_rank, &ins_rank) {
            sum += c * g.len() as f64;
            weight += g.len() as f64;
        }
    }
    (groups.len() as u64, (weight > 0.0).then(|| sum / weight))
}

/// Ranks by `_id` when every `_id` is an ObjectId (creation order).
fn insertion_ranks(values: &[(Vec<Bson>, Bson)]) -> Option<Vec<f64>> {
    let ids: Vec<bson::oid::ObjectId> = values
        .iter()
        .map(|(_, id)| id.as_object_id())
        .collect::<Option<_>>()?;
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| ids[i]);
    let mut rank = vec![0.0; ids.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r as f64;
    }
    Some(rank)
}

/// Pearson's correlation of two rank vectors; `None` when either is flat.
fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len() as f64;
    if a.len() < 2 {
        return None;
    }
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        cov += (x - ma) * (y - mb);
        va += (x - ma) * (x - ma);
        vb += (y - mb) * (y - mb);
    }
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

fn verdict(a: &KeyAnalysis) -> Vec<String> {
    let key = format!("{{{}}}", a.key.join(", "));
    let top = a.most_common.first().map_or(0.0, |(_, _, share)| *share);
    let mut out = Vec::new();
    // `{type, ts}`: each value of a low-cardinality prefix is one ascending
    // stream, so inserts go to one chunk per prefix value, although the key
    // as a whole is neither monotonic nor low-cardinality.
    let streams = match (a.prefix_distinct, a.prefix_correlation) {
        (Some(p), Some(c))
            if p < LOW_CARDINALITY && c >= MONOTONIC && a.monotonic() == Some(false) =>
        {
            let prefix = format!("{{{}}}", a.key[..a.key.len() - 1].join(", "));
            let last = &a.key[a.key.len() - 1];
            out.push(format!(
                "one ascending stream per {prefix} value (correlation {c:.2} of `{last}` with insertion order within each): {p} prefix values, so every insert goes to the last chunk of its value, and at most {p} chunks (on as many shards) take all inserts; put a coarse time field first, as in {{month, {}}}, or hash it",
                a.key[..a.key.len() - 1].join(", ")
            ));
            true
        }
        _ => false,
    };
    match (a.low_cardinality(), a.monotonic(), a.correlation) {
        (true, Some(true), Some(c)) => out.push(format!(
            "coarse and ascending (correlation {c:.2} with insertion order): {} distinct values, and new ones come with time; each value's documents share one chunk (the largest holds {:.0}% of the sample), so a value must fit in a chunk; inserts go to the newest values' chunks",
            a.distinct,
            top * 100.0
        )),
        (true, _, _) => out.push(format!(
            "low cardinality: {} distinct values in {} sampled documents; {key} can never have more chunks than values, and each value's documents can never be split (jumbo chunks)",
            a.distinct, a.sampled
        )),
        (false, Some(true), Some(c)) => out.push(format!(
            "monotonic (correlation {c:.2} with insertion order): every insert goes to the last chunk, on one shard; derive a coarse field (a month) and put a search field after it"
        )),
        _ => {}
    }
    if let Some((v, _, share)) = a.most_common.first().filter(|(_, _, s)| *s > HOT_VALUE) {
        out.push(format!(
            "hot value: {v} holds {:.0}% of the documents, and all of them live on one shard",
            share * 100.0
        ));
    }
    match (a.correlation, a.monotonic()) {
        (Some(c), Some(false)) => {
            out.push(format!(
                "not monotonic as a whole (correlation {c:.2} with insertion order)"
            ));
            if !a.low_cardinality() && top <= HOT_VALUE && !streams {
                out.push(format!(
                    "{key} spreads inserts; if its values are random (a UUID), rebalancing reads documents in random order, and queries that do not name it go to every shard"
                ));
            }
        }
        (None, _) => out.push("monotonicity unknown: `_id`s are not all ObjectIds".to_owned()),
        _ => {}
    }
    out
}

/// MongoDB's sort order of two values a shard key holds: type order
/// first (MinKey < null < numbers < strings < documents < arrays < binary
/// < ObjectId < bool < date < timestamp < regex < MaxKey), then value, with
/// numbers compared across int, long, double and decimal and NaN below
/// every other number.
pub fn cmp_bson(a: &Bson, b: &Bson) -> Ordering {
    crate::order::cmp(a, b)
}

fn cmp_tuple(a: &[Bson], b: &[Bson]) -> Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| crate::order::cmp(x, y))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::oid::ObjectId;

    fn ids(n: usize) -> Vec<Bson> {
        // ObjectIds made in order: their counters ascend.
        (0..n).map(|_| Bson::ObjectId(ObjectId::new())).collect()
    }

    #[test]
    fn figures() {
        let id = ids(1000);
        let ts: Vec<_> = (0..1000)
            .map(|i| (vec![Bson::Int64(1_600_000_000 + i)], id[i as usize].clone()))
            .collect();
        let a = characteristics(&["ts"], &ts);
        assert_eq!((a.sampled, a.distinct), (1000, 1000));
        assert!(a.correlation.unwrap() > 0.99 && a.monotonic() == Some(true));
        assert!(
            a.verdict.iter().any(|v| v.starts_with("monotonic")),
            "{:?}",
            a.verdict
        );

        let kinds = ["app", "app", "app", "app", "web", "admin"];
        let ty: Vec<_> = (0..1000)
            .map(|i| (vec![Bson::from(kinds[i % 6])], id[i].clone()))
            .collect();
        let a = characteristics(&["type"], &ty);
        assert_eq!(a.distinct, 3);
        assert!(a.low_cardinality());
        assert_eq!(a.most_common[0].0, doc! {"type": "app"});
        assert_eq!(a.most_common[0].1, 668);
        assert!(a.correlation.unwrap().abs() < 0.1);
        assert!(a.verdict[0].starts_with("low cardinality"));
        assert!(a.verdict[1].starts_with("hot value"));
    }

    /// `{type, ts}`: a low-cardinality prefix, then a monotonic field. It
    /// does not spread inserts: each type's inserts go to that type's last
    /// chunk. `{month, type}` is the opposite order: coarse and ascending,
    /// with the types spreading each month.
    #[test]
    fn ascending_stream_per_prefix() {
        let n = 3000;
        let id = ids(n);
        let kinds = ["app", "web", "admin"];
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let rows: Vec<(Bson, i64, Bson)> = (0..n)
            .map(|i| {
                let ts = 1_600_000_000 + i as i64 * 21_600;
                (Bson::from(kinds[(next() % 3) as usize]), ts, id[i].clone())
            })
            .collect();
        let type_ts: Vec<_> = rows
            .iter()
            .map(|(k, ts, id)| (vec![k.clone(), Bson::Int64(*ts)], id.clone()))
            .collect();
        let a = characteristics(&["type", "ts"], &type_ts);
        assert!(
            !a.low_cardinality() && a.monotonic() == Some(false),
            "{a:#?}"
        );
        assert!(a.prefix_correlation.unwrap() > 0.99, "{a:#?}");
        assert!(
            a.verdict
                .iter()
                .any(|v| v.starts_with("one ascending stream per {type} value")),
            "{:#?}",
            a.verdict
        );
        assert!(
            !a.verdict.iter().any(|v| v.contains("spreads inserts")),
            "{:#?}",
            a.verdict
        );

        // `{month, type}`: the month ascends, the type does not within it.
        let month_type: Vec<_> = rows
            .iter()
            .map(|(k, ts, id)| (vec![Bson::Int64(ts / (30 * 86_400)), k.clone()], id.clone()))
            .collect();
        let a = characteristics(&["month", "type"], &month_type);
        assert!(a.low_cardinality() && a.monotonic() == Some(true), "{a:#?}");
        assert!(a.prefix_correlation.unwrap().abs() < 0.2, "{a:#?}");
        assert!(a.verdict[0].starts_with("coarse and ascending"), "{a:#?}");
        assert!(
            !a.verdict.iter().any(|v| v.contains("ascending stream")),
            "{:#?}",
            a.verdict
        );

        // A random second field after the type spreads inserts.
        let type_uuid: Vec<_> = rows
            .iter()
            .map(|(k, _, id)| (vec![k.clone(), Bson::Int64(next() as i64)], id.clone()))
            .collect();
        let a = characteristics(&["type", "uuid"], &type_uuid);
        assert!(a.prefix_correlation.unwrap().abs() < 0.2, "{a:#?}");
        assert!(
            a.verdict.iter().any(|v| v.contains("spreads inserts")),
            "{:#?}",
            a.verdict
        );
    }

    #[test]
    fn bson_order() {
        let mut v = vec![
            Bson::from("b"),
            Bson::Int64(3),
            Bson::Null,
            Bson::Double(2.5),
            Bson::from("a"),
            Bson::Int32(1),
            Bson::Boolean(false),
        ];
        v.sort_by(cmp_bson);
        assert_eq!(
            v,
            vec![
                Bson::Null,
                Bson::Int32(1),
                Bson::Double(2.5),
                Bson::Int64(3),
                Bson::from("a"),
                Bson::from("b"),
                Bson::Boolean(false)
            ]
        );
    }
}
