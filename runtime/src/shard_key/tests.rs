use mongodb::bson::{doc, DateTime};

use super::deploy::shell_doc;
use super::time::{civil_from_days, days_from_civil, other_granularities};
use super::write::{check_update, fill};
use super::*;
use crate::error::Error;

const LOGS: ShardSpec = ShardSpec::Ranged {
    coarse: Some(Coarse {
        field: "month",
        derived: Some(Derived {
            from: "ts",
            repr: TimeRepr::EpochSeconds,
            granularity: Granularity::Month,
        }),
    }),
    search: Some("type"),
};

fn at(s: &str) -> DateTime {
    DateTime::parse_rfc3339_str(s).unwrap()
}

#[test]
fn truncation() {
    let t = at("2021-10-25T03:34:59.123Z"); // 1635132899 in epoch seconds
    assert_eq!(t.timestamp_millis() / 1000, 1_635_132_899);
    let cases = [
        (Granularity::Hour, "2021-10-25T03:00:00Z"),
        (Granularity::Day, "2021-10-25T00:00:00Z"),
        (Granularity::Week, "2021-10-25T00:00:00Z"), // a Monday
        (Granularity::Month, "2021-10-01T00:00:00Z"),
        (Granularity::Quarter, "2021-10-01T00:00:00Z"),
        (Granularity::Year, "2021-01-01T00:00:00Z"),
    ];
    for (g, want) in cases {
        assert_eq!(truncate(t, g), at(want), "{g:?}");
    }
    assert_eq!(
        truncate(at("2024-02-29T23:59:59Z"), Granularity::Week),
        at("2024-02-26T00:00:00Z")
    );
    assert_eq!(
        truncate(at("2024-05-31T12:00:00Z"), Granularity::Quarter),
        at("2024-04-01T00:00:00Z")
    );
    assert_eq!(
        truncate(at("1969-12-31T23:00:00Z"), Granularity::Month),
        at("1969-12-01T00:00:00Z")
    );
    for days in -800_000..800_000 {
        let (y, m, d) = civil_from_days(days);
        assert_eq!(days_from_civil(y, m, d), days);
    }
}

#[test]
fn key_and_commands() {
    assert_eq!(shard_spec(&LOGS), doc! {"month": 1, "type": 1});
    let hashed = ShardSpec::Hashed("id");
    assert_eq!(shard_spec(&hashed), doc! {"id": "hashed"});
    assert_eq!(shell_doc(&shard_spec(&LOGS)), "{ month: 1, type: 1 }");
    assert_eq!(shell_doc(&shard_spec(&hashed)), "{ id: \"hashed\" }");
    assert_eq!(index_name(&LOGS), "mp_shard_month_type");
}

#[test]
fn derived_field_and_filters() {
    let mut d = doc! {"_id": "4df16cf0", "type": "app", "ts": 1_635_132_899_i64};
    fill(&LOGS, &mut d, "logs").unwrap();
    assert_eq!(
        d.get_datetime("month").unwrap(),
        &at("2021-10-01T00:00:00Z")
    );
    let mut bad = doc! {"_id": 1, "ts": "yesterday"};
    assert!(matches!(
        fill(&LOGS, &mut bad, "logs"),
        Err(Error::UnsupportedValue { .. })
    ));
}

#[test]
fn updates_cannot_touch_the_key() {
    let ok = doc! {"$set": {"msg": "x"}, "$inc": {"retries": 1}};
    assert!(check_update(&LOGS, &ok).is_ok());
    for bad in [
        doc! {"$set": {"type": "web"}},
        doc! {"$set": {"month": 1}},
        doc! {"$inc": {"ts": 1}},
        doc! {"$rename": {"msg": "type"}},
        doc! {"$unset": {"type.sub": ""}},
        doc! {"$set": {"_id": 2}},
        doc! {"msg": "replacement"},
        doc! {"$where": "1"},
    ] {
        assert!(
            matches!(
                check_update(&LOGS, &bad),
                Err(Error::InvalidArgument { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn another_granularitys_period_is_told_apart() {
    let t = at("2021-10-25T03:34:59Z");
    // Stored under `month`, read under `day`: the month of `t`.
    let month = at("2021-10-01T00:00:00Z");
    assert_eq!(
        other_granularities(t, month, Granularity::Day),
        [Granularity::Quarter, Granularity::Month]
    );
    // Monday 25 October is its week and its day.
    assert_eq!(
        other_granularities(t, at("2021-10-25T00:00:00Z"), Granularity::Hour),
        [Granularity::Week, Granularity::Day]
    );
    // A date that is no period of `t`.
    assert!(other_granularities(t, at("2021-10-02T00:00:00Z"), Granularity::Day).is_empty());
    assert!(other_granularities(t, at("2020-10-01T00:00:00Z"), Granularity::Day).is_empty());
}
