//! The admin server on `--bind-address:--serve-port` (127.0.0.1:10267), with yurthub's paths:
//!
//! - `GET /v1/healthz`: `200 OK` while the process runs (liveness); `500` once a cache store
//!   call has made no progress for [`Readiness::cache_hung_after`] (a deadlocked sled, a disk
//!   that stopped answering): the static pod's liveness probe then restarts the hub, the one way
//!   out of a stuck store. Readiness alone did not help there: nothing restarts an unready pod.
//! - `GET /v1/readyz`: `200` only when every readiness check passes; the body lists each check in
//!   kube-apiserver's `[+]name ok` / `[-]name failed: reason` style with the time its state began;
//!   `?verbose` adds details. A degraded check (offline and serving from the cache, a cache that
//!   cannot persist) passes and says so. A check must fail for [`Readiness::flap_guard`] before it
//!   is reported failed, so one failed probe does not flap readiness. Readiness never gates
//!   requests, so the hub's own traffic cannot deadlock on it at start-up.
//! - `GET /metrics`: Prometheus text exposition (outpost's series and yurthub's names for them).
//! - `GET /pods`: this node's pods as a PodList, as yurthub serves them to OTA tooling: kubelet's
//!   cached pods in edge mode (online or not), the cloud's in cloud mode.
//! - `POST|PUT /v1/token`: token mode's rejoin with a new bootstrap token
//!   ([`crate::identity::bootstrap::TokenBootstrap::rejoin`]).
//! - `POST /openyurt.io/v1/namespaces/{ns}/pods/{pod}/{upgrade,imagepull}`: OTA ([`crate::admin::ota`]).

pub mod ota;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use outpost_certs::IdentityInfo;
use tracing::{info, warn};

use crate::side::own::SyncState;
use outpost_proxy::Metrics;
use outpost_proxy::body::{self, ProxyBody};
use outpost_proxy::upstream::ServerStates;

/// A storage call running longer than this means sled is stuck (see `outpost_cache::Health`).
const CACHE_STUCK_AFTER: Duration = Duration::from_secs(10);

/// A store call without progress for this long fails liveness: far beyond a flushed write on
/// a slow SD card or a relist's commit; a compaction reports progress per copied batch.
pub const CACHE_HUNG_AFTER: Duration = Duration::from_secs(30);

/// The result of one readiness check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub name: &'static str,
    pub ok: bool,
    /// Passing, but working in a reduced way (offline, or the cache cannot persist): shown even
    /// without `?verbose`, and distinct from "not ready".
    pub degraded: bool,
    pub detail: String,
}

impl CheckResult {
    fn new(name: &'static str, ok: bool, detail: String) -> CheckResult {
        CheckResult {
            name,
            ok,
            degraded: false,
            detail,
        }
    }
}

/// Everything readiness is computed from; evaluated fresh on every probe.
pub struct Readiness {
    /// The client certificate presented upstream now (it follows kubelet's rotations).
    pub identity: tokio::sync::watch::Receiver<IdentityInfo>,
    /// Edge mode only.
    pub cache: Option<Arc<dyn outpost_cache::Store>>,
    /// Why the disk cache is an in-memory stand-in, if it is.
    pub cache_volatile: Option<String>,
    /// How long a store call may go without progress before `/v1/healthz` fails
    /// ([`CACHE_HUNG_AFTER`]).
    pub cache_hung_after: Duration,
    /// The apiservers' health.
    pub servers: Option<Arc<ServerStates>>,
    /// Edge mode: with no server healthy the cache serves, so the hub is degraded, not unready.
    pub edge: bool,
    /// Whether `yurt-hub-cfg` has been read.
    pub config: Option<tokio::sync::watch::Receiver<SyncState>>,
    /// Whether the filters' side data (Services, NodePools, the Node) has been read.
    pub side_data: crate::side::filters::SideSync,
    /// The secure port's certificate, when the port is served. Informational: without one the
    /// port refuses handshakes, but the node's own traffic is unaffected, so it degrades
    /// readiness rather than failing it (an approver may never come).
    pub serving_cert: Option<Arc<outpost_certs::serving::CertSlot>>,
    /// How long a check must fail before readiness reports it (two probe intervals).
    pub flap_guard: Duration,
    /// Per check: the reported state, since when, and since when it has been failing.
    pub history: Mutex<HashMap<&'static str, Tracked>>,
}

