//! Small helpers with no Kubernetes logic: timestamps, random names and uids, durations.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A random u64 from std's per-instance SipHash keys, so no RNG crate is needed.
pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(unix_now().as_nanos() as u64);
    h.finish()
}

/// A version-4-shaped UUID, as kube-apiserver assigns to `metadata.uid`.
pub fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// The 5-character suffix `generateName` gets (apimachinery's `utilrand.String`).
pub fn name_suffix() -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHANUMS[(n % ALPHANUMS.len() as u64) as usize] as char;
            n /= ALPHANUMS.len() as u64;
            c
        })
        .collect()
}

pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `metav1.Time` wire format: RFC 3339, UTC, whole seconds.
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

pub fn now_rfc3339() -> String {
    rfc3339(unix_now())
}

/// Parses what [`rfc3339`] produces (and fractional seconds / `Z` variants) back to epoch time.
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

/// apimachinery's `duration.HumanDuration`, the `AGE` column of `kubectl get`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (m, h, days) = (s / 60, s / 3600, s / 86_400);
    match () {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => match s % 60 {
            0 => format!("{m}m"),
            r => format!("{m}m{r}s"),
        },
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => match m % 60 {
            0 => format!("{h}h"),
            r => format!("{h}h{r}m"),
        },
        _ if h < 48 => format!("{h}h"),
        _ if h < 24 * 8 => match h % 24 {
            0 => format!("{days}d"),
            r => format!("{days}d{r}h"),
        },
        _ if h < 24 * 365 * 2 => format!("{days}d"),
        _ if h < 24 * 365 * 8 => match days % 365 {
            0 => format!("{}y", days / 365),
            r => format!("{}y{r}d", days / 365),
        },
        _ => format!("{}y", days / 365),
    }
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
    fn uids_look_like_v4_uuids_and_differ() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn human_durations_match_kubectl_age() {
        let cases = [
            (5, "5s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (90_000, "25h"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(Duration::from_secs(secs)), want);
        }
        assert_eq!(human_duration(Duration::from_secs(325 * 86_400)), "325d");
    }
}
