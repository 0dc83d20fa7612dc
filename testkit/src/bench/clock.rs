//! The process's own CPU time: the server runs in another process, so what
//! these clocks count is the client's work alone.

use std::time::{Duration, Instant};

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
/// fields 14 and 15; counted after the parenthesised command name): a
/// coarse cross-check of [`cpu_ns`].
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

/// CPU time, clock ticks and wall time from one starting point.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch {
    cpu_ns: u64,
    ticks: u64,
    wall: Instant,
}

/// What a [`Stopwatch`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Lap {
    pub wall: Duration,
    pub cpu_ns: u64,
    pub ticks: u64,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch {
            cpu_ns: cpu_ns(),
            ticks: cpu_ticks(),
            wall: Instant::now(),
        }
    }

    /// Everything since [`Stopwatch::start`]; the wall clock is read first.
    pub fn lap(&self) -> Lap {
        let wall = self.wall.elapsed();
        Lap {
            wall,
            cpu_ns: cpu_ns() - self.cpu_ns,
            ticks: cpu_ticks() - self.ticks,
        }
    }
}
