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

pub use outpost_core::time::{parse_rfc3339, rfc3339};

pub fn now_rfc3339() -> String {
    rfc3339(unix_now())
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
