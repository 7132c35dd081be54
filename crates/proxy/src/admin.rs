//! The admin server on `--bind-address:--serve-port` (127.0.0.1:10267), with yurthub's paths:
//!
//! - `GET /v1/healthz`: `200 OK` while the process runs (liveness).
//! - `GET /v1/readyz`: `200` only when every readiness check passes; the body lists each check in
//!   kube-apiserver's `[+]name ok` / `[-]name failed: reason` style; `?verbose` adds details.
//! - `GET /metrics`: Prometheus text exposition.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use outpost_certs::IdentityInfo;

use crate::body::{self, ProxyBody};
use crate::health::ServerStates;
use crate::metrics::Metrics;

/// A storage call running longer than this means sled is stuck (see `outpost_cache::Health`).
const CACHE_STUCK_AFTER: Duration = Duration::from_secs(10);

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
    pub identity: IdentityInfo,
    /// Edge mode only.
    pub cache: Option<Arc<dyn outpost_cache::Store>>,
    /// Why the disk cache is an in-memory stand-in, if it is.
    pub cache_volatile: Option<String>,
    /// The apiservers' health.
    pub servers: Option<Arc<ServerStates>>,
    /// Edge mode: with no server healthy the cache serves, so the hub is degraded, not unready.
    pub edge: bool,
}

impl Readiness {
    pub fn checks(&self, now: SystemTime) -> Vec<CheckResult> {
        let mut checks = vec![self.certificate_check(now)];
        checks.extend(
            self.cache
                .as_deref()
                .map(|c| cache_check(c, self.cache_volatile.as_deref())),
        );
        checks.extend(self.servers.as_deref().map(|s| servers_check(s, self.edge)));
        checks
    }

    fn certificate_check(&self, now: SystemTime) -> CheckResult {
        let id = &self.identity;
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
}

impl Admin {
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<ProxyBody> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        let verbose = req.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == "verbose" || p.starts_with("verbose="))
        });
        match req.uri().path() {
            "/v1/healthz" => text(StatusCode::OK, "OK"),
            "/v1/readyz" => self.readyz(verbose),
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

    fn readyz(&self, verbose: bool) -> Response<ProxyBody> {
        let checks = self.readiness.checks(SystemTime::now());
        let ready = checks.iter().all(|c| c.ok);
        let mut out = String::new();
        for c in &checks {
            match (c.ok, verbose) {
                (true, _) if c.degraded => {
                    out.push_str(&format!("[+]{} degraded: {}\n", c.name, c.detail))
                }
                (true, false) => out.push_str(&format!("[+]{} ok\n", c.name)),
                (true, true) => out.push_str(&format!("[+]{} ok: {}\n", c.name, c.detail)),
                (false, _) => out.push_str(&format!("[-]{} failed: {}\n", c.name, c.detail)),
            }
        }
        out.push_str(if ready {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        let code = if ready {
            StatusCode::OK
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        text(code, out)
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
            not_after: SystemTime::now() + valid_for,
        }
    }

    #[test]
    fn certificate_check_passes_then_fails_after_expiry() {
        let r = Readiness {
            identity: identity(Duration::from_secs(3600)),
            cache: None,
            cache_volatile: None,
            servers: None,
            edge: false,
        };
        assert!(r.checks(SystemTime::now())[0].ok);
        let later = SystemTime::now() + Duration::from_secs(7200);
        let c = &r.checks(later)[0];
        assert!(!c.ok);
        assert!(c.detail.contains("expired"), "{}", c.detail);
    }
}
