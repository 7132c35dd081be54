//! Outpost's node agent: the hub as a process runs it, beside the request path.
//!
//! Start reading at [`Hub::start`]: it is the start-up order, one step per subsystem, each
//! starting its tasks under one [`Supervisor`] that owns shutdown and names every task. The
//! request path itself (classify, route, forward or answer from the cache, filter, respond) is
//! `outpost-proxy`; this crate runs what it relies on.
//!
//! - [`config`]: [`HubConfig`], what the hub is started with.
//! - [`health`]: the servers' probes and the node-lease heartbeat gated on kubelet.
//! - [`identity`]: the hub's client certificate (kubelet's, rotated; or its own by token
//!   bootstrap and CSR) and the secure port's serving certificate.
//! - [`side`]: side data kept from the cloud: the filters' Services and NodePools, the shared
//!   cache's feeds, `yurt-hub-cfg`.
//! - [`pool`]: pool sharing, the leader hub: `leader-hub-<pool>` followed, a leader's port, a
//!   follower's feeds from the leaders.
//! - [`host`]: the node itself: the dummy interface, memory given back after bursts, the state
//!   dump of `kill -USR1`.
//! - [`admin`]: the admin port (`/v1/healthz`, `/v1/readyz`, `/metrics`, `/pods`, `/v1/token`,
//!   OTA).
//! - [`listen`]: the ports' accept loops and what each allows its clients.
//! - [`supervisor`]: the hub's tasks and their shutdown.

pub mod admin;
pub mod config;
pub mod health;
pub mod host;
pub mod identity;
pub mod listen;
pub mod pool;
pub mod side;
pub mod supervisor;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use host::dummy_if::DummyInterface;
use listen::server;
use listen::slots::{self, Slots, port_metrics};
use outpost_certs::serving::CertSlot;
use outpost_proxy::Metrics;
use outpost_proxy::autonomy::lease::LocalLease;
use outpost_proxy::autonomy::node_status::NodeStatus;
use outpost_proxy::autonomy::{Autonomy, KubeletCalls};
use outpost_proxy::callers::{Entry, VerifiedTokens};
use outpost_proxy::edge::{self, Edge};
use outpost_proxy::multiplexer::Multiplexer;
use outpost_proxy::pipeline::Pipeline;
use outpost_proxy::upstream::{ServerStates, Upstream};
use tokio::net::TcpListener;
use tracing::info;

pub use config::{EdgeConfig, HubConfig, SecureConfig, StartError};
pub use outpost_proxy::{LbMode, Server, UpstreamConfig};
pub use side::filters::FilterSettings;
pub use supervisor::Supervisor;

/// A running hub: its listeners bound, serving until [`Hub::shutdown`].
pub struct Hub {
    proxy_addr: SocketAddr,
    admin_addr: SocketAddr,
    secure_addr: Option<SocketAddr>,
    tasks: Arc<Supervisor>,
    /// Kept for shutdown: its edge cache's queued writes are finished before the hub stops.
    pipeline: Arc<Pipeline>,
    /// What [`Hub::state_dump`] reads.
    admin: Arc<admin::Admin>,
    /// Removed at shutdown, after the listeners closed their connections.
    dummy_if: Option<Arc<DummyInterface>>,
}

/// How long a stopping hub waits for the cache writer to apply what was queued. Normally
/// milliseconds; kubelet gives a static pod 30 s to stop.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// How much longer than the connections' grace period a stopping hub waits for its background
/// tasks (the listeners take the grace period itself to close their connections).
const TASK_SLACK: Duration = Duration::from_secs(1);