/// One check's reported state over time.
#[derive(Debug, Clone)]
pub struct Tracked {
    ok: bool,
    since: SystemTime,
    failing_since: Option<Instant>,
    /// Whether the check has ever passed: one that never has (the hub's configuration not
    /// read yet at start-up) is not ready at once, with no grace.
    passed: bool,
}

impl Readiness {
    /// Why the process should be restarted, if it should (see `/v1/healthz`).
    pub fn liveness_failure(&self) -> Option<String> {
        let busy = self.cache.as_deref()?.health().busy_for?;
        (busy > self.cache_hung_after).then(|| {
            format!(
                "a cache store call has made no progress for {busy:?}; the hub must be restarted"
            )
        })
    }

    pub fn checks(&self, now: SystemTime) -> Vec<CheckResult> {
        let mut checks = vec![self.certificate_check(now)];
        checks.extend(
            self.cache
                .as_deref()
                .map(|c| cache_check(c, self.cache_volatile.as_deref())),
        );
        checks.extend(self.servers.as_deref().map(|s| servers_check(s, self.edge)));
        checks.extend(
            self.config
                .as_ref()
                .map(|c| self.sync_check("config", "yurt-hub-cfg", &c.borrow())),
        );
        if !self.side_data.states.is_empty() {
            checks.push(self.side_data_check());
        }
        checks.extend(
            self.serving_cert
                .as_deref()
                .map(|slot| serving_cert_check(slot, now)),
        );
        checks
    }

    /// One check over the filters' reflectors: the first that is not synced decides it.
    fn side_data_check(&self) -> CheckResult {
        let mut synced = Vec::new();
        for (name, state) in &self.side_data.states {
            let state = state.borrow();
            match &*state {
                SyncState::Synced { source } => synced.push(format!("{name} from {source}")),
                other => return self.sync_check("filters", name, other),
            }
        }
        CheckResult::new(
            "filters",
            true,
            format!("side data read: {}", synced.join(", ")),
        )
    }

    /// Whether `what` has been read: from the cloud or the cache is ready; never read is
    /// degraded while the cloud is unreachable (defaults apply), else not ready.
    fn sync_check(&self, name: &'static str, what: &str, state: &SyncState) -> CheckResult {
        let offline = self.servers.as_deref().is_some_and(|s| !s.is_online());
        match state {
            SyncState::Synced { source } => {
                CheckResult::new(name, true, format!("{what} read from {source}"))
            }
            _ if offline => {
                let mut check = CheckResult::new(name, true, String::new());
                check.degraded = true;
                check.detail = format!("{what} never read (cloud unreachable); defaults apply");
                check
            }
            SyncState::Pending => CheckResult::new(name, false, format!("{what} not read yet")),
            SyncState::Failing { cause } => CheckResult::new(name, false, cause.clone()),
        }
    }

    /// The checks as reported, each with the time its reported state began. A check that has
    /// passed before is reported failing only once the failure has lasted `flap_guard`; one that
    /// never passed fails at once.
    pub fn reported(&self, now: SystemTime) -> Vec<(CheckResult, SystemTime)> {
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        self.checks(now)
            .into_iter()
            .map(|mut check| {
                let tracked = history.entry(check.name).or_insert(Tracked {
                    ok: check.ok,
                    since: now,
                    failing_since: None,
                    passed: false,
                });
                if check.ok {
                    tracked.failing_since = None;
                    tracked.passed = true;
                } else {
                    let failing_since = *tracked.failing_since.get_or_insert_with(Instant::now);
                    if tracked.passed && failing_since.elapsed() < self.flap_guard {
                        check.ok = true;
                        check.degraded = true;
                        check.detail =
                            format!("failing for under {:?}: {}", self.flap_guard, check.detail);
                    }
                }
                if tracked.ok != check.ok {
                    tracked.ok = check.ok;
                    tracked.since = now;
                }
                let since = tracked.since;
                (check, since)
            })
            .collect()
    }

