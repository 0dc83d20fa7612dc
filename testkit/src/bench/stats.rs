//! Medians and spreads of repeated measurements.

use std::time::Duration;

/// The median of `v`, which it sorts; the mean of the middle two for an even
/// length, zero for an empty slice.
pub fn median(v: &mut [Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    }
}

/// The median of an already sorted, non-empty slice; the mean of the middle
/// two for an even length.
pub fn median_f64(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Sorts the non-empty `v` (by [`f64::total_cmp`]) and returns its
/// [`median_f64`].
pub fn sort_median_f64(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    median_f64(v)
}

/// The median and the range of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// Of a non-empty set of samples, in any order.
    pub fn of(samples: &[f64]) -> Spread {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Spread {
            median: median_f64(&v),
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

/// `a[i] / b[i]` for each pair: the ratio of two variants measured back to
/// back, which cancels what the machine did meanwhile better than a ratio
/// of medians.
pub fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a / b).collect()
}