impl Hub {
    /// Binds the proxy, admin and secure listeners and starts serving on them.
    pub async fn start(config: HubConfig) -> Result<Hub, StartError> {
        let metrics = Metrics::new();
        let tasks = Arc::new(Supervisor::default());
        // The ports first: a busy one ends the start-up before anything else runs.
        let (ports, dummy_if) = Ports::bind(&config, &metrics).await?;
        // The cloud: which servers are healthy, and the clients that reach them.
        let (states, upstream) = connect(&config, &metrics);
        let renewal = config.token_bootstrap.as_ref();
        let interval = config.health.interval;
        identity::keep_client_certificate(interval, renewal, &upstream, &metrics, &tasks);
        let edge = edge_cache(&config, &states, &metrics)?;
        let cloud = (&states, &upstream);
        let (node, edge_mode) = (&config.node_name, edge.is_some());
        let heartbeat = health::start(node, &config.health, edge_mode, cloud, &metrics, &tasks);
        let pool = config
            .pool_sharing
            .clone()
            .filter(|_| !config.pool_scope.is_empty())
            .map(|settings| {
                let store = edge.as_ref().map(|e| e.store().clone());
                pool::PoolSharing::start(settings, &upstream, store.as_ref(), &metrics, &tasks)
            });
        let settings = side_settings(&config, &ports, pool.as_ref());
        let side = side::start(&settings, &upstream, edge.as_ref(), &metrics, &tasks);
        let autonomy = kubelet_autonomy(
            &config,
            edge.as_ref(),
            heartbeat,
            &upstream,
            &metrics,
            &tasks,
        )
        .await;
        let feeds = (edge.as_ref(), pool.clone(), &side.lists);
        let multiplexer = shared_cache(&config, cloud, feeds, &metrics, &tasks);
        host::start(dummy_if.as_ref(), &metrics, &tasks);
        let pipeline = Arc::new(Pipeline {
            upstream: upstream.clone(),
            metrics: metrics.clone(),
            edge,
            autonomy,
            filtering: side.filtering.clone(),
            multiplexer,
            verified_tokens: Arc::new(verified_tokens(&config)),
        });
        let admin = admin(&config, &pipeline, side, ports.serving_cert.clone());
        if let Some(pool) = pool {
            leader_port(&config, pool, &pipeline, ports.serving_cert.clone(), &tasks);
        }
        let hub = ports.serve(&config, pipeline, admin, tasks, dummy_if);
        let servers: Vec<String> = states.servers().map(|s| s.label().to_owned()).collect();
        info!(proxy = %hub.proxy_addr, admin = %hub.admin_addr, secure = ?hub.secure_addr, upstream = ?servers, "hub serving");
        Ok(hub)
    }

    /// Whether an apiserver answers (in edge mode, otherwise the cache does).
    pub fn is_online(&self) -> bool {
        self.pipeline.upstream.states().is_online()
    }

    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The secure port's address, when it is served.
    pub fn secure_addr(&self) -> Option<SocketAddr> {
        self.secure_addr
    }

    /// The hub's state as text, for `kill -USR1` ([`host::dump`]).
    pub fn state_dump(&self) -> String {
        host::dump::render(&self.admin)
    }

    /// Stops accepting, lets open connections finish within the grace period, removes the dummy
    /// interface ([`host::dummy_if`]), applies the cache writes they left queued (bounded by
    /// `SHUTDOWN_DRAIN`, 5 s), and returns. A background task still busy after the grace period
    /// (an apiserver call that hangs) is aborted, so a stopping hub never waits on the cloud.
    pub async fn shutdown(self) {
        self.tasks.stop(server::SHUTDOWN_GRACE + TASK_SLACK).await;
        if let Some(iface) = &self.dummy_if {
            iface.remove().await;
        }
        if let Some(edge) = &self.pipeline.edge {
            edge.finish_writes(SHUTDOWN_DRAIN).await;
        }
        info!("hub stopped");
    }
}

/// The servers' health (as last remembered) and the upstream clients with the node's identity.
fn connect(config: &HubConfig, metrics: &Metrics) -> (Arc<ServerStates>, Arc<Upstream>) {
    metrics.record_client_certificate(&config.upstream.tls.identity);
    let states = health::server_states(&config.health, &config.upstream.servers, metrics);
    let upstream = Arc::new(Upstream::new(
        config.upstream.clone(),
        states.clone(),
        metrics,
    ));
    (states, upstream)
}

