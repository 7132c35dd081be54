//! Is kubelet alive? The evidence the heartbeat is gated on (lesson 000: a node whose kubelet is
//! dead must not look alive), and the rule that turns it into "renew" or "skip".
//!
//! Two signals: the time of kubelet's last lease request (kubelet renews its lease every 10 s, and
//! in edge mode those requests end at the hub: `outpost_proxy::autonomy::KubeletCalls`), and kubelet's own health endpoint
//! (`--kubelet-healthz-url`). The rule, [`decide`], is evaluated right before each renewal with
//! freshly read evidence (lesson 001: never act on state read before a wait):
//!
//! - kubelet called within the grace period → renew; but when renewals had stopped (kubelet was
//!   quiet) they resume only if the health endpoint does not say kubelet is failing, so one call
//!   from a crash-looping kubelet does not make the node look healthy;
//! - the last call is older than the grace period by less than one interval and the health
//!   endpoint answers OK → renew: evidence a moment old is not death, so no NotReady flap;
//! - otherwise → skip, and the cloud sees the node go NotReady after its lease expires.
//!
//! A failing health endpoint while kubelet keeps calling its lease does not stop renewals:
//! kubelet is alive and reports its own conditions in its node status (a vanilla node would keep
//! its lease too); the hub logs it and exports `outpost_kubelet_healthz_ok 0`.

use std::time::{Duration, Instant};

/// What kubelet's health endpoint said just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Healthz {
    Ok,
    Failing,
    /// No `--kubelet-healthz-url`.
    Disabled,
}

/// The heartbeat's decision for one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Renew,
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// kubelet has not called since the hub started, and nothing else vouches for it.
    NeverCalled,
    /// No lease request within the grace period.
    Silent,
    /// kubelet came back after a quiet period but its health endpoint says it is failing.
    UnhealthyOnReturn,
}

/// The rule, pure: see the module doc.
pub fn decide(
    now: Instant,
    last_call: Option<Instant>,
    grace: Duration,
    interval: Duration,
    healthz: Healthz,
    was_renewing: bool,
) -> Decision {
    let Some(last_call) = last_call else {
        return if healthz == Healthz::Ok {
            Decision::Renew
        } else {
            Decision::Skip(SkipReason::NeverCalled)
        };
    };
    let age = now.saturating_duration_since(last_call);
    if age < grace {
        if !was_renewing && healthz == Healthz::Failing {
            return Decision::Skip(SkipReason::UnhealthyOnReturn);
        }
        return Decision::Renew;
    }
    if age < grace + interval && healthz == Healthz::Ok {
        return Decision::Renew;
    }
    Decision::Skip(SkipReason::Silent)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(40);
    const INTERVAL: Duration = Duration::from_secs(10);

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn renews_while_kubelet_calls_and_stops_after_the_grace_period() {
        let t0 = Instant::now();
        let d = |now, hz| decide(at(t0, now), Some(t0), GRACE, INTERVAL, hz, true);
        assert_eq!(d(5, Healthz::Disabled), Decision::Renew);
        assert_eq!(d(39, Healthz::Disabled), Decision::Renew);
        assert_eq!(d(40, Healthz::Disabled), Decision::Skip(SkipReason::Silent));
        assert_eq!(d(40, Healthz::Failing), Decision::Skip(SkipReason::Silent));
    }

    #[test]
    fn a_moment_late_call_from_a_healthy_kubelet_is_not_death() {
        let t0 = Instant::now();
        let d = |now| decide(at(t0, now), Some(t0), GRACE, INTERVAL, Healthz::Ok, true);
        assert_eq!(d(45), Decision::Renew);
        assert_eq!(d(50), Decision::Skip(SkipReason::Silent));
    }

    #[test]
    fn resuming_needs_a_kubelet_that_is_not_failing() {
        let t0 = Instant::now();
        let resume = |hz| decide(at(t0, 1), Some(t0), GRACE, INTERVAL, hz, false);
        assert_eq!(resume(Healthz::Ok), Decision::Renew);
        assert_eq!(resume(Healthz::Disabled), Decision::Renew);
        assert_eq!(
            resume(Healthz::Failing),
            Decision::Skip(SkipReason::UnhealthyOnReturn)
        );
        // Already renewing: a failing health endpoint alone does not stop renewals.
        let d = decide(at(t0, 1), Some(t0), GRACE, INTERVAL, Healthz::Failing, true);
        assert_eq!(d, Decision::Renew);
    }

    #[test]
    fn before_the_first_call_only_a_healthy_endpoint_vouches() {
        let now = Instant::now();
        let d = |hz| decide(now, None, GRACE, INTERVAL, hz, false);
        assert_eq!(d(Healthz::Ok), Decision::Renew);
        assert_eq!(
            d(Healthz::Disabled),
            Decision::Skip(SkipReason::NeverCalled)
        );
        assert_eq!(d(Healthz::Failing), Decision::Skip(SkipReason::NeverCalled));
    }
}
