//! The apiservers behind the hub and the pooled TLS clients that reach them.
//!
//! Two hyper clients share the pool settings: one presents the node's client certificate, one
//! presents none (for callers with their own bearer token). [`Upstream::send`] performs one
//! exchange with a deadline on the response headers and sorts failures into the upstream error
//! kinds the rest of the proxy understands: unreachable (the connect failed), connection lost
//! (after the request was sent), timeout, bad reply.
//! [`Upstream::replace_tls`] swaps both clients when kubelet rotates the certificate the hub
//! borrows (the node agent watches for that); requests already under way finish on the old ones.
//! [`ServerStates`] ([`states`]) is which servers are healthy.
//!
//! Requests go over HTTP/2 when the server offers it ([`h2`]: one connection per server and
//! identity, a second at the server's stream limit); upgrades (exec, attach, port-forward) and
//! servers without HTTP/2 use the pooled HTTP/1.1 client, as does `--disable-http2`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::{Request, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_certs::{IdentityInfo, UpstreamTls};
use prometheus::{IntCounterVec, IntGaugeVec};
use tokio::sync::watch;

use crate::body::ProxyBody;
use crate::connections::Counting;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use h2::{Dispatch, H2Client};

mod answer;
mod frames;
pub mod h2;
mod server;
pub mod states;

pub use answer::{BodyError, UpstreamBody};
pub use h2::Http2Config;
pub use server::{LbMode, Server, ServerAddrError};
pub use states::ServerStates;

/// Settings of the upstream side.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub servers: Vec<Server>,
    pub lb_mode: LbMode,
    /// TCP connect limit; the TLS handshake falls under the header deadline.
    pub connect_timeout: Duration,
    /// Longest wait for response headers when the client set no shorter `?timeout=`.
    pub request_timeout: Duration,
    pub tls: UpstreamTls,
    pub http2: Http2Config,
}

/// Which credentials the upstream request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The node's client certificate (the hub's own identity).
    Node,
    /// No client certificate: the caller's `Authorization: Bearer` header authenticates.
    Bearer,
}

type HttpsClient = Client<HttpsConnector<Counting>, ProxyBody>;

/// The pool of apiservers and the clients that talk to them.
pub struct Upstream {
    states: Arc<ServerStates>,
    lb_mode: LbMode,
    next: AtomicUsize,
    clients: RwLock<Clients>,
    /// The certificate the node client presents; readiness and metrics follow it.
    identity: watch::Sender<IdentityInfo>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Open connections per server, shared by every pool (see [`crate::connections`]).
    connections: IntGaugeVec,
    /// Open HTTP/2 streams per server.
    streams: IntGaugeVec,
    http2: Http2Config,
    /// `outpost_upstream_received_bytes_total`, for readers of upstream bodies.
    received_bytes: IntCounterVec,
}

/// The clients built from one [`UpstreamTls`]: HTTP/1.1 always, HTTP/2 unless disabled.
struct Clients {
    node: HttpsClient,
    bearer: HttpsClient,
    node_h2: Option<Arc<H2Client>>,
    bearer_h2: Option<Arc<H2Client>>,
    tls: UpstreamTls,
}

impl Clients {
    fn new(tls: UpstreamTls, upstream: &ClientSettings<'_>) -> Clients {
        let client = |config: &rustls::ClientConfig| {
            https_client(
                config.clone(),
                upstream.connect_timeout,
                upstream.connections.clone(),
            )
        };
        let h2 = |config: &rustls::ClientConfig| {
            upstream.http2.enabled.then(|| {
                Arc::new(H2Client::new(
                    *upstream.http2,
                    config.clone(),
                    Counting::new(
                        tcp_connector(upstream.connect_timeout),
                        upstream.connections.clone(),
                    ),
                    upstream.streams.clone(),
                    upstream.states.clone(),
                ))
            })
        };
        Clients {
            node: client(&tls.with_identity),
            bearer: client(&tls.without_identity),
            node_h2: h2(&tls.with_identity),
            bearer_h2: h2(&tls.without_identity),
            tls,
        }
    }
}

