//! kubelet's events while the cloud is away: queued, and sent when it returns, so that
//! operators can see afterwards what the node went through (pods restarted, images pulled,
//! probes failing) instead of nothing.
//!
//! kubelet's event recorder POSTs an event (protobuf) and PATCHes it when the same event
//! repeats (its count and last timestamp). Offline, a POST is queued and answered `201` with
//! the event; a PATCH of an event queued here is applied to it, queued too, and answered with
//! the result; a PATCH of one the hub never saw is `404`, on which the recorder POSTs it anew.
//! The queue is bounded ([`MAX_QUEUED`], oldest dropped first, counted) and kept in the edge
//! cache, so a hub restarted offline still sends what came before. On the cloud's return the
//! queue is sent in order; an answer that says the write can never succeed (a 4xx) drops it,
//! an outage again stops the replay until the next return.
//!
//! Only kubelet's events (the node's identity) are taken: the replay writes as the node.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Method, Response, StatusCode, header};
use outpost_cache::Store;
use outpost_core::{RequestInfo, Status, Verb};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use super::replay::ReplayError;
use crate::body::ProxyBody;
use crate::edge::offline::blocking;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::objects;
use crate::upstream::{OwnCall, OwnCallError, Upstream};

/// Events kept at most while offline.
pub const MAX_QUEUED: usize = 1000;
/// An event is a few hundred bytes; a note may be longer.
const MAX_BODY: usize = 256 << 10;
/// Where the queue is kept in the edge cache: `<prefix><sequence>`.
const PREFIX: &str = "local/events/";
const USER_AGENT: &str = "outpost/events";

/// One queued write of an event.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Queued {
    seq: u64,
    /// `POST` or `PATCH`.
    method: String,
    namespace: String,
    /// The event's name (a PATCH's, or the POSTed event's).
    name: String,
    /// The event (POST) as JSON, or the patch (PATCH).
    body: Value,
    /// A PATCH's content type.
    patch_type: Option<String>,
}

impl Queued {
    fn document(&self) -> String {
        format!("{PREFIX}{:020}", self.seq)
    }
}

/// The events queued while offline.
pub struct Events {
    store: Arc<dyn Store>,
    metrics: Metrics,
    queue: Mutex<VecDeque<Queued>>,
}

impl Events {
    pub fn new(store: Arc<dyn Store>, metrics: Metrics) -> Events {
        Events {
            store,
            metrics,
            queue: Mutex::default(),
        }
    }

    /// kubelet's `POST …/events` and `PATCH …/events/<name>` (core/v1 events).
    pub fn handles(info: &RequestInfo) -> bool {
        super::is_kubelets(info, &[Verb::Create, Verb::Patch], "events", "")
            && !info.namespace.is_empty()
    }

    /// Takes up the queue kept before a restart.
    pub async fn restore(&self) {
        let kept = super::kept(&self.store, PREFIX, "events").await;
        let mut queue = self.lock();
        queue.extend(
            kept.iter()
                .filter_map(|(_, bytes)| serde_json::from_slice::<Queued>(bytes).ok()),
        );
    }

