//! kubelet's own node lease, answered by the hub (edge mode), as yurthub does — but with
//! consistent resourceVersions where yurthub hands back the same stale object every time.
//!
//! kubelet's lease controller GETs its lease, then PUTs updated copies carrying the last
//! resourceVersion it saw, re-GETting on a conflict, and POSTs it when missing. The hub keeps one
//! local copy: GET returns it, PUT checks the resourceVersion (409 Conflict when stale, as the
//! apiserver would) and stores the body with the next version, POST creates it (409
//! AlreadyExists when present). Every such request is the evidence that kubelet is alive
//! ([`KubeletCalls`]); the cloud's lease is renewed by the heartbeat, never by these requests.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use outpost_core::{RequestInfo, Status};
use serde_json::{Value, json};

use super::kubelet::KubeletCalls;
use crate::body::ProxyBody;
use crate::edge::offline::json_response;
use crate::error::ProxyError;

const NAMESPACE: &str = "kube-node-lease";
const GROUP: &str = "coordination.k8s.io";
/// A lease is a few hundred bytes; anything near this is not one.
const MAX_BODY: usize = 64 << 10;

/// The local copy and its resourceVersion counter.
pub struct LocalLease {
    node: String,
    calls: Arc<KubeletCalls>,
    state: Mutex<Option<(Value, u64)>>,
}

impl LocalLease {
    pub fn new(node: &str, calls: Arc<KubeletCalls>) -> LocalLease {
        LocalLease {
            node: node.to_owned(),
            calls,
            state: Mutex::new(None),
        }
    }

    /// kubelet's requests for its own lease (GET / PUT / POST).
    pub fn handles(&self, info: &RequestInfo) -> bool {
        let own = info.api_group == GROUP
            && info.resource == "leases"
            && info.subresource.is_empty()
            && info.namespace == NAMESPACE
            && info.component.as_deref() == Some("kubelet");
        own && match info.verb {
            outpost_core::Verb::Get | outpost_core::Verb::Update => info.name == self.node,
            outpost_core::Verb::Create => true,
            _ => false,
        }
    }

    /// No local copy yet: kubelet's first GET goes to the cloud and [`Self::seed`]s it.
    pub fn is_empty(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Takes the cloud's lease as the local copy; local versions continue from its number.
    pub fn seed(&self, lease: &[u8]) {
        self.calls.record(Instant::now());
        let Ok(lease) = serde_json::from_slice::<Value>(lease) else {
            return;
        };
        if lease["metadata"]["name"].as_str() != Some(self.node.as_str()) {
            return;
        }
        let rv = lease["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            *state = Some((lease, rv));
        }
    }

    /// Answers one of kubelet's lease requests and records that kubelet called.
    pub async fn serve<B>(
        &self,
        method: &Method,
        body: B,
    ) -> Result<Response<ProxyBody>, ProxyError>
    where
        B: http_body::Body<Data = Bytes> + Send,
        B::Error: Into<crate::body::BoxError>,
    {
        self.calls.record(Instant::now());
        let (status, value) = match *method {
            Method::GET => self.get()?,
            Method::PUT => self.put(read_lease(body).await?)?,
            Method::POST => self.create(read_lease(body).await?)?,
            _ => return Err(ProxyError::InvalidRequest(format!("{method} on a lease"))),
        };
        let mut resp = json_response(value.to_string(), "application/json");
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            "x-outpost-served-from",
            http::HeaderValue::from_static("local-lease"),
        );
        Ok(resp)
    }

    fn get(&self) -> Result<(StatusCode, Value), ProxyError> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.as_ref() {
            Some((lease, _)) => Ok((StatusCode::OK, lease.clone())),
            None => Err(ProxyError::Local(Status::not_found(
                GROUP, "leases", &self.node,
            ))),
        }
    }

    fn put(&self, mut lease: Value) -> Result<(StatusCode, Value), ProxyError> {
        self.check_name(&lease)?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some((_, rv)) = state.as_ref() else {
            return Err(ProxyError::Local(Status::not_found(
                GROUP, "leases", &self.node,
            )));
        };
        let sent = lease["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !sent.is_empty() && sent != rv.to_string() {
            return Err(ProxyError::Local(Status::conflict(
                GROUP, "leases", &self.node,
            )));
        }
        let next = rv + 1;
        lease["metadata"]["resourceVersion"] = json!(next.to_string());
        *state = Some((lease.clone(), next));
        Ok((StatusCode::OK, lease))
    }

    fn create(&self, mut lease: Value) -> Result<(StatusCode, Value), ProxyError> {
        self.check_name(&lease)?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_some() {
            return Err(ProxyError::Local(Status::already_exists(
                GROUP, "leases", &self.node,
            )));
        }
        lease["metadata"]["resourceVersion"] = json!("1");
        lease["metadata"]["namespace"] = json!(NAMESPACE);
        *state = Some((lease.clone(), 1));
        drop(state);
        Ok((StatusCode::CREATED, lease))
    }

    /// The node may only write its own lease (the node authorizer's rule, kept locally too).
    fn check_name(&self, lease: &Value) -> Result<(), ProxyError> {
        if lease["metadata"]["name"].as_str() == Some(self.node.as_str()) {
            Ok(())
        } else {
            Err(ProxyError::Local(Status::forbidden(format!(
                "leases.coordination.k8s.io is forbidden: node \"{}\" may only write its own lease",
                self.node
            ))))
        }
    }
}

