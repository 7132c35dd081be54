//! The request lifecycle, written down once and read top to bottom:
//!
//! ```text
//!   client ─▶ 1. classify ─▶ 2. route ──┬─▶ 3a. remote ──(tee)──┬─▶ 4. filter ─▶ 5. respond ─▶ client
//!             RequestInfo     Route      │   Upstream (TLS)      │   Chain or     Status on error,
//!             (400 if bad)    CachePlan  ├─▶ 3s. shared cache ───┤   untouched    metrics, logs
//!                             Chain      └─▶ 3b. cache ──────────┘
//!                                             (edge mode, cloud unreachable)
//! ```
//!
//! 1. [`classify`]: one [`RequestInfo`] per request (kube-apiserver's rules); a request the
//!    apiserver would reject is answered `400` here, without touching upstream. On the secure
//!    port ([`crate::callers`]) a request without a bearer token is answered `401` here.
//! 2. [`route::decide`]: what serves the request ([`Serve`]: a tunnel, kubelet's requests the
//!    hub answers itself, the cache while the cloud is known to be down, or an apiserver), which
//!    identity to present, and in edge mode the cache's part ([`CachePlan`]); a secure-port
//!    caller's route also says whether the cache may answer its token.
//! 3. 3s: a LIST or WATCH of a pool-scope resource (Services, EndpointSlices) that the shared
//!    cache can answer exactly is answered from memory ([`crate::multiplexer`]). Otherwise
//!    `Pipeline::remote` / `Pipeline::tunnel`: one exchange with an apiserver, bodies
//!    streaming both ways (reads ask for gzip; [`crate::encoding`] decodes what the cache or the
//!    filters read); in edge mode a good response is teed into the cache, and an upstream
//!    failure on a cached read falls back to 3b. 3b, [`Edge::serve`]: the cloud is unreachable,
//!    the cache answers (or a Status says why it cannot).
//!    Edge mode also answers two of kubelet's requests itself: its own lease
//!    ([`crate::autonomy::lease`], the heartbeat's evidence) and, offline, its node-status
//!    PATCH ([`crate::autonomy::node_status`], replayed on reconnect).
//! 4. [`Filtering::apply`]: when filters apply ([`crate::filtering`]), the answer — from the
//!    cloud or the cache alike — is rewritten on its way out; the cache keeps the upstream truth.
//! 5. `Pipeline::respond`: errors become Kubernetes `Status` bodies (in
//!    [`ProxyError::into_status`]), and every response is counted and logged once.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use outpost_core::{RequestInfo, Status, Verb};
use tracing::{debug, warn};

use crate::autonomy::lease::LocalLease;
use crate::autonomy::tokens::{self, TokenKey, Tokens};
use crate::autonomy::{Autonomy, KubeletRequest};
use crate::body::{self, ProxyBody};
use crate::callers::{self, Entry, SecureCaller, VerifiedTokens};
use crate::edge::{CachePlan, Edge};
use crate::encoding;
use crate::error::ProxyError;
use crate::filtering::Filtering;
use crate::headers;
use crate::metrics::{Metrics, ResourceLabels};
use crate::multiplexer::Multiplexer;
use crate::objects;
use crate::route::{self, Route, Serve};
use crate::upstream::{Server, Upstream, UpstreamBody};

/// The secure port's answer to a request without a bearer token.
const NO_BEARER_TOKEN: &str =
    "Unauthorized: this port accepts only bearer tokens (Authorization: Bearer)";

/// A read is sent at most this often: once, again on a fresh connection or to another server,
/// and once more after the retry found its server refusing and moved on.
const MAX_READ_ATTEMPTS: usize = 3;

/// What every request handler shares.
pub struct Pipeline {
    pub upstream: Arc<Upstream>,
    pub metrics: Metrics,
    /// Edge mode only.
    pub edge: Option<Edge>,
    /// Edge mode only: kubelet's requests the hub answers itself (its lease, tokens,
    /// registration and node status while offline).
    pub autonomy: Option<Autonomy>,
    /// Response filters (absent when turned off entirely).
    pub filtering: Option<Arc<Filtering>>,
    /// The pool-scope shared cache (absent with no `--pool-scope-resources`).
    pub multiplexer: Option<Arc<Multiplexer>>,
    /// Secure-port tokens the apiserver has accepted (see [`crate::callers`]).
    pub verified_tokens: Arc<VerifiedTokens>,
}