/// What building [`Clients`] takes besides the TLS identity.
struct ClientSettings<'a> {
    connect_timeout: Duration,
    connections: &'a IntGaugeVec,
    streams: &'a IntGaugeVec,
    http2: &'a Http2Config,
    states: &'a Arc<ServerStates>,
}

impl Upstream {
    /// `states` holds the same servers as `config.servers`, with their health.
    /// `metrics`: where open connections and streams are counted
    /// (`outpost_upstream_connections`, `outpost_upstream_streams`).
    pub fn new(config: UpstreamConfig, states: Arc<ServerStates>, metrics: &Metrics) -> Upstream {
        let identity = watch::Sender::new(config.tls.identity.clone());
        let connections = metrics.upstream_connections.clone();
        let streams = metrics.upstream_streams.clone();
        let clients = Clients::new(
            config.tls,
            &ClientSettings {
                connect_timeout: config.connect_timeout,
                connections: &connections,
                streams: &streams,
                http2: &config.http2,
                states: &states,
            },
        );
        Upstream {
            states,
            lb_mode: config.lb_mode,
            next: AtomicUsize::new(0),
            clients: RwLock::new(clients),
            identity,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            connections,
            streams,
            http2: config.http2,
            received_bytes: metrics.upstream_received_bytes.clone(),
        }
    }

    /// Where the readers of upstream bodies count their bytes, by resource and encoding.
    pub fn received_bytes(&self) -> &IntCounterVec {
        &self.received_bytes
    }

    /// The client certificate presented now, and its changes.
    pub fn identity(&self) -> watch::Receiver<IdentityInfo> {
        self.identity.subscribe()
    }

    /// The TLS identity requests present now.
    pub fn tls(&self) -> UpstreamTls {
        self.clients
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .tls
            .clone()
    }

    /// Presents `tls` from the next request on: new clients with their own connection pools.
    pub fn replace_tls(&self, tls: UpstreamTls) {
        let identity = tls.identity.clone();
        let clients = Clients::new(
            tls,
            &ClientSettings {
                connect_timeout: self.connect_timeout,
                connections: &self.connections,
                streams: &self.streams,
                http2: &self.http2,
                states: &self.states,
            },
        );
        *self.clients.write().unwrap_or_else(|e| e.into_inner()) = clients;
        self.identity.send_replace(identity);
    }

    /// The current HTTP/1.1 client for `identity`. Cloned, so the lock is held only to look.
    fn http1_for(&self, identity: Identity) -> HttpsClient {
        let clients = self.clients.read().unwrap_or_else(|e| e.into_inner());
        match identity {
            Identity::Node => clients.node.clone(),
            Identity::Bearer => clients.bearer.clone(),
        }
    }

    /// The current HTTP/2 client for `identity`, unless HTTP/2 is disabled. Looked up apart
    /// from [`Self::http1_for`]: a request over HTTP/2 does not clone the HTTP/1.1 client.
    fn http2_for(&self, identity: Identity) -> Option<Arc<H2Client>> {
        let clients = self.clients.read().unwrap_or_else(|e| e.into_inner());
        match identity {
            Identity::Node => clients.node_h2.clone(),
            Identity::Bearer => clients.bearer_h2.clone(),
        }
    }

    /// One exchange: over HTTP/2 when the server speaks it and `req` is no upgrade (those
    /// need HTTP/1.1 end to end), else over the pooled HTTP/1.1 client.
    async fn start(
        &self,
        server: &Server,
        identity: Identity,
        req: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let upgrade = req.headers().contains_key(http::header::UPGRADE);
        let req = match self.http2_for(identity) {
            Some(h2) if !upgrade => match h2.dispatch(server, req).await {
                Dispatch::Http2(answered) => return answered,
                Dispatch::Http1(req) => req,
            },
            _ => req,
        };
        self.http1_for(identity)
            .request(req)
            .await
            .map(|resp| resp.map(UpstreamBody::Http1))
            .map_err(|e| classify_client_error(server, e))
    }

    /// HTTP/2 connections open to `server` with the node's identity, as (open streams, the
    /// server's stream limit) each; empty with HTTP/2 disabled.
    pub fn http2_connections(&self, server: &Server) -> Vec<(usize, u32)> {
        self.http2_for(Identity::Node)
            .map(|h2| h2.connections(server))
            .unwrap_or_default()
    }

