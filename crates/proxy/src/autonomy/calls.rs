//! [`KubeletCalls`]: the evidence that kubelet is alive, as the request path sees it (its lease
//! requests end at the hub, [`super::lease`]); the node agent's heartbeat is gated on it.

use std::sync::Mutex;
use std::time::Instant;

/// When kubelet last called in; written by the local lease handler, read by the heartbeat.
#[derive(Debug, Default)]
pub struct KubeletCalls {
    last: Mutex<Option<Instant>>,
}

impl KubeletCalls {
    pub fn record(&self, at: Instant) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|l| l < at) {
            *last = Some(at);
        }
    }

    pub fn last(&self) -> Option<Instant> {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn calls_only_move_forward() {
        let calls = KubeletCalls::default();
        let t0 = Instant::now();
        calls.record(at(t0, 5));
        calls.record(t0);
        assert_eq!(calls.last(), Some(at(t0, 5)));
    }
}
