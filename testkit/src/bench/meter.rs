//! What a stretch of client code costs: this process's CPU time, or, when
//! the program runs under callgrind, the instructions it executed.
//!
//! CPU time on a small machine that also runs the server moves by 10–30 %
//! from one repetition to the next, which hides a gap of a few per cent
//! between generated and hand-written code. Instructions do not move: the
//! same code on the same replies executes the same instructions, whatever
//! else the machine does. They do not weigh a cache miss or a locked
//! instruction as time does, so a table gives both, from two runs.
//!
//! Under callgrind, `start` zeroes the counts (`CALLGRIND_ZERO_STATS`) and
//! `stop` dumps them (`CALLGRIND_DUMP_STATS_AT`) to a file it then reads
//! and deletes (kept with `MP_CALLGRIND_KEEP=1`, to be read with
//! `callgrind_annotate`, one file per measured stretch, named by its
//! label). Measurements therefore cannot nest. The program must be run as
//! `valgrind --tool=callgrind --callgrind-out-file=$F` with
//! `MP_CALLGRIND_OUT=$F` in its environment (`scripts/bench` does).

use std::cell::Cell;
use std::path::PathBuf;

use super::{cpu_ns, BoxResult};

/// The clock of a benchmark's client-cost sections.
#[derive(Debug)]
pub enum Meter {
    /// This process's on-CPU time ([`cpu_ns`]), in nanoseconds.
    Cpu,
    /// Instructions executed by every thread of the process, by callgrind.
    Instructions(Callgrind),
}

/// A reading taken by [`Meter::start`].
#[derive(Debug, Clone, Copy)]
pub struct Mark(u64);

impl Meter {
    /// [`Meter::Instructions`] under callgrind, [`Meter::Cpu`] otherwise.
    pub fn from_env() -> BoxResult<Meter> {
        if !running_on_valgrind() {
            return Ok(Meter::Cpu);
        }
        let out = std::env::var_os("MP_CALLGRIND_OUT").ok_or(
            "under valgrind, MP_CALLGRIND_OUT must name the file given to --callgrind-out-file",
        )?;
        Ok(Meter::Instructions(Callgrind {
            out: PathBuf::from(out),
            dumps: Cell::new(0),
            keep: std::env::var_os("MP_CALLGRIND_KEEP").is_some_and(|v| v == "1"),
        }))
    }

    pub fn is_instructions(&self) -> bool {
        matches!(self, Meter::Instructions(_))
    }

    /// The unit of [`Meter::per`]: "CPU µs per {what}" or "instructions per {what}".
    pub fn unit(&self, what: &str) -> String {
        match self {
            Meter::Cpu => format!("CPU µs per {what}"),
            Meter::Instructions(_) => format!("instructions per {what}"),
        }
    }

    /// Starts a stretch (under callgrind: zeroes the counts).
    pub fn start(&self) -> Mark {
        match self {
            Meter::Cpu => Mark(cpu_ns()),
            Meter::Instructions(_) => {
                request(ZERO_STATS, 0);
                Mark(0)
            }
        }
    }

    /// What the stretch since `mark` cost, in raw units (ns or
    /// instructions). `label` names its dump under callgrind.
    pub fn stop(&self, mark: Mark, label: &str) -> BoxResult<u64> {
        match self {
            Meter::Cpu => Ok(cpu_ns() - mark.0),
            Meter::Instructions(c) => c.dump(label),
        }
    }

    /// `raw` for `ops` operations, per operation in [`Meter::unit`]'s unit.
    pub fn per(&self, raw: u64, ops: u64) -> f64 {
        let per = raw as f64 / ops.max(1) as f64;
        match self {
            Meter::Cpu => per / 1e3,
            Meter::Instructions(_) => per,
        }
    }

    /// One sentence for a table's text: what was counted.
    pub fn describe(&self) -> &'static str {
        match self {
            Meter::Cpu => "Client cost is this process's on-CPU time over its threads (`/proc/self/task/*/schedstat`); the server's CPU is not included.",
            Meter::Instructions(_) => "Client cost is the instructions this process executed, over all its threads, counted by callgrind (`valgrind --tool=callgrind`): the same for the same code on the same replies, whatever else the machine does, but blind to cache misses and the price of locked instructions. The server runs outside valgrind.",
        }
    }
}

/// The files callgrind dumps to, one per [`Meter::stop`].
#[derive(Debug)]
pub struct Callgrind {
    out: PathBuf,
    dumps: Cell<u32>,
    keep: bool,
}

impl Callgrind {
    fn dump(&self, label: &str) -> BoxResult<u64> {
        let mut c = label.replace(|c: char| c.is_control() || c == '\0', " ");
        c.push('\0');
        request(DUMP_STATS_AT, c.as_ptr() as usize);
        // callgrind numbers its dumps from 1, as `<out file>.<n>`.
        let n = self.dumps.get() + 1;
        self.dumps.set(n);
        let mut path = self.out.clone().into_os_string();
        path.push(format!(".{n}"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("callgrind's dump {}: {e}", PathBuf::from(&path).display()))?;
        let total = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("summary:")
                    .or_else(|| l.strip_prefix("totals:"))
            })
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .ok_or_else(|| format!("no summary line in callgrind's dump {n}"))?;
        if !self.keep {
            let _ = std::fs::remove_file(&path);
        }
        Ok(total)
    }
}

/// Valgrind's client requests (valgrind.h, callgrind.h).
const RUNNING_ON_VALGRIND: usize = 0x1001;
const CALLGRIND_BASE: usize = ((b'C' as usize) << 24) | ((b'T' as usize) << 16);
const ZERO_STATS: usize = CALLGRIND_BASE + 1;
const DUMP_STATS_AT: usize = CALLGRIND_BASE + 3;

fn running_on_valgrind() -> bool {
    request(RUNNING_ON_VALGRIND, 0) != 0
}

/// A client request with one argument: the magic sequence of valgrind.h
/// for amd64, which does nothing (and answers 0) outside valgrind.
#[cfg(all(target_arch = "x86_64", unix))]
fn request(code: usize, arg: usize) -> usize {
    let args: [usize; 6] = [code, arg, 0, 0, 0, 0];
    let mut result: usize = 0;
    // SAFETY: the four rotations of rdi sum to 128 bits, so rdi ends as it
    // began, and `xchg rbx, rbx` changes nothing; valgrind recognises the
    // sequence, reads `args` through rax and answers in rdx.
    unsafe {
        std::arch::asm!(
            "rol rdi, 3",
            "rol rdi, 13",
            "rol rdi, 61",
            "rol rdi, 51",
            "xchg rbx, rbx",
            inout("rdx") result,
            in("rax") args.as_ptr(),
            options(nostack),
        );
    }
    result
}

/// Elsewhere there is no callgrind to ask: always the CPU clock.
#[cfg(not(all(target_arch = "x86_64", unix)))]
fn request(_code: usize, _arg: usize) -> usize {
    0
}
