//! kubelet's TokenRequests (the projected service-account token of every pod that has one),
//! answered from the cloud's last answer when the cloud is away.
//!
//! kubelet keeps pod tokens in memory only: after a reboot its cache is empty, a failed
//! TokenRequest fails the projected volume, and the pod never starts (openyurt #867). So every
//! answer the cloud gives kubelet is kept in the edge cache, under the request that got it:
//! namespace, service account, audiences, `expirationSeconds` and the bound object's kind, name
//! and **uid**. Offline, the same request is answered with it — even expired (kubelet mounts it,
//! so the pod starts, and asks again once it `requiresRefresh`, which the cloud answers when it
//! is back). A request for another pod (another uid: a pod re-created under the same name) has
//! no answer (503): yurthub matches tokens without the binding and would hand one pod's token to
//! another.
//!
//! The answer is kept as it came (JSON or protobuf) and converted only for a client that cannot
//! read that encoding. The token itself is never logged.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use outpost_cache::Store;
use outpost_core::wire::{self, Encoding};
use outpost_core::{RequestInfo, Verb};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::body::{self, ProxyBody};
use crate::edge::offline::{self, blocking};
use crate::edge::writer::{CacheOp, Writer};
use crate::error::ProxyError;
use crate::metrics::Metrics;

/// A TokenRequest is a few hundred bytes; its answer a few KB.
pub const MAX_BODY: usize = 64 << 10;
const PREFIX: &str = "tokens/";

/// What identifies one of kubelet's token requests, and so the answer it may be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKey {
    namespace: String,
    service_account: String,
    audiences: Vec<String>,
    expiration_seconds: Option<i64>,
    bound: Option<BoundObject>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct BoundObject {
    kind: String,
    name: String,
    uid: String,
}

impl TokenKey {
    /// The key of a TokenRequest (`request`, its body as JSON) for `info`'s service account.
    pub fn of(info: &RequestInfo, request: &Value) -> Result<TokenKey, ProxyError> {
        if request["kind"]
            .as_str()
            .is_some_and(|k| k != "TokenRequest")
        {
            return Err(ProxyError::InvalidRequest(format!(
                "the body is a {}, not a TokenRequest",
                request["kind"]
            )));
        }
        let spec = &request["spec"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let bound = spec
            .get("boundObjectRef")
            .filter(|b| b.is_object())
            .map(|b| BoundObject {
                kind: text(&b["kind"]),
                name: text(&b["name"]),
                uid: text(&b["uid"]),
            });
        Ok(TokenKey {
            namespace: info.namespace.clone(),
            service_account: info.name.clone(),
            audiences: spec["audiences"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect(),
            expiration_seconds: spec["expirationSeconds"].as_i64(),
            bound,
        })
    }

    /// The cache document the answer is kept under: a digest, so that names and audiences of
    /// any length make one bounded key.
    fn document(&self) -> String {
        let canonical = json!([
            self.namespace,
            self.service_account,
            self.audiences,
            self.expiration_seconds,
            self.bound.as_ref().map(|b| [&b.kind, &b.name, &b.uid]),
        ])
        .to_string();
        let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("{PREFIX}{hex}")
    }

    /// The bound pod's uid, if the token is bound to one.
    fn pod_uid(&self) -> &str {
        self.bound.as_ref().map_or("", |b| b.uid.as_str())
    }

    fn pod(&self) -> &str {
        self.bound.as_ref().map_or("", |b| b.name.as_str())
    }
}

/// The TokenRequest answers kept for offline use.
pub struct Tokens {
    store: Arc<dyn Store>,
    writer: Writer,
    metrics: Metrics,
}

impl Tokens {
    pub fn new(store: Arc<dyn Store>, writer: Writer, metrics: Metrics) -> Tokens {
        Tokens {
            store,
            writer,
            metrics,
        }
    }

    /// kubelet's `POST …/serviceaccounts/<sa>/token`.
    pub fn handles(info: &RequestInfo) -> bool {
        super::is_kubelets(info, &[Verb::Create], "serviceaccounts", "token")
            && !info.name.is_empty()
    }

    /// Keeps the cloud's answer to `key` (`201 Created`, in `content_type`) — only if it is what
    /// was asked for: a TokenRequest carrying a token, bound to the same object.
    pub fn remember(&self, key: &TokenKey, content_type: Option<&str>, answer: Bytes) {
        let outcome = match check_answer(key, content_type, &answer) {
            Ok(()) => {
                let op = CacheOp::Verbatim {
                    name: key.document(),
                    content_type: content_type.unwrap_or(wire::JSON).to_owned(),
                    body: answer,
                };
                if self.writer.submit(op).is_some() {
                    "kept"
                } else {
                    "not_kept"
                }
            }
            Err(reason) => {
                debug!(%reason, "TokenRequest answer not kept");
                "unusable_answer"
            }
        };
        self.count(outcome);
    }

    /// Answers `key` from the kept answer (the cloud is unreachable); 503 when there is none.
    pub async fn answer(
        &self,
        key: &TokenKey,
        headers: &HeaderMap,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let name = key.document();
        let kept = blocking(&self.store, move |s| s.get_document(&name)).await?;
        let Some((content_type, bytes)) = kept.as_deref().and_then(offline::split_document) else {
            self.count("missing");
            return Err(ProxyError::Offline(format!(
                "no service-account token for {}/{} bound to pod {} ({}) was kept from the cloud",
                key.namespace,
                key.service_account,
                key.pod(),
                key.pod_uid()
            )));
        };
        let object = wire::read_body(Some(content_type), bytes)
            .map_err(|e| ProxyError::Cache(format!("the kept TokenRequest answer: {e}")))?;
        let expired = expiry(&object).is_some_and(|at| at <= now());
        self.count(if expired { "served_expired" } else { "served" });
        info!(
            namespace = %key.namespace,
            service_account = %key.service_account,
            pod = key.pod(),
            expired,
            "service-account token served from the edge cache (the cloud is unreachable)"
        );
        let wanted = crate::objects::encoding_for(headers);
        let kept_encoding = if wire::is_protobuf(content_type) {
            Encoding::Protobuf
        } else {
            Encoding::Json
        };
        let mut resp = if wanted == kept_encoding || accepts(headers, kept_encoding) {
            let mut resp = offline::cache_response(
                body::full(Bytes::copy_from_slice(bytes)),
                kept_encoding.content_type(),
            );
            *resp.status_mut() = StatusCode::CREATED;
            resp
        } else {
            crate::objects::answer(StatusCode::CREATED, &object, wanted, "edge-cache")
        };
        *resp.status_mut() = StatusCode::CREATED;
        Ok(resp)
    }

    /// Forgets the answers no pod uses any more, for as long as the hub runs: once the cloud
    /// has answered for [`STALE_AFTER_ONLINE`] in a row (kubelet refreshed every live pod's
    /// token meanwhile), every answer that expired more than [`KEPT_EXPIRED`] ago is gone.
    pub async fn forget_stale(
        self: Arc<Self>,
        mut online: watch::Receiver<bool>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                up = online.wait_for(|up| *up) => if up.is_err() { return },
                _ = shutdown.changed() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(STALE_AFTER_ONLINE) => {}
                _ = online.wait_for(|up| !*up) => continue,
                _ = shutdown.changed() => return,
            }
            if let Err(e) = self.collect_garbage(now()).await {
                debug!(error = %e, "kept tokens not collected");
            }
        }
    }

