//! kubelet's registration (`POST /api/v1/nodes`) while the cloud is away.
//!
//! At every start kubelet creates its Node and takes `409 AlreadyExists` as "registered": it then
//! GETs the node (from the cache, offline) and goes on to report status. Until registration
//! succeeds it holds node status back and loops with a backoff, so a 503 here would keep the
//! node's offline status from ever being written after a reboot. The hub answers the 409 that
//! kube-apiserver would — but only for this node's own Node, and only when the cache holds it
//! (so the node did exist as last seen from the cloud). A node the cache does not know waits for
//! the cloud (503).

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use outpost_cache::{Gvr, Lookup, ObjectKey, Store};
use outpost_core::{RequestInfo, Status, Verb};
use tracing::info;

use crate::body::ProxyBody;
use crate::edge::offline::blocking;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::objects;

/// A Node with its images and conditions is tens of KB.
const MAX_BODY: usize = 1 << 20;

pub struct Registration {
    node: String,
    store: Arc<dyn Store>,
    metrics: Metrics,
}

impl Registration {
    pub fn new(node: &str, store: Arc<dyn Store>, metrics: Metrics) -> Registration {
        Registration {
            node: node.to_owned(),
            store,
            metrics,
        }
    }

    /// kubelet's `POST /api/v1/nodes`.
    pub fn handles(info: &RequestInfo) -> bool {
        super::is_kubelets(info, &[Verb::Create], "nodes", "")
    }

    /// Answers the registration from the cache: 409 AlreadyExists for this node when cached.
    pub async fn answer(
        &self,
        headers: &HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let node = objects::read_request(headers, body, MAX_BODY).await?.object;
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        if node["kind"].as_str().is_some_and(|k| k != "Node") || name != self.node {
            return Err(ProxyError::Offline(format!(
                "only node {:?} registering itself is answered offline",
                self.node
            )));
        }
        let key = ObjectKey::new("kubelet", &Gvr::new("", "v1", "nodes"), "", name);
        if !matches!(
            blocking(&self.store, move |s| s.get(&key)).await?,
            Lookup::Found(_)
        ) {
            self.count("unknown_node");
            return Err(ProxyError::Offline(format!(
                "node {name} is not in the edge cache, so whether it is registered is unknown"
            )));
        }
        self.count("already_exists");
        info!(
            node = name,
            "kubelet's registration answered from the edge cache: the node exists"
        );
        let status = Status::already_exists("", "nodes", name);
        let encoding = objects::encoding_for(headers);
        Ok(objects::answer(
            StatusCode::CONFLICT,
            &status.to_value(),
            encoding,
            "edge-cache",
        ))
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .autonomy
            .with_label_values(&["registration", outcome])
            .inc();
    }
}
