//! The workload: application logs, their fields, and calendar months.

use mongo_patterns::bson::DateTime;
use mongo_patterns::shard_key::{truncate, Granularity};

use crate::rng::SplitMix64;

/// A log's `type`, skewed 80/15/5 in the default workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogType {
    /// `"app"`, 80 % of the logs.
    App,
    /// `"web"`, 15 %.
    Web,
    /// `"admin"`, 5 %.
    Admin,
}

impl LogType {
    /// The three types, in the order of [`Workload::mix`] and
    /// [`Row::query_shards`](crate::Row::query_shards).
    pub const ALL: [LogType; 3] = [LogType::App, LogType::Web, LogType::Admin];

    /// The value stored in `type`.
    pub fn name(self) -> &'static str {
        match self {
            LogType::App => "app",
            LogType::Web => "web",
            LogType::Admin => "admin",
        }
    }

    /// The key encoding: it orders as the strings do
    /// (`"admin" < "app" < "web"`), and is never 0 (MinKey).
    pub fn code(self) -> u128 {
        match self {
            LogType::Admin => 1,
            LogType::App => 2,
            LogType::Web => 3,
        }
    }
}

/// A log's `level`: on no key, generated for a realistic document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// `"info"`, 90 %.
    Info,
    /// `"warn"`, 8 %.
    Warn,
    /// `"error"`, 2 %.
    Error,
}

impl Level {
    /// The key encoding, in string order (`"error" < "info" < "warn"`).
    pub fn code(self) -> u128 {
        match self {
            Level::Error => 1,
            Level::Info => 2,
            Level::Warn => 3,
        }
    }
}

/// One log as the model sees it. `msg` is left out: no key uses it, and
/// sizes are counted in documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogDoc {
    /// A random version 4 UUID.
    pub id: u128,
    /// `type`.
    pub log_type: LogType,
    /// `level`.
    pub level: Level,
    /// Seconds since the Unix epoch.
    pub ts: i64,
    /// The start of `ts`'s calendar month (UTC), in epoch seconds: what the
    /// repository derives as the `month` date.
    pub month: i64,
}

/// The start of the calendar month (UTC) holding `ts`, in epoch seconds,
/// by the same [`truncate`] the repository derives `month` with.
pub fn month_start(ts: i64) -> i64 {
    let t = DateTime::from_millis(ts.saturating_mul(1000));
    truncate(t, Granularity::Month)
        .timestamp_millis()
        .div_euclid(1000)
}

/// The start of the month `n` months after the month holding `ts`.
pub fn add_months(ts: i64, n: u32) -> i64 {
    let mut m = month_start(ts);
    for _ in 0..n {
        // 32 days past a month's first day is always in the next month.
        m = month_start(m + 32 * 86_400);
    }
    m
}

/// An instant as a key component: the sign bit flipped, so the unsigned
/// order is the signed order and the epoch is not MinKey.
pub fn encode_time(secs: i64) -> u128 {
    u128::from((secs as u64) ^ (1 << 63))
}

/// A field of [`LogDoc`] a key can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `id`, a random UUID.
    Id,
    /// `type`.
    Type,
    /// `level`.
    Level,
    /// `ts`.
    Ts,
    /// `month`, derived from `ts`.
    Month,
}

impl Field {
    /// The BSON field name.
    pub fn name(self) -> &'static str {
        match self {
            Field::Id => "id",
            Field::Type => "type",
            Field::Level => "level",
            Field::Ts => "ts",
            Field::Month => "month",
        }
    }

    /// The field's value in `doc`, encoded so that `u128` order is BSON
    /// order for the field's type and 0 and `u128::MAX` never occur.
    pub fn value(self, doc: &LogDoc) -> u128 {
        match self {
            Field::Id => doc.id,
            Field::Type => doc.log_type.code(),
            Field::Level => doc.level.code(),
            Field::Ts => encode_time(doc.ts),
            Field::Month => encode_time(doc.month),
        }
    }
}

/// Application logs in `ts` order over whole calendar months.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Logs to insert.
    pub logs: usize,
    /// Calendar months they span.
    pub months: u32,
    /// The first month's start, in epoch seconds (UTC).
    pub start: i64,
    /// Relative weights of app, web and admin ([`LogType::ALL`] order).
    pub mix: [u32; 3],
    /// The PRNG seed.
    pub seed: u64,
}

impl Default for Workload {
    /// 1,000,000 logs over the 24 months from 2023-01, 80/15/5, seed 2.
    fn default() -> Self {
        Workload {
            logs: 1_000_000,
            months: 24,
            start: 1_672_531_200, // 2023-01-01T00:00:00Z
            mix: [80, 15, 5],
            seed: 2,
        }
    }
}

/// The logs of `w`: `ts` evenly spread over the months (so a 31-day month
/// holds more logs than February), ascending; a random UUID each; the type
/// drawn by `w.mix`; `month` derived from `ts`.
pub fn generate(w: &Workload) -> Vec<LogDoc> {
    let start = month_start(w.start);
    let span = (add_months(start, w.months) - start) as u128;
    let total = u64::from(w.mix.iter().sum::<u32>().max(1));
    let mut rng = SplitMix64::new(w.seed);
    let mut month = (i64::MIN, i64::MIN);
    (0..w.logs)
        .map(|i| {
            let ts = start + (i as u128 * span / w.logs as u128) as i64;
            if ts >= month.1 {
                month = (month_start(ts), add_months(ts, 1));
            }
            let id = rng.uuid_v4();
            let mut r = rng.below(total);
            let mut log_type = LogType::Admin;
            for (t, weight) in LogType::ALL.into_iter().zip(w.mix) {
                if r < u64::from(weight) {
                    log_type = t;
                    break;
                }
                r -= u64::from(weight);
            }
            let level = match rng.below(100) {
                0..=1 => Level::Error,
                2..=9 => Level::Warn,
                _ => Level::Info,
            };
            LogDoc {
                id,
                log_type,
                level,
                ts,
                month: month.0,
            }
        })
        .collect()
}