impl Pipeline {
    /// Serves one client request, arrived on `entry`, through all five stages.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        entry: Entry,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let info = match classify(&req) {
            Ok(info) => info,
            Err(err) => return self.respond(None, Err(err), started, None),
        };
        // Only the secure port looks at who the caller is (the plain port is the node's own).
        let caller = match entry {
            Entry::Plain => None,
            Entry::Secure => match SecureCaller::of(req.headers()) {
                Some(caller) => Some(caller),
                None => {
                    let err = ProxyError::Unauthenticated(NO_BEARER_TOKEN.into());
                    return self.respond(Some(&info), Err(err), started, None);
                }
            },
        };
        let labels = crate::metrics::resource_labels(&info);
        let in_flight = InFlight::enter(&self.metrics, &info, labels);
        let (req, exchange) = self.exchange(req, &info, started, labels);
        let mut route = route::decide(
            &info,
            req.headers(),
            self.edge.as_ref(),
            self.autonomy.as_ref(),
            self.filtering.as_deref(),
        );
        if let Some(caller) = caller {
            let verified = self.verified_tokens.knows(&caller.token);
            route = route.for_secure_caller(caller, verified);
        }
        let chain = route.filter.clone();
        // A body held for the filters may fail after the headers came: the cache may answer.
        let fallback = match (&route.cache, &chain) {
            (Some(plan), Some(_)) if route.cache_may_answer && plan.answers_offline() => {
                Some((plan.clone(), req.headers().clone()))
            }
            _ => None,
        };
        let shared = self
            .multiplexer
            .as_ref()
            .and_then(|m| m.read(&info, req.headers()));
        let answered = shared.as_ref().and_then(|s| s.answer(&info));
        let result = match (answered, route.serve) {
            (Some(resp), _) => Ok(resp),
            // Boxed, as are other rare paths ([`cached_instead`]): their states are kilobytes,
            // and every request's future would otherwise carry (and move) the largest of them.
            (None, Serve::Tunnel) => Box::pin(self.tunnel(route, &info, req)).await,
            (None, Serve::Kubelet(which)) => {
                Box::pin(self.kubelet(which, route, &info, req, &exchange)).await
            }
            // Serve::Cache comes only with a cache plan, and so in edge mode.
            (None, Serve::Cache) => match (&self.edge, &route.cache) {
                (Some(edge), Some(plan)) => edge.serve(plan.clone(), &info, req.headers()).await,
                _ => self.remote(route, &info, req, &exchange).await,
            },
            (None, Serve::Remote) => self.remote(route, &info, req, &exchange).await,
        };
        if let (Some(shared), Ok(resp)) = (&shared, &result) {
            shared.learn(resp);
        }
        let result = match (&self.filtering, chain, result) {
            (Some(filtering), Some(chain), Ok(resp)) => {
                let filtered = filtering.apply(chain, info.verb, resp).await;
                self.after_failed_body(filtered, fallback, &info).await
            }
            (_, _, result) => result,
        };
        let result = result
            .map(|resp| encoding::for_client(resp, exchange.client_gzip))
            .map_err(|e| exchange.blame(e));
        self.respond(Some(&info), result, started, Some(in_flight))
    }

    /// The request with its body watched, and the bounds of the exchange: a request that is not
    /// long-running (a watch, logs, exec, proxy) must be over, response body included, by
    /// the client's `?timeout=` or else the upstream request timeout (60 s: kube-apiserver's
    /// `--request-timeout`, which caps `?timeout=` the same way). kube-apiserver gives a
    /// request no longer, so an answer that takes longer is not coming.
    fn exchange(
        &self,
        req: Request<Incoming>,
        info: &RequestInfo,
        started: Instant,
        labels: ResourceLabels,
    ) -> (Request<body::RequestBody>, Exchange) {
        let length = self.upstream.header_deadline(info.query.timeout);
        let deadline =
            (!info.is_long_running()).then(|| tokio::time::Instant::from_std(started) + length);
        let (parts, body) = req.into_parts();
        let (body, client_body) = body::from_client(body, deadline.map(|at| (at, length)));
        let exchange = Exchange {
            deadline,
            length,
            client_body,
            client_gzip: encoding::accepts_gzip(&parts.headers),
            labels,
        };
        (Request::from_parts(parts, body), exchange)
    }

    /// A cached read whose upstream body failed while it was collected (for the filters) is
    /// answered as one that failed before its headers ([`cached_instead`]).
    async fn after_failed_body(
        &self,
        result: Result<Response<ProxyBody>, ProxyError>,
        fallback: Option<(CachePlan, http::HeaderMap)>,
        info: &RequestInfo,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        match (&result, &self.edge, fallback) {
            (Err(e), Some(edge), Some((plan, headers))) if e.is_upstream() => {
                Box::pin(cached_instead(edge, plan, info, &headers, false))
                    .await
                    .unwrap_or(result)
            }
            _ => result,
        }
    }

    /// Stage 3b for kubelet's requests the hub answers itself ([`crate::autonomy`]).
    async fn kubelet(
        &self,
        which: KubeletRequest,
        route: Route,
        info: &RequestInfo,
        req: Request<body::RequestBody>,
        exchange: &Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let Some(autonomy) = &self.autonomy else {
            return self.remote(route, info, req, exchange).await;
        };
        match which {
            KubeletRequest::Lease => match &autonomy.lease {
                Some(lease) => self.kubelet_lease(lease, route, info, req, exchange).await,
                None => self.remote(route, info, req, exchange).await,
            },
            KubeletRequest::NodeStatus => match &autonomy.node_status {
                Some(status) => status.accept(req.into_body()).await,
                None => self.remote(route, info, req, exchange).await,
            },
            KubeletRequest::Token => {
                self.token(&autonomy.tokens, route, info, req, exchange)
                    .await
            }
            KubeletRequest::PodStatus => {
                let (parts, body) = req.into_parts();
                autonomy
                    .pods
                    .accept(info, &parts.headers, body.boxed_proxy())
                    .await
            }
            KubeletRequest::Event => {
                let (parts, body) = req.into_parts();
                autonomy
                    .events
                    .accept(info, &parts.headers, body.boxed_proxy())
                    .await
            }
            KubeletRequest::Registration => {
                let (parts, body) = req.into_parts();
                autonomy
                    .registration
                    .answer(&parts.headers, body.boxed_proxy())
                    .await
            }
        }
    }

    /// kubelet's TokenRequest: the cloud's answer is kept; when the cloud cannot answer, the
    /// kept one is ([`crate::autonomy::tokens`]). The request body is read first: it names
    /// the answer, and is sent again as it came.
    async fn token(
        &self,
        tokens: &Tokens,
        route: Route,
        info: &RequestInfo,
        req: Request<body::RequestBody>,
        exchange: &Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (parts, body) = req.into_parts();
        let request =
            objects::read_request(&parts.headers, body.boxed_proxy(), tokens::MAX_BODY).await?;
        let key = TokenKey::of(info, &request.object)?;
        let cloud_down = self.edge.as_ref().is_some_and(Edge::is_offline);
        if cloud_down {
            return tokens.answer(&key, &parts.headers).await;
        }
        let req = Request::from_parts(parts.clone(), body::full(request.bytes));
        let sent = self.remote_streamed(route, info, req, exchange).await;
        let cloud_failed = match &sent {
            Err(e) => e.is_upstream() || matches!(e, ProxyError::Offline(_)),
            Ok(resp) => is_cloud_failure(resp.status()),
        };
        if cloud_failed {
            if let Ok(kept) = tokens.answer(&key, &parts.headers).await {
                return Ok(kept);
            }
            return sent;
        }
        let resp = sent?;
        if resp.status() != StatusCode::CREATED {
            return Ok(resp);
        }
        let (resp_parts, body) = resp.into_parts();
        let answer = objects::read_bytes(body, tokens::MAX_BODY).await?;
        let content_type = resp_parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        tokens.remember(&key, content_type, answer.clone());
        Ok(Response::from_parts(resp_parts, body::full(answer)))
    }

    /// Stage 3b for kubelet's own lease (edge mode): answered locally; the first GET seeds the
    /// local copy from the cloud while it is reachable.
    async fn kubelet_lease(
        &self,
        lease: &LocalLease,
        route: Route,
        info: &RequestInfo,
        req: Request<body::RequestBody>,
        exchange: &Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let seeding =
            req.method() == http::Method::GET && lease.is_empty() && !route.cache_answers_locally();
        if !seeding {
            let (parts, body) = req.into_parts();
            return lease
                .serve(&parts.method, &parts.headers, body.boxed_proxy())
                .await;
        }
        let resp = self.remote(route, info, req, exchange).await?;
        if resp.status() != StatusCode::OK {
            return Ok(resp);
        }
        let (parts, body) = resp.into_parts();
        let bytes = body
            .collect()
            .await
            .map_err(|e| ProxyError::from_response_body(&e))?
            .to_bytes();
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        lease.seed(content_type, &bytes).await;
        Ok(Response::from_parts(parts, body::full(bytes)))
    }

    /// Stage 3a: one exchange with an apiserver, streaming the bodies. A read that fails to
    /// reach one server is retried once on another healthy one. In edge mode a good response is
    /// teed into the cache, and a cached read whose upstream fails is answered locally.
    async fn remote(
        &self,
        route: Route,
        info: &RequestInfo,
        req: Request<body::RequestBody>,
        exchange: &Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        self.remote_streamed(
            route,
            info,
            req.map(body::RequestBody::boxed_proxy),
            exchange,
        )
        .await
    }

    /// [`Self::remote`] for a request whose body is already a [`ProxyBody`].
    async fn remote_streamed(
        &self,
        route: Route,
        info: &RequestInfo,
        req: Request<ProxyBody>,
        exchange: &Exchange,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (parts, body) = req.into_parts();
        let attempts = self.attempts(&route, info, &parts, body, exchange).await;
        let Attempts {
            sent,
            outage,
            served_by,
        } = attempts;
        if let (Some(token), Ok(resp)) = (&route.token, &sent) {
            self.judge_token(token, resp.status());
        }
        let Some(edge) = &self.edge else {
            let resp = self.received(&route, exchange, sent?);
            return Ok(ended_by(outage, exchange.bound(resp, served_by)));
        };
        let fall_back = match &sent {
            Err(e) => e.is_upstream() || matches!(e, ProxyError::Offline(_)),
            Ok(resp) => is_cloud_failure(resp.status()),
        };
        let readable = route.cache.as_ref().filter(|plan| plan.answers_offline());
        if let (true, Some(plan)) = (fall_back, readable) {
            if !route.cache_may_answer {
                return Err(ProxyError::Offline(
                    "the apiserver never accepted this bearer token, so the edge cache does not answer it"
                        .into(),
                ));
            }
            let gave_up = matches!(sent, Err(ProxyError::Offline(_)));
            if let Some(cached) = Box::pin(cached_instead(
                edge,
                plan.clone(),
                info,
                &parts.headers,
                gave_up,
            ))
            .await
            {
                return cached;
            }
        }
        let resp = self.received(&route, exchange, sent?);
        let resp = ended_by(outage, exchange.bound(resp, served_by));
        Ok(match route.cache {
            Some(plan) => edge.tee(plan, resp),
            None => resp,
        })
    }

    /// The upstream answer for the client hop: its WAN bytes counted, a gzip body decoded when
    /// the cache or the filters read it or the client did not ask for gzip ([`encoding`]).
    fn received(
        &self,
        route: &Route,
        exchange: &Exchange,
        resp: Response<UpstreamBody>,
    ) -> Response<ProxyBody> {
        let resp = encoding::count_received(
            client_response(resp, false),
            &self.metrics.upstream_received_bytes,
            &exchange.labels.joined(),
        );
        let read_here = route.cache.is_some() || route.filter.is_some();
        encoding::decode(resp, read_here, exchange.client_gzip)
    }

    /// Sends the request: a read that fails to reach one server is retried on another healthy
    /// one (at most [`MAX_READ_ATTEMPTS`] sends in all).
    async fn attempts<'s>(
        &'s self,
        route: &Route,
        info: &RequestInfo,
        parts: &http::request::Parts,
        body: ProxyBody,
        exchange: &Exchange,
    ) -> Attempts<'s, impl std::future::Future<Output = ()> + Send + Sync + 'static + use<'s>> {
        let per_attempt = self.deadline(info, route.cache.as_ref());
        let retryable = parts.method == http::Method::GET && info.verb != Verb::Watch;
        let mut body = Some(body);
        let mut done = Attempts {
            sent: Err(ProxyError::NoUpstream),
            outage: None,
            served_by: None,
        };
        let mut avoid = None;
        for attempt in 0..MAX_READ_ATTEMPTS {
            // With no server left to try, the last error stands.
            let Some(server) = self.upstream.pick_except(avoid) else {
                break;
            };
            done.served_by = Some(server);
            let upstream_req = self.prepared(
                route,
                info.verb,
                parts,
                body.take().unwrap_or_else(body::empty),
            );
            // Taken before the send, so an outage during it still ends the watch.
            done.outage =
                (info.verb == Verb::Watch).then(|| self.upstream.states().next_outage(server));
            let more = retryable && attempt + 1 < MAX_READ_ATTEMPTS;
            let retry_possible = more && self.upstream.has_other_healthy(server);
            let deadline = exchange.header_deadline(per_attempt, retry_possible);
            let sent = self.send(server, route, upstream_req, deadline).await;
            done.sent = sent.map_err(|e| exchange.blame(e));
            self.note_outcome(server, &done.sent);
            let Err(e) = &done.sent else { break };
            if !more {
                break;
            }
            avoid = match e {
                // The connect failure marked the server down, so it is not picked again; a lost
                // connection is retried on a fresh one, to the same server if picked.
                e if e.is_connection_failure() => None,
                // A server that was too slow or garbled its answer is not asked twice: the
                // retry goes to another healthy one, if any.
                ProxyError::Timeout { .. } | ProxyError::BadReply { .. } => Some(server),
                _ => break,
            };
        }
        done
    }

    /// The upstream request for one attempt: JSON asked for when the cache or the filters read
    /// the answer, gzip for reads.
    fn prepared(
        &self,
        route: &Route,
        verb: Verb,
        parts: &http::request::Parts,
        body: ProxyBody,
    ) -> Request<ProxyBody> {
        let mut upstream_req = upstream_request(parts, body);
        if let (Some(edge), Some(plan)) = (&self.edge, &route.cache) {
            edge.prepare_upstream(plan, upstream_req.headers_mut());
        }
        if route.filter.is_some() {
            Filtering::prepare_upstream(upstream_req.headers_mut());
        }
        encoding::ask_for_gzip(&parts.method, verb, upstream_req.headers_mut());
        upstream_req
    }

    /// A secure-port token the apiserver accepted may be answered from the cache offline; one
    /// it refused may not.
    fn judge_token(&self, token: &callers::TokenDigest, status: StatusCode) {
        if status.is_success() {
            self.verified_tokens.remember(*token);
        } else if status == StatusCode::UNAUTHORIZED {
            self.verified_tokens.forget(token);
        }
    }

    /// One send; in edge mode a cached read stops waiting as soon as every server is unhealthy.
    async fn send(
        &self,
        server: &crate::upstream::Server,
        route: &Route,
        req: Request<ProxyBody>,
        deadline: std::time::Duration,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let send = self.upstream.send(server, route.identity, req, deadline);
        if self.edge.is_none() || route.cache.is_none() {
            return send.await;
        }
        tokio::select! {
            sent = send => sent,
            _ = self.upstream.states().went_offline() => {
                Err(ProxyError::Offline("stopped waiting for it".into()))
            }
        }
    }

    /// Counts a failure and tells the health checker. Only a server that could not be
    /// connected to is marked unhealthy at once. One exchange that failed after it was sent (the
    /// connection lost, no headers in time, garbage), or an answer that the server cannot serve,
    /// says little about the server, and marking it would end every watch on it: it is only
    /// suspected, and the prober looks at it at once (see
    /// [`crate::upstream::ServerStates::suspect`]).
    fn note_outcome(
        &self,
        server: &crate::upstream::Server,
        sent: &Result<Response<UpstreamBody>, ProxyError>,
    ) {
        let states = self.upstream.states();
        match sent {
            // The client's own body failed the exchange: nothing to say about the server.
            Err(ProxyError::ClientBody(_) | ProxyError::ClientTimeout { .. }) => {}
            Err(e) => {
                self.count_upstream_error(server.label(), e);
                match e {
                    ProxyError::Unreachable { .. } => states.mark_failed(server, &e.to_string()),
                    e if e.is_upstream() => states.suspect(server, &e.to_string()),
                    _ => {}
                }
            }
            Ok(resp) if is_unavailable(resp.status()) => {
                states.suspect(server, &format!("answered {}", resp.status()));
            }
            Ok(_) => {}
        }
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
        mut req: Request<body::RequestBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let client_side = hyper::upgrade::on(&mut req);
        let server = self.upstream.pick().ok_or(ProxyError::NoUpstream)?;
        let deadline = self.upstream.header_deadline(info.query.timeout);
        let (parts, body) = req.into_parts();
        let upstream_req = upstream_request_with(&parts, body.boxed_proxy(), true);
        let mut resp = self
            .upstream
            .send(server, route.identity, upstream_req, deadline)
            .await
            .inspect_err(|e| self.count_upstream_error(server.label(), e))?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let upstream_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(splice(client_side, upstream_side));
            return Ok(client_response(resp, true));
        }
        // The apiserver refused the switch (401/403/404…): relay its answer as a plain response.
        Ok(client_response(resp, false))
    }

    /// Stage 5: turn errors into Status bodies, count and log once, attach stream accounting.
    fn respond(
        &self,
        info: Option<&RequestInfo>,
        result: Result<Response<ProxyBody>, ProxyError>,
        started: Instant,
        in_flight: Option<InFlight>,
    ) -> Response<ProxyBody> {
        let verb = info.map_or("unknown", |i| i.verb.as_str());
        let label = info.map(RequestInfo::resource_label).unwrap_or_default();
        let resource = &*label;
        let component = info.and_then(|i| i.component.as_deref());
        let component_label = crate::metrics::component_label(component);
        let component = component.unwrap_or("none");
        let mut resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                warn!(verb, resource, component, error = %err, "request failed");
                status_response(err.into_status())
            }
        };
        declare_length(&mut resp);
        let status = resp.status();
        let code = status.as_u16();
        debug!(
            verb,
            resource,
            component,
            path = info.map_or("", |i| i.path.as_str()),
            code,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "request"
        );
        let labels = match &in_flight {
            Some(in_flight) => Some(in_flight.labels),
            None => info.map(crate::metrics::resource_labels),
        };
        let joined = labels.map(ResourceLabels::joined).unwrap_or_default();
        self.metrics
            .requests
            .with_label_values(&[component_label, verb, &joined, status.as_str()])
            .inc();
        crate::work::note_work();
        self.metrics
            .latency
            .with_label_values(&[verb])
            .observe(started.elapsed().as_secs_f64());
        let (resource, subresource) = labels.map_or(("", ""), |l| (l.resource, l.subresource));
        let bytes = self.metrics.response_bytes.with_label_values(&[
            component_label,
            verb,
            resource,
            subresource,
        ]);
        resp.map(|b| counted(b, bytes, in_flight))
    }

    fn count_upstream_error(&self, server: &str, err: &ProxyError) {
        self.metrics
            .upstream_errors
            .with_label_values(&[server, err.kind()])
            .inc();
    }
}