    /// Deletes the kept answers that expired before `now - KEPT_EXPIRED`; returns how many.
    pub async fn collect_garbage(&self, now: Duration) -> Result<usize, ProxyError> {
        let kept = blocking(&self.store, |s| s.documents(PREFIX)).await?;
        let stale: Vec<String> = kept
            .into_iter()
            .filter(|(_, doc)| {
                let expired = offline::split_document(doc)
                    .and_then(|(content_type, body)| wire::read_body(Some(content_type), body).ok())
                    .and_then(|answer| expiry(&answer));
                expired.is_none_or(|at| at + KEPT_EXPIRED < now)
            })
            .map(|(name, _)| name)
            .collect();
        let forgotten = stale.len();
        blocking(&self.store, move |s| {
            stale.iter().try_for_each(|name| s.delete_document(name))
        })
        .await?;
        for _ in 0..forgotten {
            self.count("forgotten");
        }
        Ok(forgotten)
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .autonomy
            .with_label_values(&["token", outcome])
            .inc();
    }
}

/// How long the cloud must have answered before kept tokens are collected: kubelet refreshes
/// a live pod's token well within it (at 80 % of its hour).
pub const STALE_AFTER_ONLINE: Duration = Duration::from_secs(3600);
/// How long after its expiry an answer is kept: a node offline longer than that had its
/// tokens refreshed on its return before any collection.
pub const KEPT_EXPIRED: Duration = Duration::from_secs(24 * 3600);

/// Whether the client's `Accept` allows `encoding` at all (not only as its first choice).
fn accepts(headers: &HeaderMap, encoding: Encoding) -> bool {
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    accept.trim().is_empty()
        || accept.split(',').any(|clause| {
            let media = clause.split(';').next().unwrap_or("").trim();
            media == "*/*" || media.eq_ignore_ascii_case(encoding.content_type())
        })
}