    pub fn states(&self) -> &Arc<ServerStates> {
        &self.states
    }

    /// A healthy server for the next request, per `--lb-mode`: round-robin over the healthy
    /// ones, or the first healthy one in flag order. `None` when none is healthy.
    pub fn pick(&self) -> Option<&Server> {
        self.pick_except(None)
    }

    /// [`Self::pick`], leaving `excluded` out (the server a retry must not go back to).
    pub fn pick_except(&self, excluded: Option<&Server>) -> Option<&Server> {
        let excluded = excluded.and_then(|s| self.states.index_of(s));
        let healthy = || {
            (0..self.states.len())
                .filter(move |&i| self.states.is_healthy(i) && Some(i) != excluded)
        };
        let index = match self.lb_mode {
            LbMode::Priority => healthy().next()?,
            LbMode::RoundRobin => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                healthy().nth(n % healthy().count().max(1))?
            }
        };
        self.states.server(index)
    }

    /// Whether a healthy server other than `server` could take a retry.
    pub fn has_other_healthy(&self, server: &Server) -> bool {
        let this = self.states.index_of(server);
        (0..self.states.len()).any(|i| Some(i) != this && self.states.is_healthy(i))
    }

    /// The deadline for response headers: the client's own `?timeout=` when shorter.
    pub fn header_deadline(&self, client_timeout: Option<Duration>) -> Duration {
        client_timeout
            .filter(|t| !t.is_zero())
            .map_or(self.request_timeout, |t| t.min(self.request_timeout))
    }

    /// Sends `req` (whose URI holds only path and query) to `server` and waits for the headers.
    pub async fn send(
        &self,
        server: &Server,
        identity: Identity,
        mut req: Request<ProxyBody>,
        deadline: Duration,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        // Cloned, not parsed again: the client's path and query are already checked.
        let path_and_query = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        *req.uri_mut() = server
            .uri_for(path_and_query)
            .map_err(|e| ProxyError::InvalidRequest(format!("cannot build upstream URI: {e}")))?;
        match tokio::time::timeout(deadline, self.start(server, identity, req)).await {
            Ok(answered) => answered,
            Err(_elapsed) => Err(ProxyError::Timeout {
                server: server.label().to_owned(),
                after: deadline,
            }),
        }
    }
}

/// One of the hub's own requests: who asks, and with what body.
pub struct OwnCall<'a> {
    pub method: http::Method,
    pub path: &'a str,
    /// The hub's component name for this call (`outpost/heartbeat`…), so it shows in audit logs.
    pub user_agent: &'static str,
    /// `(content type, JSON)` for writes.
    pub body: Option<(&'static str, serde_json::Value)>,
    pub timeout: Duration,
}

