//! The random source of sampled and geometric writes: SplitMix64 over a
//! counter. Unseeded, the counter is the increment's position in the
//! handle's per-thread count (`tally`), under the handle's random key, so
//! a draw costs no state beyond the count; seeded, it is one stream per
//! handle, shared by its clones, so that a test sees the same writes each
//! run.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::tally::word;
use super::{Inner, Mode};
use crate::util::{mix64, splitmix64, GAMMA};

impl Inner {
    /// Counts `n` increments, and says what they write when each writes
    /// `m` with probability 1/m: `m` times the draws that hit (0 most of
    /// the time). A seeded sampled handle counts them by claiming `n`
    /// numbers of its stream (see [`Inner::increments_seen`]).
    #[inline(always)]
    pub(super) fn count_and_draw(&self, n: u64, m: u64) -> u64 {
        match &self.seed {
            None => self.count_and_draw_unseeded(n, m),
            Some((seed, draws)) => {
                if self.spec.mode != Mode::Sampled || m <= 1 {
                    self.increments.add(n);
                }
                self.draw_seeded(*seed, draws, n, m)
            }
        }
    }

    /// [`Inner::count_and_draw`] on a handle known to be unseeded.
    #[inline(always)]
    pub(super) fn count_and_draw_unseeded(&self, n: u64, m: u64) -> u64 {
        hits(self.increments.add(n), n, m)
    }

    /// The draws of `n` increments whose first word is `at` (what
    /// [`Tally::add`](super::tally::Tally::add) returned: unseeded), or of
    /// the next `n` numbers of the seeded stream.
    #[inline]
    pub(super) fn draw(&self, at: u64, n: u64, m: u64) -> u64 {
        match &self.seed {
            None => hits(at, n, m),
            Some((seed, draws)) => self.draw_seeded(*seed, draws, n, m),
        }
    }

    /// One claim of `n` numbers of the seeded stream, not one per draw.
    #[inline(always)]
    fn draw_seeded(&self, seed: u64, draws: &AtomicU64, n: u64, m: u64) -> u64 {
        if m <= 1 {
            return m * n;
        }
        hits(word(seed, draws.fetch_add(n, Ordering::Relaxed)), n, m)
    }

    /// Increments seen: the per-thread counts, plus, on a seeded sampled
    /// handle, the numbers its stream gave out (every such increment
    /// draws one, and is counted only by that).
    pub(super) fn increments_seen(&self) -> u64 {
        let claimed = match &self.seed {
            Some((_, draws)) if self.spec.mode == Mode::Sampled => draws.load(Ordering::Relaxed),
            _ => 0,
        };
        self.increments.sum().wrapping_add(claimed)
    }
}

/// What `n` increments whose first word is `first` write when each writes
/// `m` with probability 1/m: `m` times the draws that hit. Number `i` of
/// the stream `key` is SplitMix64's output after `i` steps from `key`:
/// the mix of its word `key + (i + 1)·γ`, so that distinct positions
/// never draw the same number. One increment is inline; more are a loop
/// out of line.
#[inline(always)]
fn hits(first: u64, n: u64, m: u64) -> u64 {
    if n == 1 && m > 1 {
        return m * u64::from(hit(mix64(first), m));
    }
    hits_many(first, n, m)
}

#[inline(never)]
fn hits_many(first: u64, n: u64, m: u64) -> u64 {
    if m <= 1 {
        return m * n;
    }
    let hits = (0..n)
        .filter(|&i| hit(mix64(first.wrapping_add(i.wrapping_mul(GAMMA))), m))
        .count() as u64;
    m * hits
}

/// True with probability 1/m for a uniform `r`.
#[inline]
fn hit(r: u64, m: u64) -> bool {
    ((u128::from(r) * u128::from(m)) >> 64) == 0
}

/// A handle's id in the flush markers: random, so that two handles (in one
/// process or many) meet with probability 2⁻⁶⁴.
pub(super) fn random_handle() -> u64 {
    static HANDLES: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    HANDLES.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    splitmix64(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_stream_is_uniform_enough() {
        let hits = (0..1_000_000_u64)
            .filter(|&i| hit(mix64(word(42, i)), 100))
            .count();
        // Binomial(10⁶, 1/100): σ ≈ 99.5.
        assert!((9_700..=10_300).contains(&hits), "{hits}");
    }
}
