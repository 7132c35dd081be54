//! What the hub's own reads from the cloud share: how they are sent and how a failure is worded
//! ([`OwnGets`]), and whether what they keep has been read yet ([`SyncState`], for readiness).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::BodyExt;
use outpost_core::RequestInfo;
use outpost_core::wire::LineFramer;
use outpost_proxy::error::{BoxError, ProxyError};
use outpost_proxy::upstream::{Identity, Server, Upstream};
use outpost_proxy::{body, encoding};

/// How long one of the hub's own watches lasts before it is opened again.
pub const WATCH_TIMEOUT_SECONDS: u64 = 300;
/// The longest wait before a failed read is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Whether the configuration has been read, for readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncState {
    /// Nothing read yet, and no error either.
    Pending,
    /// Read from the cloud or from the cached copy.
    Synced { source: String },
    /// Never read, and the last attempt failed (an RBAC 403, say).
    Failing { cause: String },
}

/// The hub's own GETs (get, list, watch) to the cloud, as the node: who asks, and how a failure
/// is worded. Shared by the reflectors and the `yurt-hub-cfg` watch.
#[derive(Debug, Clone, Copy)]
pub struct OwnGets {
    /// For errors and logs (`side-data watch`).
    pub label: &'static str,
    pub user_agent: &'static str,
}

impl OwnGets {
    /// One GET to a healthy server, JSON asked for; long enough for a watch.
    pub async fn send(
        self,
        upstream: &Upstream,
        path: &str,
    ) -> Result<http::Response<hyper::body::Incoming>, ProxyError> {
        let server = upstream.pick().ok_or(ProxyError::NoUpstream)?;
        self.send_to(upstream, server, path).await
    }

    /// [`Self::send`] to a given server.
    pub async fn send_to(
        self,
        upstream: &Upstream,
        server: &Server,
        path: &str,
    ) -> Result<http::Response<hyper::body::Incoming>, ProxyError> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(http::header::USER_AGENT, self.user_agent)
            .header(http::header::ACCEPT, "application/json")
            .body(body::empty())
            .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
        let info = RequestInfo::classify(&Method::GET, path, Some(self.user_agent))
            .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
        encoding::ask_for_gzip(info.verb, req.headers_mut());
        let deadline = Duration::from_secs(WATCH_TIMEOUT_SECONDS + 30);
        upstream.send(server, Identity::Node, req, deadline).await
    }

    /// A failed read of the cloud's answer, `cause` being why (a message, or the error itself).
    pub fn bad_reply(self, cause: impl Into<BoxError>) -> ProxyError {
        ProxyError::BadReply {
            server: self.label.into(),
            cause: cause.into(),
        }
    }

    /// The whole body of the answer to [`Self::send`] of `path`, decoded if it came compressed;
    /// its WAN bytes counted (`outpost_upstream_received_bytes_total`).
    pub async fn collect(
        self,
        upstream: &Upstream,
        path: &str,
        resp: http::Response<hyper::body::Incoming>,
    ) -> Result<Bytes, ProxyError> {
        let resource = RequestInfo::classify(&Method::GET, path, Some(self.user_agent))
            .map(|info| info.resource_label())
            .unwrap_or_default();
        let (parts, body) = resp.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| self.bad_reply(e))?;
        encoding::received_counter(upstream.received_bytes(), &resource, &parts.headers)
            .inc_by(bytes.len() as u64);
        encoding::decoded_bytes(&parts.headers, bytes).map_err(|e| self.bad_reply(e))
    }

    pub async fn next_line(
        self,
        body: &mut hyper::body::Incoming,
        framer: &mut LineFramer,
    ) -> Result<Option<Bytes>, ProxyError> {
        body::next_line(body, framer)
            .await
            .map_err(|e| self.bad_reply(e))
    }
}
