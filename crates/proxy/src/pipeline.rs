//! The request lifecycle, written down once and read top to bottom:
//!
//! ```text
//!   client ──▶ 1. classify ──▶ 2. route ──┬─▶ 3a. remote ──(tee)──┬─▶ 4. respond ──▶ client
//!              RequestInfo      Route      │   Upstream (TLS)      │   Status on error,
//!              (400 if bad)     CachePlan  └─▶ 3b. cache ──────────┘   metrics, logs
//!                                               (edge mode, cloud unreachable)
//! ```
//!
//! 1. [`classify`]: one [`RequestInfo`] per request (kube-apiserver's rules); a request the
//!    apiserver would reject is answered `400` here, without touching upstream.
//! 2. [`route::decide`]: which identity to present, whether this is a protocol switch, and in
//!    edge mode the cache's part ([`CachePlan`]) and whether the cloud is known to be down.
//! 3. [`Pipeline::remote`] / [`Pipeline::tunnel`]: one exchange with an apiserver, bodies
//!    streaming both ways; in edge mode a good response is teed into the cache, and an upstream
//!    failure on a cached read falls back to 3b. 3b, [`Edge::serve`]: the cloud is unreachable,
//!    the cache answers (or a Status says why it cannot).
//! 4. [`Pipeline::respond`]: errors become Kubernetes `Status` bodies (in
//!    [`ProxyError::into_status`]), and every response is counted and logged once.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use outpost_core::{RequestInfo, Status};
use tracing::{debug, warn};

use crate::body::{self, ProxyBody};
use crate::edge::{CachePlan, Edge};
use crate::error::ProxyError;
use crate::headers;
use crate::metrics::Metrics;
use crate::route::{self, Route};
use crate::upstream::Upstream;

/// What every request handler shares.
pub struct Pipeline {
    pub upstream: Arc<Upstream>,
    pub metrics: Metrics,
    /// Edge mode only.
    pub edge: Option<Edge>,
    /// Ends background work started by requests (the cloud prober).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Pipeline {
    /// Serves one client request through all four stages.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let started = Instant::now();
        let info = match classify(&req) {
            Ok(info) => info,
            Err(err) => return self.respond(None, Err(err), started, None),
        };
        let in_flight = InFlight::enter(&self.metrics, &info);
        let route = route::decide(&info, req.headers(), self.edge.as_ref());
        let result = match (&self.edge, route.cache.clone()) {
            _ if route.tunnel => self.tunnel(route, &info, req).await,
            (Some(edge), Some(plan)) if route.local => edge.serve(plan, &info, req.headers()).await,
            _ => self.remote(route, &info, req).await,
        };
        self.respond(Some(&info), result, started, Some(in_flight))
    }

    /// Stage 3a: one exchange with an apiserver, streaming the bodies; in edge mode the response
    /// is teed into the cache, and a cached read whose upstream fails is answered locally.
    async fn remote(
        &self,
        route: Route,
        info: &RequestInfo,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let headers = req.headers().clone();
        let server = self.upstream.pick().ok_or(ProxyError::NoUpstream)?;
        let deadline = self.deadline(info, route.cache.as_ref());
        let mut upstream_req = upstream_request(req, false);
        if let (Some(edge), Some(plan)) = (&self.edge, &route.cache) {
            edge.prepare_upstream(plan, upstream_req.headers_mut());
        }
        let send = self
            .upstream
            .send(server, route.identity, upstream_req, deadline);
        let Some(edge) = &self.edge else {
            let resp = send
                .await
                .inspect_err(|e| self.count_upstream_error(&server.label(), e))?;
            return Ok(client_response(resp, false));
        };
        let sent = match &route.cache {
            // A cached read stops waiting as soon as the cloud is known to be down.
            Some(_) => tokio::select! {
                sent = send => sent,
                _ = edge.cloud().went_offline() => {
                    Err(ProxyError::Offline("stopped waiting for it".into()))
                }
            },
            None => send.await,
        }
        .inspect_err(|e| self.count_upstream_error(&server.label(), e));
        let failure = match &sent {
            Err(e) if e.is_upstream() => Some(e.to_string()),
            Ok(resp) if is_cloud_failure(resp.status()) => {
                Some(format!("{} answered {}", server.label(), resp.status()))
            }
            _ => None,
        };
        let gave_up = matches!(sent, Err(ProxyError::Offline(_)));
        match &failure {
            Some(cause) => {
                edge.cloud()
                    .report_failure(cause, self.upstream.clone(), self.shutdown.clone())
            }
            None if sent.is_ok() => edge.cloud().report_success(),
            None => {}
        }
        if let (true, Some(plan)) = (failure.is_some() || gave_up, &route.cache) {
            return edge.serve(plan.clone(), info, &headers).await;
        }
        let resp = client_response(sent?, false);
        Ok(match &route.cache {
            Some(plan) => edge.tee(plan, resp),
            None => resp,
        })
    }

    /// How long to wait for response headers. A cached read gives up 2 s before the client's own
    /// `?timeout=`, like yurthub, so the cache can still answer in time.
    fn deadline(&self, info: &RequestInfo, plan: Option<&CachePlan>) -> std::time::Duration {
        const CACHE_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);
        let client = info.query.timeout;
        let client = match (plan, client) {
            (Some(CachePlan::Object { .. } | CachePlan::List { .. }), Some(t))
                if t > CACHE_MARGIN =>
            {
                Some(t - CACHE_MARGIN)
            }
            _ => client,
        };
        self.upstream.header_deadline(client)
    }

    /// Stage 3 for exec / attach / port-forward: forward the upgrade, then splice both sockets.
    async fn tunnel(
        &self,
        route: Route,
        info: &RequestInfo,
        mut req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let client_side = hyper::upgrade::on(&mut req);
        let server = self.upstream.pick().ok_or(ProxyError::NoUpstream)?;
        let deadline = self.upstream.header_deadline(info.query.timeout);
        let upstream_req = upstream_request(req, true);
        let mut resp = self
            .upstream
            .send(server, route.identity, upstream_req, deadline)
            .await
            .inspect_err(|e| self.count_upstream_error(&server.label(), e))?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let upstream_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(splice(client_side, upstream_side));
            return Ok(client_response(resp, true));
        }
        // The apiserver refused the switch (401/403/404…): relay its answer as a plain response.
        Ok(client_response(resp, false))
    }

    /// Stage 4: turn errors into Status bodies, count and log once, attach stream accounting.
    fn respond(
        &self,
        info: Option<&RequestInfo>,
        result: Result<Response<ProxyBody>, ProxyError>,
        started: Instant,
        in_flight: Option<InFlight>,
    ) -> Response<ProxyBody> {
        let verb = info.map_or("unknown", |i| i.verb.as_str());
        let resource = info.map(RequestInfo::resource_label).unwrap_or_default();
        let component = info
            .and_then(|i| i.component.clone())
            .unwrap_or_else(|| "none".to_owned());
        let resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                warn!(verb, resource, component, error = %err, "request failed");
                status_response(err.into_status())
            }
        };
        let code = resp.status().as_u16();
        debug!(
            verb,
            resource,
            component,
            path = info.map_or("", |i| i.path.as_str()),
            code,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "request"
        );
        self.metrics
            .requests
            .with_label_values(&[
                component.as_str(),
                verb,
                resource.as_str(),
                &code.to_string(),
            ])
            .inc();
        self.metrics
            .latency
            .with_label_values(&[verb])
            .observe(started.elapsed().as_secs_f64());
        self.observe_body(resp, &component, in_flight)
    }

    /// Counts response bytes and keeps the request "in flight" until its body is done or dropped.
    fn observe_body(
        &self,
        resp: Response<ProxyBody>,
        component: &str,
        in_flight: Option<InFlight>,
    ) -> Response<ProxyBody> {
        let bytes = self.metrics.response_bytes.with_label_values(&[component]);
        resp.map(|b| {
            b.map_frame(move |frame| {
                let _still_in_flight = &in_flight;
                if let Some(data) = frame.data_ref() {
                    bytes.inc_by(data.len() as u64);
                }
                frame
            })
            .boxed()
        })
    }

    fn count_upstream_error(&self, server: &str, err: &ProxyError) {
        self.metrics
            .upstream_errors
            .with_label_values(&[server, err.kind()])
            .inc();
    }
}

