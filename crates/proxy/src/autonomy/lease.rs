//! kubelet's own node lease, answered by the hub (edge mode), as yurthub does — but with
//! consistent resourceVersions where yurthub hands back the same stale object every time.
//!
//! kubelet's lease controller GETs its lease, then PUTs updated copies carrying the last
//! resourceVersion it saw, re-GETting on a conflict, and POSTs it when missing. The hub keeps one
//! local copy: GET returns it, PUT checks the resourceVersion (409 Conflict when stale, as the
//! apiserver would) and stores the body with the next version, POST creates it (409
//! AlreadyExists when present). Every such request is the evidence that kubelet is alive
//! ([`KubeletCalls`]); the cloud's lease is renewed by the heartbeat, never by these requests.
//!
//! kubelet writes its lease in protobuf and prefers protobuf back ([`crate::objects`]); JSON
//! works the same. The copy is kept in the edge cache too ([`LocalLease::restore`]), so a hub
//! restarted while the cloud is away answers kubelet's first GET with the lease and versions it
//! had, instead of a 404 that sends kubelet to re-create it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::{HeaderMap, Method, Response, StatusCode};
use outpost_cache::Store;
use outpost_core::{RequestInfo, Status};
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::KubeletCalls;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::objects;

const NAMESPACE: &str = "kube-node-lease";
const GROUP: &str = "coordination.k8s.io";
/// A lease is a few hundred bytes; anything near this is not one.
const MAX_BODY: usize = 64 << 10;
/// Where the local copy is kept in the edge cache.
const DOCUMENT: &str = "local/kubelet-lease";

/// The local copy and its resourceVersion counter.
pub struct LocalLease {
    node: String,
    calls: Arc<KubeletCalls>,
    state: Mutex<Option<(Value, u64)>>,
    /// Edge mode's cache, where the copy outlives a restart.
    store: Option<Arc<dyn Store>>,
}

impl LocalLease {
    pub fn new(node: &str, calls: Arc<KubeletCalls>, store: Option<Arc<dyn Store>>) -> LocalLease {
        LocalLease {
            node: node.to_owned(),
            calls,
            state: Mutex::new(None),
            store,
        }
    }

    /// Takes up the copy kept before a restart, if any.
    pub async fn restore(&self) {
        let Some(store) = &self.store else { return };
        let kept = match crate::edge::offline::blocking(store, |s| s.get_document(DOCUMENT)).await {
            Ok(kept) => kept,
            Err(e) => {
                warn!(error = %e, "cannot read the kept kubelet lease; kubelet will re-create it");
                return;
            }
        };
        let Some(lease) = kept.and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        else {
            return;
        };
        if lease["metadata"]["name"].as_str() != Some(self.node.as_str()) {
            return;
        }
        let rv = resource_version(&lease);
        debug!(
            resource_version = rv,
            "kubelet's lease restored from the edge cache"
        );
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.get_or_insert((lease, rv));
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

    /// Takes the cloud's lease (its answer to kubelet's GET, in whatever encoding it came) as
    /// the local copy; local versions continue from its number.
    pub async fn seed(&self, content_type: Option<&str>, lease: &[u8]) {
        self.calls.record(Instant::now());
        let Ok(lease) = objects::parse(content_type, lease) else {
            return;
        };
        if lease["metadata"]["name"].as_str() != Some(self.node.as_str()) {
            return;
        }
        let rv = resource_version(&lease);
        let seeded = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.is_none().then(|| {
                *state = Some((lease.clone(), rv));
                lease
            })
        };
        if let Some(lease) = seeded {
            self.keep(&lease).await;
        }
    }

    /// Answers one of kubelet's lease requests and records that kubelet called.
    pub async fn serve(
        &self,
        method: &Method,
        headers: &HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        self.calls.record(Instant::now());
        let (status, value) = match *method {
            Method::GET => self.get()?,
            Method::PUT => self.put(read_lease(headers, body).await?)?,
            Method::POST => self.create(read_lease(headers, body).await?)?,
            _ => return Err(ProxyError::InvalidRequest(format!("{method} on a lease"))),
        };
        if *method != Method::GET {
            self.keep(&value).await;
        }
        let encoding = objects::encoding_for(headers);
        Ok(objects::answer(status, &value, encoding, "local-lease"))
    }

