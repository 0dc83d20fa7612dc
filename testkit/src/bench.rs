//! What the benchmark programs (`benches/<name>/`) share: flags, the runtime
//! and a database of their own, the server's counters and `explain`
//! statistics, the process's CPU clock, medians and spreads, number
//! formatting, and a seedable hash for reproducible workloads.
//!
//! The programs print markdown to stdout and progress to stderr, so that
//! `cargo bench --bench NAME > out.md` keeps only what can be pasted.

mod clock;
mod flags;
mod format;
mod meter;
mod server;
mod session;
mod stats;

pub use clock::{clock_ticks_per_second, cpu_ns, cpu_ticks, Lap, Stopwatch};
pub use flags::{num, usage, Flags};
pub use format::{ms, opt, thousands, thousands_i};
pub use meter::{Mark, Meter};
pub use server::{bare, explain, stat_u64, Explained, ServerCounters};
pub use session::{describe_server, external_server, main, server_version, Runtime, Session};
pub use stats::{median, median_f64, ratios, sort_median_f64, Spread};

/// What a benchmark's steps return: any error ends the program with its
/// message.
pub type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// SplitMix64's output function: a well-mixed 64-bit hash of `x`, so that
/// a workload drawn from `splitmix64(i)` is the same on every run.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
