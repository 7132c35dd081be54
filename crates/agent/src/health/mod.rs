//! The cloud's health as the node agent keeps it: the servers' probes and the node-lease
//! heartbeat.
//!
//! [`prober`] drives the request path's `ServerStates` (`outpost_proxy::upstream::states`):
//! every `--heartbeat-interval-seconds` every server is probed (yurthub stops at the first
//! success and leaves the others stale). In edge mode the probe of one server is the node-lease
//! renewal ([`lease`]), gated on kubelet being alive ([`kubelet`]); kubelet's own lease requests
//! are answered locally by the request path (`outpost_proxy::autonomy::lease`) and are that
//! evidence. kubelet's liveness and the servers' health are separate states: a dead kubelet stops
//! the heartbeat, never the hub's traffic.

pub mod kubelet;
pub mod lease;
pub mod prober;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use outpost_proxy::Metrics;
use outpost_proxy::autonomy::KubeletCalls;
use outpost_proxy::upstream::{Server, ServerStates, Upstream};

use crate::supervisor::Supervisor;

/// The prober's settings (yurthub's heartbeat flags).
#[derive(Debug, Clone)]
pub struct HealthConfig {
    pub interval: Duration,
    pub healthy_threshold: u32,
    pub failed_retry: u32,
    pub probe_timeout: Duration,
    /// Edge mode: renew the node lease (gated on kubelet) and answer kubelet's lease locally.
    pub heartbeat: Option<HeartbeatConfig>,
    /// Where the last healthy server list is remembered (`<root-dir>/servers.json`).
    pub state_file: Option<PathBuf>,
}

impl Default for HealthConfig {
    /// yurthub's defaults, without the heartbeat (cloud mode).
    fn default() -> Self {
        HealthConfig {
            interval: Duration::from_secs(10),
            healthy_threshold: 2,
            failed_retry: 3,
            probe_timeout: Duration::from_secs(2),
            heartbeat: None,
            state_file: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct HeartbeatConfig {
    /// `--kubelet-health-grace-period`; also the lease's `leaseDurationSeconds`.
    pub grace: Duration,
    /// `--kubelet-healthz-url`; `None` when empty.
    pub kubelet_healthz_url: Option<http::Uri>,
}

/// Which servers are healthy, starting from the list remembered by the last run (every server
/// healthy when nothing is remembered).
pub fn server_states(
    config: &HealthConfig,
    servers: &[Server],
    metrics: &Metrics,
) -> Arc<ServerStates> {
    let labels: Vec<String> = servers.iter().map(|s| s.label().to_owned()).collect();
    let initially_healthy = config
        .state_file
        .as_deref()
        .map(|path| prober::remembered(path, &labels))
        .unwrap_or_default();
    Arc::new(ServerStates::new(
        servers.to_vec(),
        &initially_healthy,
        config.healthy_threshold,
        metrics,
    ))
}

/// Starts the prober; in edge mode with a heartbeat configured, the probe of one server renews
/// the node lease, and the evidence of kubelet's calls it is gated on is returned (kubelet's
/// lease requests, answered by the request path, record it).
pub fn start(
    node: &str,
    config: &HealthConfig,
    edge: bool,
    (states, upstream): (&Arc<ServerStates>, &Arc<Upstream>),
    metrics: &Metrics,
    tasks: &Supervisor,
) -> Option<Arc<KubeletCalls>> {
    let heartbeat = match &config.heartbeat {
        Some(hb) if edge => Some(Arc::new(prober::Heartbeat::new(
            node,
            hb.clone(),
            Arc::default(),
        ))),
        _ => None,
    };
    let prober = prober::run(
        states.clone(),
        upstream.clone(),
        heartbeat.clone(),
        config.clone(),
        metrics.clone(),
        tasks.stopping(),
    );
    tasks.spawn("prober", prober);
    heartbeat.map(|hb| hb.calls.clone())
}