async fn read_lease<B>(body: B) -> Result<Value, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<crate::body::BoxError>,
{
    let bytes = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| ProxyError::InvalidRequest(format!("lease body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ProxyError::InvalidRequest(format!("lease body is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    const UA: &str = "kubelet/v1.32.0 (linux/amd64) kubernetes/x";

    fn info(method: Method, path: &str) -> RequestInfo {
        RequestInfo::classify(&method, path, Some(UA)).unwrap()
    }

    fn lease_body(rv: Option<&str>) -> http_body_util::Full<Bytes> {
        let mut lease = json!({"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
            "metadata":{"name":"edge-1","namespace":"kube-node-lease"},"spec":{"holderIdentity":"edge-1"}});
        if let Some(rv) = rv {
            lease["metadata"]["resourceVersion"] = json!(rv);
        }
        http_body_util::Full::new(Bytes::from(lease.to_string()))
    }

    async fn status(l: &LocalLease, m: Method, rv: Option<&str>) -> (u16, Value) {
        match l.serve(&m, lease_body(rv)).await {
            Ok(resp) => {
                let code = resp.status().as_u16();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (code, serde_json::from_slice(&body).unwrap())
            }
            Err(e) => {
                let s = e.into_status();
                (s.code, Value::Null)
            }
        }
    }

    #[test]
    fn only_kubelets_own_lease_is_local() {
        let l = LocalLease::new("edge-1", Arc::default());
        let lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        assert!(l.handles(&info(Method::GET, &format!("{lease}/edge-1"))));
        assert!(l.handles(&info(Method::PUT, &format!("{lease}/edge-1"))));
        assert!(l.handles(&info(Method::POST, lease)));
        assert!(!l.handles(&info(Method::GET, &format!("{lease}/edge-2"))));
        assert!(!l.handles(&info(Method::DELETE, &format!("{lease}/edge-1"))));
        let other =
            RequestInfo::classify(&Method::GET, &format!("{lease}/edge-1"), Some("kubectl/1"));
        assert!(!l.handles(&other.unwrap()));
    }

    #[tokio::test]
    async fn kubelets_lease_loop_sees_consistent_versions() {
        let calls = Arc::new(KubeletCalls::default());
        let l = LocalLease::new("edge-1", calls.clone());
        assert_eq!(status(&l, Method::GET, None).await.0, 404);
        assert!(
            calls.last().is_some(),
            "every request is evidence kubelet is alive"
        );
        let (code, created) = status(&l, Method::POST, None).await;
        assert_eq!(code, 201);
        assert_eq!(created["metadata"]["resourceVersion"], "1");
        assert_eq!(status(&l, Method::POST, None).await.0, 409);
        let (code, updated) = status(&l, Method::PUT, Some("1")).await;
        assert_eq!(code, 200);
        assert_eq!(updated["metadata"]["resourceVersion"], "2");
        assert_eq!(
            status(&l, Method::PUT, Some("1")).await.0,
            409,
            "stale version"
        );
        let (code, got) = status(&l, Method::GET, None).await;
        assert_eq!(code, 200);
        assert_eq!(got["metadata"]["resourceVersion"], "2");
    }

    #[tokio::test]
    async fn a_seeded_lease_continues_the_clouds_versions() {
        let l = LocalLease::new("edge-1", Arc::default());
        assert!(l.is_empty());
        l.seed(br#"{"metadata":{"name":"edge-1","resourceVersion":"527"}}"#);
        assert!(!l.is_empty());
        let (code, updated) = status(&l, Method::PUT, Some("527")).await;
        assert_eq!(code, 200);
        assert_eq!(updated["metadata"]["resourceVersion"], "528");
        let other = LocalLease::new("edge-1", Arc::default());
        other.seed(br#"{"metadata":{"name":"edge-2","resourceVersion":"1"}}"#);
        assert!(other.is_empty(), "another node's lease is never taken");
    }
}
