//! Numbers as the markdown tables print them.

use std::time::Duration;

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

/// [`thousands`] of a signed number: `-1234` as `-1,234`.
pub fn thousands_i(n: i64) -> String {
    if n < 0 {
        format!("-{}", thousands(n.unsigned_abs()))
    } else {
        thousands(n as u64)
    }
}

/// [`thousands`], or `n/a` for `None`.
pub fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), thousands)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_three() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands_i(-1234), "-1,234");
        assert_eq!(thousands_i(i64::MIN), "-9,223,372,036,854,775,808");
        assert_eq!(opt(None), "n/a");
    }
}
