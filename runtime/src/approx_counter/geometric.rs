//! Geometric mode's write size: `m = max(N, ⌊E/N⌋)` from the value `E`
//! this handle last read back for the key, and the error that follows.

use super::{shard_of, Inner};

impl Inner {
    /// `m` for `key`, from the value last read back for it (0 when none
    /// was, or it was forgotten).
    pub(super) fn geometric_step(&self, key: &[u8]) -> u64 {
        let seen = self.seen[shard_of(key)].get(key).unwrap_or(0);
        step(seen, self.spec.every)
    }

    /// Keeps `value` as `key`'s last value read back. A shard holding its
    /// share of `max_keys` is emptied first: forgetting only sends a key
    /// back to the first step.
    pub(super) fn remember(&self, key: &[u8], value: i64) {
        self.seen[shard_of(key)].insert(key, value);
    }
}

/// `m` for geometric mode: `N` until the value passes N², then `⌊E/N⌋`.
fn step(seen: i64, every: u32) -> u64 {
    let every = u64::from(every);
    (u64::try_from(seen).unwrap_or(0) / every).max(every)
}

/// The relative standard error after `n` increments of one key, with
/// `every` N. The variance is Σ(m−1): N−1 an increment up to N², then
/// about E/N.
pub(super) fn relative_error(every: f64, n: f64) -> f64 {
    let knee = every * every;
    let var = if n <= knee {
        n * (every - 1.0)
    } else {
        knee * (every - 1.0) + (n * n - knee * knee) / (2.0 * every) - (n - knee)
    };
    var.max(0.0).sqrt() / n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometric_step_never_divides_by_zero() {
        assert_eq!(step(i64::MAX, 1), i64::MAX as u64);
        assert_eq!(step(-5, 10), 10);
    }
}
