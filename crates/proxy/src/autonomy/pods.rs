//! kubelet's pod-status PATCHes while the cloud is away: accepted, read back, and sent to the
//! cloud when it returns.
//!
//! After an offline reboot kubelet restarts the node's pods and reports each one's status (new
//! IPs, readiness, container states) with `PATCH …/pods/<p>/status` — a strategic merge patch
//! carrying `metadata.uid` as a precondition. Refused, kubelet retries every 10 s and nothing
//! on the node learns where its pods now are. Here:
//!
//! - the patch is checked against the cached pod (another uid: 409 Conflict, as the apiserver
//!   answers a pod re-created under the same name), applied to the status the node last
//!   reported (or the cached one), and kept: in memory ([`Overlay`]) and in the edge cache, so
//!   that a hub restarted offline still has it;
//! - offline readers see it ([`crate::edge::overlay`]): kubelet's own GET/LIST/WATCH, and
//!   kube-proxy's and coredns' EndpointSlices and Endpoints, which carry the pods' new IPs;
//! - when the cloud is back, the latest report of each pod is sent, after re-reading the pod: a
//!   pod deleted meanwhile, or re-created (another uid), gets nothing. The patch replaces the
//!   cloud's lists with the node's (`$setElementOrder`, `$patch: delete`), so the cloud ends
//!   with exactly the reported status, as kubelet's own patches would leave it.
//!
//! The node's reports are never stored as cloud truth: the cached objects are unchanged, and
//! once the cloud is back its answers win.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, Response, StatusCode, header};
use outpost_cache::{Gvr, Lookup, ObjectKey, Store};
use outpost_core::{Reason, RequestInfo, Status, Verb};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use super::replay::ReplayError;
use crate::body::ProxyBody;
use crate::edge::offline::blocking;
use crate::edge::overlay::{LocalPod, Overlay};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::objects;
use crate::upstream::{OwnCall, OwnCallError, Upstream};

/// A status patch with every container's state is a few KB.
const MAX_BODY: usize = 1 << 20;
/// Where the reports are kept in the edge cache: `<prefix><namespace>/<name>`.
const PREFIX: &str = "local/pod-status/";
const USER_AGENT: &str = "outpost/pod-status";

/// Lists of a pod's status and the field their items merge by (`patchMergeKey`).
fn pod_merge_key(list: &str) -> Option<&'static str> {
    match list {
        "conditions" => Some("type"),
        "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "resourceClaimStatuses" => Some("name"),
        "podIPs" | "hostIPs" => Some("ip"),
        _ => None,
    }
}

/// The pod statuses kubelet reported while offline.
pub struct PodStatuses {
    store: Arc<dyn Store>,
    overlay: Arc<Overlay>,
    metrics: Metrics,
}

impl PodStatuses {
    pub fn new(store: Arc<dyn Store>, overlay: Arc<Overlay>, metrics: Metrics) -> PodStatuses {
        PodStatuses {
            store,
            overlay,
            metrics,
        }
    }

    /// kubelet's `PATCH …/pods/<p>/status`.
    pub fn handles(info: &RequestInfo) -> bool {
        super::is_kubelets(info, &[Verb::Patch], "pods", "status") && !info.name.is_empty()
    }

    /// Takes up the reports kept before a restart.
    pub async fn restore(&self) {
        for (name, bytes) in super::kept(&self.store, PREFIX, "pod statuses").await {
            let Some((namespace, pod)) = name[PREFIX.len()..].split_once('/') else {
                continue;
            };
            let Ok(report) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            let local = LocalPod {
                uid: report["uid"].as_str().unwrap_or_default().to_owned(),
                status: report["status"].clone(),
            };
            self.overlay.set(namespace, pod, local);
        }
    }

