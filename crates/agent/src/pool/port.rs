//! The leader hub's port (`--multiplexer-port`): the shared cache's LISTs and WATCHes of the
//! pool-scope resources, over HTTPS, for the other hubs of the pool.
//!
//! It is open only while this hub is a leader, on its address in `leaders` ([`run`]). Unlike
//! yurthub's leader, which allows every caller, each request is authenticated and authorized
//! ([`LeaderPort::admit`]), and refused as kube-apiserver words it:
//! - `401 Unauthorized`: no client certificate, or one the cluster CA did not issue (or expired);
//! - `403 Forbidden`: a certificate that is not a node's (`system:node:<name>` in
//!   `system:nodes`), a node that is not in this pool (its NodePool's `status.nodes`; an
//!   unknown node is refused), or a request that is not a LIST or WATCH of a pool-scope resource.
//!
//! `GET /healthz` answers `ok` to the same callers while this hub leads: followers probe it
//! to notice a leader that hangs with its connections open ([`super::source`]).
//!
//! Answers come from the shared cache ([`outpost_proxy::multiplexer`]) with its semantics
//! (selectors, resourceVersion resume, bookmarks); a read it cannot answer is `410 Expired` (a
//! resourceVersion outside its window: the follower relists) or `503` (not synced within
//! [`SYNC_WAIT`], or no longer a leader: the follower tries another leader or the cloud). Never
//! the cloud on the caller's behalf.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use outpost_certs::peers::{PeerCertificates, PeerCheck};
use outpost_certs::serving::CertSlot;
use outpost_core::RequestInfo;
use outpost_proxy::body::ProxyBody;
use outpost_proxy::error::ProxyError;
use outpost_proxy::multiplexer::Multiplexer;
use outpost_proxy::pipeline::status_response;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{PoolSharing, Role};
use crate::listen::server;
use crate::listen::slots::{PortLimits, Slots, port_metrics};

/// What followers probe.
pub const HEALTH_PATH: &str = "/healthz";
/// How long a read waits for the shared cache's first list before it is answered 503.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);
/// How long after a failed bind the port is tried again.
const REBIND_AFTER: Duration = Duration::from_secs(5);

/// What the leader's port serves with.
pub struct LeaderPort {
    pub pool: Arc<PoolSharing>,
    pub multiplexer: Arc<Multiplexer>,
    /// The hub's serving certificate (the secure port's).
    pub certificate: Arc<CertSlot>,
    /// Checks clients' certificates against the cluster CA.
    pub check: PeerCheck,
    pub limits: PortLimits,
}

/// Opens the port while this hub is a leader (on its address in `leaders`), closes it when it
/// no longer is, until `shutdown`.
pub async fn run(port: Arc<LeaderPort>, mut shutdown: watch::Receiver<bool>) {
    let mut view = port.pool.view();
    // The open port's address, and what closes it when dropped.
    let mut open: Option<(SocketAddr, watch::Sender<bool>)> = None;
    // The address a failed bind was last logged for: once, not every retry.
    let mut failed: Option<SocketAddr> = None;
    loop {
        let wanted = match port.pool.role() {
            Role::Leader(ip) => Some(SocketAddr::new(ip, port.pool.settings.port)),
            _ => None,
        };
        if open.as_ref().map(|(addr, _)| *addr) != wanted {
            if let Some((addr, close)) = open.take() {
                close.send_replace(true);
                info!(%addr, "leader hub port closed: no longer a leader");
            }
            if let Some(addr) = wanted {
                match port.clone().open(addr).await {
                    Ok(serving) => {
                        open = Some(serving);
                        failed = None;
                    }
                    Err(e) if failed != Some(addr) => {
                        warn!(%addr, error = %e, "cannot open the leader hub port; trying again every 5 s");
                        failed = Some(addr);
                    }
                    Err(_) => {}
                }
            }
        }
        let retry = wanted.is_some() && open.is_none();
        tokio::select! {
            changed = view.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(REBIND_AFTER), if retry => {}
            _ = shutdown.changed() => break,
        }
    }
    if let Some((_, close)) = open {
        close.send_replace(true);
    }
}