    fn certificate_check(&self, now: SystemTime) -> CheckResult {
        let id = &*self.identity.borrow();
        let ok = !id.is_expired_at(now);
        let detail = if ok {
            format!(
                "client certificate for {} valid until unix time {}",
                id.user,
                id.not_after_unix()
            )
        } else {
            format!(
                "client certificate for {} expired at unix time {}",
                id.user,
                id.not_after_unix()
            )
        };
        CheckResult::new("certificate", ok, detail)
    }
}

fn cache_check(store: &dyn outpost_cache::Store, volatile: Option<&str>) -> CheckResult {
    let health = store.health();
    if let Some(busy) = health.busy_for.filter(|b| *b > CACHE_STUCK_AFTER) {
        let detail = format!("a cache write has been running for {busy:?}; restart the hub");
        return CheckResult::new("cache", false, detail);
    }
    let mut check = CheckResult::new(
        "cache",
        true,
        format!("open; {} entries quarantined", health.quarantined),
    );
    let missed = (health.missed_scopes > 0).then(|| {
        format!(
            "; {} cached scope(s) missed watch events: the cache answers them 503 until relisted",
            health.missed_scopes
        )
    });
    if let Some(why) = volatile {
        check.degraded = true;
        check.detail = format!("in memory only, nothing survives a restart ({why})");
    } else if health.degraded {
        check.degraded = true;
        check.detail = format!(
            "cannot persist writes ({}); proxying continues",
            health.last_error.as_deref().unwrap_or("unknown error")
        );
    }
    if let Some(missed) = missed {
        check.degraded = true;
        check.detail.push_str(&missed);
    }
    check
}

fn serving_cert_check(slot: &outpost_certs::serving::CertSlot, now: SystemTime) -> CheckResult {
    let mut check = CheckResult::new("secure-port", true, String::new());
    match slot.current() {
        Some(cert) if cert.is_valid_at(now) => {
            check.detail = format!(
                "serving certificate valid until unix time {}",
                cert.not_after_unix()
            );
        }
        Some(cert) => {
            check.degraded = true;
            check.detail = format!(
                "serving certificate expired at unix time {}; waiting for a new one",
                cert.not_after_unix()
            );
        }
        None => {
            check.degraded = true;
            check.detail = "no serving certificate yet (the CSR awaits approval or the cloud); \
                            in-cluster clients cannot connect"
                .into();
        }
    }
    check
}

fn servers_check(servers: &ServerStates, edge: bool) -> CheckResult {
    let healthy = servers.healthy_flags().iter().filter(|h| **h).count();
    let detail = format!("{healthy} of {} apiservers healthy", servers.len());
    if healthy > 0 {
        return CheckResult::new("cloud", true, detail);
    }
    if edge {
        let mut check = CheckResult::new("cloud", true, String::new());
        check.degraded = true;
        check.detail = "offline, serving from cache".into();
        return check;
    }
    CheckResult::new("cloud", false, detail)
}

/// What the admin handler needs.
pub struct Admin {
    pub readiness: Readiness,
    pub metrics: Metrics,
    pub pods: NodePods,
    /// Token mode: what `/v1/token` re-runs.
    pub token_bootstrap: Option<crate::identity::bootstrap::TokenBootstrap>,
    /// One `/v1/token` at a time: each rewrites the same files.
    pub token_updates: tokio::sync::Mutex<()>,
    /// `/openyurt.io/v1/namespaces/{ns}/pods/{name}/{upgrade,imagepull}`.
    pub ota: crate::admin::ota::Ota,
}

/// The source of `GET /pods`.
pub struct NodePods {
    pub pipeline: Arc<outpost_proxy::pipeline::Pipeline>,
    pub node_name: String,
}

impl NodePods {
    async fn serve(&self) -> Response<ProxyBody> {
        let path = format!(
            "/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
            self.node_name
        );
        let result = match &self.pipeline.edge {
            Some(edge) => Self::cached(edge, &path).await,
            None => self.upstream_list(&path).await,
        };
        result.unwrap_or_else(|e| outpost_proxy::pipeline::status_response(e.into_status()))
    }

