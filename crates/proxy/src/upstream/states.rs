//! Server health: one healthy/unhealthy state per `--server-addr`, the only source of "online"
//! for the rest of the hub (load balancing, edge routing, offline watches, readiness).
//!
//! The node agent's prober drives it (`outpost_agent::health`): every
//! `--heartbeat-interval-seconds` every server is probed. A server turns unhealthy on its first
//! failed probe (after `--heartbeat-failed-retry` tries) or on a request that could not connect
//! to it (refused, TLS failure). A request that failed after it was sent (connection lost,
//! timeout, garbage) or was answered 502/503/504 only has it probed at once
//! ([`ServerStates::suspect`]): one bad exchange must not end every watch. It turns healthy again
//! after `--heartbeat-healthy-threshold` consecutive successful probes. Watches proxied from a
//! server end when it turns unhealthy ([`ServerStates::next_outage`]).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use super::server::Server;
use crate::metrics::Metrics;

struct ServerState {
    server: Server,
    healthy: AtomicBool,
    /// Consecutive successful probes since the last failure.
    streak: AtomicU32,
    /// How many times the server turned unhealthy; streams from it end on a change.
    outages: watch::Sender<u64>,
    /// A request failed after it was sent, or was answered 502/503/504, since the prober last
    /// looked ([`ServerStates::suspect`]).
    suspected: AtomicBool,
}

/// Health of every configured apiserver.
pub struct ServerStates {
    servers: Vec<ServerState>,
    healthy_threshold: u32,
    online: watch::Sender<bool>,
    /// Wakes the prober for a suspected server.
    suspicion: Notify,
    gauge: IntGaugeVec,
    transitions: IntCounterVec,
    /// How long each probe took (the prober records it).
    pub probe_latency: HistogramVec,
    cloud_online: prometheus::IntGauge,
}

impl ServerStates {
    /// `initially_healthy[i]`: the state each server starts in (the last known good list, or
    /// every server when nothing is remembered).
    pub fn new(
        servers: Vec<Server>,
        initially_healthy: &[bool],
        healthy_threshold: u32,
        metrics: &Metrics,
    ) -> ServerStates {
        let servers: Vec<ServerState> = servers
            .into_iter()
            .enumerate()
            .map(|(i, server)| ServerState {
                server,
                healthy: AtomicBool::new(initially_healthy.get(i).copied().unwrap_or(true)),
                streak: AtomicU32::new(0),
                outages: watch::Sender::new(0),
                suspected: AtomicBool::new(false),
            })
            .collect();
        let states = ServerStates {
            online: watch::Sender::new(false),
            suspicion: Notify::new(),
            healthy_threshold: healthy_threshold.max(1),
            gauge: metrics.server_healthy.clone(),
            transitions: metrics.server_transitions.clone(),
            probe_latency: metrics.probe_latency.clone(),
            cloud_online: metrics.cloud_online.clone(),
            servers,
        };
        for s in &states.servers {
            states
                .gauge
                .with_label_values(&[s.server.label()])
                .set(i64::from(s.healthy.load(Ordering::Relaxed)));
        }
        states.publish();
        states
    }

    pub fn servers(&self) -> impl Iterator<Item = &Server> {
        self.servers.iter().map(|s| &s.server)
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn server(&self, index: usize) -> Option<&Server> {
        self.servers.get(index).map(|s| &s.server)
    }

    pub fn is_healthy(&self, index: usize) -> bool {
        self.servers
            .get(index)
            .is_some_and(|s| s.healthy.load(Ordering::Acquire))
    }

    pub fn healthy_flags(&self) -> Vec<bool> {
        (0..self.servers.len())
            .map(|i| self.is_healthy(i))
            .collect()
    }

    pub fn index_of(&self, server: &Server) -> Option<usize> {
        self.servers.iter().position(|s| &s.server == server)
    }

    /// Any server healthy: the hub is online.
    pub fn is_online(&self) -> bool {
        *self.online.borrow()
    }

    /// Changes of [`Self::is_online`]; offline watches end when it turns `true`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.online.subscribe()
    }

    /// Resolves once every server is unhealthy (at once if that is already so).
    pub async fn went_offline(&self) {
        let mut rx = self.online.subscribe();
        let _ = rx.wait_for(|online| !*online).await;
    }

