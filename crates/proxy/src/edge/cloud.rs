//! Whether the cloud answers: one shared state instead of a guess per request.
//!
//! A failed upstream exchange (connection refused, TLS failure, timeout, a 5xx) marks the cloud
//! offline; from then on cached reads are answered locally at once instead of each waiting for its
//! own timeout, writes get a 503 Status, and a prober asks `GET /version` every
//! [`PROBE_INTERVAL`] until an apiserver answers. Then the state flips back and every offline
//! watch ends, so clients relist against the cloud and the cache converges.
//!
//! The health-checker issue replaces this with per-server probers and the lease heartbeat; the
//! rest of the edge code only sees [`Cloud::is_online`] and [`Cloud::subscribe`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Method, Request};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::body;
use crate::metrics::Metrics;
use crate::upstream::{Identity, Upstream};

/// How often an offline hub asks whether the cloud is back.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The shared online/offline state.
pub struct Cloud {
    online: watch::Sender<bool>,
    probing: AtomicBool,
    metrics: Metrics,
}

impl Cloud {
    pub fn new(metrics: Metrics) -> Arc<Cloud> {
        metrics.cloud_online.set(1);
        Arc::new(Cloud {
            online: watch::Sender::new(true),
            probing: AtomicBool::new(false),
            metrics,
        })
    }

    pub fn is_online(&self) -> bool {
        *self.online.borrow()
    }

    /// Changes of the state; offline watches end when it turns `true`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.online.subscribe()
    }

    /// Resolves once the cloud is offline (at once if it already is).
    pub async fn went_offline(&self) {
        let mut rx = self.online.subscribe();
        // The sender lives as long as `self`, so `wait_for` cannot fail here.
        let _ = rx.wait_for(|online| !*online).await;
    }

    /// Checks the cloud once at start-up, so that a hub booting while the cloud is unreachable
    /// serves from its cache within one probe timeout instead of one request timeout.
    pub fn probe_at_start(
        self: &Arc<Self>,
        upstream: Arc<Upstream>,
        shutdown: watch::Receiver<bool>,
    ) {
        let cloud = self.clone();
        tokio::spawn(async move {
            if !probe(&upstream).await {
                cloud.report_failure("start-up probe failed", upstream, shutdown);
            }
        });
    }

    /// An upstream exchange failed: go offline and start probing (once).
    pub fn report_failure(
        self: &Arc<Self>,
        cause: &str,
        upstream: Arc<Upstream>,
        shutdown: watch::Receiver<bool>,
    ) {
        if self.set(false) {
            warn!(cause, "cloud unreachable; serving cached reads locally");
        }
        if !self.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().probe_until_online(upstream, shutdown));
        }
    }

    /// An apiserver answered a request: the cloud is back (the prober stops on its own).
    pub fn report_success(&self) {
        if !self.is_online() && self.set(true) {
            info!("cloud reachable again; ending offline watches");
        }
    }

    /// Sets the state; `true` when it changed.
    fn set(&self, online: bool) -> bool {
        self.metrics.cloud_online.set(i64::from(online));
        self.online.send_if_modified(|state| {
            let changed = *state != online;
            *state = online;
            changed
        })
    }

    async fn probe_until_online(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                _ = shutdown.changed() => return,
            }
            if !self.is_online() && !probe(&upstream).await {
                continue;
            }
            self.report_success();
            self.probing.store(false, Ordering::Release);
            // A failure reported between the success and the store found `probing` still set
            // and started no prober: carry on probing for it.
            if self.is_online() || self.probing.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }
}

/// One `GET /version` to the next server: any answer below 500 means the cloud is there.
async fn probe(upstream: &Upstream) -> bool {
    let Some(server) = upstream.pick() else {
        return false;
    };
    let Ok(req) = Request::builder()
        .method(Method::GET)
        .uri("/version")
        .header(http::header::USER_AGENT, "outpost/probe")
        .body(body::empty())
    else {
        return false;
    };
    match upstream
        .send(server, Identity::Node, req, PROBE_TIMEOUT)
        .await
    {
        Ok(resp) => resp.status().as_u16() < 500,
        Err(_) => false,
    }
}
