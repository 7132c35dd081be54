//! Kubernetes timestamps as text: `metav1.Time` (RFC 3339, UTC, whole seconds) and
//! `metav1.MicroTime` (the same with microseconds), from and to time since the Unix epoch. Pure
//! arithmetic on a duration the caller read from its clock.

use std::time::Duration;

/// `metav1.Time` wire format: `2026-11-23T19:44:21Z`.
pub fn rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `metav1.MicroTime` wire format, as lease `renewTime`: `2026-11-23T19:44:21.123456Z`.
pub fn micro_time(since_epoch: Duration) -> String {
    let seconds = rfc3339(since_epoch);
    let whole = seconds.trim_end_matches('Z');
    format!("{whole}.{:06}Z", since_epoch.subsec_micros())
}

/// Parses what [`rfc3339`] and [`micro_time`] produce back to time since the epoch (whole
/// seconds; a fraction is ignored).
pub fn parse_rfc3339(s: &str) -> Option<Duration> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    u64::try_from(secs).ok().map(Duration::from_secs)
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian, days since 1970-01-01).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_known_dates() {
        assert_eq!(rfc3339(Duration::from_secs(0)), "1970-01-01T00:00:00Z");
        let t = parse_rfc3339("2026-02-27T01:23:36Z").unwrap();
        assert_eq!(rfc3339(t), "2026-02-27T01:23:36Z");
        assert_eq!(
            rfc3339(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert!(parse_rfc3339("yesterday").is_none());
    }

    #[test]
    fn micro_time_matches_the_apiserver_format() {
        let t = Duration::from_micros(1_795_463_061_123_456);
        assert_eq!(micro_time(t), "2026-11-23T19:44:21.123456Z");
        assert_eq!(micro_time(Duration::ZERO), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            parse_rfc3339(&micro_time(t)),
            Some(Duration::from_secs(1_795_463_061))
        );
    }
}
