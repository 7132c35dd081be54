//! The proxy's error type and the one place errors become responses.
//!
//! Every failure a client can see goes through [`ProxyError::into_status`], so the mapping from
//! cause to HTTP code lives here and nowhere else: malformed request (or request body) → 400, no
//! credentials on the secure port → 401, a client that stops sending its body → 408, no upstream
//! reachable → 503, upstream too slow → 504, upstream answered with something that is not HTTP →
//! 502, a cache that cannot answer (stuck, damaged, a scope that missed events) → 503.

use std::time::Duration;

use outpost_core::{ClassifyError, Reason, Status};

/// A boxed error, as bodies carry them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a body was cut by [`crate::body::until_deadline`]: who was sending it, and how long the
/// request had.
#[derive(Debug, Clone, thiserror::Error)]
#[error("apiserver {server} did not finish its answer within the request's {after:?}")]
pub struct DeadlineExceeded {
    pub server: std::sync::Arc<str>,
    pub after: Duration,
}

/// Which side of the proxy failed; decides the status code and whether a retry elsewhere may help.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client's request is not something kube-apiserver would accept.
    #[error("malformed request: {0}")]
    BadRequest(#[from] ClassifyError),
    /// The request could not be turned into an upstream request (e.g. an unusable path).
    #[error("malformed request: {0}")]
    InvalidRequest(String),
    /// The client's request body is not valid HTTP (bad chunked encoding, cut short): the
    /// client's fault, whatever the apiserver made of the part it got.
    #[error("malformed request body from the client: {0}")]
    ClientBody(String),
    /// The client stopped sending its request body: nothing could answer it in time.
    #[error("the client did not send its whole request body within {after:?}")]
    ClientTimeout { after: Duration },
    /// A caller on the secure port without a bearer token: the node's identity is never lent.
    #[error("{0}")]
    Unauthenticated(String),
    /// An authenticated caller not allowed this request (the leader hub's port: a certificate
    /// that is not a node of this pool).
    #[error("{0}")]
    Forbidden(String),
    /// The leader hub's port cannot answer from its shared cache (not a leader, not synced):
    /// the follower asks another leader or the cloud.
    #[error("the pool's shared cache cannot answer: {0}")]
    PoolUnavailable(String),
    /// No TCP or TLS connection to any upstream could be made.
    #[error("no apiserver reachable ({server}): {}", error_chain(cause.as_ref()))]
    Unreachable {
        server: String,
        #[source]
        cause: BoxError,
    },
    /// The connection closed or reset under a request that had been sent, before any answer:
    /// this exchange failed, which says little about the server (a stale pooled connection, a
    /// NAT that forgot it).
    #[error(
        "apiserver {server} closed the connection before answering: {}",
        error_chain(cause.as_ref())
    )]
    ConnectionLost {
        server: String,
        #[source]
        cause: BoxError,
    },
    /// The apiserver did not process the request, which the hub sent as often as it sends one
    /// (it refused the stream, or went away before it, each time): the client may send it
    /// again as it was.
    #[error(
        "apiserver {server} did not process the request ({why}; sent {sends} times): send it again"
    )]
    NotProcessed {
        server: String,
        why: &'static str,
        sends: u32,
    },
    /// The upstream did not answer within the deadline.
    #[error("apiserver {server} did not answer within {after:?}")]
    Timeout { server: String, after: Duration },
    /// The upstream sent something that is not a valid HTTP response.
    #[error("bad reply from apiserver {server}: {}", error_chain(cause.as_ref()))]
    BadReply {
        server: String,
        #[source]
        cause: BoxError,
    },
    /// A port full of connections that all serve requests turned a new one away.
    #[error("the hub has no room for another connection: all are serving requests")]
    NoRoom,
    /// No apiserver is healthy (or none is configured).
    #[error("no healthy apiserver: every --server-addr failed its last probe or request")]
    NoUpstream,
    /// The cloud is unreachable and the cache cannot answer this request.
    #[error("the cloud is unreachable and {0}")]
    Offline(String),
    /// Offline, the object is not in the cache.
    #[error("{resource} {name:?} not found (served from the edge cache; the cloud is unreachable)")]
    NotCached {
        group: String,
        resource: String,
        name: String,
    },
    /// Offline, a resourceVersion or continue token older than the cache can serve.
    #[error("{0}")]
    Expired(String),
    /// The client accepts no encoding the cache holds (the cache holds JSON).
    #[error("{0}")]
    NotAcceptable(String),
    /// The cache itself failed while answering.
    #[error("edge cache failure: {0}")]
    Cache(String),
    /// A fault inside the hub that is neither the cache's nor the upstream's (a worker task
    /// that panicked).
    #[error("internal error in the hub: {0}")]
    Internal(String),
    /// An answer the hub gives itself (kubelet's local lease): the Status as the apiserver
    /// would word it.
    #[error("{}", .0.message)]
    Local(Status),
}

