//! kubelet's node-status PATCH while the cloud is unreachable (edge mode): accepted locally, and
//! replayed to the cloud when it returns.
//!
//! kubelet computes each status patch against the node it last read, which offline is the
//! cached node. So a patch accepted and then forgotten would be lost for good: the hub applies
//! it to the cached node (kubelet's next GET sees its own status, and its next patch is a small
//! diff), and remembers the node as pending. When a server turns healthy again the hub re-reads
//! the cloud's node and sends the conditions whose `lastHeartbeatTime` is newer locally, merged
//! into the cloud's own list — so newer cloud data is never overwritten, and the body means the
//! same under a strategic merge patch (merge by `type`) and a JSON merge patch (list replaced).
//!
//! The local apply is the subset of strategic merge patch that kubelet's status patches use:
//! maps merge, `null` deletes, `conditions` and `addresses` merge by `type`, other lists are
//! replaced, and `$`-directives (`$setElementOrder/...`, `$patch`, `$retainKeys`) are dropped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use outpost_cache::{Gvr, Lookup, ObjectKey, Store};
use outpost_core::{RequestInfo, Verb};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use super::KubeletCalls;
use super::condition;
use super::replay::ReplayError;
use crate::body::{BoxError, ProxyBody};
use crate::edge::offline::{blocking, json_response};
use crate::error::ProxyError;
use crate::objects;
use crate::upstream::{OwnCall, OwnCallError, Server, Upstream};

const MAX_BODY: usize = 1 << 20;
const USER_AGENT: &str = "outpost/node-status";
/// Lists in a node's status whose items strategic merge patch merges by `type`.
const MERGED_BY_TYPE: &[&str] = &["conditions", "addresses"];

/// Offline node status for one node.
pub struct NodeStatus {
    node: String,
    store: Arc<dyn Store>,
    /// The locally patched node not yet sent to the cloud.
    pending: Mutex<Option<Value>>,
    /// kubelet's calls (its lease requests and these status patches): the evidence, read again
    /// right before a replay, that kubelet is still there to stand behind what is replayed.
    calls: Arc<KubeletCalls>,
    /// `--kubelet-health-grace-period`: how long ago kubelet's last call may be.
    grace: Duration,
}

impl NodeStatus {
    pub fn new(
        node: &str,
        store: Arc<dyn Store>,
        calls: Arc<KubeletCalls>,
        grace: Duration,
    ) -> NodeStatus {
        NodeStatus {
            node: node.to_owned(),
            store,
            pending: Mutex::new(None),
            calls,
            grace,
        }
    }

    /// kubelet's PATCH of its own node's status.
    pub fn handles(&self, info: &RequestInfo) -> bool {
        info.verb == Verb::Patch
            && info.api_group.is_empty()
            && info.resource == "nodes"
            && info.subresource == "status"
            && info.name == self.node
            && info.component.as_deref() == Some("kubelet")
    }

    fn key(&self) -> ObjectKey {
        ObjectKey::new("kubelet", &Gvr::new("", "v1", "nodes"), "", &self.node)
    }

