//! Rounding to `precision`, the same on the client (every score a call
//! takes) and on the server (`rebuild`'s grouping), so that both land on
//! the same double.

use mongodb::bson;
use mongodb::bson::Bson;

/// How `precision` rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Quantum {
    Exact,
    /// A decimal step (`1 / k`, as 0.5 or 0.01): the score is
    /// `floor(x·k + ½) / k`, whose division by an integer gives the double
    /// nearest the decimal (87.35, not 87.35000000000001).
    Inverse(f64),
    /// Any other step `p`: `floor(x/p + ½)·p`.
    Step(f64),
}

fn quantum(precision: Option<f64>) -> Quantum {
    match precision {
        None => Quantum::Exact,
        Some(p) => {
            let k = (1.0 / p).round();
            if k >= 1.0 && ((1.0 / p) - k).abs() <= 1e-9 * k {
                Quantum::Inverse(k)
            } else {
                Quantum::Step(p)
            }
        }
    }
}

/// Rounds `x` to `precision` as `rebuild`'s pipeline does (`+ 0.0` turns
/// `-0.0` into `0.0`).
pub(super) fn round(x: f64, precision: Option<f64>) -> f64 {
    let r = match quantum(precision) {
        Quantum::Exact => x,
        Quantum::Inverse(k) => (x * k + 0.5).floor() / k,
        Quantum::Step(p) => (x / p + 0.5).floor() * p,
    };
    r + 0.0
}

/// `field` (a `$path`) rounded as [`round`] does, as a server expression.
pub(super) fn rounded(field: String, precision: Option<f64>) -> Bson {
    match quantum(precision) {
        Quantum::Exact => Bson::String(field),
        Quantum::Inverse(k) => bson::bson!({"$divide": [
            {"$floor": {"$add": [{"$multiply": [field, k]}, 0.5]}}, k]}),
        Quantum::Step(p) => bson::bson!({"$multiply": [
            {"$floor": {"$add": [{"$divide": [field, p]}, 0.5]}}, p]}),
    }
}