/// How the sends of one request went: the last outcome, the outage that ends a watch, and the
/// server that answered.
struct Attempts<'s, O> {
    sent: Result<Response<UpstreamBody>, ProxyError>,
    outage: Option<O>,
    served_by: Option<&'s Server>,
}

/// The bounds of one client exchange and how the client's request body went
/// ([`Pipeline::exchange`]).
struct Exchange {
    /// `None` for a long-running request (watch, logs, exec, proxy): no overall bound.
    deadline: Option<tokio::time::Instant>,
    /// How long the exchange may take in all.
    length: std::time::Duration,
    client_body: body::ClientBody,
    /// The client's `Accept-Encoding` takes gzip ([`encoding`]).
    client_gzip: bool,
    /// The request's metric labels, looked up once ([`crate::metrics::resource_labels`]).
    labels: ResourceLabels,
}

impl Exchange {
    /// How long one attempt may wait for response headers: `per_attempt`, within what is left
    /// of the exchange (a retry does not get the whole time again), and only half of it when
    /// another server could take a retry: a server too slow to answer is not waited for so
    /// long that the other one has no time left.
    fn header_deadline(
        &self,
        per_attempt: std::time::Duration,
        retry_possible: bool,
    ) -> std::time::Duration {
        let Some(deadline) = self.deadline else {
            return per_attempt;
        };
        let left = deadline - tokio::time::Instant::now();
        per_attempt.min(if retry_possible { left / 2 } else { left })
    }