    /// kubelet's own list, answered by the cache exactly as kubelet would be offline.
    async fn cached(
        edge: &outpost_proxy::edge::Edge,
        path: &str,
    ) -> Result<Response<ProxyBody>, outpost_proxy::ProxyError> {
        let info = outpost_core::RequestInfo::classify(&Method::GET, path, Some("kubelet"))?;
        let mut headers = http::HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let plan = edge.plan(&info, &headers).ok_or_else(|| {
            outpost_proxy::ProxyError::Cache(
                "kubelet's pods are not cached (kubelet is not a cache agent)".into(),
            )
        })?;
        edge.serve(plan, &info, &headers).await
    }

    async fn upstream_list(
        &self,
        path: &str,
    ) -> Result<Response<ProxyBody>, outpost_proxy::ProxyError> {
        let upstream = &self.pipeline.upstream;
        let server = upstream
            .pick()
            .ok_or(outpost_proxy::ProxyError::NoUpstream)?;
        let call = outpost_proxy::upstream::OwnCall {
            method: Method::GET,
            path,
            user_agent: "outpost/pods",
            body: None,
            timeout: Duration::from_secs(30),
        };
        let (code, bytes) = upstream.own_call(server, call).await.map_err(|cause| {
            outpost_proxy::ProxyError::Unreachable {
                server: server.label().to_owned(),
                cause: Box::new(cause),
            }
        })?;
        let mut resp = Response::new(body::full(bytes));
        *resp.status_mut() = code;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    }
}

