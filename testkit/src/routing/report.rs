//! What the checker says: verdicts, findings, counts, and how a finding is
//! reported.

use std::fmt;
use std::io::Write;

use mongo_patterns::bson::Bson;

/// What `mongos` does with one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// A write `mongos` rejects.
    Refused,
    /// A write sent to every shard.
    Broadcast,
    /// A read sent to every shard.
    Scatter,
    /// Sent to the shards of some key values or ranges (`$in`, a range, a
    /// key prefix).
    Multi,
    /// Sent to one shard.
    Targeted,
}

impl Verdict {
    /// Whether it fails a strict check: a refused or broadcast write.
    pub fn is_violation(self) -> bool {
        matches!(self, Verdict::Refused | Verdict::Broadcast)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Refused => "refused",
            Verdict::Broadcast => "broadcast",
            Verdict::Scatter => "scatter",
            Verdict::Multi => "multi",
            Verdict::Targeted => "targeted",
        })
    }
}

/// One judged operation (a statement of a command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub verdict: Verdict,
    /// The collection's name.
    pub coll: String,
    /// The command: `update`, `delete`, `findAndModify`, `insert`,
    /// `bulkWrite`, `find`, `aggregate`, `count`, `distinct`.
    pub command: String,
    /// The operation: `updateOne`, `updateOne upsert`, `updateMany`,
    /// `deleteOne`, `deleteMany`, `findAndModify`, `insert`, `read`,
    /// `$merge`.
    pub op: String,
    /// The filter with its values replaced by `?`.
    pub shape: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({}) on {} filter {}: {}",
            self.verdict, self.command, self.op, self.coll, self.shape, self.why
        )
    }
}

/// How many operations got each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub refused: usize,
    pub broadcast: usize,
    pub targeted_writes: usize,
    pub multi_writes: usize,
    pub scatter: usize,
    pub multi_reads: usize,
    pub targeted_reads: usize,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "writes: {} refused, {} broadcast, {} multi, {} targeted; reads: {} scatter, {} multi, {} targeted",
            self.refused,
            self.broadcast,
            self.multi_writes,
            self.targeted_writes,
            self.scatter,
            self.multi_reads,
            self.targeted_reads
        )
    }
}

/// What the checker does on a refused or broadcast write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Records it; [`Routing::assert_clean`](super::Routing::assert_clean) fails on it.
    Record,
    /// Records it and prints it to stderr (as every scatter read).
    Report,
    /// Records it and panics in the call that sent the command.
    Panic,
}

/// `b` with its values replaced by `?`: the keys and operators stay.
pub fn shape(b: &Bson) -> String {
    match b {
        Bson::Document(d) => {
            let parts: Vec<String> = d
                .iter()
                .map(|(k, v)| format!("{k}: {}", shape(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Bson::Array(a) => match a.first() {
            None => "[]".into(),
            Some(first) if a.len() == 1 => format!("[{}]", shape(first)),
            Some(first) => format!("[{}, …]", shape(first)),
        },
        _ => "?".into(),
    }
}

/// Appends `f` to the log file at `path`: one tab-separated line
/// (verdict, collection, command, operation, filter shape, reason, test).
pub(super) fn append_to_log(path: &std::path::Path, f: &Finding) {
    let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    else {
        return;
    };
    // One `write` per line: lines from parallel calls do not interleave.
    // Nextest runs a test per process, named after `--exact`.
    let test = std::env::args()
        .skip_while(|a| a != "--exact")
        .nth(1)
        .unwrap_or_default();
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        f.verdict, f.coll, f.command, f.op, f.shape, f.why, test
    );
    let _ = file.write_all(line.as_bytes());
}