/// Edge mode: the cache, and its writer thread.
fn edge_cache(
    config: &HubConfig,
    states: &Arc<ServerStates>,
    metrics: &Metrics,
) -> Result<Option<Edge>, StartError> {
    let Some(c) = &config.edge else {
        return Ok(None);
    };
    let edge = Edge::new(
        c.store.clone(),
        edge::CachePolicy::new(c.agents.clone()),
        states.clone(),
        metrics.clone(),
        c.volatile.is_some(),
        c.max_object_bytes,
    )
    .map_err(StartError::Writer)?;
    Ok(Some(edge.with_min_request_timeout(c.min_request_timeout)))
}

/// Edge mode: kubelet's requests the hub answers itself, with what was kept before a restart
/// taken up, and their tasks started. kubelet's lease and node status need the heartbeat's
/// evidence.
async fn kubelet_autonomy(
    config: &HubConfig,
    edge: Option<&Edge>,
    heartbeat: Option<Arc<KubeletCalls>>,
    upstream: &Arc<Upstream>,
    metrics: &Metrics,
    tasks: &Supervisor,
) -> Option<Autonomy> {
    let edge = edge?;
    let (lease, node_status) = match (heartbeat, &config.health.heartbeat) {
        (Some(calls), Some(hb)) => {
            let store = edge.store().clone();
            let lease = LocalLease::new(&config.node_name, calls.clone(), Some(store.clone()));
            lease.restore().await;
            let status = Arc::new(NodeStatus::new(&config.node_name, store, calls, hb.grace));
            let online = edge.health().subscribe();
            let replay =
                status
                    .clone()
                    .replay_on_reconnect(upstream.clone(), online, tasks.stopping());
            tasks.spawn("node status replay", replay);
            let interval = config.health.interval;
            let condition =
                status
                    .clone()
                    .maintain_autonomy(upstream.clone(), interval, tasks.stopping());
            tasks.spawn("autonomy", condition);
            (Some(lease), Some(status))
        }
        _ => (None, None),
    };
    let (autonomy, started) = Autonomy::start(
        edge,
        upstream,
        (lease, node_status),
        &config.node_name,
        metrics,
        &tasks.stopping(),
    )
    .await;
    for (name, task) in started {
        tasks.spawn(name, task);
    }
    Some(autonomy)
}

/// The pool-scope shared cache (none without `--pool-scope-resources`); its feeds are reflectors
/// this agent runs, started on each resource's first read.
fn shared_cache(
    config: &HubConfig,
    (states, upstream): (&Arc<ServerStates>, &Arc<Upstream>),
    (edge, pool, lists): (
        Option<&Edge>,
        Option<Arc<pool::PoolSharing>>,
        &Arc<side::own::SharedLists>,
    ),
    metrics: &Metrics,
    tasks: &Arc<Supervisor>,
) -> Option<Arc<Multiplexer>> {
    if config.pool_scope.is_empty() {
        return None;
    }
    let feeds = side::ReflectorFeeds {
        upstream: upstream.clone(),
        store: edge.map(|e| e.store().clone()),
        tasks: tasks.clone(),
        pool: pool.map(|p| p.leader_sources()),
        lists: lists.clone(),
    };
    let min_request_timeout = config
        .edge
        .as_ref()
        .map_or(edge::watch::DEFAULT_MIN_REQUEST_TIMEOUT, |c| {
            c.min_request_timeout
        });
    Some(Multiplexer::new(
        &config.pool_scope,
        states,
        Arc::new(feeds),
        metrics,
        min_request_timeout,
        edge.map(|e| e.overlay().clone()),
    ))
}

/// Pool sharing: the leader hub's port, open while this hub is a leader. It presents the secure
/// port's serving certificate, so a hub without a secure port cannot lead (logged).
fn leader_port(
    config: &HubConfig,
    pool: Arc<pool::PoolSharing>,
    pipeline: &Pipeline,
    certificate: Option<Arc<CertSlot>>,
    tasks: &Supervisor,
) {
    let (Some(multiplexer), Some(certificate)) = (pipeline.multiplexer.clone(), certificate) else {
        tracing::warn!(
            "pool sharing: no secure port, so no serving certificate: this hub cannot serve as a leader"
        );
        return;
    };
    let source = pipeline.upstream.tls().source;
    let roots = std::fs::read(&source.ca_file)
        .map_err(|e| e.to_string())
        .and_then(|pem| outpost_certs::ca_roots(&source.ca_file, &pem).map_err(|e| e.to_string()))
        .and_then(|roots| outpost_certs::peers::PeerCheck::new(roots).map_err(|e| e.to_string()));
    let check = match roots {
        Ok(check) => check,
        Err(e) => {
            tracing::warn!(error = %e, "pool sharing: cannot read the cluster CA; this hub cannot serve as a leader");
            return;
        }
    };
    let limits = config.clients.ports(slots::open_files_limit()).secure;
    let port = Arc::new(pool::port::LeaderPort {
        pool,
        multiplexer,
        certificate,
        check,
        limits,
    });
    tasks.spawn("leader hub port", pool::port::run(port, tasks.stopping()));
}