    /// Resolves when `server` next turns unhealthy (also when it does so before the first
    /// poll: the count is taken now). A proxied watch ends on it: a link that went silent sends
    /// no FIN, and a stream over it would hang until its timeout, missing what changes after the
    /// link returns.
    pub fn next_outage(&self, server: &Server) -> impl Future<Output = ()> + Send + Sync + 'static {
        let outages = self
            .index_of(server)
            .map(|i| self.servers[i].outages.subscribe());
        async move {
            match outages {
                // An error means the states are gone: the hub is shutting down.
                Some(mut outages) => _ = outages.changed().await,
                None => std::future::pending().await,
            }
        }
    }

    /// The result of one probe (after its retries).
    pub fn record_probe(&self, index: usize, ok: bool, cause: &str) {
        let Some(s) = self.servers.get(index) else {
            return;
        };
        if !ok {
            s.streak.store(0, Ordering::Release);
            self.set(s, false, cause);
            return;
        }
        let streak = s.streak.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        if streak >= self.healthy_threshold {
            self.set(s, true, "probes succeeded");
        }
    }

    /// A request could not connect to the server: unhealthy now, until probes say otherwise.
    pub fn mark_failed(&self, server: &Server, cause: &str) {
        if let Some(i) = self.index_of(server) {
            self.record_probe(i, false, cause);
        }
    }

    /// A request to the server failed after it was sent (its connection lost or reset, no
    /// headers in time, a reply that is not HTTP), or was answered 502, 503 or 504. That may be
    /// the server (or the load balancer in front of it) unable to serve, or only that exchange
    /// or what the server fronts: a pooled connection a NAT forgot, a slow LIST, an aggregated
    /// API whose backend is down (kube-apiserver answers 503 for `metrics.k8s.io` without
    /// metrics-server while serving everything else). So the server is not marked unhealthy
    /// here; the prober (`outpost_agent::health::prober`) checks it at once and its probe decides.
    pub fn suspect(&self, server: &Server, cause: &str) {
        let Some(s) = self.index_of(server).map(|i| &self.servers[i]) else {
            return;
        };
        if !s.suspected.swap(true, Ordering::AcqRel) {
            debug!(server = %s.server.label(), cause, "apiserver suspected; probing it now");
        }
        self.suspicion.notify_one();
    }

    /// Resolves once a server is suspected (at once if one was since the last
    /// [`Self::take_suspects`]).
    pub async fn suspected(&self) {
        self.suspicion.notified().await;
    }

    /// The servers suspected since the last call, and forgets them.
    pub fn take_suspects(&self) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].suspected.swap(false, Ordering::AcqRel))
            .collect()
    }

    fn set(&self, s: &ServerState, healthy: bool, cause: &str) {
        if s.healthy.swap(healthy, Ordering::AcqRel) == healthy {
            return;
        }
        let to = if healthy { "healthy" } else { "unhealthy" };
        if healthy {
            info!(server = %s.server.label(), "apiserver healthy");
        } else {
            warn!(server = %s.server.label(), cause, "apiserver unhealthy");
            s.outages.send_modify(|n| *n += 1);
        }
        self.gauge
            .with_label_values(&[s.server.label()])
            .set(i64::from(healthy));
        self.transitions
            .with_label_values(&[s.server.label(), to])
            .inc();
        self.publish();
    }

    fn publish(&self) {
        let online = self
            .servers
            .iter()
            .any(|s| s.healthy.load(Ordering::Acquire));
        self.cloud_online.set(i64::from(online));
        self.online.send_if_modified(|state| {
            let changed = *state != online;
            if changed {
                if online {
                    info!("cloud reachable; serving from the apiservers");
                } else {
                    warn!("no apiserver healthy; edge mode serves from its cache");
                }
            }
            *state = online;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn states(n: usize, threshold: u32) -> ServerStates {
        let servers = (0..n)
            .map(|i| Server::parse(&format!("127.0.0.1:{}", 1000 + i)).unwrap())
            .collect();
        ServerStates::new(servers, &[], threshold, &Metrics::new())
    }

    #[tokio::test]
    async fn a_suspect_wakes_the_prober_once_and_stays_healthy() {
        let s = states(2, 1);
        let second = s.server(1).unwrap().clone();
        s.suspect(&second, "answered 503");
        s.suspect(&second, "answered 503 again");
        tokio::time::timeout(Duration::from_secs(1), s.suspected())
            .await
            .expect("the prober is woken");
        assert!(s.is_healthy(1), "only a probe decides");
        assert_eq!(s.take_suspects(), [1]);
        assert!(s.take_suspects().is_empty(), "taken once");
    }

    #[tokio::test]
    async fn next_outage_resolves_when_that_server_turns_unhealthy() {
        use std::future::Future;
        use std::task::{Context, Poll};
        let s = states(2, 1);
        let first = s.server(0).unwrap().clone();
        let pending = |f: &mut std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>| {
            f.as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()))
                == Poll::Pending
        };
        let mut outage: std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>> =
            Box::pin(s.next_outage(&first));
        s.record_probe(1, false, "the other server");
        s.record_probe(0, true, "already healthy");
        assert!(pending(&mut outage));
        s.record_probe(0, false, "refused");
        assert!(
            !pending(&mut outage),
            "taken before the outage, resolved by it"
        );

        // Taken while unhealthy: the next outage is the one after a recovery.
        let mut next: std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>> =
            Box::pin(s.next_outage(&first));
        s.record_probe(0, false, "still refused");
        assert!(pending(&mut next), "failing again is not a new outage");
        s.record_probe(0, true, "back");
        s.record_probe(0, false, "gone again");
        assert!(!pending(&mut next));
    }

    #[test]
    fn one_failure_makes_unhealthy_threshold_successes_make_healthy() {
        let s = states(2, 2);
        assert!(s.is_online());
        s.record_probe(0, false, "refused");
        assert!(!s.is_healthy(0));
        assert!(s.is_online(), "the other server still answers");
        s.record_probe(1, false, "refused");
        assert!(!s.is_online());
        s.record_probe(0, true, "");
        assert!(!s.is_healthy(0), "one success is not enough");
        s.record_probe(0, false, "flap");
        s.record_probe(0, true, "");
        assert!(!s.is_healthy(0), "the streak restarted");
        s.record_probe(0, true, "");
        assert!(s.is_healthy(0));
        assert!(s.is_online());
    }

    #[test]
    fn remembered_states_are_the_start() {
        let servers = (0..2)
            .map(|i| Server::parse(&format!("127.0.0.1:{}", 2000 + i)).unwrap())
            .collect();
        let s = ServerStates::new(servers, &[false, true], 2, &Metrics::new());
        assert_eq!(s.healthy_flags(), [false, true]);
        let server = s.server(1).unwrap().clone();
        s.mark_failed(&server, "reset");
        assert!(!s.is_online());
    }
}
