//! What the benchmark programs (`benches/*.rs`) share: the process's CPU
//! clock, medians, number formatting, flag parsing, a seedable hash and the
//! reading of `explain` statistics.

use std::str::FromStr;
use std::time::Duration;

use mongo_patterns::bson::{Bson, Document};

// ------------------------------------------------------------------ clocks

/// This process's on-CPU time in nanoseconds, summed over its live threads
/// (`/proc/self/task/*/schedstat`, first field). Falls back to
/// `/proc/self/stat` (clock-tick resolution) where schedstat is missing.
pub fn cpu_ns() -> u64 {
    let mut total = 0u64;
    let mut found = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            if let Some(ns) = s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
            {
                total += ns;
                found = true;
            }
        }
    }
    if found {
        total
    } else {
        cpu_ticks() * 1_000_000_000 / clock_ticks_per_second()
    }
}

/// utime + stime of the whole process, in clock ticks (`/proc/self/stat`,
/// fields 14 and 15; counted after the parenthesised command name).
pub fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After ")": index 0 is field 3 (state), so utime (14) is 11, stime (15) is 12.
    field(11) + field(12)
}

/// `USER_HZ`, which Linux fixes at 100 for `/proc`.
pub fn clock_ticks_per_second() -> u64 {
    100
}

// ----------------------------------------------------------------- medians

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

// -------------------------------------------------------------- formatting

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// [`thousands`], or `n/a` for `None`.
pub fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), thousands)
}

// ------------------------------------------------------------------- flags

/// A flag's numeric value; `_` separators are allowed (`100_000`). Calls
/// `usage` with an error when `s` is not a number.
pub fn num<T: FromStr>(s: &str, usage: fn(&str) -> !) -> T {
    s.replace('_', "")
        .parse()
        .unwrap_or_else(|_| usage(&format!("`{s}` is not a number")))
}

/// Prints `err` (unless empty) and `usage: {line}` to stderr, then exits:
/// with 0 when `err` is empty (`--help`), 2 otherwise.
pub fn usage(line: &str, err: &str) -> ! {
    if !err.is_empty() {
        eprintln!("error: {err}");
    }
    eprintln!("usage: {line}");
    std::process::exit(if err.is_empty() { 0 } else { 2 })
}

// -------------------------------------------------------------------- data

/// SplitMix64's output function: a well-mixed 64-bit hash of `x`.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ----------------------------------------------------------------- explain

/// A count from `explain`'s `executionStats` (`totalKeysExamined`, ...),
/// whichever numeric type the server sent it as.
pub fn stat_u64(stats: &Document, k: &str) -> Option<u64> {
    match stats.get(k)? {
        Bson::Int32(v) => Some(*v as u64),
        Bson::Int64(v) => Some(*v as u64),
        Bson::Double(v) => Some(*v as u64),
        _ => None,
    }
}