impl ProxyError {
    /// The Kubernetes Status a client receives for this error.
    pub fn into_status(self) -> Status {
        let message = self.to_string();
        match self {
            ProxyError::BadRequest(_)
            | ProxyError::InvalidRequest(_)
            | ProxyError::ClientBody(_) => Status::bad_request(message),
            ProxyError::ClientTimeout { .. } => {
                Status::new(Reason::Timeout, message).with_code(408)
            }
            ProxyError::Unauthenticated(_) => Status::new(Reason::Unauthorized, message),
            ProxyError::Forbidden(_) => Status::forbidden(message),
            // Retry-After: client-go sends such a request again (its rest client's retries).
            ProxyError::PoolUnavailable(_) | ProxyError::NotProcessed { .. } => {
                Status::service_unavailable(message).with_retry_after(1)
            }
            ProxyError::Unreachable { .. }
            | ProxyError::ConnectionLost { .. }
            | ProxyError::NoUpstream => Status::service_unavailable(message),
            ProxyError::Timeout { .. } => Status::gateway_timeout(message),
            ProxyError::BadReply { .. } => Status::bad_gateway(message),
            ProxyError::Offline(_) | ProxyError::NoRoom => {
                Status::service_unavailable(message).with_retry_after(1)
            }
            ProxyError::NotCached {
                group,
                resource,
                name,
            } => Status::not_found(&group, &resource, &name),
            ProxyError::Expired(_) => Status::expired(message),
            ProxyError::NotAcceptable(_) => Status::new(Reason::NotAcceptable, message),
            // The hub cannot answer from its cache for now (a stuck or damaged store, which is
            // replaced or restarted): unavailable, not a fault in the request or the hub's logic.
            ProxyError::Cache(_) => Status::service_unavailable(message).with_retry_after(1),
            ProxyError::Internal(_) => Status::internal(message),
            ProxyError::Local(status) => status,
        }
    }

