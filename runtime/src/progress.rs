//! How far a long call has come: what the calls that go over a whole
//! collection (`Ranks::rebuild_all`) hand to a callback as they go, for
//! a log line or a progress bar.

use std::time::Duration;

/// How far a long call has come, handed to its `on_progress` callback
/// after each step (the call's docs say what a unit is).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Progress {
    /// Units done so far.
    pub done: u64,
    /// Units in all, as counted when the call began: more may appear
    /// while it runs.
    pub of: u64,
    /// Time since the call began.
    pub elapsed: Duration,
}

impl Progress {
    pub(crate) fn new(done: u64, of: u64, elapsed: Duration) -> Progress {
        Progress { done, of, elapsed }
    }

    /// Units a second so far.
    pub fn rate(&self) -> f64 {
        match self.elapsed.as_secs_f64() {
            s if s > 0.0 => self.done as f64 / s,
            _ => 0.0,
        }
    }
}

/// A callback the call runs after each step.
pub(crate) type OnProgress = Box<dyn FnMut(Progress) + Send + Sync>;