    /// Queues one of kubelet's event writes and answers it as the apiserver would.
    pub async fn accept(
        &self,
        info: &RequestInfo,
        headers: &HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (queued, answer, code) = match info.verb {
            Verb::Create => {
                let event = objects::read_request(headers, body, MAX_BODY).await?.object;
                let name = event["metadata"]["name"].as_str().unwrap_or_default();
                let namespace = event["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(&info.namespace);
                if event["kind"].as_str().is_some_and(|k| k != "Event")
                    || name.is_empty()
                    || namespace != info.namespace
                {
                    return Err(ProxyError::Local(Status::bad_request(
                        "the body is not an Event with a name in the request's namespace",
                    )));
                }
                let queued = self.queued(Method::POST, info, name, event.clone(), None);
                (queued, event, StatusCode::CREATED)
            }
            _ => {
                let patch_type = content_type(headers);
                let bytes = objects::read_bytes(body, MAX_BODY).await?;
                let patch: Value = serde_json::from_slice(&bytes).map_err(|e| {
                    ProxyError::Local(Status::bad_request(format!("the event patch: {e}")))
                })?;
                let Some(mut event) = self.latest(&info.namespace, &info.name) else {
                    return Err(ProxyError::Local(Status::not_found(
                        "", "events", &info.name,
                    )));
                };
                crate::objects::strategic_merge(&mut event, &patch, |_| None);
                let queued = self.queued(Method::PATCH, info, &info.name, patch, Some(patch_type));
                (queued, event, StatusCode::OK)
            }
        };
        self.push(queued).await;
        let encoding = objects::encoding_for(headers);
        Ok(objects::answer(code, &answer, encoding, "edge-cache"))
    }

    fn queued(
        &self,
        method: Method,
        info: &RequestInfo,
        name: &str,
        body: Value,
        patch_type: Option<String>,
    ) -> Queued {
        let seq = self.lock().back().map_or(0, |q| q.seq + 1);
        Queued {
            seq,
            method: method.to_string(),
            namespace: info.namespace.clone(),
            name: name.to_owned(),
            body,
            patch_type,
        }
    }

    /// The event `namespace/name` as the queue leaves it: its POST with the later PATCHes.
    fn latest(&self, namespace: &str, name: &str) -> Option<Value> {
        let queue = self.lock();
        let mut event: Option<Value> = None;
        for q in queue
            .iter()
            .filter(|q| q.namespace == namespace && q.name == name)
        {
            match (q.method.as_str(), &mut event) {
                ("POST", _) => event = Some(q.body.clone()),
                (_, Some(event)) => {
                    crate::objects::strategic_merge(event, &q.body, |_| None);
                }
                _ => {}
            }
        }
        event
    }

    /// Queues, dropping the oldest beyond [`MAX_QUEUED`], and keeps the queue in the cache.
    async fn push(&self, queued: Queued) {
        let document = queued.document();
        let bytes = serde_json::to_vec(&queued).unwrap_or_default();
        let dropped = {
            let mut queue = self.lock();
            queue.push_back(queued);
            let mut dropped = Vec::new();
            while queue.len() > MAX_QUEUED {
                dropped.extend(queue.pop_front().map(|q| q.document()));
            }
            dropped
        };
        self.count("queued");
        for _ in &dropped {
            self.count("dropped_oldest");
        }
        let kept = blocking(&self.store, move |s| {
            s.put_document(&document, &bytes)?;
            dropped.iter().try_for_each(|name| s.delete_document(name))
        })
        .await;
        if let Err(e) = kept {
            warn!(error = %e, "an event queued offline is kept in memory only");
        }
    }

    /// Sends the queue each time the cloud comes back, until `shutdown`.
    pub async fn replay_on_reconnect(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        online: watch::Receiver<bool>,
        shutdown: watch::Receiver<bool>,
    ) {
        super::replay::on_each_return(online, shutdown, || self.replay(&upstream)).await
    }

    /// Sends queued writes in order until the queue is empty or the cloud fails again.
    async fn replay(&self, upstream: &Upstream) {
        let mut sent = 0usize;
        loop {
            let Some(next) = self.lock().front().cloned() else {
                break;
            };
            match send(upstream, &next).await {
                Ok(outcome) => {
                    self.count(outcome);
                    sent += 1;
                }
                Err(e) => {
                    warn!(error = %e, left = self.lock().len(), "events queued offline not all sent; the rest go on the cloud's next return");
                    return;
                }
            }
            self.lock().pop_front();
            let document = next.document();
            let _ = blocking(&self.store, move |s| s.delete_document(&document)).await;
        }
        if sent > 0 {
            info!(events = sent, "events queued offline sent to the cloud");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .autonomy
            .with_label_values(&["event", outcome])
            .inc();
    }
}

/// Sends one queued write; `Err` means the cloud could not take it now.
async fn send(upstream: &Upstream, queued: &Queued) -> Result<&'static str, ReplayError> {
    let server = upstream.pick().ok_or(OwnCallError::Offline)?;
    let collection = format!("/api/v1/namespaces/{}/events", queued.namespace);
    let (method, path, content_type) = if queued.method == "POST" {
        (Method::POST, collection, "application/json")
    } else {
        let patch_type = match queued.patch_type.as_deref() {
            Some("application/merge-patch+json") => "application/merge-patch+json",
            _ => "application/strategic-merge-patch+json",
        };
        (
            Method::PATCH,
            format!("{collection}/{}", queued.name),
            patch_type,
        )
    };
    let call = OwnCall {
        method,
        path: &path,
        user_agent: USER_AGENT,
        body: Some((content_type, queued.body.clone())),
        timeout: Duration::from_secs(10),
    };
    let (code, _) = upstream.own_call(server, call).await?;
    match code {
        c if c.is_success() => Ok("replayed"),
        StatusCode::CONFLICT => Ok("replayed_duplicate"),
        c if c.is_server_error() || c == StatusCode::TOO_MANY_REQUESTS => {
            Err(ReplayError::answered(&queued.method, c))
        }
        _ => Ok("dropped_refused"),
    }
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/strategic-merge-patch+json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use serde_json::json;

    fn info(method: Method, path: &str) -> RequestInfo {
        RequestInfo::classify(
            &method,
            path,
            Some("kubelet/v1.32.4 (linux/amd64) kubernetes/x"),
        )
        .unwrap()
    }

    fn event(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
            "reason": "Started", "message": "Started container c", "count": 1, "type": "Normal"})
    }

    async fn post(events: &Events, body: &Value) -> u16 {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            outpost_core::wire::PROTOBUF.parse().unwrap(),
        );
        let pb = outpost_core::wire::protobuf::encode_object(body).unwrap();
        let i = info(Method::POST, "/api/v1/namespaces/default/events");
        match events.accept(&i, &headers, crate::body::full(pb)).await {
            Ok(resp) => resp.status().as_u16(),
            Err(e) => e.into_status().code,
        }
    }

    #[tokio::test]
    async fn the_queue_is_bounded_oldest_first_and_survives_a_restart() {
        let store: Arc<dyn Store> = Arc::new(outpost_cache::MemStore::new());
        let events = Events::new(store.clone(), Metrics::new());
        for i in 0..MAX_QUEUED + 5 {
            assert_eq!(post(&events, &event(&format!("e{i}"))).await, 201);
        }
        assert_eq!(events.lock().len(), MAX_QUEUED);
        assert_eq!(
            events.lock().front().unwrap().name,
            "e5",
            "the oldest went first"
        );
        let restarted = Events::new(store, Metrics::new());
        restarted.restore().await;
        assert_eq!(restarted.lock().len(), MAX_QUEUED);
        assert_eq!(
            restarted.lock().back().unwrap().name,
            format!("e{}", MAX_QUEUED + 4)
        );
    }

    #[tokio::test]
    async fn a_patch_applies_to_the_queued_event_or_is_not_found() {
        let store: Arc<dyn Store> = Arc::new(outpost_cache::MemStore::new());
        let events = Events::new(store, Metrics::new());
        assert_eq!(post(&events, &event("e1")).await, 201);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            "application/strategic-merge-patch+json".parse().unwrap(),
        );
        let patch = json!({"count": 2, "lastTimestamp": "2026-11-26T10:00:00Z"}).to_string();
        let i = info(Method::PATCH, "/api/v1/namespaces/default/events/e1");
        let resp = events
            .accept(&i, &headers, crate::body::full(patch.clone()))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let patched: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (patched["count"].clone(), patched["reason"].clone()),
            (json!(2), json!("Started"))
        );
        let other = info(Method::PATCH, "/api/v1/namespaces/default/events/e9");
        let missing = events
            .accept(&other, &headers, crate::body::full(patch))
            .await;
        assert_eq!(missing.err().map(|e| e.into_status().code), Some(404));
        assert_eq!(events.lock().len(), 2);
    }
}
