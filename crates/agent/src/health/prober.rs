//! The health loop: every interval, every server is probed; in edge mode one of the probes is the
//! node-lease renewal, made only when kubelet is alive (see [`super::kubelet`]).
//!
//! Each round: (1) if the heartbeat runs, decide with fresh evidence whether to renew, and if so
//! renew through the first healthy server in `--lb-mode` order (the unhealthy ones after): the
//! server that renews is healthy for this round, one that fails is not; (2) every server not
//! covered by (1) answers `GET /readyz`, each with `--heartbeat-failed-retry` tries of
//! `--heartbeat-timeout-seconds`. A skipped renewal never marks a server unhealthy: kubelet's
//! death and the cloud's reachability are separate states. Between rounds, a server a request
//! found answering 502/503/504, or lost after sending, is probed at once (`GET /readyz`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::{Method, Request};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::kubelet::{self, Decision, Healthz};
use super::lease::LeaseRenewer;
use super::{HealthConfig, HeartbeatConfig, ServerStates};
use crate::side::own::jitter;
use outpost_proxy::Metrics;
use outpost_proxy::autonomy::KubeletCalls;
use outpost_proxy::body;
use outpost_proxy::upstream::{Identity, Upstream};

/// The heartbeat's parts: kubelet's evidence, the renewer, and whether renewals were running.
pub struct Heartbeat {
    config: HeartbeatConfig,
    pub calls: Arc<KubeletCalls>,
    renewer: LeaseRenewer,
    renewing: AtomicBool,
}

impl Heartbeat {
    /// The heartbeat of node `node`.
    pub fn new(node: &str, config: HeartbeatConfig, calls: Arc<KubeletCalls>) -> Heartbeat {
        Heartbeat {
            renewer: LeaseRenewer::new(node, config.grace),
            config,
            calls,
            renewing: AtomicBool::new(false),
        }
    }

    /// The decision for this round, from evidence read now (lesson 001).
    async fn decide(&self, interval: Duration, metrics: &Metrics) -> Decision {
        let healthz = self.kubelet_healthz(metrics).await;
        // Read after the (possibly slow) health check, so the decision uses the latest call.
        let last_call = self.calls.last();
        let was_renewing = self.renewing.load(Ordering::Acquire);
        let decision = kubelet::decide(
            Instant::now(),
            last_call,
            self.config.grace,
            interval,
            healthz,
            was_renewing,
        );
        let renewing = decision == Decision::Renew;
        if self.renewing.swap(renewing, Ordering::AcqRel) != renewing {
            if renewing {
                info!(?healthz, "kubelet is alive; renewing the node lease");
            } else {
                warn!(
                    ?decision,
                    ?healthz,
                    "kubelet is not alive; no longer renewing the node lease"
                );
            }
        }
        if healthz == Healthz::Failing && renewing {
            warn!("kubelet's health endpoint fails while it keeps calling its lease; renewing");
        }
        decision
    }

    async fn kubelet_healthz(&self, metrics: &Metrics) -> Healthz {
        let Some(url) = &self.config.kubelet_healthz_url else {
            return Healthz::Disabled;
        };
        let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(2), client.get(url.clone())).await,
            Ok(Ok(resp)) if resp.status().is_success()
        );
        metrics.kubelet_healthz_ok.set(i64::from(ok));
        if ok { Healthz::Ok } else { Healthz::Failing }
    }
}