    /// Applies kubelet's patch to the pod's status as the node knows it, keeps it, and answers
    /// with the pod as the apiserver would.
    pub async fn accept(
        &self,
        info: &RequestInfo,
        headers: &HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let patch = read_patch(headers, body).await?;
        let (namespace, name) = (info.namespace.clone(), info.name.clone());
        let cached = self.cached_pod(&namespace, &name).await?;
        let uid = cached["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Some(wanted) = patch["metadata"]["uid"].as_str().filter(|u| *u != uid) {
            self.count("uid_mismatch");
            return Err(ProxyError::Local(Status::new(
                Reason::Conflict,
                format!(
                    "Operation cannot be fulfilled on pods \"{name}\": Precondition failed: UID in precondition: {wanted}, UID in object meta: {uid}"
                ),
            )
            .with_details("", "pods", &name)));
        }
        let mut status = match self.overlay.get(&namespace, &name) {
            Some(reported) if reported.uid == uid => reported.status,
            _ => cached["status"].clone(),
        };
        objects::strategic_merge(&mut status, &patch["status"], pod_merge_key);
        let report = LocalPod {
            uid: uid.clone(),
            status: status.clone(),
        };
        self.keep(&namespace, &name, &report).await;
        self.overlay.set(&namespace, &name, report);
        self.count("accepted");
        let mut pod = cached;
        pod["status"] = status;
        Ok(objects::answer(
            StatusCode::OK,
            &pod,
            objects::encoding_for(headers),
            "edge-cache",
        ))
    }

    /// The pod as kubelet cached it; a pod the cache does not hold waits for the cloud.
    async fn cached_pod(&self, namespace: &str, name: &str) -> Result<Value, ProxyError> {
        let key = ObjectKey::new("kubelet", &Gvr::new("", "v1", "pods"), namespace, name);
        match blocking(&self.store, move |s| s.get(&key)).await? {
            Lookup::Found(object) => serde_json::from_slice(&object.bytes)
                .map_err(|e| ProxyError::Cache(format!("the cached pod: {e}"))),
            _ => Err(ProxyError::Offline(format!(
                "pod {namespace}/{name} is not in the edge cache, so its status cannot be kept until the cloud is back"
            ))),
        }
    }

    async fn keep(&self, namespace: &str, name: &str, report: &LocalPod) {
        let document = format!("{PREFIX}{namespace}/{name}");
        let bytes = json!({"uid": report.uid, "status": report.status}).to_string();
        let kept = blocking(&self.store, move |s| {
            s.put_document(&document, bytes.as_bytes())
        })
        .await;
        if let Err(e) = kept {
            warn!(error = %e, pod = %format!("{namespace}/{name}"), "a pod status reported offline is kept in memory only");
        }
    }

    async fn forget(&self, namespace: &str, name: &str, report: &LocalPod) {
        self.overlay.remove(namespace, name, report);
        if self.overlay.get(namespace, name).is_some() {
            return; // a newer report came meanwhile
        }
        let document = format!("{PREFIX}{namespace}/{name}");
        let _ = blocking(&self.store, move |s| s.delete_document(&document)).await;
    }

    /// Sends the reports each time the cloud comes back, until `shutdown`.
    pub async fn replay_on_reconnect(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        online: watch::Receiver<bool>,
        shutdown: watch::Receiver<bool>,
    ) {
        super::replay::on_each_return(online, shutdown, || self.replay(&upstream)).await
    }

    /// Sends every report; what could not be sent stays for the next return of the cloud.
    async fn replay(&self, upstream: &Upstream) {
        for ((namespace, name), report) in self.overlay.pods() {
            let outcome = match self.replay_one(upstream, &namespace, &name, &report).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    warn!(pod = %format!("{namespace}/{name}"), error = %e, "pod status reported offline not sent yet");
                    self.count("replay_failed");
                    continue;
                }
            };
            info!(pod = %format!("{namespace}/{name}"), outcome, "pod status reported offline, on the cloud's return");
            self.count(outcome);
            self.forget(&namespace, &name, &report).await;
        }
    }

    async fn replay_one(
        &self,
        upstream: &Upstream,
        namespace: &str,
        name: &str,
        report: &LocalPod,
    ) -> Result<&'static str, ReplayError> {
        let server = upstream.pick().ok_or(OwnCallError::Offline)?;
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        let (code, body) = upstream
            .own_call(server, call(Method::GET, &path, None))
            .await?;
        if code == StatusCode::NOT_FOUND {
            return Ok("dropped_deleted");
        }
        if code != StatusCode::OK {
            return Err(ReplayError::answered("pod read", code));
        }
        let cloud: Value = serde_json::from_slice(&body)?;
        if cloud["metadata"]["uid"].as_str() != Some(report.uid.as_str()) {
            return Ok("dropped_recreated");
        }
        let patch = json!({
            "metadata": {"uid": report.uid},
            "status": replacing(&cloud["status"], &report.status),
        });
        let status_path = format!("{path}/status");
        let (code, _) = upstream
            .own_call(server, call(Method::PATCH, &status_path, Some(patch)))
            .await?;
        match code {
            StatusCode::OK => Ok("replayed"),
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => Ok("dropped_recreated"),
            other => Err(ReplayError::answered("status patch", other)),
        }
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .autonomy
            .with_label_values(&["pod_status", outcome])
            .inc();
    }
}