/// Why one of the hub's own calls has no answer.
#[derive(Debug, thiserror::Error)]
pub enum OwnCallError {
    /// No server is healthy: the hub is offline.
    #[error("no healthy apiserver")]
    Offline,
    /// The call cannot be made into a request (an unusable path).
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error(transparent)]
    Exchange(#[from] ProxyError),
    #[error("{user_agent} {path}: response body timed out")]
    BodyTimedOut {
        user_agent: &'static str,
        path: String,
    },
    #[error(transparent)]
    Body(#[from] BodyError),
}

impl Upstream {
    /// [`Upstream::own_call`] to a healthy server, picked per `--lb-mode`.
    pub async fn own_call_any(
        &self,
        call: OwnCall<'_>,
    ) -> Result<(http::StatusCode, bytes::Bytes), OwnCallError> {
        let server = self.pick().ok_or(OwnCallError::Offline)?;
        self.own_call(server, call).await
    }

    /// Sends one of the hub's own requests as the node and reads the whole (small) answer,
    /// bounded by the call's timeout for headers and body alike.
    pub async fn own_call(
        &self,
        server: &Server,
        call: OwnCall<'_>,
    ) -> Result<(http::StatusCode, bytes::Bytes), OwnCallError> {
        use http_body_util::BodyExt;
        // A GET that finds its pooled connection gone (the server restarted, a link came back)
        // is sent once more on a fresh one, as the pipeline retries its reads.
        let attempts = if call.method == http::Method::GET {
            2
        } else {
            1
        };
        let mut sent = Err(ProxyError::NoUpstream);
        for _ in 0..attempts {
            sent = self
                .send(server, Identity::Node, own_request(&call)?, call.timeout)
                .await;
            if !sent.as_ref().is_err_and(ProxyError::is_connection_failure) {
                break;
            }
        }
        let resp = sent?;
        let status = resp.status();
        let bytes = tokio::time::timeout(call.timeout, resp.into_body().collect())
            .await
            .map_err(|_| OwnCallError::BodyTimedOut {
                user_agent: call.user_agent,
                path: call.path.to_owned(),
            })??
            .to_bytes();
        Ok((status, bytes))
    }
}

/// The HTTP request for one of the hub's own calls.
fn own_request(call: &OwnCall<'_>) -> Result<Request<ProxyBody>, http::Error> {
    let mut builder = Request::builder()
        .method(call.method.clone())
        .uri(call.path)
        .header(http::header::USER_AGENT, call.user_agent)
        .header(http::header::ACCEPT, "application/json");
    let body = match &call.body {
        Some((content_type, value)) => {
            builder = builder.header(http::header::CONTENT_TYPE, *content_type);
            crate::body::full(value.to_string())
        }
        None => crate::body::empty(),
    };
    builder.body(body)
}

fn https_client(
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
    connections: IntGaugeVec,
) -> HttpsClient {
    // HTTP/1.1 only: exec/attach/port-forward need HTTP/1.1 upgrades end to end.
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(Counting::new(tcp_connector(connect_timeout), connections));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(25)
        .build(connector)
}

/// The TCP side of every upstream connection.
fn tcp_connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    // yurthub's 30 s keepalive, with probes every 10 s and 3 tries, so that a connection whose
    // peer vanished is given up within a minute rather than Linux's default 11 minutes.
    http.set_keepalive(Some(Duration::from_secs(30)));
    http.set_keepalive_interval(Some(Duration::from_secs(10)));
    http.set_keepalive_retries(Some(3));
    http
}

/// Sorts a client error into unreachable (connect/TLS, or the connection lost before any
/// answer: a server going away while a pooled connection was in use) or bad reply (anything
/// the server did answer that is not HTTP).
fn classify_client_error(server: &Server, err: hyper_util::client::legacy::Error) -> ProxyError {
    let lost = connection_lost(&err);
    let cause = Box::new(err);
    if cause.is_connect() {
        ProxyError::Unreachable {
            server: server.label().to_owned(),
            cause,
        }
    } else if lost {
        ProxyError::ConnectionLost {
            server: server.label().to_owned(),
            cause,
        }
    } else {
        ProxyError::BadReply {
            server: server.label().to_owned(),
            cause,
        }
    }
}

/// Whether the connection closed or reset under the request, before a response arrived.
fn connection_lost(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_closed())
        {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lost_under_a_request_counts_as_unreachable() {
        use std::io::{Error, ErrorKind};
        #[derive(Debug)]
        struct Wrapped(Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("send request")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let eof = Wrapped(Error::new(ErrorKind::UnexpectedEof, "no close_notify"));
        assert!(connection_lost(&eof));
        assert!(connection_lost(&Error::from(ErrorKind::ConnectionReset)));
        assert!(!connection_lost(&Wrapped(Error::other("bad header"))));
    }

    #[test]
    fn server_addr_rules() {
        assert_eq!(
            Server::parse("10.0.0.1:6443").unwrap().label(),
            "https://10.0.0.1:6443"
        );
        assert_eq!(
            Server::parse("https://api.example:6443/").unwrap().label(),
            "https://api.example:6443"
        );
        assert!(
            Server::parse("http://10.0.0.1:6443")
                .unwrap_err()
                .to_string()
                .contains("must use https")
        );
        assert!(Server::parse("").is_err());
        assert!(Server::parse("https://h:1/prefix").is_err());
    }

    #[test]
    fn uri_keeps_path_and_query() {
        let s = Server::parse("127.0.0.1:1").unwrap();
        let uri = s.uri_for("/api/v1/pods?watch=true").unwrap();
        assert_eq!(
            uri.to_string(),
            "https://127.0.0.1:1/api/v1/pods?watch=true"
        );
    }
}