/// The admin endpoints of a hub serving `pipeline`: readiness over the request path's parts
/// and what the agent keeps (`side`, the secure port's `serving_cert`).
fn admin(
    config: &HubConfig,
    pipeline: &Arc<outpost_proxy::pipeline::Pipeline>,
    side: side::Side,
    serving_cert: Option<Arc<outpost_certs::serving::CertSlot>>,
) -> Arc<admin::Admin> {
    let edge = config.edge.as_ref();
    let readiness = admin::Readiness {
        identity: pipeline.upstream.identity(),
        cache: pipeline.edge.as_ref().map(|e| e.store().clone()),
        cache_volatile: edge.and_then(|c| c.volatile.clone()),
        cache_hung_after: edge.map_or(admin::CACHE_HUNG_AFTER, |c| c.hung_after),
        servers: Some(pipeline.upstream.states().clone()),
        edge: pipeline.edge.is_some(),
        config: Some(side.config),
        side_data: side.side_data,
        serving_cert,
        flap_guard: config.health.interval * 2,
        history: std::sync::Mutex::default(),
    };
    Arc::new(admin::Admin {
        readiness,
        metrics: pipeline.metrics.clone(),
        token_bootstrap: config.token_bootstrap.clone(),
        token_updates: tokio::sync::Mutex::default(),
        ota: admin::ota::Ota {
            upstream: pipeline.upstream.clone(),
            node_name: config.node_name.clone(),
        },
        pods: admin::NodePods {
            pipeline: pipeline.clone(),
            node_name: config.node_name.clone(),
        },
    })
}

/// What the side data is started with. The filters' Services are read from the pool's leaders
/// too when Services are pool-scope.
fn side_settings<'c>(
    config: &'c HubConfig,
    ports: &Ports,
    pool: Option<&Arc<pool::PoolSharing>>,
) -> side::Settings<'c> {
    let services = outpost_cache::Gvr::new("", "v1", "services");
    let shared = config.pool_scope.iter().any(|r| r.gvr == services);
    side::Settings {
        node: &config.node_name,
        namespace: &config.namespace,
        filters: config.filters.as_ref(),
        secure_addr: ports.secure_addr(),
        pool: pool.filter(|_| shared).map(|p| p.leader_sources()),
    }
}

/// What the secure port's certificate names: the node, the secure and proxy addresses
/// (unless unspecified) and `--node-ip`.
fn serving_cert_config(
    config: &HubConfig,
    secure: &SecureConfig,
    proxy_addr: SocketAddr,
) -> identity::serving_cert::ServingCertConfig {
    identity::serving_cert::ServingCertConfig {
        node_name: config.node_name.clone(),
        ips: [
            Some(secure.addr.ip()),
            Some(proxy_addr.ip()),
            secure.node_ip,
        ]
        .into_iter()
        .flatten()
        .filter(|ip| !ip.is_unspecified())
        .collect(),
        file: secure.cert_file.clone(),
    }
}

/// Secure-port tokens the apiserver accepted before (kept in a file, when there is one).
fn verified_tokens(config: &HubConfig) -> VerifiedTokens {
    config
        .secure
        .as_ref()
        .and_then(|s| s.tokens_file.as_deref())
        .map(VerifiedTokens::load)
        .unwrap_or_default()
}

/// The hub's listeners, bound.
struct Ports {
    proxy: (TcpListener, SocketAddr),
    admin: (TcpListener, SocketAddr),
    secure: Option<(TcpListener, SocketAddr)>,
    /// The secure port's certificate, once it has one.
    serving_cert: Option<Arc<CertSlot>>,
}