/// Runs the health loop until `shutdown`.
pub async fn run(
    states: Arc<ServerStates>,
    upstream: Arc<Upstream>,
    heartbeat: Option<Arc<Heartbeat>>,
    config: HealthConfig,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        // A round waits on the apiservers (seconds when one hangs); shutdown does not.
        tokio::select! {
            () = round(&states, &upstream, heartbeat.as_deref(), &config, &metrics) => {}
            _ = shutdown.changed() => return,
        }
        if let Some(path) = &config.state_file {
            remember(path, &states).await;
        }
        let next_round = tokio::time::Instant::now() + round_wait(config.interval, &states);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_round) => break,
                _ = shutdown.changed() => return,
                () = states.suspected() => {}
            }
            tokio::select! {
                () = probe_suspects(&states, &upstream, &config) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// The wait before the next round: the interval while the cloud is reachable (the lease is
/// renewed at that pace); offline, a random point of its second half (never later than
/// online), so that a fleet of hubs that lost the cloud at the same moment does not find it back
/// at the same moment either: their probes drift apart round by round.
fn round_wait(interval: Duration, states: &ServerStates) -> Duration {
    if states.is_online() {
        interval
    } else {
        interval / 2 + jitter(interval / 2)
    }
}

/// Probes the servers a failed exchange or a 5xx answer made suspect
/// ([`ServerStates::suspect`]), then waits a little: a client hammering a broken aggregated API
/// must not turn into a probe per request.
async fn probe_suspects(states: &ServerStates, upstream: &Upstream, config: &HealthConfig) {
    const SPACING: Duration = Duration::from_secs(1);
    let suspects = states.take_suspects();
    let probes = suspects
        .into_iter()
        .map(|i| probe_readyz(states, upstream, i, config));
    futures_util::future::join_all(probes).await;
    tokio::time::sleep(SPACING).await;
}

async fn round(
    states: &ServerStates,
    upstream: &Upstream,
    heartbeat: Option<&Heartbeat>,
    config: &HealthConfig,
    metrics: &Metrics,
) {
    let mut renewed_by = None;
    if let Some(hb) = heartbeat {
        match hb.decide(config.interval, metrics).await {
            Decision::Renew => renewed_by = renew(states, upstream, hb, config, metrics).await,
            Decision::Skip(reason) => {
                debug!(?reason, "node lease not renewed");
                metrics.lease_renewals.with_label_values(&["skipped"]).inc();
            }
        }
    }
    let probes = (0..states.len())
        .filter(|&i| Some(i) != renewed_by)
        .map(|i| probe_readyz(states, upstream, i, config));
    futures_util::future::join_all(probes).await;
}

/// Renews through the healthy servers first; returns the index of the one that renewed.
async fn renew(
    states: &ServerStates,
    upstream: &Upstream,
    hb: &Heartbeat,
    config: &HealthConfig,
    metrics: &Metrics,
) -> Option<usize> {
    let mut order: Vec<usize> = (0..states.len()).collect();
    order.sort_by_key(|&i| !states.is_healthy(i));
    for i in order {
        let server = states.server(i)?;
        let started = Instant::now();
        let result = hb
            .renewer
            .renew(upstream, server, config.failed_retry, config.probe_timeout)
            .await;
        observe(states, server.label(), started);
        match result {
            Ok(_) => {
                metrics.lease_renewals.with_label_values(&["renewed"]).inc();
                states.record_probe(i, true, "");
                return Some(i);
            }
            Err(cause) => {
                metrics.lease_renewals.with_label_values(&["failed"]).inc();
                let cause = cause.to_string();
                warn!(server = %server.label(), cause, "node lease renewal failed");
                states.record_probe(i, false, &cause);
            }
        }
    }
    None
}

async fn probe_readyz(states: &ServerStates, upstream: &Upstream, i: usize, config: &HealthConfig) {
    let Some(server) = states.server(i) else {
        return;
    };
    let started = Instant::now();
    let mut cause = String::new();
    for _ in 0..config.failed_retry.max(1) {
        let Ok(req) = Request::builder()
            .method(Method::GET)
            .uri("/readyz")
            .header(http::header::USER_AGENT, "outpost/probe")
            .body(body::empty())
        else {
            return;
        };
        match upstream
            .send(server, Identity::Node, req, config.probe_timeout)
            .await
        {
            Ok(resp) if resp.status().is_success() => {
                // A body that never ends would hold the prober, and every later round, for good.
                let read = tokio::time::timeout(config.probe_timeout, resp.into_body().collect());
                if read.await.is_err() {
                    cause = format!("/readyz did not finish within {:?}", config.probe_timeout);
                    continue;
                }
                observe(states, server.label(), started);
                states.record_probe(i, true, "");
                return;
            }
            Ok(resp) => cause = format!("/readyz answered {}", resp.status()),
            Err(e) => cause = e.to_string(),
        }
    }
    observe(states, server.label(), started);
    states.record_probe(i, false, &cause);
}

fn observe(states: &ServerStates, label: &str, started: Instant) {
    states
        .probe_latency
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
}

/// Keeps the last healthy list on disk, so a restart while a server is down starts right.
async fn remember(path: &std::path::Path, states: &ServerStates) {
    let servers: Vec<_> = states
        .servers()
        .zip(states.healthy_flags())
        .map(|(s, healthy)| serde_json::json!({"server": s.label(), "healthy": healthy}))
        .collect();
    let text = serde_json::json!({ "servers": servers }).to_string();
    let tmp = path.with_extension("tmp");
    let written = async {
        tokio::fs::write(&tmp, text).await?;
        tokio::fs::rename(&tmp, path).await
    }
    .await;
    if let Err(e) = written {
        debug!(path = %path.display(), error = %e, "cannot remember server health");
    }
}

/// The remembered healthy flags for `labels`, in order; unknown servers start healthy.
pub fn remembered(path: &std::path::Path, labels: &[String]) -> Vec<bool> {
    let known: Vec<(String, bool)> = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["servers"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|s| Some((s["server"].as_str()?.to_owned(), s["healthy"].as_bool()?)))
        .collect();
    let flags: Vec<bool> = labels
        .iter()
        .map(|l| known.iter().find(|(k, _)| k == l).is_none_or(|(_, h)| *h))
        .collect();
    // All remembered as down: start optimistic rather than serving only from the cache until
    // two probes pass; the first round corrects it within one interval.
    if flags.iter().all(|h| !h) {
        return vec![true; labels.len()];
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_flags_follow_labels_and_never_start_all_down() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("servers.json");
        let labels = vec!["https://a:1".to_owned(), "https://b:1".to_owned()];
        assert_eq!(
            remembered(&path, &labels),
            [true, true],
            "nothing remembered"
        );
        std::fs::write(
            &path,
            r#"{"servers":[{"server":"https://a:1","healthy":false},{"server":"https://b:1","healthy":true}]}"#,
        )
        .unwrap();
        assert_eq!(remembered(&path, &labels), [false, true]);
        std::fs::write(
            &path,
            r#"{"servers":[{"server":"https://a:1","healthy":false},{"server":"https://b:1","healthy":false}]}"#,
        )
        .unwrap();
        assert_eq!(remembered(&path, &labels), [true, true]);
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(remembered(&path, &labels), [true, true]);
    }
}