    /// Applies the patch to the cached node, keeps it for the replay, answers like the apiserver.
    pub async fn accept<B>(&self, body: B) -> Result<Response<ProxyBody>, ProxyError>
    where
        B: http_body::Body<Data = Bytes> + Send,
        B::Error: Into<BoxError>,
    {
        self.calls.record(Instant::now());
        let bytes = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| ProxyError::InvalidRequest(format!("status patch body: {e}")))?
            .to_bytes();
        let patch: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ProxyError::InvalidRequest(format!("status patch is not JSON: {e}")))?;
        let key = self.key();
        let Lookup::Found(cached) = blocking(&self.store, move |s| s.get(&key)).await? else {
            return Err(ProxyError::Offline(format!(
                "node {} is not cached, so its status cannot be kept until the cloud is back",
                self.node
            )));
        };
        let mut node: Value = serde_json::from_slice(&cached.bytes)
            .map_err(|e| ProxyError::Cache(format!("cached node: {e}")))?;
        strategic_merge(&mut node, &patch);
        let stored = node.to_string();
        let to_store = stored.clone();
        blocking(&self.store, move |s| {
            s.put_object("kubelet", &Gvr::new("", "v1", "nodes"), to_store.as_bytes())
        })
        .await?;
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(node);
        Ok(json_response(stored, "application/json"))
    }

    /// Replays pending status each time the cloud comes back, until `shutdown`.
    pub async fn replay_on_reconnect(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        online: watch::Receiver<bool>,
        shutdown: watch::Receiver<bool>,
    ) {
        super::replay::on_each_return(online, shutdown, || self.replay_pending(&upstream)).await
    }

    /// Sends the pending status, if kubelet is still there to stand behind it.
    async fn replay_pending(&self, upstream: &Upstream) {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(local) = pending else {
            return;
        };
        // Read right before sending (lesson 001): a kubelet that died during the outage
        // must not be reported as it last was (Ready) by the hub in its name.
        let silent_for = self.calls.last().map(|at| at.elapsed());
        if silent_for.is_none_or(|quiet| quiet > self.grace) {
            warn!(
                silent_s = silent_for.map(|d| d.as_secs()),
                "kubelet has not called in within the grace period; its offline node status is not sent to the cloud"
            );
            self.drop_pending(&local);
            return;
        }
        match self.replay(upstream, &local).await {
            Ok(sent) => {
                info!(conditions = sent, "offline node status sent to the cloud");
                self.drop_pending(&local);
            }
            Err(e) => {
                warn!(error = %e, "offline node status not sent; kubelet's next update will carry it")
            }
        }
    }

    /// Forgets `sent` unless kubelet patched again meanwhile.
    fn drop_pending(&self, sent: &Value) {
        let mut guard = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref() == Some(sent) {
            *guard = None;
        }
    }

    /// Keeps the cloud node's `Autonomy` condition right, once per `interval` while online.
    pub async fn maintain_autonomy(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        interval: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut cache_failures = 0u32;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
            cache_failures = if self.store.health().degraded {
                cache_failures.saturating_add(1)
            } else {
                0
            };
            if !upstream.states().is_online() {
                continue;
            }
            if let Err(e) = self.sync_autonomy(&upstream, cache_failures).await {
                warn!(error = %e, "cannot update the Autonomy node condition");
            }
        }
    }

    async fn sync_autonomy(
        &self,
        upstream: &Upstream,
        cache_failures: u32,
    ) -> Result<(), ReplayError> {
        let (server, node) = self.cloud_node(upstream).await?;
        let Some(conditions) = condition::updated_conditions(&node, cache_failures) else {
            return Ok(());
        };
        self.patch_conditions(upstream, server, conditions).await?;
        info!(node = %self.node, "Autonomy node condition updated");
        Ok(())
    }

    /// Re-reads the cloud's node and sends the locally newer conditions; returns how many.
    async fn replay(&self, upstream: &Upstream, local: &Value) -> Result<usize, ReplayError> {
        let (server, cloud) = self.cloud_node(upstream).await?;
        let (merged, newer) = newer_conditions(&cloud, local);
        if newer > 0 {
            self.patch_conditions(upstream, server, merged).await?;
        }
        Ok(newer)
    }

    /// The cloud's node, read through a healthy server (which the patch then uses too).
    async fn cloud_node<'u>(
        &self,
        upstream: &'u Upstream,
    ) -> Result<(&'u Server, Value), ReplayError> {
        let server = upstream.pick().ok_or(OwnCallError::Offline)?;
        let path = format!("/api/v1/nodes/{}", self.node);
        let (status, body) = upstream
            .own_call(server, own_call(Method::GET, &path, None))
            .await?;
        if status != StatusCode::OK {
            return Err(ReplayError::answered("node read", status));
        }
        let node = serde_json::from_slice(&body)?;
        Ok((server, node))
    }

    /// Sends the node's whole condition list: a strategic merge patch merges it by `type`, a
    /// JSON merge patch replaces the list; both end with exactly these conditions.
    async fn patch_conditions(
        &self,
        upstream: &Upstream,
        server: &Server,
        conditions: Vec<Value>,
    ) -> Result<(), ReplayError> {
        let path = format!("/api/v1/nodes/{}/status", self.node);
        let patch = json!({ "status": { "conditions": conditions } });
        let call = own_call(Method::PATCH, &path, Some(patch));
        let (status, _) = upstream.own_call(server, call).await?;
        if status != StatusCode::OK {
            return Err(ReplayError::answered("status patch", status));
        }
        Ok(())
    }
}