    /// A response whose body must end with the exchange ([`body::until_deadline`]).
    fn bound(&self, resp: Response<ProxyBody>, server: Option<&Server>) -> Response<ProxyBody> {
        let Some(deadline) = self.deadline else {
            return resp;
        };
        let exceeded = body::DeadlineExceeded {
            server: server.map_or_else(|| "".into(), Server::shared_label),
            after: self.length,
        };
        resp.map(|b| body::until_deadline(b, deadline, exceeded))
    }

    /// Puts a failure down to the client when its request body caused it: a malformed body is
    /// a 400 whatever the apiserver made of it, and a body still unfinished when the time ran
    /// out (the apiserver was waiting for the rest) a 408.
    fn blame(&self, err: ProxyError) -> ProxyError {
        if let Some(cause) = self.client_body.malformed() {
            return ProxyError::ClientBody(cause.to_owned());
        }
        let timed_out = matches!(err, ProxyError::Timeout { .. }) || self.client_body.late();
        if timed_out && self.client_body.unfinished() {
            return ProxyError::ClientTimeout { after: self.length };
        }
        err
    }
}

/// `body`, counting its bytes as it goes out and keeping the request in flight until it ends.
/// Each data frame is work for [`crate::work`]: a hub streaming a watch is busy long after
/// its request was counted, and must not be trimmed meanwhile.
fn counted(
    body: ProxyBody,
    bytes: prometheus::IntCounter,
    in_flight: Option<InFlight>,
) -> ProxyBody {
    body::counted(body, move |len| {
        let _still_in_flight = &in_flight;
        bytes.inc_by(len as u64);
        crate::work::note_work();
    })
}

