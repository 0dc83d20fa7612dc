//! The key draws: per task, a seeded stream through the Zipf CDF, drawn
//! before any timing so that every run counts exactly the same views.

use std::sync::Arc;

use mongo_patterns_testkit::bench::splitmix64;

use crate::Args;

/// Draw `i` of the stream `seed`, as `Counter::seeded` draws it.
pub(crate) fn seeded_draw(seed: u64, i: u64) -> u64 {
    splitmix64(seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// The key draws, the products' ids and the Zipf probabilities.
pub(crate) struct Workload {
    pub(crate) ids: Arc<Vec<String>>,
    /// Per task, the indices (0-based: index 0 is the hottest product) of
    /// the products it counts, in order.
    pub(crate) draws: Vec<Arc<Vec<u32>>>,
    /// Probability of each key.
    pub(crate) p: Vec<f64>,
}

/// How many of `n` increments task `t` of `tasks` issues.
pub(crate) fn share(n: u64, tasks: usize, t: usize) -> usize {
    let tasks = tasks as u64;
    (n / tasks + u64::from((t as u64) < n % tasks)) as usize
}

impl Workload {
    pub(crate) fn new(args: &Args) -> Workload {
        let weights: Vec<f64> = (1..=args.keys)
            .map(|k| (k as f64).powf(-args.zipf))
            .collect();
        let sum: f64 = weights.iter().sum();
        let p: Vec<f64> = weights.iter().map(|w| w / sum).collect();
        let mut acc = 0.0;
        let cdf: Vec<f64> = p
            .iter()
            .map(|x| {
                acc += x;
                acc
            })
            .collect();
        let n = args.increments.max(args.exact_increments);
        let draws = (0..args.tasks)
            .map(|t| {
                let seed = splitmix64(args.seed ^ (t as u64).wrapping_mul(0xA076_1D64_78BD_642F));
                let v: Vec<u32> = (0..share(n, args.tasks, t) as u64)
                    .map(|i| {
                        let u = (seeded_draw(seed, i) >> 11) as f64 / (1u64 << 53) as f64;
                        cdf.partition_point(|&c| c <= u).min(args.keys - 1) as u32
                    })
                    .collect();
                Arc::new(v)
            })
            .collect();
        let ids = (0..args.keys).map(|k| format!("p{:05}", k + 1)).collect();
        Workload {
            ids: Arc::new(ids),
            draws,
            p,
        }
    }

    /// Each key's count when each task issues its share of `n`.
    pub(crate) fn truth(&self, n: u64) -> Vec<u64> {
        let mut counts = vec![0u64; self.ids.len()];
        let tasks = self.draws.len();
        for (t, d) in self.draws.iter().enumerate() {
            for &k in d.iter().take(share(n, tasks, t)) {
                counts[k as usize] += 1;
            }
        }
        counts
    }
}