/// Stage 1: classify the request once; later stages only read the result.
pub fn classify<B>(req: &Request<B>) -> Result<RequestInfo, ProxyError> {
    let path_and_query = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    Ok(RequestInfo::classify(
        req.method(),
        path_and_query,
        user_agent,
    )?)
}

/// An upstream answer that means "this apiserver cannot serve now" (501 is a real answer).
fn is_cloud_failure(status: StatusCode) -> bool {
    status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED
}

/// The client's request, rewritten for the upstream hop (headers cleaned, body streamed).
fn upstream_request(req: Request<Incoming>, tunnel: bool) -> Request<ProxyBody> {
    let (mut parts, incoming) = req.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, tunnel);
    // The upstream's own authority goes into Host (set by the client from the URI).
    parts.headers.remove(header::HOST);
    parts.version = http::Version::HTTP_11;
    parts.extensions = http::Extensions::new();
    Request::from_parts(parts, body::stream(incoming))
}

/// The upstream's response, rewritten for the client hop.
fn client_response(resp: Response<Incoming>, switching: bool) -> Response<ProxyBody> {
    let (mut parts, incoming) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, switching);
    parts.extensions = http::Extensions::new();
    Response::from_parts(parts, body::stream(incoming))
}

/// A Kubernetes Status as a complete HTTP response.
pub fn status_response(status: Status) -> Response<ProxyBody> {
    let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = Response::new(body::full(status.to_json()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = status.retry_after_seconds {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    resp
}

/// Copies bytes both ways between the client's and the apiserver's upgraded connections.
async fn splice(client: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            warn!(error = %e, "protocol upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => debug!(bytes_up = up, bytes_down = down, "tunnel closed"),
        Err(e) => debug!(error = %e, "tunnel ended with an error"),
    }
}

/// Decrements the in-flight gauge when the response (or its stream) is finished or dropped.
struct InFlight(prometheus::IntGauge);

impl InFlight {
    fn enter(metrics: &Metrics, info: &RequestInfo) -> InFlight {
        let component = info.component.as_deref().unwrap_or("none");
        let gauge = metrics
            .in_flight
            .with_label_values(&[component, info.verb.as_str()]);
        gauge.inc();
        InFlight(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