/// Gives a whole body the hub made itself (a cached object, a Status, a lease answered
/// locally) its `Content-Length`; the filter stage sets the new length of what it rewrites.
/// Without one, a body whose size is not known to hyper goes out chunked: a client then needs
/// one more read for the closing chunk (an offline GET took markedly longer so). The byte
/// counting ([`body::counted`]) passes the size on. Relayed headers and streams are left
/// alone, and so are the statuses that must not carry a length.
fn declare_length(resp: &mut Response<ProxyBody>) {
    let status = resp.status();
    if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return;
    }
    let headers = resp.headers();
    if headers.contains_key(header::CONTENT_LENGTH)
        || headers.contains_key(header::TRANSFER_ENCODING)
    {
        return;
    }
    if let Some(len) = http_body::Body::size_hint(resp.body()).exact() {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, len.into());
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

/// The cache's answer to a cached read whose upstream exchange failed, when it may stand in:
/// the cloud is judged unreachable (or the send `gave_up` waiting for it), or the cache holds
/// the answer. A server that answered badly while the cloud is up is not an outage, so
/// otherwise (`None`) the upstream's own answer stands, never a cache miss worded as if the
/// cloud were gone.
async fn cached_instead(
    edge: &Edge,
    plan: CachePlan,
    info: &RequestInfo,
    headers: &http::HeaderMap,
    gave_up: bool,
) -> Option<Result<Response<ProxyBody>, ProxyError>> {
    let cached = edge.serve(plan, info, headers).await;
    if edge.is_offline() || gave_up || cached.is_ok() {
        return Some(cached);
    }
    debug!(error = %cached.err().map(|e| e.to_string()).unwrap_or_default(),
        "upstream failed and the cache cannot answer; passing the upstream's answer on");
    None
}

