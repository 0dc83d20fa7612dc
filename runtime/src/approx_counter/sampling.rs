//! The random source of sampled and geometric writes: per thread
//! (xorshift64*, seeded from the OS's hasher keys), or one deterministic
//! stream per seeded handle, so that a test sees the same writes each run.

use std::cell::Cell;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::Inner;
use crate::util::splitmix64;

impl Inner {
    /// What `n` increments write when each writes `m` with probability
    /// 1/m: `m` times the draws that hit (0 most of the time).
    #[inline]
    pub(super) fn draw(&self, n: u64, m: u64) -> u64 {
        if m <= 1 {
            return m * n;
        }
        let hits = match &self.seed {
            // One claim of `n` numbers of the stream, not one per draw.
            Some((seed, draws)) => {
                let first = draws.fetch_add(n, Ordering::Relaxed);
                (first..first.wrapping_add(n))
                    .filter(|&i| hit(seeded_draw(*seed, i), m))
                    .count()
            }
            None => (0..n).filter(|_| hit(thread_random(), m)).count(),
        };
        m * hits as u64
    }
}

/// True with probability 1/m for a uniform `r`.
#[inline]
fn hit(r: u64, m: u64) -> bool {
    ((u128::from(r) * u128::from(m)) >> 64) == 0
}

/// xorshift64* on this thread's state, seeded at the first draw.
#[inline]
fn thread_random() -> u64 {
    THREAD_RNG.with(|state| {
        let mut x = state.get();
        if x == 0 {
            x = thread_seed();
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// From the process's random hasher keys and the thread, never 0.
#[cold]
fn thread_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::thread::current().id().hash(&mut h);
    Instant::now().hash(&mut h);
    splitmix64(h.finish()) | 1
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

/// Draw `i` of the stream `seed`: SplitMix64 over a counter, so that tasks
/// sharing a seeded handle never draw the same number.
fn seeded_draw(seed: u64, i: u64) -> u64 {
    splitmix64(seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

thread_local! {
    /// 0 until the thread's first draw seeds it: a constant initializer,
    /// so that reading it is one load.
    static THREAD_RNG: Cell<u64> = const { Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_stream_is_uniform_enough() {
        let hits = (0..1_000_000_u64)
            .filter(|&i| ((u128::from(seeded_draw(42, i)) * 100) >> 64) == 0)
            .count();
        // Binomial(10⁶, 1/100): σ ≈ 99.5.
        assert!((9_700..=10_300).contains(&hits), "{hits}");
    }
}
