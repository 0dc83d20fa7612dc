//! The client-cost table every benchmark prints in one shape, so that a
//! script can read them all: per path, the median of each variant over
//! interleaved repetitions, the ratio of the medians, and the spread of the
//! per-repetition ratios (p10 – p90, and min – max).
//!
//! Shared by the counter, rank and keyset benchmarks (`#[path]`).

/// One path measured generated and by hand, a sample per repetition each
/// (same unit, same order: repetition `i` of both ran back to back).
pub(crate) struct Path {
    pub(crate) name: String,
    /// What a sample is ("CPU µs per call", "wall ns per increment").
    pub(crate) unit: String,
    pub(crate) generated: Vec<f64>,
    pub(crate) hand: Vec<f64>,
}

/// The `q`-quantile (0 ≤ q ≤ 1) of sorted, non-empty `v`, interpolated.
fn quantile(v: &[f64], q: f64) -> f64 {
    let at = q * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The table: header `### Client cost: generated ÷ hand-written`, one row per path.
pub(crate) fn table(paths: &[Path]) -> String {
    let mut out = String::from("### Client cost: generated ÷ hand-written\n\n");
    out += "Per path: the median of each variant over interleaved repetitions (order alternating), their ratio (the figure to read), and the per-repetition ratios generated ÷ hand, p10 – p90 and min – max.\n\n";
    out += "| path | unit | repetitions | generated (median) | hand-written (median) | ratio of medians | per-rep ratio p10 – p90 | per-rep ratio min – max |\n| --- | --- | ---: | ---: | ---: | ---: | :---: | :---: |\n";
    for p in paths {
        let (g, h) = (sorted(&p.generated), sorted(&p.hand));
        let r = sorted(
            &p.generated
                .iter()
                .zip(&p.hand)
                .map(|(g, h)| g / h)
                .collect::<Vec<_>>(),
        );
        let (gm, hm) = (quantile(&g, 0.5), quantile(&h, 0.5));
        out += &format!(
            "| {} | {} | {} | {} | {} | {:.3} | {:.3} – {:.3} | {:.3} – {:.3} |\n",
            p.name,
            p.unit,
            r.len(),
            fmt(gm),
            fmt(hm),
            gm / hm,
            quantile(&r, 0.1),
            quantile(&r, 0.9),
            r[0],
            r[r.len() - 1]
        );
    }
    out + "\n"
}

/// Three significant figures or so, whatever the magnitude.
fn fmt(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}