    /// Short label for the `outpost_upstream_errors_total{kind}` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::BadRequest(_) | ProxyError::InvalidRequest(_) => "bad_request",
            ProxyError::ClientBody(_) => "client_body",
            ProxyError::ClientTimeout { .. } => "client_timeout",
            ProxyError::Unauthenticated(_) => "unauthenticated",
            ProxyError::Forbidden(_) => "forbidden",
            ProxyError::PoolUnavailable(_) => "pool_unavailable",
            ProxyError::Unreachable { .. } | ProxyError::NoUpstream => "unreachable",
            ProxyError::ConnectionLost { .. } => "connection_lost",
            ProxyError::NotProcessed { .. } => "not_processed",
            ProxyError::Timeout { .. } => "timeout",
            ProxyError::BadReply { .. } => "bad_reply",
            ProxyError::Offline(_) => "offline",
            ProxyError::NoRoom => "no_room",
            ProxyError::NotCached { .. } => "not_cached",
            ProxyError::Expired(_) => "expired",
            ProxyError::NotAcceptable(_) => "not_acceptable",
            ProxyError::Cache(_) => "cache",
            ProxyError::Internal(_) => "internal",
            ProxyError::Local(_) => "local",
        }
    }

    /// A response body that failed while the hub collected it: past the request's deadline
    /// ([`crate::body::until_deadline`]) a timeout, otherwise a bad reply.
    pub fn from_response_body(err: &BoxError) -> ProxyError {
        match err.downcast_ref::<DeadlineExceeded>() {
            Some(e) => ProxyError::Timeout {
                server: e.server.to_string(),
                after: e.after,
            },
            None => ProxyError::BadReply {
                server: "upstream".into(),
                cause: format!("response body: {err}").into(),
            },
        }
    }

    /// Whether no connection carried the request to an answer (connecting failed, the
    /// connection was lost under it, or the server did not process it): a read may go again
    /// on a fresh connection, to the same server.
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            ProxyError::Unreachable { .. }
                | ProxyError::ConnectionLost { .. }
                | ProxyError::NotProcessed { .. }
        )
    }

    /// Whether the failure is on the upstream side (as opposed to the client's request).
    pub fn is_upstream(&self) -> bool {
        self.is_connection_failure()
            || matches!(
                self,
                ProxyError::Timeout { .. } | ProxyError::BadReply { .. } | ProxyError::NoUpstream
            )
    }
}

/// `a: b: c` from an error and its sources, so the one log line says everything.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_mapped_in_one_place() {
        let cases = [
            (ProxyError::InvalidRequest("x".into()), 400),
            (
                ProxyError::ClientBody("invalid chunk size line".into()),
                400,
            ),
            (
                ProxyError::ClientTimeout {
                    after: Duration::from_secs(2),
                },
                408,
            ),
            (ProxyError::Unauthenticated("no token".into()), 401),
            (
                ProxyError::Unreachable {
                    server: "s".into(),
                    cause: "refused".into(),
                },
                503,
            ),
            (
                ProxyError::ConnectionLost {
                    server: "s".into(),
                    cause: "reset".into(),
                },
                503,
            ),
            (
                ProxyError::NotProcessed {
                    server: "s".into(),
                    why: "it went away before the stream",
                    sends: 3,
                },
                503,
            ),
            (
                ProxyError::Timeout {
                    server: "s".into(),
                    after: Duration::from_secs(1),
                },
                504,
            ),
            (
                ProxyError::BadReply {
                    server: "s".into(),
                    cause: "garbage".into(),
                },
                502,
            ),
            (ProxyError::NoUpstream, 503),
            (ProxyError::NoRoom, 503),
            (ProxyError::Offline("no cached list covers it".into()), 503),
            (
                ProxyError::NotCached {
                    group: String::new(),
                    resource: "pods".into(),
                    name: "p".into(),
                },
                404,
            ),
            (ProxyError::Expired("too old".into()), 410),
            (ProxyError::NotAcceptable("protobuf".into()), 406),
            (ProxyError::Cache("disk".into()), 503),
            (ProxyError::Internal("filter task panicked".into()), 500),
        ];
        for (err, code) in cases {
            let status = err.into_status();
            assert_eq!(status.code, code, "{status:?}");
            assert!(!status.message.is_empty());
        }
    }

    /// What the server never processed, its client may send again: said as kube-apiserver
    /// says it, so that client-go does (its rest client follows `Retry-After` on a 503).
    #[test]
    fn a_request_the_server_did_not_process_is_one_to_send_again() {
        let not_processed = ProxyError::NotProcessed {
            server: "s".into(),
            why: "it refused the stream",
            sends: 1,
        };
        assert_eq!(not_processed.into_status().retry_after_seconds, Some(1));
        let lost = ProxyError::ConnectionLost {
            server: "s".into(),
            cause: "reset".into(),
        };
        assert_eq!(lost.into_status().retry_after_seconds, None);
    }
}
