//! yurthub's OTA endpoints on the admin port, for DaemonSets whose update strategy is `OTA`:
//! the node's owner, not the cluster, decides when a pod of the node takes its new version.
//!
//! yurt-manager's daemonpodupdater marks such a pod with the condition `PodNeedUpgrade=True`
//! (its message names the new revision); `GET /pods` shows it. Then, on the node:
//! - `POST /openyurt.io/v1/namespaces/{ns}/pods/{name}/imagepull` asks for the new image to be
//!   pulled ahead: the pod's status gets `PodImageReady=False` (reason `WaitPullImage`, the
//!   revision as message), which yurt-manager's image pre-pull controller acts on;
//! - `POST …/upgrade` deletes the pod, so that the DaemonSet (`OnDelete`) recreates it from
//!   the new template.
//!
//! Both act as the node (the node authorizer lets it delete and patch only its own pods) and need
//! the cloud: offline they answer 503 and change nothing. Start at [`Ota::handle`].

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tracing::info;

use outpost_proxy::upstream::{OwnCall, OwnCallError, Upstream};

const USER_AGENT: &str = "outpost/ota";
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The condition yurt-manager sets on a pod that has a newer version to take.
const POD_NEED_UPGRADE: &str = "PodNeedUpgrade";
const POD_IMAGE_READY: &str = "PodImageReady";
const WAIT_PULL_IMAGE: &str = "WaitPullImage";

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Upgrade,
    ImagePull,
}

/// An OTA request, from its admin path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtaRequest {
    pub namespace: String,
    pub pod: String,
    pub action: Action,
}

impl OtaRequest {
    /// `/openyurt.io/v1/namespaces/{ns}/pods/{name}/{upgrade|imagepull}`, or `None`.
    pub fn from_path(path: &str) -> Option<OtaRequest> {
        let rest = path.strip_prefix("/openyurt.io/v1/namespaces/")?;
        let mut parts = rest.split('/');
        let (namespace, pods, pod, action) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let action = match action {
            "upgrade" => Action::Upgrade,
            "imagepull" => Action::ImagePull,
            _ => return None,
        };
        let named = |s: &str| !s.is_empty();
        (pods == "pods" && named(namespace) && named(pod) && parts.next().is_none()).then(|| {
            OtaRequest {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
                action,
            }
        })
    }

    fn pod_path(&self) -> String {
        format!("/api/v1/namespaces/{}/pods/{}", self.namespace, self.pod)
    }

    fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }
}

/// An answer: the status code and a one-line text, as yurthub writes them.
pub type Answer = (StatusCode, String);

pub struct Ota {
    pub upstream: Arc<Upstream>,
    pub node_name: String,
}

impl Ota {
    pub async fn handle(&self, method: &Method, request: &OtaRequest) -> Answer {
        if method != Method::POST {
            return (StatusCode::METHOD_NOT_ALLOWED, "method not allowed".into());
        }
        match self.apply(request).await {
            Ok(done) => {
                info!(pod = %request.label(), action = ?request.action, "OTA request applied");
                (StatusCode::OK, done)
            }
            Err(answer) => answer,
        }
    }