    /// Keeps the copy in the edge cache; a failure only costs the copy after a restart.
    async fn keep(&self, lease: &Value) {
        let Some(store) = &self.store else { return };
        let bytes = lease.to_string();
        let kept = crate::edge::offline::blocking(store, move |s| {
            s.put_document(DOCUMENT, bytes.as_bytes())
        })
        .await;
        if let Err(e) = kept {
            debug!(error = %e, "kubelet's lease not kept in the edge cache");
        }
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

fn resource_version(lease: &Value) -> u64 {
    lease["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

async fn read_lease(headers: &HeaderMap, body: ProxyBody) -> Result<Value, ProxyError> {
    let read = objects::read_request(headers, body, MAX_BODY).await?;
    match read.object["kind"].as_str() {
        Some("Lease") | None => Ok(read.object),
        Some(other) => Err(ProxyError::Local(Status::bad_request(format!(
            "the body is a {other}, not a Lease"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use http_body_util::BodyExt;

    const UA: &str = "kubelet/v1.32.0 (linux/amd64) kubernetes/x";

    fn info(method: Method, path: &str) -> RequestInfo {
        RequestInfo::classify(&method, path, Some(UA)).unwrap()
    }

    fn lease_body(rv: Option<&str>) -> ProxyBody {
        let mut lease = json!({"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
            "metadata":{"name":"edge-1","namespace":"kube-node-lease"},"spec":{"holderIdentity":"edge-1"}});
        if let Some(rv) = rv {
            lease["metadata"]["resourceVersion"] = json!(rv);
        }
        crate::body::full(lease.to_string())
    }

    async fn status(l: &LocalLease, m: Method, rv: Option<&str>) -> (u16, Value) {
        match l.serve(&m, &HeaderMap::new(), lease_body(rv)).await {
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
        let l = LocalLease::new("edge-1", Arc::default(), None);
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
        let l = LocalLease::new("edge-1", calls.clone(), None);
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
        let l = LocalLease::new("edge-1", Arc::default(), None);
        assert!(l.is_empty());
        l.seed(
            None,
            br#"{"metadata":{"name":"edge-1","resourceVersion":"527"}}"#,
        )
        .await;
        assert!(!l.is_empty());
        let (code, updated) = status(&l, Method::PUT, Some("527")).await;
        assert_eq!(code, 200);
        assert_eq!(updated["metadata"]["resourceVersion"], "528");
        let other = LocalLease::new("edge-1", Arc::default(), None);
        other
            .seed(
                None,
                br#"{"metadata":{"name":"edge-2","resourceVersion":"1"}}"#,
            )
            .await;
        assert!(other.is_empty(), "another node's lease is never taken");
    }

    fn protobuf_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(outpost_core::wire::PROTOBUF),
        );
        h.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("application/vnd.kubernetes.protobuf,application/json"),
        );
        h
    }

    /// kubelet's real bodies: a protobuf Lease in, a protobuf Lease back.
    #[tokio::test]
    async fn kubelets_protobuf_lease_loop_is_answered_in_protobuf() {
        let l = LocalLease::new("edge-1", Arc::default(), None);
        let lease = json!({"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
            "metadata":{"name":"edge-1","namespace":"kube-node-lease"},
            "spec":{"holderIdentity":"edge-1","leaseDurationSeconds":40,
                    "renewTime":"2026-11-26T10:00:00.123456Z"}});
        let body = outpost_core::wire::protobuf::encode_object(&lease).unwrap();
        let headers = protobuf_headers();
        let resp = l
            .serve(&Method::POST, &headers, crate::body::full(body))
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        assert_eq!(
            resp.headers()[http::header::CONTENT_TYPE],
            outpost_core::wire::PROTOBUF
        );
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let created = outpost_core::wire::protobuf::decode_object(&bytes).unwrap();
        assert_eq!(created["metadata"]["resourceVersion"], "1");
        assert_eq!(created["spec"]["renewTime"], "2026-11-26T10:00:00.123456Z");
        let garbage = l
            .serve(
                &Method::PUT,
                &headers,
                crate::body::full(bytes::Bytes::from_static(b"k8s\0\x0a\xff")),
            )
            .await;
        assert_eq!(garbage.err().map(|e| e.into_status().code), Some(400));
    }

    /// A restarted hub answers from the copy it kept, with the versions it had.
    #[tokio::test]
    async fn the_lease_outlives_a_restart_in_the_edge_cache() {
        let store: Arc<dyn Store> = Arc::new(outpost_cache::MemStore::new());
        let before = LocalLease::new("edge-1", Arc::default(), Some(store.clone()));
        before.restore().await;
        assert_eq!(status(&before, Method::POST, None).await.0, 201);
        assert_eq!(status(&before, Method::PUT, Some("1")).await.0, 200);
        let after = LocalLease::new("edge-1", Arc::default(), Some(store));
        after.restore().await;
        let (code, got) = status(&after, Method::GET, None).await;
        assert_eq!(code, 200);
        assert_eq!(got["metadata"]["resourceVersion"], "2");
        assert_eq!(status(&after, Method::PUT, Some("2")).await.0, 200);
    }
}
