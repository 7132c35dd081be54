//! [`FakeApiServer`]: the HTTPS listener, per-connection hyper tasks, fault injection and the
//! server-side API tests use to read and write the cluster state.
//!
//! The listener lives in a slot the accept loop polls, so [`FakeApiServer::refuse_connections`]
//! can close the socket synchronously (the next connect gets `ECONNREFUSED`) and
//! [`FakeApiServer::restore`] can bind the same port again. Connection tasks live in a `JoinSet`,
//! so dropping connections, shutdown and `Drop` abort all of them; watch streams are bodies of
//! those connections and end with them.

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use outpost_core::{Reason, Status};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::authn::Authenticator;
use crate::connections::{
    ConnectionRecord, Counted, HttpVersion, IdentityTraffic, traffic_by_identity,
};
use crate::pki::TestPki;
use crate::registry::{self, Origin, Part, typed};
use crate::resources::{ResourceDef, by_gvr};
use crate::router::{self, ConnInfo};
use crate::state::{RequestRecord, Shared, lock};
use crate::store::{Store, object_key};

/// How the fake behaves; `FakeConfig::default()` is a seeded, lenient-TLS v1.32.4 apiserver.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// Reject TLS handshakes without a valid client certificate. The default (false) matches
    /// kube-apiserver: certificates are requested, and checked per request.
    pub require_client_cert: bool,
    /// How often watches with `allowWatchBookmarks=true` get a `BOOKMARK`.
    pub bookmark_interval: Duration,
    /// Watch events remembered per resource; older resourceVersions get 410 Expired.
    pub event_window: usize,
    /// `/version`'s `gitVersion` (`major` / `minor` are derived from it).
    pub git_version: String,
    /// Load the fixture pods and a small edge cluster (see the `seed` module).
    pub seed: bool,
    /// Which CertificateSigningRequest controllers run in the cluster.
    pub csr_signing: CsrSigning,
    /// Offer HTTP/2 (ALPN `h2`) next to HTTP/1.1, as kube-apiserver does; false offers only
    /// `http/1.1` (a client that offers only `h2` then fails its handshake).
    pub http2: bool,
    /// The concurrent streams one HTTP/2 connection may carry (SETTINGS_MAX_CONCURRENT_STREAMS):
    /// kube-apiserver's 100 when `--http2-max-streams-per-connection` is left at 0.
    pub http2_max_streams: u32,
    /// Compress answers over 128 KiB for requests that accept gzip, as kube-apiserver does by
    /// default (see the `compress` module). Off by default here, so that tests see the bytes
    /// they ask for unless they turn it on.
    pub gzip: bool,
}

/// The controllers that act on CertificateSigningRequests (see the `csr_controller` module).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CsrSigning {
    /// OpenYurt's yurt-manager approves node serving and yurthub client requests, and
    /// kube-controller-manager signs approved `kubernetes.io/*` requests with the cluster CA.
    #[default]
    ApproveAndSign,
    /// No approver: requests stay pending until someone approves them through the `approval`
    /// subresource; kube-controller-manager still signs what gets approved.
    Pending,
    /// Neither: requests are stored and never approved or signed.
    Off,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            require_client_cert: false,
            bookmark_interval: Duration::from_secs(1),
            event_window: 1000,
            git_version: "v1.32.4".to_owned(),
            seed: true,
            csr_signing: CsrSigning::default(),
            http2: true,
            http2_max_streams: 100,
            gzip: false,
        }
    }
}

/// Failures to start the fake.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("certificates: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("manifest: {0}")]
    Manifest(String),
    #[error("{0}")]
    Other(String),
}

type ListenerSlot = Arc<Mutex<Option<TcpListener>>>;
type Connections = Arc<Mutex<JoinSet<()>>>;

/// A running fake kube-apiserver on `127.0.0.1:<ephemeral port>`.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    pki: Arc<TestPki>,
    acceptor: TlsAcceptor,
    listener: ListenerSlot,
    /// While connections are refused: the port, bound but not listening, so that connects get
    /// `ECONNREFUSED` and the kernel hands the port to no one binding port 0 meanwhile (its
    /// ephemeral search skips ports bound with `SO_REUSEADDR`; a hub started during an outage
    /// once got the fake's port and pointed at itself).
    reserved: Mutex<Option<TcpSocket>>,
    accept_task: Mutex<Option<JoinHandle<()>>>,
    /// The in-cluster CSR controllers, if any run.
    controllers: Option<JoinHandle<()>>,
    connections: Connections,
    /// Sockets accepted while blackholed, held open without a handshake.
    held: Arc<Mutex<Vec<TcpStream>>>,
}