    async fn apply(&self, request: &OtaRequest) -> Result<String, Answer> {
        let pod = self.updatable_pod(request).await?;
        let owner = pod
            .pointer("/metadata/ownerReferences/0/kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match (owner, request.action) {
            ("DaemonSet", Action::Upgrade) => self.delete(request).await,
            ("DaemonSet", Action::ImagePull) => self.request_image_pull(request, &pod).await,
            ("Node", _) => Err((
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "pod {} is a static pod: outpost does not upgrade YurtStaticSets over the air",
                    request.label()
                ),
            )),
            (other, _) => Err((
                StatusCode::BAD_REQUEST,
                format!("Not support ota upgrade pod type {other:?}"),
            )),
        }
    }

    /// yurthub's pre-check: the pod exists, is not being deleted, runs on this node, and
    /// yurt-manager has marked it `PodNeedUpgrade=True`. Any other answer is 403.
    async fn updatable_pod(&self, request: &OtaRequest) -> Result<Value, Answer> {
        let (code, body) = self.call(Method::GET, &request.pod_path(), None).await?;
        let not_updatable = |why: String| {
            Err((
                StatusCode::FORBIDDEN,
                format!("Pod is not-updatable: {why}"),
            ))
        };
        if code != StatusCode::OK {
            return not_updatable(format!("reading pod {} answered {code}", request.label()));
        }
        let pod: Value = serde_json::from_slice(&body).map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                format!("unreadable pod {}: {e}", request.label()),
            )
        })?;
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return not_updatable("it is being deleted".into());
        }
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if node != self.node_name {
            return not_updatable(format!("it runs on {node:?}, not on this node"));
        }
        if condition(&pod, POD_NEED_UPGRADE).is_none_or(|c| c["status"] != "True") {
            return not_updatable(format!("it has no {POD_NEED_UPGRADE}=True condition"));
        }
        Ok(pod)
    }

    async fn delete(&self, request: &OtaRequest) -> Result<String, Answer> {
        let (code, body) = self.call(Method::DELETE, &request.pod_path(), None).await?;
        if !code.is_success() {
            return Err(refused("deleting", request, code, &body));
        }
        Ok(format!("Start updating pod {}", request.label()))
    }

    async fn request_image_pull(
        &self,
        request: &OtaRequest,
        pod: &Value,
    ) -> Result<String, Answer> {
        let revision = condition(pod, POD_NEED_UPGRADE)
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default();
        let patch = json!({"status": {"conditions": [{
            "type": POD_IMAGE_READY,
            "status": "False",
            "reason": WAIT_PULL_IMAGE,
            "message": revision,
            "lastTransitionTime": outpost_proxy::rfc3339_now(),
        }]}});
        let path = format!("{}/status", request.pod_path());
        let (code, body) = self.call(Method::PATCH, &path, Some(patch)).await?;
        if !code.is_success() {
            return Err(refused("patching the status of", request, code, &body));
        }
        Ok(format!(
            "Start pulling the image of pod {}",
            request.label()
        ))
    }

    /// One call as the node; offline (no healthy server) is yurthub's refusal.
    async fn call(
        &self,
        method: Method,
        path: &str,
        patch: Option<Value>,
    ) -> Result<(StatusCode, bytes::Bytes), Answer> {
        let call = OwnCall {
            method,
            path,
            user_agent: USER_AGENT,
            body: patch.map(|p| ("application/strategic-merge-patch+json", p)),
            timeout: CALL_TIMEOUT,
        };
        self.upstream.own_call_any(call).await.map_err(|e| match e {
            OwnCallError::Offline => (
                StatusCode::SERVICE_UNAVAILABLE,
                "OTA update is not allowed when edge is disconnected to cloud".to_owned(),
            ),
            e => (StatusCode::BAD_GATEWAY, format!("{path}: {e}")),
        })
    }
}

fn condition<'a>(pod: &'a Value, kind: &str) -> Option<&'a Value> {
    pod.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn refused(doing: &str, request: &OtaRequest, code: StatusCode, body: &[u8]) -> Answer {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|s| s["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "Apply update failed: {doing} pod {} answered {code}: {message}",
            request.label()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ota_paths_name_the_pod_and_the_action() {
        let upgrade =
            OtaRequest::from_path("/openyurt.io/v1/namespaces/kube-system/pods/ds-1/upgrade");
        assert_eq!(
            upgrade,
            Some(OtaRequest {
                namespace: "kube-system".into(),
                pod: "ds-1".into(),
                action: Action::Upgrade
            })
        );
        let pull = OtaRequest::from_path("/openyurt.io/v1/namespaces/ns/pods/p/imagepull");
        assert_eq!(pull.map(|r| r.action), Some(Action::ImagePull));
        for other in [
            "/openyurt.io/v1/namespaces/ns/pods/p/restart",
            "/openyurt.io/v1/namespaces/ns/pods//upgrade",
            "/openyurt.io/v1/namespaces/ns/services/p/upgrade",
            "/openyurt.io/v1/namespaces/ns/pods/p/upgrade/more",
            "/pods",
        ] {
            assert_eq!(OtaRequest::from_path(other), None, "{other}");
        }
    }
}
