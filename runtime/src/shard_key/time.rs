//! Coarse time: a timestamp rounded down to its period, in UTC.

use mongodb::bson::DateTime;

use mongodb::bson::Bson;

use super::{Granularity, TimeRepr};
use crate::error::{Error, Result};

/// Every granularity, coarsest first.
const ALL: [Granularity; 6] = [
    Granularity::Year,
    Granularity::Quarter,
    Granularity::Month,
    Granularity::Week,
    Granularity::Day,
    Granularity::Hour,
];

/// The time a stored timestamp field holds, as the model reads it: a
/// date, or (epoch seconds) an integer of seconds. `None` for anything
/// else (missing, a string, a double, out of range).
pub(super) fn stored_time(v: Option<&Bson>, repr: TimeRepr) -> Option<DateTime> {
    match (v, repr) {
        (Some(Bson::DateTime(t)), _) => Some(*t),
        (Some(Bson::Int64(s)), TimeRepr::EpochSeconds) => seconds(*s).ok(),
        (Some(Bson::Int32(s)), TimeRepr::EpochSeconds) => seconds(i64::from(*s)).ok(),
        _ => None,
    }
}

/// The granularities other than `g` whose period of `at` is `value`: what
/// a coarse field written under another `granularity` holds.
pub(super) fn other_granularities(
    at: DateTime,
    value: DateTime,
    g: Granularity,
) -> Vec<Granularity> {
    ALL.into_iter()
        .filter(|&o| o != g && truncate(at, o) == value)
        .collect()
}

/// A granularity as the attribute spells it.
pub(super) fn name(g: Granularity) -> String {
    format!("{g:?}").to_lowercase()
}

/// The first whole second at or after `t`, in epoch seconds.
pub(super) fn ceil_seconds(t: DateTime) -> i64 {
    let ms = t.timestamp_millis();
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0)
}

pub(super) fn seconds(s: i64) -> Result<DateTime> {
    s.checked_mul(1000)
        .map(DateTime::from_millis)
        .ok_or_else(|| Error::invalid("timestamp", format!("{s} seconds is out of range")))
}

/// `t` rounded down to the start of its hour, day, ISO week, month,
/// quarter or year, in UTC.
pub fn truncate(t: DateTime, g: Granularity) -> DateTime {
    const HOUR: i64 = 3_600_000;
    const DAY: i64 = 24 * HOUR;
    let ms = t.timestamp_millis();
    let days = ms.div_euclid(DAY);
    let at_day = |d: i64| DateTime::from_millis(d * DAY);
    match g {
        Granularity::Hour => DateTime::from_millis(ms.div_euclid(HOUR) * HOUR),
        Granularity::Day => at_day(days),
        // 1970-01-01 was a Thursday: Monday is 3 days before.
        Granularity::Week => at_day(days - (days + 3).rem_euclid(7)),
        Granularity::Month | Granularity::Quarter | Granularity::Year => {
            let (y, m, _) = civil_from_days(days);
            let m = match g {
                Granularity::Month => m,
                Granularity::Quarter => (m - 1) / 3 * 3 + 1,
                _ => 1,
            };
            at_day(days_from_civil(y, m, 1))
        }
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 → (y, m, d).
pub(super) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse: (y, m, d) → days since 1970-01-01.
pub(super) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