/// Why the cloud's answer to a TokenRequest is not kept.
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    #[error(transparent)]
    Body(#[from] wire::BodyError),
    #[error("a {0} came back")]
    NotTokenRequest(Value),
    #[error("no token in the answer")]
    NoToken,
    #[error("the answer is bound to another object")]
    BoundElsewhere,
}

/// Whether the cloud's answer is a TokenRequest with a token for the object `key` names.
fn check_answer(
    key: &TokenKey,
    content_type: Option<&str>,
    answer: &[u8],
) -> Result<(), AnswerError> {
    let object = wire::read_body(content_type, answer)?;
    if object["kind"].as_str().is_some_and(|k| k != "TokenRequest") {
        return Err(AnswerError::NotTokenRequest(object["kind"].clone()));
    }
    if object["status"]["token"].as_str().is_none_or(str::is_empty) {
        return Err(AnswerError::NoToken);
    }
    let bound_uid = object["spec"]["boundObjectRef"]["uid"]
        .as_str()
        .unwrap_or_default();
    if bound_uid != key.pod_uid() {
        return Err(AnswerError::BoundElsewhere);
    }
    Ok(())
}

/// `status.expirationTimestamp`, as time since the epoch.
fn expiry(object: &Value) -> Option<Duration> {
    outpost_core::time::parse_rfc3339(object["status"]["expirationTimestamp"].as_str()?)
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info() -> RequestInfo {
        RequestInfo::classify(
            &Method::POST,
            "/api/v1/namespaces/apps/serviceaccounts/default/token",
            Some("kubelet/v1.32.4 (linux/amd64) kubernetes/x"),
        )
        .unwrap()
    }

    fn request(uid: &str) -> Value {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3607,
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": uid}}})
    }

    #[test]
    fn the_key_binds_the_pod_uid() {
        let a = TokenKey::of(&info(), &request("uid-1")).unwrap();
        let b = TokenKey::of(&info(), &request("uid-2")).unwrap();
        assert!(Tokens::handles(&info()));
        assert_ne!(a.document(), b.document(), "another pod, another token");
        assert_eq!(
            a.document(),
            TokenKey::of(&info(), &request("uid-1")).unwrap().document()
        );
        let mut shorter = request("uid-1");
        shorter["spec"]["expirationSeconds"] = json!(600);
        assert_ne!(
            a.document(),
            TokenKey::of(&info(), &shorter).unwrap().document()
        );
    }

    #[tokio::test]
    async fn answers_long_expired_are_forgotten_and_current_ones_kept() {
        let store: Arc<dyn Store> = Arc::new(outpost_cache::MemStore::new());
        let keep = |uid: &str, expires: &str| {
            let key = TokenKey::of(&info(), &request(uid)).unwrap();
            let mut answer = request(uid);
            answer["status"] = json!({"token": "t", "expirationTimestamp": expires});
            let doc =
                offline::discovery_document("application/json", answer.to_string().as_bytes());
            store.put_document(&key.document(), &doc).unwrap();
        };
        keep("current", "2026-11-26T12:00:00Z");
        keep("yesterday", "2026-11-25T12:00:00Z");
        keep("last-week", "2026-11-19T12:00:00Z");
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        let tokens = Tokens::new(store.clone(), writer, Metrics::new());
        let now = outpost_core::time::parse_rfc3339("2026-11-26T11:30:00Z").unwrap();
        assert_eq!(tokens.collect_garbage(now).await.unwrap(), 1);
        assert_eq!(store.documents(PREFIX).unwrap().len(), 2);
    }

    #[test]
    fn only_an_answer_for_the_same_binding_is_kept() {
        let key = TokenKey::of(&info(), &request("uid-1")).unwrap();
        let mut answer = request("uid-1");
        answer["status"] = json!({"token": "t0k3n", "expirationTimestamp": "2026-11-26T12:00:00Z"});
        let bytes = answer.to_string();
        assert!(check_answer(&key, Some("application/json"), bytes.as_bytes()).is_ok());
        let pb = wire::protobuf::encode_object(&answer).unwrap();
        assert!(check_answer(&key, Some(wire::PROTOBUF), &pb).is_ok());
        let other = bytes.replace("uid-1", "uid-2");
        assert!(check_answer(&key, None, other.as_bytes()).is_err());
        let secret = json!({"kind": "Secret", "apiVersion": "v1"}).to_string();
        assert!(check_answer(&key, None, secret.as_bytes()).is_err());
        let tokenless = bytes.replace("t0k3n", "");
        assert!(check_answer(&key, None, tokenless.as_bytes()).is_err());
    }
}