fn call(method: Method, path: &str, patch: Option<Value>) -> OwnCall<'_> {
    OwnCall {
        method,
        path,
        user_agent: USER_AGENT,
        body: patch.map(|p| ("application/strategic-merge-patch+json", p)),
        timeout: Duration::from_secs(10),
    }
}

/// kubelet's patch body: strategic merge (or JSON merge) patch JSON.
async fn read_patch(headers: &HeaderMap, body: ProxyBody) -> Result<Value, ProxyError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !matches!(
        media,
        "application/strategic-merge-patch+json" | "application/merge-patch+json"
    ) {
        return Err(ProxyError::Local(Status::new(
            Reason::UnsupportedMediaType,
            format!("the status patch's content type {content_type:?} is not kept offline"),
        )));
    }
    let bytes = objects::read_bytes(body, MAX_BODY).await?;
    let patch: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ProxyError::Local(Status::bad_request(format!(
            "the status patch is not JSON: {e}"
        )))
    })?;
    if !patch.is_object() {
        return Err(ProxyError::Local(Status::bad_request(
            "the status patch is not a JSON object",
        )));
    }
    Ok(patch)
}

/// A strategic merge patch that turns the cloud's status `cloud` into exactly `local`: every
/// field of `local`, `null` for what only the cloud has, and for each list that merges by key,
/// the node's items in its order with the cloud's others deleted.
fn replacing(cloud: &Value, local: &Value) -> Value {
    let mut patch = Map::new();
    if let Some(cloud) = cloud.as_object() {
        for key in cloud.keys().filter(|k| local.get(k.as_str()).is_none()) {
            patch.insert(key.clone(), Value::Null);
        }
    }
    for (key, value) in local.as_object().into_iter().flatten() {
        let (Some(by), Some(items)) = (pod_merge_key(key), value.as_array()) else {
            patch.insert(key.clone(), value.clone());
            continue;
        };
        let mut listed = items.clone();
        for gone in cloud[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| !items.iter().any(|i| i[by] == c[by]))
        {
            listed.push(json!({ by: gone[by], "$patch": "delete" }));
        }
        let order: Vec<Value> = items.iter().map(|i| json!({ by: i[by] })).collect();
        patch.insert(format!("$setElementOrder/{key}"), Value::Array(order));
        patch.insert(key.clone(), Value::Array(listed));
    }
    Value::Object(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelets_status_patch_merges_as_the_apiserver_merges_it() {
        let mut status = json!({"phase": "Pending", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "c", "ready": false, "state": {"waiting": {"reason": "ContainerCreating"}}}]});
        let patch = json!({"$setElementOrder/conditions": [{"type": "PodScheduled"}, {"type": "Ready"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "ready": true, "state": {"running": {"startedAt": "2026-11-26T10:00:00Z"}, "waiting": null}}],
            "phase": "Running", "podIP": "10.0.0.77", "podIPs": [{"ip": "10.0.0.77"}, {"ip": "10.0.0.5", "$patch": "delete"}]});
        objects::strategic_merge(&mut status, &patch, pod_merge_key);
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(status["conditions"][1]["status"], "True");
        assert_eq!(status["podIPs"], json!([{"ip": "10.0.0.77"}]));
        assert_eq!(
            status["containerStatuses"][0]["state"],
            json!({"running": {"startedAt": "2026-11-26T10:00:00Z"}})
        );
    }

    #[test]
    fn the_replay_leaves_the_cloud_with_exactly_the_reported_status() {
        let cloud = json!({"phase": "Running", "podIP": "10.0.0.5", "message": "old",
            "podIPs": [{"ip": "10.0.0.5"}],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]});
        let local = json!({"phase": "Running", "podIP": "10.0.0.77", "podIPs": [{"ip": "10.0.0.77"}],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]});
        let patch = replacing(&cloud, &local);
        let mut merged = cloud.clone();
        objects::strategic_merge(&mut merged, &patch, pod_merge_key);
        assert_eq!(merged, local);
        assert_eq!(
            patch["message"],
            Value::Null,
            "what only the cloud had goes"
        );
        assert_eq!(
            patch["$setElementOrder/podIPs"],
            json!([{"ip": "10.0.0.77"}])
        );
    }
}
