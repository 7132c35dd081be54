//! Node autonomy (edge mode): kubelet's requests the hub answers itself, so that a node whose
//! cloud is away — even across a reboot — gets its pods running and keeps reporting.
//!
//! Reads are the cache's business ([`crate::edge`]). These are the requests a reboot sends that
//! are not reads; [`Autonomy::classify`] picks them out at the route stage:
//!
//! - kubelet's own lease, always ([`lease`]; its requests are the evidence the node agent's
//!   heartbeat is gated on, [`KubeletCalls`]);
//! - its node-status PATCH offline, replayed on return ([`node_status`], which also keeps the
//!   `Autonomy` node condition, [`condition`]);
//! - its TokenRequests: online the cloud's answers are kept, offline they are answered from
//!   them ([`tokens`]);
//! - its registration offline: 409 AlreadyExists for the cached Node ([`registration`]);
//! - its pod-status PATCHes offline: kept, read back by offline readers (kubelet's pods, the
//!   EndpointSlices kube-proxy and coredns read, with the pods' new IPs) and replayed on
//!   return ([`pods`]);
//! - its events offline: queued and sent on return ([`events`]).
//!
//! Anything kept offline is the node's own report, never cloud truth: the cloud's answers win
//! once it is back.

mod calls;
pub mod condition;
pub mod events;
pub mod lease;
pub mod node_status;
pub mod pods;
pub mod registration;
pub mod replay;
pub mod tokens;

use std::sync::Arc;

use bytes::Bytes;
use outpost_cache::Store;
use outpost_core::{RequestInfo, Verb};
use tokio::sync::watch;

use crate::edge::Edge;
use crate::metrics::Metrics;
use crate::upstream::Upstream;
pub use calls::KubeletCalls;
use lease::LocalLease;
use node_status::NodeStatus;

/// A named background task for the node agent to run.
pub type Task = (
    &'static str,
    std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
);

/// A request of kubelet's that the hub answers itself (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletRequest {
    Lease,
    NodeStatus,
    Token,
    Registration,
    PodStatus,
    Event,
}

/// Everything edge mode answers for kubelet.
pub struct Autonomy {
    pub lease: Option<LocalLease>,
    pub node_status: Option<Arc<NodeStatus>>,
    pub tokens: Arc<tokens::Tokens>,
    pub registration: registration::Registration,
    pub pods: Arc<pods::PodStatuses>,
    pub events: Arc<events::Events>,
}

impl Autonomy {
    /// Takes up what was kept before a restart (pod statuses, queued events), and returns the
    /// tasks (for the caller to run) that send it to the cloud on its return, and forget kept
    /// tokens no pod uses.
    pub async fn start(
        edge: &Edge,
        upstream: &Arc<Upstream>,
        (lease, node_status): (Option<LocalLease>, Option<Arc<NodeStatus>>),
        node: &str,
        metrics: &Metrics,
        shutdown: &watch::Receiver<bool>,
    ) -> (Autonomy, Vec<Task>) {
        let store = edge.store();
        let pods = Arc::new(pods::PodStatuses::new(
            store.clone(),
            edge.overlay().clone(),
            metrics.clone(),
        ));
        pods.restore().await;
        let events = Arc::new(events::Events::new(store.clone(), metrics.clone()));
        events.restore().await;
        let tokens = Arc::new(tokens::Tokens::new(
            store.clone(),
            edge.writer().clone(),
            metrics.clone(),
        ));
        let online = || edge.health().subscribe();
        let tasks: Vec<Task> = vec![
            (
                "pod status replay",
                Box::pin(pods.clone().replay_on_reconnect(
                    upstream.clone(),
                    online(),
                    shutdown.clone(),
                )),
            ),
            (
                "event replay",
                Box::pin(events.clone().replay_on_reconnect(
                    upstream.clone(),
                    online(),
                    shutdown.clone(),
                )),
            ),
            (
                "kept tokens",
                Box::pin(tokens.clone().forget_stale(online(), shutdown.clone())),
            ),
        ];
        let autonomy = Autonomy {
            lease,
            node_status,
            tokens,
            registration: registration::Registration::new(node, store.clone(), metrics.clone()),
            pods,
            events,
        };
        (autonomy, tasks)
    }

    /// Which of kubelet's requests this is, if the hub answers it; `offline`: the cloud is
    /// known to be unreachable.
    pub fn classify(&self, info: &RequestInfo, offline: bool) -> Option<KubeletRequest> {
        if self.lease.as_ref().is_some_and(|l| l.handles(info)) {
            return Some(KubeletRequest::Lease);
        }
        if tokens::Tokens::handles(info) {
            return Some(KubeletRequest::Token);
        }
        if !offline {
            return None;
        }
        if self.node_status.as_ref().is_some_and(|n| n.handles(info)) {
            Some(KubeletRequest::NodeStatus)
        } else if registration::Registration::handles(info) {
            Some(KubeletRequest::Registration)
        } else if pods::PodStatuses::handles(info) {
            Some(KubeletRequest::PodStatus)
        } else if events::Events::handles(info) {
            Some(KubeletRequest::Event)
        } else {
            None
        }
    }
}

/// Whether `info` is kubelet's request of one of `verbs` on the core group's `resource`
/// (`subresource`: "" for the object itself).
fn is_kubelets(info: &RequestInfo, verbs: &[Verb], resource: &str, subresource: &str) -> bool {
    verbs.contains(&info.verb)
        && info.api_group.is_empty()
        && info.resource == resource
        && info.subresource == subresource
        && info.component.as_deref() == Some("kubelet")
}

/// The documents kept under `prefix` before a restart (none when they cannot be read: what
/// was kept is then lost, which the log says).
async fn kept(store: &Arc<dyn Store>, prefix: &'static str, what: &str) -> Vec<(String, Bytes)> {
    match crate::edge::offline::blocking(store, move |s| s.documents(prefix)).await {
        Ok(kept) => kept,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the {what} kept offline");
            Vec::new()
        }
    }
}
