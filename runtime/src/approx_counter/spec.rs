//! What `#[approx_counter(...)]` declares, and the limits the derive checks
//! it against.

use serde::Serialize;

use super::FLUSHES;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::util::impls;

/// Largest `every`: past it, a counter's error is over 0.1% only after 10⁹
/// increments, and a buffered key holds that much in memory before writing.
pub const MAX_EVERY: u32 = 1_000_000;
/// `max_delay_ms` when the attribute leaves it out: a buffered increment
/// reaches the server within a second.
pub const DEFAULT_MAX_DELAY_MS: u64 = 1_000;
/// `max_keys` when the attribute leaves it out: keys a buffer holds before
/// it flushes early.
pub const DEFAULT_MAX_KEYS: usize = 10_000;

/// How a counter trades writes for precision: see [the modes](crate::approx_counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One write of `$inc: N` with probability 1/N.
    Sampled,
    /// Counted in memory, written every N per key or after `max_delay_ms`.
    Buffered,
    /// Write probability falling with the count.
    Geometric,
}

/// What `#[approx_counter(...)]` declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSpec {
    /// The BSON name of the counter field.
    pub field: &'static str,
    /// N: writes happen about one time in N (1 to [`MAX_EVERY`]).
    pub every: u32,
    /// The mode.
    pub mode: Mode,
    /// Buffered: the longest an increment waits in memory, in milliseconds.
    pub max_delay_ms: u64,
    /// Buffered: the most keys pending at once (at least 1); past it the
    /// oldest are written.
    pub max_keys: usize,
    /// Whether a write creates a missing document.
    pub upsert: bool,
}

impl CounterSpec {
    /// What generated code declares after a compile error.
    #[doc(hidden)]
    pub const FALLBACK: CounterSpec = CounterSpec {
        field: "",
        every: 2,
        mode: Mode::Sampled,
        max_delay_ms: 1,
        max_keys: 1,
        upsert: false,
    };

    /// `InvalidArgument` for a declaration no counter can follow.
    pub(super) fn check(&self) -> Result<()> {
        if self.every == 0 || self.every > MAX_EVERY {
            return Err(Error::invalid(
                "every",
                format!("{} is outside 1..={MAX_EVERY}", self.every),
            ));
        }
        let f = self.field;
        if f.is_empty() || f.starts_with('$') || f.contains('.') || f == "_id" || f == FLUSHES {
            return Err(Error::invalid(
                "field",
                format!("{f:?} cannot be a counter field"),
            ));
        }
        if self.mode == Mode::Buffered && self.max_keys == 0 {
            return Err(Error::invalid("max_keys", "a buffer holds at least 1 key"));
        }
        Ok(())
    }
}

/// A model with approximate counters, addressed by `_id`.
/// `#[approx_counter]` implements it.
pub trait ApproxCounted: Model + Send + Sync + 'static {
    /// The `_id` field's type.
    type Id: Serialize + Send + Sync;
}

/// Field types a counter can have.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an approximate counter",
    label = "not a number",
    note = "a counter must be an integer (i32, i64, u32, u64) or an f64"
)]
pub trait CounterValue {}

impls!(CounterValue: i32, i64, u32, u64, f64);

/// What a counter handle has seen and sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CounterStats {
    /// Increments counted (the sum of every accepted `incr_by`'s `n`).
    pub increments: u64,
    /// Writes the server acknowledged.
    pub writes: u64,
    /// Increments held in memory, not known to be written (buffered mode):
    /// not yet sent, or sent by a write whose outcome is unknown.
    pub pending: u64,
}

impl CounterStats {
    /// Increments per write: what the counter saved, as a factor.
    pub fn saving(&self) -> f64 {
        self.increments as f64 / self.writes.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(field: &'static str, every: u32, mode: Mode, max_keys: usize) -> CounterSpec {
        CounterSpec {
            field,
            every,
            mode,
            max_delay_ms: 1,
            max_keys,
            upsert: false,
        }
    }

    #[test]
    fn specs_no_counter_can_follow_are_invalid_arguments() {
        let name = |s: CounterSpec| match s.check() {
            Err(Error::InvalidArgument { name, .. }) => Some(name),
            _ => None,
        };
        for mode in [Mode::Sampled, Mode::Buffered, Mode::Geometric] {
            assert_eq!(name(spec("v", 0, mode, 1)), Some("every"));
            assert_eq!(name(spec("v", MAX_EVERY + 1, mode, 1)), Some("every"));
            for f in ["", "_id", "a.b", "$v", FLUSHES] {
                assert_eq!(name(spec(f, 10, mode, 1)), Some("field"), "{f:?}");
            }
            assert_eq!(name(spec("v", 1, mode, 1)), None);
            assert_eq!(name(spec("v", MAX_EVERY, mode, 1)), None);
        }
        assert_eq!(name(spec("v", 10, Mode::Buffered, 0)), Some("max_keys"));
        assert_eq!(name(spec("v", 10, Mode::Sampled, 0)), None);
    }
}