impl Ports {
    /// Binds the proxy and admin ports, then the secure port, on the dummy interface's address
    /// when there is one: the interface is set up once the ports are the hub's (a busy one ends
    /// the start-up), and before the secure port binds its address.
    async fn bind(
        config: &HubConfig,
        metrics: &Metrics,
    ) -> Result<(Ports, Option<Arc<DummyInterface>>), StartError> {
        let proxy = bind(config.proxy_addr, "proxy").await?;
        let admin = bind(config.admin_addr, "admin").await?;
        let dummy_if = host::dummy_interface(config.dummy_if.clone(), metrics).await;
        let secure = match &config.secure {
            Some(secure) => Some(bind_secure(secure.addr)?),
            None => None,
        };
        let ports = Ports {
            proxy,
            admin,
            serving_cert: secure.as_ref().map(|_| Arc::default()),
            secure,
        };
        Ok((ports, dummy_if))
    }

    fn secure_addr(&self) -> Option<SocketAddr> {
        self.secure.as_ref().map(|(_, addr)| *addr)
    }

    /// Serves the pipeline on the proxy and secure ports and the admin endpoints on the admin
    /// port, each within its share of the open-files limit.
    fn serve(
        self,
        config: &HubConfig,
        pipeline: Arc<Pipeline>,
        admin: Arc<admin::Admin>,
        tasks: Arc<Supervisor>,
        dummy_if: Option<Arc<DummyInterface>>,
    ) -> Hub {
        let open_files = slots::open_files_limit();
        let budget = config.clients.ports(open_files);
        info!(
            open_files,
            proxy = budget.proxy.max_connections,
            secure = budget.secure.max_connections,
            admin = budget.admin.max_connections,
            header_timeout = ?budget.proxy.header_timeout,
            idle_timeout = ?budget.proxy.idle_timeout,
            "client connection limits"
        );
        let metrics = &pipeline.metrics;
        let secure_addr = self.secure_addr();
        if let (Some((listener, _)), Some(secure), Some(slot)) =
            (self.secure, &config.secure, self.serving_cert)
        {
            let slots = Slots::new("secure", budget.secure, port_metrics(metrics, "secure"));
            let certificate = serving_cert_config(config, secure, self.proxy.1);
            identity::keep_serving_certificate(certificate, &slot, &pipeline, &tasks);
            let acceptor = tokio_rustls::TlsAcceptor::from(slot.server_config());
            let served = pipeline.clone();
            let handle = move |req| served.clone().handle(req, Entry::Secure);
            tasks.spawn(
                "secure port",
                server::serve_tls(listener, slots, acceptor, handle, tasks.stopping()),
            );
        }
        let served = pipeline.clone();
        let slots = Slots::new("proxy", budget.proxy, port_metrics(metrics, "proxy"));
        let handle = move |req| served.clone().handle(req, Entry::Plain);
        tasks.spawn(
            "proxy port",
            server::serve(self.proxy.0, slots, handle, tasks.stopping()),
        );
        let served = admin.clone();
        let slots = Slots::new("admin", budget.admin, port_metrics(metrics, "admin"));
        let handle = move |req| served.clone().handle(req);
        tasks.spawn(
            "admin port",
            server::serve(self.admin.0, slots, handle, tasks.stopping()),
        );
        Hub {
            proxy_addr: self.proxy.1,
            admin_addr: self.admin.1,
            secure_addr,
            tasks,
            pipeline,
            admin,
            dummy_if,
        }
    }
}

async fn bind(
    addr: SocketAddr,
    what: &'static str,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, what, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    Ok((listener, local))
}

/// The secure port may sit on the dummy interface's address before the interface exists.
fn bind_secure(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let (listener, present) = server::bind_freebind(addr).map_err(|source| StartError::Bind {
        addr,
        what: "secure proxy",
        source,
    })?;
    if !present {
        tracing::warn!(%addr, "this host has no such address yet; the secure port answers once it is configured (the dummy interface)");
    }
    let local = listener.local_addr().unwrap_or(addr);
    Ok((listener, local))
}