fn own_call(method: Method, path: &str, patch: Option<Value>) -> OwnCall<'_> {
    OwnCall {
        method,
        path,
        user_agent: USER_AGENT,
        body: patch.map(|p| ("application/strategic-merge-patch+json", p)),
        timeout: Duration::from_secs(10),
    }
}

/// The cloud's conditions with each one replaced by the local one of the same `type` when that
/// has a newer `lastHeartbeatTime` (RFC 3339 in UTC compares as text); local-only types added.
fn newer_conditions(cloud: &Value, local: &Value) -> (Vec<Value>, usize) {
    let mut merged: Vec<Value> = cloud["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut newer = 0;
    for cond in local["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let beat = |c: &Value| c["lastHeartbeatTime"].as_str().unwrap_or("").to_owned();
        match merged.iter_mut().find(|c| c["type"] == cond["type"]) {
            Some(existing) if beat(cond) > beat(existing) => {
                *existing = cond.clone();
                newer += 1;
            }
            Some(_) => {}
            None => {
                merged.push(cond.clone());
                newer += 1;
            }
        }
    }
    (merged, newer)
}

/// The strategic-merge-patch subset described in the module doc.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    objects::strategic_merge(target, patch, node_merge_key);
}

/// A node status list's `patchMergeKey`.
fn node_merge_key(list: &str) -> Option<&'static str> {
    MERGED_BY_TYPE.contains(&list).then_some("type")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Value {
        json!({"kind":"Node","metadata":{"name":"edge-1","resourceVersion":"5"},
            "status":{"conditions":[
                {"type":"Ready","status":"True","lastHeartbeatTime":"2026-11-23T10:00:00Z"},
                {"type":"MemoryPressure","status":"False","lastHeartbeatTime":"2026-11-23T10:00:00Z"}],
              "addresses":[{"type":"InternalIP","address":"10.0.0.1"}],
              "images":[{"names":["a"]}]}})
    }

    #[test]
    fn kubelets_status_patch_merges_conditions_by_type() {
        let mut n = node();
        let patch = json!({"status":{
            "$setElementOrder/conditions":[{"type":"MemoryPressure"},{"type":"Ready"}],
            "conditions":[{"type":"Ready","status":"False","lastHeartbeatTime":"2026-11-23T10:01:00Z"}],
            "images":[{"names":["b"]}]}});
        strategic_merge(&mut n, &patch);
        let conds = n["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 2, "merged by type, nothing lost");
        assert_eq!(conds[0]["status"], "False");
        assert_eq!(conds[0]["lastHeartbeatTime"], "2026-11-23T10:01:00Z");
        assert_eq!(conds[1]["type"], "MemoryPressure");
        assert_eq!(
            n["status"]["images"],
            json!([{"names":["b"]}]),
            "other lists are replaced"
        );
        assert_eq!(n["status"]["addresses"][0]["address"], "10.0.0.1");
        assert!(n["status"].get("$setElementOrder/conditions").is_none());
        strategic_merge(&mut n, &json!({"status":{"addresses":null}}));
        assert!(n["status"].get("addresses").is_none());
    }

    #[test]
    fn only_newer_local_conditions_are_sent() {
        let cloud = node();
        let mut local = node();
        strategic_merge(
            &mut local,
            &json!({"status":{"conditions":[
                {"type":"Ready","status":"False","lastHeartbeatTime":"2026-11-23T10:05:00Z"},
                {"type":"MemoryPressure","status":"True","lastHeartbeatTime":"2026-11-23T09:00:00Z"},
                {"type":"PIDPressure","status":"False","lastHeartbeatTime":"2026-11-23T10:05:00Z"}]}}),
        );
        let (merged, newer) = newer_conditions(&cloud, &local);
        assert_eq!(
            newer, 2,
            "Ready is newer, PIDPressure is new, MemoryPressure is older"
        );
        let by_type = |t: &str| merged.iter().find(|c| c["type"] == t).unwrap().clone();
        assert_eq!(by_type("Ready")["status"], "False");
        assert_eq!(
            by_type("MemoryPressure")["status"],
            "False",
            "newer cloud data kept"
        );
        assert_eq!(by_type("PIDPressure")["status"], "False");
    }
}