impl LeaderPort {
    /// Binds `addr` and serves on it until the returned sender says stop.
    async fn open(
        self: Arc<Self>,
        addr: SocketAddr,
    ) -> std::io::Result<(SocketAddr, watch::Sender<bool>)> {
        let listener = TcpListener::bind(addr).await?;
        let (close, closed) = watch::channel(false);
        let metrics = &self.pool.metrics;
        let slots = Slots::new(
            "multiplexer",
            self.limits,
            port_metrics(metrics, "multiplexer"),
        );
        let tls = self.check.server_config(self.certificate.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let served = self.clone();
        let handle = move |req| served.clone().handle(req);
        tokio::spawn(server::serve_tls(listener, slots, acceptor, handle, closed));
        info!(%addr, "leader hub port open: serving the pool's shared cache");
        Ok((addr, close))
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let probe = req.uri().path() == HEALTH_PATH;
        let (outcome, resp) = match self.answer(&req).await {
            Ok(resp) if probe => ("probed", resp),
            Ok(resp) => ("served", resp),
            Err(e) => {
                let outcome = match &e {
                    ProxyError::Unauthenticated(_) => "unauthenticated",
                    ProxyError::Forbidden(_) | ProxyError::BadRequest(_) => "forbidden",
                    ProxyError::Expired(_) => "expired",
                    _ => "unavailable",
                };
                (outcome, status_response(e.into_status()))
            }
        };
        self.pool
            .metrics
            .pool_port_requests
            .with_label_values(&[outcome])
            .inc();
        resp
    }

    async fn answer(&self, req: &Request<Incoming>) -> Result<Response<ProxyBody>, ProxyError> {
        let path = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        let user_agent = req
            .headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok());
        let info = RequestInfo::classify(req.method(), path, user_agent)?;
        self.admit(req.extensions().get::<PeerCertificates>(), &info)?;
        if !matches!(self.pool.role(), Role::Leader(_)) {
            return Err(ProxyError::PoolUnavailable(
                "this hub is no longer a leader of its pool".into(),
            ));
        }
        if info.path == HEALTH_PATH && req.method() == http::Method::GET {
            return Ok(Response::new(outpost_proxy::body::full("ok")));
        }
        // A bearer token means nothing here: the caller is the node its certificate names.
        let mut headers = req.headers().clone();
        headers.remove(http::header::AUTHORIZATION);
        let read = self.multiplexer.read(&info, &headers).ok_or_else(|| {
            ProxyError::Forbidden(format!(
                "the leader hub serves only LISTs and WATCHes of the pool-scope resources; not {} {}",
                info.verb.as_str(),
                path
            ))
        })?;
        let deadline = tokio::time::Instant::now() + SYNC_WAIT;
        while !read.is_servable() {
            if tokio::time::Instant::now() >= deadline {
                return Err(ProxyError::PoolUnavailable(format!(
                    "its copy of {} is not synced yet",
                    info.resource
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        read.answer(&info).ok_or_else(|| {
            let rv = info.query.resource_version.as_deref().unwrap_or_default();
            ProxyError::Expired(format!(
                "too old resource version: {rv} (the leader hub's window does not reach it)"
            ))
        })
    }

    /// Who may read here: a node of this pool, by a certificate of the cluster CA.
    fn admit(
        &self,
        peers: Option<&PeerCertificates>,
        info: &RequestInfo,
    ) -> Result<(), ProxyError> {
        let chain = peers.map(|p| p.0.as_slice()).unwrap_or_default();
        let who = self
            .check
            .identity(chain)
            .map_err(|e| ProxyError::Unauthenticated(format!("Unauthorized: {e}")))?;
        let pool = self.pool.view.borrow().pool.clone().unwrap_or_default();
        let denied = |why: String| {
            ProxyError::Forbidden(format!(
                "{} is forbidden: User \"{}\" cannot {} resource \"{}\" on the leader hub of pool \"{pool}\": {why}",
                info.resource,
                who.user,
                info.verb.as_str(),
                info.resource
            ))
        };
        let node = who
            .user
            .strip_prefix("system:node:")
            .filter(|_| who.groups.iter().any(|g| g == "system:nodes"))
            .ok_or_else(|| denied("only the nodes of the pool may".into()))?;
        if !self.pool.has_member(node) {
            return Err(denied(format!("node \"{node}\" is not in the pool")));
        }
        Ok(())
    }
}