/// An upstream answer a cached read falls back on the cache for (501 is a real answer).
fn is_cloud_failure(status: StatusCode) -> bool {
    status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED
}

/// An upstream answer that says the server, or what it fronts, cannot serve now.
fn is_unavailable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The client's request, rewritten for the upstream hop (headers cleaned, body streamed). Built
/// from the parts so a bodiless read can be sent again to another server.
fn upstream_request(parts: &http::request::Parts, body: ProxyBody) -> Request<ProxyBody> {
    upstream_request_with(parts, body, false)
}

fn upstream_request_with(
    parts: &http::request::Parts,
    body: ProxyBody,
    tunnel: bool,
) -> Request<ProxyBody> {
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.headers_mut() = parts.headers.clone();
    headers::strip_hop_by_hop(req.headers_mut(), tunnel);
    // The upstream's own authority goes into Host (set by the client from the URI).
    req.headers_mut().remove(header::HOST);
    req
}

/// The upstream's response, rewritten for the client hop.
fn client_response(resp: Response<UpstreamBody>, switching: bool) -> Response<ProxyBody> {
    let (mut parts, answer) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, switching);
    parts.extensions = http::Extensions::new();
    Response::from_parts(parts, body::stream(answer))
}

/// A proxied watch ends when its apiserver turns unhealthy
/// ([`crate::upstream::ServerStates::next_outage`]); other answers are left as they are.
fn ended_by(
    outage: Option<impl std::future::Future<Output = ()> + Send + Sync + 'static>,
    resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    match outage {
        Some(outage) => resp.map(|body| body::until(body, outage)),
        None => resp,
    }
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
struct InFlight {
    gauge: prometheus::IntGauge,
    /// The request's labels, for the families counted at its end.
    labels: ResourceLabels,
}

impl InFlight {
    fn enter(metrics: &Metrics, info: &RequestInfo, labels: ResourceLabels) -> InFlight {
        let gauge = metrics.in_flight.with_label_values(&[
            crate::metrics::component_label(info.component.as_deref()),
            info.verb.as_str(),
            labels.resource,
            labels.subresource,
        ]);
        gauge.inc();
        InFlight { gauge, labels }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    fn length(resp: &Response<ProxyBody>) -> Option<&str> {
        resp.headers()
            .get(header::CONTENT_LENGTH)
            .map(|v| v.to_str().unwrap())
    }

    /// Other tests in the process count work too, so only a floor can be checked; without the
    /// count, they would have to add 1,000 units during the stream for this to pass.
    #[tokio::test]
    async fn a_streamed_body_counts_as_work_frame_by_frame() {
        const FRAMES: u64 = 1_000;
        let frames = (0..FRAMES).map(|_| Ok(http_body::Frame::data(Bytes::from_static(b"x\n"))));
        let stream = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
        let bytes = prometheus::IntCounter::new("bytes", "test").unwrap();
        let before = crate::work::work_done();
        let body = counted(stream, bytes.clone(), None)
            .collect()
            .await
            .unwrap();
        assert_eq!(body.to_bytes().len() as u64, 2 * FRAMES);
        assert_eq!(bytes.get(), 2 * FRAMES);
        assert!(crate::work::work_done() >= before + FRAMES);
    }

    /// Without the size passed on, hyper sends a body whose headers carry no `Content-Length`
    /// chunked, though its length is known.
    #[tokio::test]
    async fn the_counted_body_keeps_its_size_and_counts_every_byte() {
        let bytes = prometheus::IntCounter::new("bytes", "test").unwrap();
        let body = counted(body::full("{\"kind\":\"Node\"}"), bytes.clone(), None);
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(15));
        let read = body.collect().await.unwrap().to_bytes();
        assert_eq!(read.len(), 15);
        assert_eq!(bytes.get(), 15);
    }

    #[test]
    fn whole_bodies_made_here_declare_their_length_and_nothing_else_changes() {
        let mut whole = Response::new(body::full("{\"kind\":\"Status\"}"));
        declare_length(&mut whole);
        assert_eq!(length(&whole), Some("17"));

        let frames = futures_util::stream::iter([Ok::<_, body::BoxError>(http_body::Frame::data(
            Bytes::from_static(b"{}"),
        ))]);
        let mut streamed = Response::new(http_body_util::StreamBody::new(frames).boxed());
        declare_length(&mut streamed);
        assert_eq!(length(&streamed), None, "a stream's length is unknown");

        let mut relayed = Response::new(body::full("{}"));
        relayed
            .headers_mut()
            .insert(header::CONTENT_LENGTH, 2.into());
        relayed
            .headers_mut()
            .append(header::VARY, "Accept".parse().unwrap());
        declare_length(&mut relayed);
        assert_eq!(relayed.headers().len(), 2, "a declared length is kept");

        for status in [
            StatusCode::SWITCHING_PROTOCOLS,
            StatusCode::NO_CONTENT,
            StatusCode::NOT_MODIFIED,
        ] {
            let mut resp = Response::new(body::empty());
            *resp.status_mut() = status;
            declare_length(&mut resp);
            assert_eq!(length(&resp), None, "{status} carries no length");
        }
    }
}