fn pem_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, TestkitError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TestkitError::Other(format!("bad certificate PEM: {e}")))
}

fn tls_acceptor(
    pki: &TestPki,
    authn: &Authenticator,
    mandatory: bool,
    http2: bool,
) -> Result<TlsAcceptor, TestkitError> {
    let key = PrivateKeyDer::from_pem_slice(pki.server.key_pem.as_bytes())
        .map_err(|e| TestkitError::Other(format!("bad key PEM: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(authn.tls_verifier(mandatory))
        .with_single_cert(pem_certs(&pki.server.cert_pem)?, key)?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn authenticator(pki: &TestPki) -> Result<Authenticator, TestkitError> {
    let mut roots = RootCertStore::empty();
    for cert in pem_certs(&pki.ca_pem)? {
        roots.add(cert)?;
    }
    Authenticator::new(roots).map_err(|e| TestkitError::Other(e.to_string()))
}

/// Binds with `SO_REUSEADDR` so `restore` can take the same port right after `refuse`.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    reserve(addr)?.listen(1024)
}

/// A socket bound to `addr` and not listening: the kernel refuses connects to it, and will not
/// hand the port to anyone else.
fn reserve(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

impl FakeApiServer {
    /// Starts a fake with a fresh [`TestPki`].
    pub async fn start(config: FakeConfig) -> Result<FakeApiServer, TestkitError> {
        Self::start_with_pki(config, Arc::new(TestPki::new()?)).await
    }

    /// Starts a fake whose serving cert and client CA come from `pki`.
    pub async fn start_with_pki(
        config: FakeConfig,
        pki: Arc<TestPki>,
    ) -> Result<FakeApiServer, TestkitError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let authn = authenticator(&pki)?;
        let acceptor = tls_acceptor(&pki, &authn, config.require_client_cert, config.http2)?;
        let listener = bind("127.0.0.1:0".parse().expect("literal address"))?;
        let addr = listener.local_addr()?;
        let store = Store::new(config.event_window, 0);
        if config.seed {
            crate::seed::seed(&store, &pki);
        }
        store.compact_all();
        let shared = Arc::new(Shared::new(config, store, authn, addr));
        let controllers = crate::csr_controller::spawn(shared.clone(), pki.clone());
        let server = FakeApiServer {
            shared,
            pki,
            acceptor,
            listener: Arc::new(Mutex::new(Some(listener))),
            reserved: Mutex::new(None),
            accept_task: Mutex::new(None),
            controllers,
            connections: Arc::new(Mutex::new(JoinSet::new())),
            held: Arc::new(Mutex::new(Vec::new())),
        };
        server.spawn_accept_loop();
        Ok(server)
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.shared.addr)
    }

    pub fn pki(&self) -> &Arc<TestPki> {
        &self.pki
    }

    /// Registers a bearer token for `user` in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.shared.authn.add_token(token, user, groups);
    }

    /// Registers a kubeadm bootstrap token `<id>.<secret>` (user `system:bootstrap:<id>`, groups
    /// `system:bootstrappers` and `system:authenticated`) and publishes `kube-public/cluster-info`
    /// signed with it, readable anonymously, as kubeadm's bootstrap-signer does:
    ///
    /// - `data.kubeconfig`: the cluster as `kubeadm init` writes it (this fake's CA inline,
    ///   `server` = [`FakeApiServer::url`]), unless the ConfigMap already holds one, which is
    ///   then what gets signed;
    /// - `data.jws-kubeconfig-<id>`: its detached JWS (HS256 keyed with the secret), as
    ///   `k8s.io/cluster-bootstrap`'s `jws.ComputeDetachedSignature` makes it; each token adds its
    ///   own, earlier ones stay;
    /// - Role and RoleBinding `kube-public/kubeadm:bootstrap-signer-clusterinfo`: `get` on that
    ///   ConfigMap for `system:anonymous`.
    ///
    /// The `kube-public` namespace is created if missing (kube-apiserver keeps it). A token not of
    /// the form `[a-z0-9]{6}\.[a-z0-9]{16}` is a 400 [`Status`] and changes nothing; the token
    /// is registered last, once the objects are stored.
    pub fn add_bootstrap_token(&self, token: &str) -> Result<(), Status> {
        use crate::bootstrap::{self, BOOTSTRAPPERS, CLUSTER_INFO, KUBE_PUBLIC, USER_PREFIX};
        const CONFIGMAPS: &str = "v1/configmaps";
        let (id, secret) = bootstrap::parse_token(token)?;
        if self.get("v1/namespaces", None, KUBE_PUBLIC).is_none() {
            let namespace = serde_json::json!({
                "metadata": {"name": KUBE_PUBLIC},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            });
            match self.create("v1/namespaces", namespace) {
                Err(e) if e.reason != Reason::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        self.apply_rbac(&bootstrap::cluster_info_rbac())?;
        let kubeconfig = crate::kubeconfig::cluster_info(&self.url(), &self.pki.ca_pem);
        // Read, change, write with the resourceVersion read; retried on a concurrent write.
        let mut attempts = 0;
        loop {
            let current = self.get(CONFIGMAPS, Some(KUBE_PUBLIC), CLUSTER_INFO);
            let exists = current.is_some();
            let next = bootstrap::cluster_info(current, &kubeconfig, id, secret);
            let written = if exists {
                self.update(CONFIGMAPS, next)
            } else {
                self.create(CONFIGMAPS, next)
            };
            attempts += 1;
            match written {
                Ok(_) => break,
                Err(e)
                    if attempts < 5
                        && matches!(e.reason, Reason::Conflict | Reason::AlreadyExists) => {}
                Err(e) => return Err(e),
            }
        }
        let user = format!("{USER_PREFIX}{id}");
        self.add_token(token, &user, &[BOOTSTRAPPERS, "system:authenticated"]);
        Ok(())
    }

    fn spawn_accept_loop(&self) {
        let task = tokio::spawn(accept_loop(
            self.shared.clone(),
            self.acceptor.clone(),
            self.listener.clone(),
            self.connections.clone(),
            self.held.clone(),
        ));
        if let Some(old) = lock(&self.accept_task).replace(task) {
            old.abort();
        }
    }

    fn drop_connections(&self) {
        lock(&self.connections).abort_all();
        lock(&self.held).clear();
    }

    // ---- server-side object API ----------------------------------------------------------

    fn def(gvr: &str) -> Result<&'static ResourceDef, Status> {
        by_gvr(gvr).ok_or_else(|| {
            Status::new(
                Reason::NotFound,
                format!("the server could not find the requested resource ({gvr})"),
            )
        })
    }

    /// Creates an object as a controller would (status kept as given); the namespace comes from
    /// `metadata.namespace`, defaulting to `default`.
    pub fn create(&self, gvr: &str, obj: Value) -> Result<Value, Status> {
        let def = Self::def(gvr)?;
        let ns = namespace_of(def, &obj);
        registry::create(&self.shared.store, def, ns.as_deref(), obj, Origin::Server)
    }

    /// Replaces an object (status included); a `metadata.resourceVersion` must be current.
    pub fn update(&self, gvr: &str, obj: Value) -> Result<Value, Status> {
        let def = Self::def(gvr)?;
        let ns = namespace_of(def, &obj);
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let store = &self.shared.store;
        registry::update(
            store,
            def,
            ns.as_deref(),
            &name,
            obj,
            Part::Main,
            Origin::Server,
        )
        .map(|w| w.object)
    }

    /// Deletes an object (finalizers are honoured); returns it.
    pub fn delete(&self, gvr: &str, namespace: Option<&str>, name: &str) -> Result<Value, Status> {
        let def = Self::def(gvr)?;
        registry::delete(&self.shared.store, def, namespace, name, &Value::Null).map(|d| d.object)
    }

    /// The object, with `kind` and `apiVersion`.
    pub fn get(&self, gvr: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let def = by_gvr(gvr)?;
        let obj = self
            .shared
            .store
            .get(def, &object_key(def, namespace, name))?;
        Some(typed(def, &obj))
    }

    /// All objects (of one namespace, or all), in etcd key order, with `kind` and `apiVersion`.
    pub fn list(&self, gvr: &str, namespace: Option<&str>) -> Vec<Value> {
        let Some(def) = by_gvr(gvr) else {
            return Vec::new();
        };
        let prefix = match namespace {
            Some(ns) if def.namespaced => format!("{ns}/"),
            _ => String::new(),
        };
        let (_, items) = self.shared.store.list(def, &prefix);
        items.iter().map(|(_, o)| typed(def, o)).collect()
    }

    /// Creates or replaces RBAC objects (`ClusterRole`, `ClusterRoleBinding`, `Role`,
    /// `RoleBinding`, picked by `kind`) as `kubectl apply` would; they take effect from the next
    /// request, exactly like objects created over REST. Every object is checked (it must parse
    /// as its k8s-openapi type, and bindings must reference a role of a valid kind) before any
    /// is stored.
    pub fn apply_rbac(&self, objects: &[Value]) -> Result<(), Status> {
        let gvrs = objects
            .iter()
            .map(crate::rbac::checked_gvr)
            .collect::<Result<Vec<_>, _>>()?;
        for (gvr, obj) in gvrs.into_iter().zip(objects) {
            // Without a resourceVersion, an update replaces unconditionally and creates what is
            // missing (RBAC types allow create-on-update).
            self.update(gvr, obj.clone())?;
        }
        Ok(())
    }

    /// The global (etcd-like) resourceVersion.
    pub fn current_resource_version(&self) -> u64 {
        self.shared.store.current_rv()
    }

    // ---- fault injection -----------------------------------------------------------------

    /// Closes the listening socket (connects get `ECONNREFUSED`) and drops open connections.
    /// The port stays reserved for [`FakeApiServer::restore`].
    pub fn refuse_connections(&self) {
        lock(&self.listener).take();
        if let Some(task) = lock(&self.accept_task).take() {
            task.abort();
        }
        match reserve(self.shared.addr) {
            Ok(socket) => *lock(&self.reserved) = Some(socket),
            Err(e) => {
                tracing::warn!(addr = %self.shared.addr, error = %e, "cannot reserve the refused port")
            }
        }
        self.drop_connections();
    }

    /// Accepts TCP but never answers: no TLS handshake for new sockets, and requests / watch
    /// events on existing connections stall until [`FakeApiServer::restore`].
    pub fn blackhole(&self) {
        self.shared.faults.set_blackhole(true);
    }

    /// Delays every response by `d`.
    pub fn set_latency(&self, d: Duration) {
        self.shared.faults.set_latency(d);
    }

    /// Delays the answers to requests whose path starts with `prefix` by `d`; the rest of the
    /// server answers at once (`None` = off).
    pub fn delay_requests_under(&self, prefix: &str, d: Option<Duration>) {
        self.shared
            .faults
            .set_delay_under(d.map(|d| (prefix.to_owned(), d)));
    }

    /// Answers every request with this code and a matching Status body (`None` = off).
    pub fn fail_requests(&self, code: Option<u16>) {
        self.shared.faults.set_fail(code);
    }

    /// Answers requests whose path starts with `prefix` with this code and a matching Status
    /// body, as kube-apiserver answers for an aggregated API whose backend is down; the rest of
    /// the server, `/readyz` included, works (`None` = off).
    pub fn fail_requests_under(&self, prefix: &str, code: Option<u16>) {
        self.shared
            .faults
            .set_fail_under(code.map(|code| (prefix.to_owned(), code)));
    }

    /// The `Retry-After` (seconds) of the 429s and 503s injected above; 1 unless set.
    pub fn set_retry_after(&self, seconds: u32) {
        self.shared.faults.set_retry_after(seconds);
    }

    /// Goes away, as Go's HTTP/2 server does under kube-apiserver's `--goaway-chance`, on the
    /// next connection where the client opens `streams` more streams: one GOAWAY naming the
    /// last of them, and the streams the client opened before it heard ignored, never
    /// answered. Takes a link with latency (the testkit's relay) for streams to cross it.
    pub fn go_away_after_streams(&self, streams: u32) {
        self.shared.go_away.after_streams_on(1, streams);
    }

    /// [`Self::go_away_after_streams`] on each of the next `connections` connections in turn,
    /// as a server under a high `--goaway-chance` may: the streams that crossed one GOAWAY and
    /// went again on a new connection can cross the next.
    pub fn go_away_after_streams_on(&self, connections: u32, streams: u32) {
        self.shared.go_away.after_streams_on(connections, streams);
    }

    /// Closes the connection of the next `times` requests whose path starts with `prefix` once
    /// each is read, without answering, as a link that drops an exchange does (a NAT that forgot
    /// the connection, a reset on the way); new connections and other requests work.
    pub fn hang_up_under(&self, prefix: &str, times: usize) {
        self.shared
            .faults
            .set_hang_up_under(Some((prefix.to_owned(), times)));
    }

    /// Answers requests whose path starts with `prefix` with their status and headers at
    /// once, then their body at `pace` (a few bytes per tick), or with `None` never: an
    /// apiserver, or a proxy in front of it, that stalls or trickles mid-answer. New
    /// connections, probes and other paths work.
    pub fn slow_bodies_under(&self, prefix: &str, pace: Option<Duration>) {
        self.shared
            .faults
            .set_slow_bodies_under(Some((prefix.to_owned(), pace)));
    }

    /// Answers the next `times` requests (not watches) whose path starts with `prefix` `delay`
    /// late: the answer is computed when the request arrives (a LIST holds the state and
    /// resourceVersion of that moment) and sent after the delay, as from an apiserver whose
    /// answer is slow on the wire. Other requests, watch events included, go on meanwhile.
    pub fn answer_late_under(&self, prefix: &str, delay: Duration, times: usize) {
        self.shared
            .faults
            .set_late_under(Some((prefix.to_owned(), delay, times)));
    }

    /// Answers requests for exactly `path` (any query) as if they were for `answered_as`, as a
    /// misbehaving upstream would: the client asked for one object and gets another.
    pub fn answer_as(&self, path: &str, answered_as: &str) {
        self.shared.faults.add_answer_as(path, answered_as);
    }

    /// Aborts every open watch stream mid-body (the connection drops without a final chunk).
    pub fn cut_watches(&self) {
        self.shared.cut.send_modify(|generation| *generation += 1);
    }

    /// Undoes refuse / blackhole / latency / failures, rebinding the same port if needed.
    pub async fn restore(&self) {
        self.shared.faults.set_latency(Duration::ZERO);
        self.shared.faults.set_fail(None);
        self.shared.faults.set_fail_under(None);
        self.shared.faults.set_hang_up_under(None);
        self.shared.faults.set_delay_under(None);
        self.shared.faults.set_slow_bodies_under(None);
        self.shared.faults.set_late_under(None);
        self.shared.faults.clear_answer_as();
        self.shared.faults.set_blackhole(false);
        if lock(&self.listener).is_none() {
            self.rebind().await;
        }
        let held: Vec<TcpStream> = std::mem::take(&mut *lock(&self.held));
        let mut conns = lock(&self.connections);
        for tcp in held {
            conns.spawn(serve_connection(
                self.shared.clone(),
                self.acceptor.clone(),
                tcp,
            ));
        }
    }

    /// The port may linger briefly in the kernel; retry for up to ~2 s.
    async fn rebind(&self) {
        lock(&self.reserved).take();
        for _ in 0..100 {
            match bind(self.shared.addr) {
                Ok(listener) => {
                    *lock(&self.listener) = Some(listener);
                    self.spawn_accept_loop();
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        tracing::error!(addr = %self.shared.addr, "fake apiserver could not rebind its port");
    }

    // ---- request log ---------------------------------------------------------------------

    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }

    // ---- connection accounting -----------------------------------------------------------

    /// Every connection accepted so far, open or closed, in accept order, with what it carried
    /// (see [`ConnectionRecord`]). Sockets held by a blackhole count once they are served.
    pub fn connections(&self) -> Vec<ConnectionRecord> {
        self.shared.connections.snapshot()
    }

    /// [`FakeApiServer::connections`] summed per identity: connections accepted and open, by
    /// HTTP version, requests, and bytes written and read.
    pub fn traffic(&self) -> BTreeMap<String, IdentityTraffic> {
        traffic_by_identity(&self.connections())
    }

    /// Forgets closed connections; open ones keep their counts so far.
    pub fn clear_closed_connections(&self) {
        self.shared.connections.clear_closed();
    }

    /// Stops accepting, aborts every connection (and so every watch) and frees the port.
    pub async fn shutdown(self) {
        lock(&self.listener).take();
        let accept = lock(&self.accept_task).take();
        if let Some(task) = accept {
            task.abort();
            let _ = task.await;
        }
        let mut conns = std::mem::take(&mut *lock(&self.connections));
        conns.shutdown().await;
        lock(&self.held).clear();
    }

    /// Writes a kubeconfig (plus client cert, key and CA files) for `user` in `groups`
    /// talking to this fake directly, and returns its path.
    pub fn kubeconfig_for(&self, dir: &Path, user: &str, groups: &[&str]) -> PathBuf {
        crate::kubeconfig::write(dir, &self.url(), &self.pki, user, groups)
            .unwrap_or_else(|e| panic!("writing a kubeconfig into {}: {e}", dir.display()))
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.accept_task).take() {
            task.abort();
        }
        if let Some(task) = &self.controllers {
            task.abort();
        }
        // Dropping the JoinSet would abort too, but the Arc may outlive us in the accept task.
        lock(&self.connections).abort_all();
    }
}

fn namespace_of(def: &ResourceDef, obj: &Value) -> Option<String> {
    if !def.namespaced {
        return None;
    }
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    Some(ns.to_owned())
}

async fn accept_loop(
    shared: Arc<Shared>,
    acceptor: TlsAcceptor,
    listener: ListenerSlot,
    connections: Connections,
    held: Arc<Mutex<Vec<TcpStream>>>,
) {
    loop {
        let accepted = poll_fn(|cx| match lock(&listener).as_ref() {
            Some(l) => l.poll_accept(cx).map(Some),
            None => Poll::Ready(None),
        })
        .await;
        let tcp = match accepted {
            None => return,
            Some(Ok((tcp, _))) => tcp,
            // Transient (e.g. EMFILE): back off instead of spinning.
            Some(Err(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.faults.blackholed() {
            lock(&held).push(tcp);
            continue;
        }
        let mut conns = lock(&connections);
        while conns.try_join_next().is_some() {}
        conns.spawn(serve_connection(shared.clone(), acceptor.clone(), tcp));
    }
}

/// One connection from accept to close: TLS, then HTTP/2 if ALPN chose `h2`, HTTP/1.1
/// otherwise; counted in the connection log all along.
async fn serve_connection(shared: Arc<Shared>, acceptor: TlsAcceptor, tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    let open = shared.connections.open();
    let stats = open.stats().clone();
    let Ok(tls) = acceptor.accept(Counted::new(tcp, stats.clone())).await else {
        return;
    };
    let session = tls.get_ref().1;
    let peer_certs: Option<Vec<CertificateDer<'static>>> = session
        .peer_certificates()
        .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect());
    if let Some(user) = peer_certs
        .as_ref()
        .and_then(|certs| certs.first())
        .and_then(crate::authn::identity_of)
    {
        stats.claim_identity(&user.name);
    }
    let version = match session.alpn_protocol() {
        Some(b"h2") => HttpVersion::Http2,
        _ => HttpVersion::Http1,
    };
    stats.set_version(version);
    let max_streams = shared.config.http2_max_streams;
    let conn = Arc::new(ConnInfo { peer_certs, stats });
    let go_away = shared.go_away.clone();
    let service = service_fn(move |req| router::serve(shared.clone(), conn.clone(), req));
    let _ = match version {
        HttpVersion::Http2 => {
            let io = TokioIo::new(crate::goaway::GoAwayTap::new(tls, go_away));
            http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(max_streams)
                .serve_connection(io, service)
                .await
        }
        HttpVersion::Http1 => {
            let io = TokioIo::new(tls);
            http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(io, service)
                .with_upgrades()
                .await
        }
    };
    drop(open);
}
