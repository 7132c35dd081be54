//! Kubernetes timestamps as text: `metav1.Time` (RFC 3339, UTC, whole seconds) and
//! `metav1.MicroTime` (the same with microseconds), from and to time since the Unix epoch. Pure
//! arithmetic on a duration the caller read from its clock, or on a [`Timestamp`] (the
//! `{seconds, nanos}` pair protobuf carries, which may lie before 1970).

use std::time::Duration;

/// `metav1.Time` wire format: `2026-11-23T19:44:21Z`.
pub fn rfc3339(since_epoch: Duration) -> String {
    let seconds = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    Timestamp { seconds, nanos: 0 }.rfc3339()
}

/// Seconds and nanoseconds since the Unix epoch, as `metav1.Time` / `MicroTime` travel in
/// protobuf (`nanos` in `0..1_000_000_000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// `metav1.Time`'s JSON: UTC, whole seconds (a fraction is dropped, as Go's layout does).
    pub fn rfc3339(self) -> String {
        let (days, rem) = (
            self.seconds.div_euclid(86_400),
            self.seconds.rem_euclid(86_400),
        );
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }

    /// `metav1.MicroTime`'s JSON: UTC, six fractional digits (truncated, as Go formats them).
    pub fn micro_time(self) -> String {
        let seconds = self.rfc3339();
        let whole = seconds.trim_end_matches('Z');
        format!("{whole}.{:06}Z", self.nanos / 1000)
    }

    /// Parses RFC 3339 as Go's `time.Parse(time.RFC3339, ..)` does: an optional fraction of up
    /// to nine digits, then `Z` or a `±hh:mm` offset; the result is in UTC.
    pub fn parse(s: &str) -> Option<Timestamp> {
        let b = s.as_bytes();
        let at = |i: usize, c: u8| b.get(i) == Some(&c);
        if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':')) {
            return None;
        }
        let (year, month, day) = (digits(s, 0..4)?, digits(s, 5..7)?, digits(s, 8..10)?);
        let (hour, minute, second) = (digits(s, 11..13)?, digits(s, 14..16)?, digits(s, 17..19)?);
        if !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
        {
            return None;
        }
        let (nanos, zone) = fraction(&s[19..])?;
        let offset = zone_offset(zone)?;
        let days = days_from_civil(year, month, day);
        let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
        Some(Timestamp { seconds, nanos })
    }
}

/// Exactly the digits in `range` (no sign), as a number.
fn digits(s: &str, range: std::ops::Range<usize>) -> Option<i64> {
    let part = s.get(range)?;
    part.bytes()
        .all(|c| c.is_ascii_digit())
        .then(|| part.parse().ok())
        .flatten()
}

/// An optional `.ddd` fraction (1 to 9 digits) as nanoseconds, and what follows it.
fn fraction(rest: &str) -> Option<(u32, &str)> {
    let Some(frac) = rest.strip_prefix('.') else {
        return Some((0, rest));
    };
    let n = frac.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 || n > 9 {
        return None;
    }
    let value: u32 = frac[..n].parse().ok()?;
    Some((value * 10u32.pow(9 - n as u32), &frac[n..]))
}

/// `Z` is UTC; `+hh:mm` / `-hh:mm` is the local time's offset east of UTC, in seconds.
fn zone_offset(zone: &str) -> Option<i64> {
    if zone == "Z" {
        return Some(0);
    }
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    if zone.len() != 6 || zone.as_bytes()[3] != b':' {
        return None;
    }
    let (hours, minutes) = (digits(zone, 1..3)?, digits(zone, 4..6)?);
    (hours < 24 && minutes < 60).then_some(sign * (hours * 3600 + minutes * 60))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
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
    fn timestamps_format_and_parse_like_go() {
        let t = Timestamp::parse("2003-01-01T01:01:01.000003Z").unwrap();
        assert_eq!(
            t,
            Timestamp {
                seconds: 1_041_382_861,
                nanos: 3_000
            }
        );
        assert_eq!(t.micro_time(), "2003-01-01T01:01:01.000003Z");
        assert_eq!(t.rfc3339(), "2003-01-01T01:01:01Z");
        // An offset is folded into UTC; nanoseconds below a microsecond are truncated.
        let t = Timestamp::parse("2003-01-01T03:01:01.123456789+02:00").unwrap();
        assert_eq!(t.micro_time(), "2003-01-01T01:01:01.123456Z");
        let before_1970 = Timestamp {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(before_1970.rfc3339(), "1969-12-31T23:59:59Z");
        assert_eq!(Timestamp::parse("1969-12-31T23:59:59Z"), Some(before_1970));
        for bad in [
            "2003-01-01 01:01:01Z",
            "2003-02-29T01:01:01Z",
            "2003-01-01T24:00:00Z",
            "2003-01-01T01:01:01",
            "2003-01-01T01:01:01.Z",
            "2003-01-01T01:01:01+0200",
            "+003-01-01T01:01:01Z",
        ] {
            assert_eq!(Timestamp::parse(bad), None, "{bad}");
        }
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
