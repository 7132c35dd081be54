//! The node-lease heartbeat: renews `kube-node-lease/<node>` in the cloud with the hub's (the
//! node's) identity, as kubelet would: `holderIdentity` = node name, `leaseDurationSeconds` = the
//! kubelet grace period, `renewTime` = now, an ownerReference to the Node. A missing lease is
//! created; a conflict re-reads the lease with backoff (200, 400, 800 ms) and tries again, up to
//! `--heartbeat-failed-retry` tries. yurthub's `openyurt.io/delegate-heartbeat` annotation is
//! dropped, as yurthub does.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use outpost_proxy::upstream::{OwnCall, OwnCallError, Server, Upstream};

const USER_AGENT: &str = "outpost/heartbeat";
const DELEGATE_ANNOTATION: &str = "openyurt.io/delegate-heartbeat";

/// Renews one node's lease; remembers the last lease the cloud returned.
pub struct LeaseRenewer {
    node: String,
    duration_seconds: u64,
    last: Mutex<Option<Value>>,
}

impl LeaseRenewer {
    pub fn new(node: &str, grace: Duration) -> LeaseRenewer {
        LeaseRenewer {
            node: node.to_owned(),
            duration_seconds: grace.as_secs().max(1),
            last: Mutex::new(None),
        }
    }

    fn lease_path(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{}",
            self.node
        )
    }

    /// One heartbeat through `server`: `Ok` with the renewed lease, or why it failed.
    pub async fn renew(
        &self,
        upstream: &Upstream,
        server: &Server,
        tries: u32,
        timeout: Duration,
    ) -> Result<Value, LeaseError> {
        let call = Call {
            upstream,
            server,
            timeout,
        };
        let mut last_error = LeaseError::NoAttempt;
        for attempt in 0..tries.max(1) {
            let base = match self.last() {
                Some(base) => base,
                None => match self.fetch_or_create(&call).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        last_error = e;
                        continue;
                    }
                },
            };
            let (status, body) = call
                .send(Method::PUT, &self.lease_path(), Some(self.renewed(base)))
                .await?;
            match status {
                StatusCode::OK => {
                    let lease: Value = parse(&body)?;
                    self.remember(Some(lease.clone()));
                    return Ok(lease);
                }
                StatusCode::CONFLICT | StatusCode::NOT_FOUND => {
                    self.remember(None);
                    tokio::time::sleep(Duration::from_millis(200 << attempt.min(2))).await;
                    last_error = LeaseError::Answered("lease update", status);
                }
                other => return Err(LeaseError::Answered("lease update", other)),
            }
        }
        Err(last_error)
    }

    async fn fetch_or_create(&self, call: &Call<'_>) -> Result<Value, LeaseError> {
        let (status, body) = call.send(Method::GET, &self.lease_path(), None).await?;
        match status {
            StatusCode::OK => parse(&body),
            StatusCode::NOT_FOUND => self.create(call).await,
            other => Err(LeaseError::Answered("lease read", other)),
        }
    }

    async fn create(&self, call: &Call<'_>) -> Result<Value, LeaseError> {
        let node_path = format!("/api/v1/nodes/{}", self.node);
        let (status, node) = call.send(Method::GET, &node_path, None).await?;
        if status != StatusCode::OK {
            return Err(LeaseError::Answered("node read", status));
        }
        let uid = parse(&node)?["metadata"]["uid"].clone();
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node,
                "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}],
            },
            "spec": {},
        });
        let path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        let (status, body) = call
            .send(Method::POST, path, Some(self.renewed(lease)))
            .await?;
        match status {
            StatusCode::CREATED | StatusCode::OK => parse(&body),
            other => Err(LeaseError::Answered("lease create", other)),
        }
    }

    /// `base` with this heartbeat's fields.
    fn renewed(&self, mut lease: Value) -> Value {
        lease["spec"]["holderIdentity"] = json!(self.node);
        lease["spec"]["leaseDurationSeconds"] = json!(self.duration_seconds);
        lease["spec"]["renewTime"] = json!(micro_time(SystemTime::now()));
        if let Some(annotations) = lease["metadata"]["annotations"].as_object_mut() {
            annotations.shift_remove(DELEGATE_ANNOTATION);
        }
        lease
    }

    fn last(&self) -> Option<Value> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn remember(&self, lease: Option<Value>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = lease;
    }
}

/// One server, one identity, one timeout.
struct Call<'a> {
    upstream: &'a Upstream,
    server: &'a Server,
    timeout: Duration,
}

impl Call<'_> {
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Bytes), LeaseError> {
        let call = OwnCall {
            method,
            path,
            user_agent: USER_AGENT,
            body: body.map(|v| ("application/json", v)),
            timeout: self.timeout,
        };
        Ok(self.upstream.own_call(self.server, call).await?)
    }
}

/// Why a heartbeat failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("no attempt made")]
    NoAttempt,
    #[error(transparent)]
    Call(#[from] OwnCallError),
    #[error("{0} answered {1}")]
    Answered(&'static str, StatusCode),
    #[error("undecodable lease response: {0}")]
    Undecodable(#[source] serde_json::Error),
}

fn parse(bytes: &[u8]) -> Result<Value, LeaseError> {
    serde_json::from_slice(bytes).map_err(LeaseError::Undecodable)
}

/// `metav1.MicroTime` of `t`, as kube-apiserver writes `renewTime`.
pub fn micro_time(t: SystemTime) -> String {
    outpost_core::time::micro_time(t.duration_since(UNIX_EPOCH).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_fields_and_the_delegate_annotation() {
        let r = LeaseRenewer::new("edge-1", Duration::from_secs(40));
        let base = json!({
            "metadata": {"name": "edge-1", "annotations": {DELEGATE_ANNOTATION: "true", "keep": "x"}},
            "spec": {"holderIdentity": "someone-else"}
        });
        let lease = r.renewed(base);
        assert_eq!(lease["spec"]["holderIdentity"], "edge-1");
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
        assert!(lease["spec"]["renewTime"].as_str().unwrap().ends_with('Z'));
        assert!(
            lease["metadata"]["annotations"]
                .get(DELEGATE_ANNOTATION)
                .is_none()
        );
        assert_eq!(lease["metadata"]["annotations"]["keep"], "x");
    }
}
