//! The apiservers behind the hub and the pooled TLS clients that reach them.
//!
//! Two hyper clients share the pool settings: one presents the node's client certificate, one
//! presents none (for callers with their own bearer token). [`Upstream::send`] performs one
//! exchange with a deadline on the response headers and sorts failures into the three upstream
//! error kinds the rest of the proxy understands (unreachable, timeout, bad reply).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_certs::UpstreamTls;

use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::health::ServerStates;

/// How requests are spread over several `--server-addr` entries (`--lb-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LbMode {
    /// Round-robin over the servers.
    #[default]
    RoundRobin,
    /// Always the first server in flag order.
    Priority,
}

/// One apiserver, as given in `--server-addr` (always https).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// `https://host:port`, used for building upstream URIs.
    pub base: Uri,
}

impl Server {
    /// Parses one `--server-addr` entry: a missing scheme means https, any other scheme is refused.
    pub fn parse(addr: &str) -> Result<Server, String> {
        let addr = addr.trim().trim_end_matches('/');
        if addr.is_empty() {
            return Err("empty server address".into());
        }
        let with_scheme = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("https://{addr}")
        };
        let uri: Uri = with_scheme
            .parse()
            .map_err(|e| format!("invalid server address {addr:?}: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!(
                "server address {addr:?} must use https (got scheme {:?})",
                uri.scheme_str().unwrap_or_default()
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("server address {addr:?} has no host"))?;
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(format!("server address {addr:?} must not have a path"));
        }
        let base = Uri::builder()
            .scheme("https")
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| format!("invalid server address {addr:?}: {e}"))?;
        Ok(Server { base })
    }

    /// `https://host:port` without the trailing slash, for logs and metric labels.
    pub fn label(&self) -> String {
        format!(
            "https://{}",
            self.base
                .authority()
                .map(|a| a.as_str())
                .unwrap_or_default()
        )
    }

    fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let authority = self.base.authority().cloned().unwrap_or_else(|| {
            // Server::parse guarantees an authority; this branch only keeps the function total.
            http::uri::Authority::from_static("invalid")
        });
        Uri::builder()
            .scheme("https")
            .authority(authority)
            .path_and_query(path_and_query)
            .build()
    }
}

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
}

/// Which credentials the upstream request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The node's client certificate (the hub's own identity).
    Node,
    /// No client certificate: the caller's `Authorization: Bearer` header authenticates.
    Bearer,
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, ProxyBody>;

/// The pool of apiservers and the clients that talk to them.
pub struct Upstream {
    states: Arc<ServerStates>,
    lb_mode: LbMode,
    next: AtomicUsize,
    node_client: HttpsClient,
    bearer_client: HttpsClient,
    request_timeout: Duration,
}

impl Upstream {
    /// `states` holds the same servers as `config.servers`, with their health.
    pub fn new(config: UpstreamConfig, states: Arc<ServerStates>) -> Upstream {
        let node_client = https_client(&config, Identity::Node);
        let bearer_client = https_client(&config, Identity::Bearer);
        Upstream {
            states,
            lb_mode: config.lb_mode,
            next: AtomicUsize::new(0),
            node_client,
            bearer_client,
            request_timeout: config.request_timeout,
        }
    }

    pub fn states(&self) -> &Arc<ServerStates> {
        &self.states
    }

    /// A healthy server for the next request, per `--lb-mode`: round-robin over the healthy
    /// ones, or the first healthy one in flag order. `None` when none is healthy.
    pub fn pick(&self) -> Option<&Server> {
        let healthy: Vec<usize> = (0..self.states.len())
            .filter(|&i| self.states.is_healthy(i))
            .collect();
        let index = match self.lb_mode {
            LbMode::Priority => *healthy.first()?,
            LbMode::RoundRobin => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                *healthy.get(n % healthy.len().max(1))?
            }
        };
        self.states.server(index)
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
    ) -> Result<Response<Incoming>, ProxyError> {
        let path_and_query = req
            .uri()
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();
        *req.uri_mut() = server
            .uri_for(&path_and_query)
            .map_err(|e| ProxyError::InvalidRequest(format!("cannot build upstream URI: {e}")))?;
        let client = match identity {
            Identity::Node => &self.node_client,
            Identity::Bearer => &self.bearer_client,
        };
        match tokio::time::timeout(deadline, client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(classify_client_error(server, &e)),
            Err(_elapsed) => Err(ProxyError::Timeout {
                server: server.label(),
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

impl Upstream {
    /// Sends one of the hub's own requests as the node and reads the whole (small) answer,
    /// bounded by the call's timeout for headers and body alike.
    pub async fn own_call(
        &self,
        server: &Server,
        call: OwnCall<'_>,
    ) -> Result<(http::StatusCode, bytes::Bytes), String> {
        use http_body_util::BodyExt;
        let mut builder = Request::builder()
            .method(call.method)
            .uri(call.path)
            .header(http::header::USER_AGENT, call.user_agent)
            .header(http::header::ACCEPT, "application/json");
        let body = match call.body {
            Some((content_type, value)) => {
                builder = builder.header(http::header::CONTENT_TYPE, content_type);
                crate::body::full(value.to_string())
            }
            None => crate::body::empty(),
        };
        let req = builder.body(body).map_err(|e| e.to_string())?;
        let resp = self
            .send(server, Identity::Node, req, call.timeout)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = tokio::time::timeout(call.timeout, resp.into_body().collect())
            .await
            .map_err(|_| format!("{} {}: response body timed out", call.user_agent, call.path))?
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, bytes))
    }
}

fn https_client(config: &UpstreamConfig, identity: Identity) -> HttpsClient {
    let tls = match identity {
        Identity::Node => config.tls.with_identity.as_ref().clone(),
        Identity::Bearer => config.tls.without_identity.as_ref().clone(),
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(30)));
    // HTTP/1.1 only: exec/attach/port-forward need HTTP/1.1 upgrades end to end.
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(25)
        .build(connector)
}

/// Sorts a client error into unreachable (connect/TLS, or the connection lost before any
/// answer: a server going away while a pooled connection was in use) or bad reply (anything
/// the server did answer that is not HTTP).
fn classify_client_error(server: &Server, err: &hyper_util::client::legacy::Error) -> ProxyError {
    let cause = error_chain(err);
    if err.is_connect() || connection_lost(err) {
        ProxyError::Unreachable {
            server: server.label(),
            cause,
        }
    } else {
        ProxyError::BadReply {
            server: server.label(),
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

/// `a: b: c` from an error and its sources, so the one log line says everything.
fn error_chain(err: &dyn std::error::Error) -> String {
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