/// How long `/v1/token` waits for its (small) request body.
const TOKEN_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Admin {
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        if req.uri().path() == "/v1/token" {
            return self.update_token(req).await;
        }
        if let Some(ota) = crate::admin::ota::OtaRequest::from_path(req.uri().path()) {
            let (code, answer) = self.ota.handle(req.method(), &ota).await;
            return text(code, format!("{answer}\n"));
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        let verbose = req.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == "verbose" || p.starts_with("verbose="))
        });
        match req.uri().path() {
            "/v1/healthz" => match self.readiness.liveness_failure() {
                None => text(StatusCode::OK, "OK"),
                Some(why) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
            },
            "/v1/readyz" => self.readyz(verbose),
            "/pods" => self.pods.serve().await,
            "/metrics" => {
                let mut resp = Response::new(body::full(self.metrics.render()));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                resp
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// yurthub's `POST|PUT /v1/token` with `{"jointoken": "<id>.<secret>"}`: see
    /// [`crate::identity::bootstrap::TokenBootstrap::rejoin`]. Nothing to do in kubeletcertificate mode.
    async fn update_token(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        if req.method() != Method::POST && req.method() != Method::PUT {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        let Some(bootstrap) = &self.token_bootstrap else {
            return text(
                StatusCode::OK,
                "nothing to update: the hub uses kubelet's client certificate\n",
            );
        };
        let read = http_body_util::Limited::new(req.into_body(), 64 * 1024).collect();
        // A body that never ends would keep one of the admin port's few connections busy.
        let body = match tokio::time::timeout(TOKEN_BODY_TIMEOUT, read).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}\n"),
                );
            }
            Err(_) => {
                return text(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body did not arrive within {TOKEN_BODY_TIMEOUT:?}\n"),
                );
            }
        };
        let token = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("jointoken")?.as_str().map(str::to_owned));
        let Some(token) = token else {
            return text(
                StatusCode::BAD_REQUEST,
                "the body must be {\"jointoken\": \"<id>.<secret>\"}\n",
            );
        };
        let _one_at_a_time = self.token_updates.lock().await;
        match bootstrap.rejoin(&token).await {
            Ok(done) => {
                info!(done, "bootstrap token updated through /v1/token");
                text(StatusCode::OK, format!("{done}\n"))
            }
            Err(e) => {
                warn!(error = %e, "bootstrap token update failed");
                text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"))
            }
        }
    }

    fn readyz(&self, verbose: bool) -> Response<ProxyBody> {
        let (ready, out) = self.readiness_text(verbose);
        let code = if ready {
            StatusCode::OK
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        text(code, out)
    }

    /// Whether the hub is ready, and `/v1/readyz`'s body.
    pub fn readiness_text(&self, verbose: bool) -> (bool, String) {
        let checks = self.readiness.reported(SystemTime::now());
        let ready = checks.iter().all(|(c, _)| c.ok);
        let mut out = String::new();
        for (c, since) in &checks {
            let since = outpost_core::time::rfc3339(
                since
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default(),
            );
            match (c.ok, verbose) {
                (true, _) if c.degraded => out.push_str(&format!(
                    "[+]{} degraded: {} (since {since})\n",
                    c.name, c.detail
                )),
                (true, false) => out.push_str(&format!("[+]{} ok (since {since})\n", c.name)),
                (true, true) => {
                    out.push_str(&format!("[+]{} ok: {} (since {since})\n", c.name, c.detail))
                }
                (false, _) => out.push_str(&format!(
                    "[-]{} failed: {} (since {since})\n",
                    c.name, c.detail
                )),
            }
        }
        out.push_str(if ready {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        (ready, out)
    }
}

fn text(code: StatusCode, body_text: impl Into<String>) -> Response<ProxyBody> {
    let mut resp = Response::new(body::full(body_text.into()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn identity(valid_for: Duration) -> IdentityInfo {
        IdentityInfo {
            user: "system:node:edge-1".into(),
            groups: vec!["system:nodes".into()],
            not_before: SystemTime::now(),
            not_after: SystemTime::now() + valid_for,
        }
    }

    fn readiness(valid_for: Duration, flap_guard: Duration) -> Readiness {
        Readiness {
            identity: tokio::sync::watch::channel(identity(valid_for)).1,
            cache: None,
            cache_volatile: None,
            cache_hung_after: CACHE_HUNG_AFTER,
            servers: None,
            edge: false,
            config: None,
            side_data: Default::default(),
            serving_cert: None,
            flap_guard,
            history: Mutex::default(),
        }
    }

    #[test]
    fn a_missing_serving_certificate_degrades_readiness_and_does_not_fail_it() {
        let mut r = readiness(Duration::from_secs(3600), Duration::ZERO);
        let slot = Arc::new(outpost_certs::serving::CertSlot::default());
        r.serving_cert = Some(slot);
        let check = r
            .checks(SystemTime::now())
            .into_iter()
            .find(|c| c.name == "secure-port")
            .unwrap();
        assert!(check.ok && check.degraded, "{check:?}");
        assert!(check.detail.contains("no serving certificate"), "{check:?}");
    }

    #[test]
    fn a_failure_is_reported_only_once_it_has_lasted() {
        let r = readiness(Duration::from_secs(3600), Duration::from_secs(3600));
        let now = SystemTime::now();
        assert!(r.reported(now).remove(0).0.ok);
        let (check, _) = r.reported(now + Duration::from_secs(7200)).remove(0);
        assert!(check.ok && check.degraded, "{check:?}");
        assert!(
            check.detail.contains("failing for under"),
            "{}",
            check.detail
        );
        // A check that never passed (start-up) gets no grace.
        let r = readiness(Duration::ZERO, Duration::from_secs(3600));
        let (check, _) = r.reported(SystemTime::now()).remove(0);
        assert!(!check.ok, "{check:?}");
        let r = readiness(Duration::ZERO, Duration::ZERO);
        let first = SystemTime::now();
        let (check, since) = r.reported(first).remove(0);
        assert!(!check.ok);
        let (_, still) = r.reported(first + Duration::from_secs(5)).remove(0);
        assert_eq!(since, still, "since marks the change, not the probe");
    }

    #[test]
    fn certificate_check_passes_then_fails_after_expiry() {
        let r = Readiness {
            identity: tokio::sync::watch::channel(identity(Duration::from_secs(3600))).1,
            cache: None,
            cache_volatile: None,
            cache_hung_after: CACHE_HUNG_AFTER,
            servers: None,
            edge: false,
            config: None,
            side_data: Default::default(),
            serving_cert: None,
            flap_guard: Duration::ZERO,
            history: Mutex::default(),
        };
        assert!(r.checks(SystemTime::now())[0].ok);
        let later = SystemTime::now() + Duration::from_secs(7200);
        let c = &r.checks(later)[0];
        assert!(!c.ok);
        assert!(c.detail.contains("expired"), "{}", c.detail);
    }
}
