//! Outpost's listeners and request pipeline.
//!
//! Start reading at [`pipeline`]: it spells out the request lifecycle (classify → route →
//! remote | cache → filter → respond) and the code follows that order. [`Hub::start`] assembles
//! the pieces and binds the listeners (proxy, admin, and the secure port for in-cluster clients);
//! the `outpost` binary, the tests and the demo all run the hub through it.
//!
//! - [`pipeline`]: the four stages of one request.
//! - [`route`]: the routing decision.
//! - [`edge`]: edge mode — what is cached, the tee into the cache, offline serving.
//! - [`health`]: per-server health, the node-lease heartbeat gated on kubelet, kubelet's lease.
//! - [`upstream`]: apiserver addresses, load-balancing mode, pooled TLS clients, error sorting.
//! - [`error`]: every failure and its one mapping to a Kubernetes `Status`.
//! - [`headers`]: hop-by-hop hygiene, upgrade and bearer detection.
//! - [`callers`]: the plain and secure entries, and the tokens the cache may answer offline.
//! - [`serving_cert`]: the secure port's certificate, requested from the cluster by CSR;
//!   [`dummy_if`]: the node-local address it listens on (yurthub's `hub-dummy0`).
//! - [`filtering`]: yurthub's response filters in the pipeline, and the side data they read.
//! - [`multiplexer`]: the pool-scope shared cache (Services, EndpointSlices) all callers read.
//! - [`reflector`]: list + watch of the objects the hub keeps for itself (Services, NodePools).
//! - [`hubcfg`]: the `yurt-hub-cfg` ConfigMap, watched live.
//! - [`memory`]: freed memory given back to the kernel after bursts (glibc's `malloc_trim`).
//! - [`admin`]: `/v1/healthz`, `/v1/readyz`, `/metrics`, `/pods`, `/v1/token`, OTA; [`dump`]:
//!   the state dump of `kill -USR1`.
//! - [`bootstrap`]: token mode — the hub's own client certificate, obtained, kept and renewed.
//! - [`ota`]: yurthub's OTA endpoints for DaemonSet pods.
//! - [`server`]: HTTP/1.1 accept loops (plain and TLS) with graceful shutdown; [`slots`]: what
//!   each port allows its clients (a connection cap, header-read and idle timeouts).

pub mod admin;
pub mod autonomy;
pub mod body;
pub mod bootstrap;
pub mod callers;
pub mod connections;
mod csr;
pub mod dummy_if;
pub mod dump;
pub mod edge;
pub mod error;
pub mod filtering;
pub mod headers;
pub mod health;
pub mod hubcfg;
pub mod memory;
pub mod metrics;
pub mod multiplexer;
pub(crate) mod objects;
pub mod ota;
pub mod pipeline;
pub mod reflector;
pub mod route;
pub mod server;
pub mod serving_cert;
pub mod slots;
pub mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use error::ProxyError;
pub use metrics::Metrics;
pub use upstream::{LbMode, Server, UpstreamConfig};

/// Everything the hub needs to start.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `--node-name`: whose certificate the hub borrows and whose pods `/pods` lists.
    pub node_name: String,
    /// `--bind-proxy-address:--proxy-port` (127.0.0.1:10261); port 0 picks a free one.
    pub proxy_addr: SocketAddr,
    /// `--bind-address:--serve-port` (127.0.0.1:10267); port 0 picks a free one.
    pub admin_addr: SocketAddr,
    pub upstream: UpstreamConfig,
    /// Edge mode: the cache. `None` is cloud mode (proxy only, nothing written to disk).
    pub edge: Option<EdgeConfig>,
    /// `--namespace`: where `yurt-hub-cfg` lives (kube-system).
    pub namespace: String,
    /// Probes, heartbeat and kubelet gating.
    pub health: health::HealthConfig,
    /// Response filters; `None` turns filtering off entirely (as does
    /// `--enable-resource-filter=false`).
    pub filters: Option<filtering::FilterSettings>,
    /// `--pool-scope-resources`: what the shared cache holds (empty: no shared cache).
    pub pool_scope: Vec<multiplexer::PoolScopeResource>,
    /// The HTTPS port for in-cluster clients; `None` serves none.
    pub secure: Option<SecureConfig>,
    /// `--enable-dummy-if`: the interface holding the address in-cluster clients are pointed at
    /// (the secure port's); `None` configures nothing.
    pub dummy_if: Option<dummy_if::DummyIfConfig>,
    /// Token mode: the client certificate is the hub's own, renewed in place
    /// ([`bootstrap::renew_client_certificate`]) and re-bootstrapped by `/v1/token`; `None` when
    /// it is kubelet's.
    pub token_bootstrap: Option<bootstrap::TokenBootstrap>,
    /// Header-read and idle timeouts of client connections, and the ports' caps.
    pub clients: slots::ClientLimits,
}

/// The secure port: where `masterservice` sends in-cluster clients.
#[derive(Debug, Clone)]
pub struct SecureConfig {
    /// `--dummy-if-ip` (or `--bind-proxy-address`) `:--proxy-secure-port`.
    pub addr: SocketAddr,
    /// `<root-dir>/pki/yurthub-server-current.pem`.
    pub cert_file: PathBuf,
    /// Where accepted tokens' digests are kept; `None` keeps them in memory only.
    pub tokens_file: Option<PathBuf>,
    /// `--node-ip`: one more address the serving certificate names.
    pub node_ip: Option<std::net::IpAddr>,
}

/// The edge cache's settings.
#[derive(Clone)]
pub struct EdgeConfig {
    pub store: Arc<dyn outpost_cache::Store>,
    pub agents: edge::CacheAgents,
    /// Why the disk cache could not be opened, when `store` is an in-memory stand-in: the hub
    /// still proxies and caches for its own lifetime, and readiness says the cache is degraded.
    pub volatile: Option<String>,
    /// `--min-request-timeout`: an offline watch without `timeoutSeconds` lasts 1x-2x of it.
    pub min_request_timeout: Duration,
    /// `--cache-max-object-bytes`: larger objects are proxied but not cached.
    pub max_object_bytes: usize,
    /// How long a store call may go without progress before `/v1/healthz` fails
    /// ([`admin::CACHE_HUNG_AFTER`]).
    pub hung_after: Duration,
}

impl std::fmt::Debug for EdgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeConfig")
            .field("agents", &self.agents)
            .finish_non_exhaustive()
    }
}

/// Why the hub could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot start the cache writer thread: {0}")]
    Writer(std::io::Error),
}

/// A running hub: its listeners bound, serving until [`Hub::shutdown`].
pub struct Hub {
    proxy_addr: SocketAddr,
    admin_addr: SocketAddr,
    secure_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    /// Every task the hub started, named for the log if one must be aborted at shutdown.
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    /// Kept for shutdown: its edge cache's queued writes are finished before the hub stops.
    pipeline: Arc<pipeline::Pipeline>,
    /// What [`Hub::state_dump`] reads.
    admin: Arc<admin::Admin>,
    /// Removed at shutdown, after the listeners closed their connections.
    dummy_if: Option<Arc<dummy_if::DummyInterface>>,
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
        let proxy_listener = bind(config.proxy_addr, "proxy").await?;
        let admin_listener = bind(config.admin_addr, "admin").await?;
        let metrics = Metrics::new();
        // Once the ports are the hub's (a busy one ends the start-up), and before the secure
        // port binds its address: in-cluster clients are sent there.
        let dummy_if = match config.dummy_if.clone() {
            Some(c) => {
                let iface = Arc::new(dummy_if::DummyInterface::new(
                    c,
                    metrics.dummy_if_ready.clone(),
                ));
                iface.ensure().await;
                Some(iface)
            }
            None => None,
        };
        let secure_listener = match &config.secure {
            Some(secure) => Some(bind_secure(secure.addr)?),
            None => None,
        };
        let proxy_addr = local_addr(&proxy_listener, config.proxy_addr);
        let admin_addr = local_addr(&admin_listener, config.admin_addr);
        let secure_addr = secure_listener
            .as_ref()
            .zip(config.secure.as_ref())
            .map(|(l, c)| local_addr(l, c.addr));

        metrics.record_client_certificate(&config.upstream.tls.identity);
        let servers: Vec<String> = config.upstream.servers.iter().map(Server::label).collect();
        let initially_healthy = config
            .health
            .state_file
            .as_deref()
            .map(|path| health::prober::remembered(path, &servers))
            .unwrap_or_default();
        let states = Arc::new(health::ServerStates::new(
            config.upstream.servers.clone(),
            &initially_healthy,
            config.health.healthy_threshold,
            &metrics,
        ));
        let upstream = Arc::new(upstream::Upstream::new(
            config.upstream,
            states.clone(),
            metrics.upstream_connections.clone(),
        ));
        let volatile = config.edge.as_ref().and_then(|c| c.volatile.clone());
        let cache_hung_after = config
            .edge
            .as_ref()
            .map_or(admin::CACHE_HUNG_AFTER, |c| c.hung_after);
        let min_request_timeout = config
            .edge
            .as_ref()
            .map_or(edge::watch::DEFAULT_MIN_REQUEST_TIMEOUT, |c| {
                c.min_request_timeout
            });
        let edge = match config.edge {
            Some(c) => Some(
                edge::Edge::new(
                    c.store,
                    edge::CachePolicy::new(c.agents),
                    states.clone(),
                    metrics.clone(),
                    c.volatile.is_some(),
                    c.max_object_bytes,
                )
                .map_err(StartError::Writer)?
                .with_min_request_timeout(c.min_request_timeout),
            ),
            None => None,
        };
        let heartbeat = match (&edge, &config.health.heartbeat) {
            (Some(_), Some(hb)) => Some(Arc::new(health::prober::Heartbeat::new(
                hb.clone(),
                Arc::default(),
            ))),
            _ => None,
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        let serving_cert = secure_listener
            .as_ref()
            .map(|_| Arc::new(outpost_certs::serving::CertSlot::default()));
        let mut readiness = admin::Readiness {
            identity: upstream.identity(),
            cache: edge.as_ref().map(|e| e.store().clone()),
            cache_volatile: volatile,
            cache_hung_after,
            servers: Some(states.clone()),
            edge: edge.is_some(),
            config: None,
            side_data: Default::default(),
            serving_cert: serving_cert.clone(),
            flap_guard: config.health.interval * 2,
            history: std::sync::Mutex::default(),
        };
        let mut tasks = vec![(
            "client certificate",
            tokio::spawn(upstream::watch_client_certificate(
                upstream.clone(),
                metrics.clone(),
                config.health.interval,
                shutdown_rx.clone(),
            )),
        )];
        if let Some(token_bootstrap) = &config.token_bootstrap {
            tasks.push((
                "client certificate renewal",
                tokio::spawn(bootstrap::renew_client_certificate(
                    upstream.clone(),
                    token_bootstrap.clone(),
                    shutdown_rx.clone(),
                )),
            ));
        }
        tasks.push((
            "prober",
            tokio::spawn(health::prober::run(
                states,
                upstream.clone(),
                heartbeat.clone(),
                config.health.clone(),
                metrics.clone(),
                shutdown_rx.clone(),
            )),
        ));
        let cfg_watch = hubcfg::ConfigWatch::new(
            &config.namespace,
            upstream.clone(),
            edge.as_ref().map(|e| e.store().clone()),
        );
        if let Some(edge) = &edge {
            tasks.push((
                "cache agents",
                tokio::spawn(apply_cache_agents(
                    cfg_watch.subscribe(),
                    edge.policy().clone(),
                )),
            ));
        }
        // Port 0 picks a free port: the rewritten Services must point where the hub listens.
        let filter_settings = config.filters.clone().map(|mut settings| {
            if let Some(addr) = secure_addr {
                settings.hub_port = addr.port();
            }
            settings
        });
        let filtering = match &filter_settings {
            Some(settings) => {
                let (filtering, side_tasks, side_sync) = filtering::SideData::start(
                    settings,
                    &upstream,
                    edge.as_ref().map(|e| e.store()),
                    &metrics,
                    &shutdown_rx,
                );
                tasks.extend(side_tasks.into_iter().map(|task| ("side data", task)));
                tasks.push((
                    "filter settings",
                    tokio::spawn(filtering::apply_hub_cfg(
                        cfg_watch.subscribe(),
                        filtering.clone(),
                    )),
                ));
                readiness.side_data = side_sync;
                Some(filtering)
            }
            None => None,
        };
        let multiplexer = (!config.pool_scope.is_empty()).then(|| {
            multiplexer::Multiplexer::new(
                &config.pool_scope,
                &upstream,
                edge.as_ref().map(|e| e.store()),
                &metrics,
                min_request_timeout,
                &shutdown_rx,
                edge.as_ref().map(|e| e.overlay().clone()),
            )
        });
        readiness.config = Some(cfg_watch.sync_state());
        if let Some(iface) = &dummy_if {
            tasks.push((
                "dummy interface",
                tokio::spawn(dummy_if::maintain(iface.clone(), shutdown_rx.clone())),
            ));
        }
        tasks.push((
            "memory trim",
            tokio::spawn(memory::trim_after_bursts(
                metrics.clone(),
                shutdown_rx.clone(),
            )),
        ));
        tasks.push((
            "yurt-hub-cfg",
            tokio::spawn(cfg_watch.run(shutdown_rx.clone())),
        ));
        let local_lease = match (&heartbeat, &config.health.heartbeat) {
            (Some(hb), Some(c)) => {
                let lease = health::local_lease::LocalLease::new(
                    &c.node_name,
                    hb.calls.clone(),
                    edge.as_ref().map(|e| e.store().clone()),
                );
                lease.restore().await;
                Some(lease)
            }
            _ => None,
        };
        let node_status = match (&edge, &config.health.heartbeat, &heartbeat) {
            (Some(edge), Some(c), Some(hb)) => {
                let status = Arc::new(health::node_status::NodeStatus::new(
                    &c.node_name,
                    edge.store().clone(),
                    hb.calls.clone(),
                    c.grace,
                ));
                tasks.push((
                    "node status replay",
                    tokio::spawn(status.clone().replay_on_reconnect(
                        upstream.clone(),
                        edge.health().subscribe(),
                        shutdown_rx.clone(),
                    )),
                ));
                tasks.push((
                    "autonomy",
                    tokio::spawn(status.clone().maintain_autonomy(
                        upstream.clone(),
                        config.health.interval,
                        shutdown_rx.clone(),
                    )),
                ));
                Some(status)
            }
            _ => None,
        };
        let verified_tokens = Arc::new(
            config
                .secure
                .as_ref()
                .and_then(|s| s.tokens_file.as_deref())
                .map(callers::VerifiedTokens::load)
                .unwrap_or_default(),
        );
        let autonomy = match &edge {
            Some(edge) => {
                let (autonomy, started) = autonomy::Autonomy::start(
                    edge,
                    &upstream,
                    (local_lease, node_status),
                    &config.node_name,
                    &metrics,
                    &shutdown_rx,
                )
                .await;
                tasks.extend(started);
                Some(autonomy)
            }
            None => None,
        };
        let pipeline = Arc::new(pipeline::Pipeline {
            upstream,
            metrics: metrics.clone(),
            edge,
            autonomy,
            filtering,
            multiplexer,
            verified_tokens,
        });
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
        if let (Some(listener), Some(secure), Some(slot)) =
            (secure_listener, &config.secure, serving_cert)
        {
            let slots = slots::Slots::new("secure", budget.secure, metrics.port("secure"));
            let certificate = serving_cert::ServingCertConfig {
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
            };
            tasks.extend(serve_secure(
                listener,
                slots,
                slot,
                certificate,
                &pipeline,
                &shutdown_rx,
            ));
        }
        let admin = Arc::new(admin::Admin {
            readiness,
            metrics,
            token_bootstrap: config.token_bootstrap,
            token_updates: tokio::sync::Mutex::default(),
            ota: ota::Ota {
                upstream: pipeline.upstream.clone(),
                node_name: config.node_name.clone(),
            },
            pods: admin::NodePods {
                pipeline: pipeline.clone(),
                node_name: config.node_name.clone(),
            },
        });

        let kept = pipeline.clone();
        let proxy_task = tokio::spawn(server::serve(
            proxy_listener,
            slots::Slots::new("proxy", budget.proxy, admin.metrics.port("proxy")),
            move |req| pipeline.clone().handle(req, callers::Entry::Plain),
            shutdown_rx.clone(),
        ));
        let served = admin.clone();
        let admin_task = tokio::spawn(server::serve(
            admin_listener,
            slots::Slots::new("admin", budget.admin, admin.metrics.port("admin")),
            move |req| served.clone().handle(req),
            shutdown_rx,
        ));
        info!(%proxy_addr, %admin_addr, secure = ?secure_addr, upstream = ?servers, "hub serving");
        Ok(Hub {
            proxy_addr,
            admin_addr,
            secure_addr,
            shutdown,
            tasks: {
                tasks.extend([("proxy port", proxy_task), ("admin port", admin_task)]);
                tasks
            },
            pipeline: kept,
            admin,
            dummy_if,
        })
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

    /// The hub's state as text, for `kill -USR1` ([`dump`]).
    pub fn state_dump(&self) -> String {
        dump::render(&self.admin)
    }

    /// Stops accepting, lets open connections finish within the grace period, removes the dummy
    /// interface ([`dummy_if`]), applies the cache writes they left queued (bounded by
    /// `SHUTDOWN_DRAIN`, 5 s), and returns. A background task still busy after the grace period
    /// (an apiserver call that hangs) is aborted, so a stopping hub never waits on the cloud.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        join_or_abort(self.tasks, server::SHUTDOWN_GRACE + TASK_SLACK).await;
        if let Some(iface) = &self.dummy_if {
            iface.remove().await;
        }
        if let Some(edge) = &self.pipeline.edge {
            edge.finish_writes(SHUTDOWN_DRAIN).await;
        }
        info!("hub stopped");
    }
}

/// Awaits `tasks` for at most `within` in all; aborts those still running then (logging their
/// names) and returns those names.
async fn join_or_abort(
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    within: Duration,
) -> Vec<&'static str> {
    let deadline = tokio::time::Instant::now() + within;
    let mut aborted = Vec::new();
    for (name, mut task) in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            warn!(task = name, "did not stop in time; aborted");
            task.abort();
            aborted.push(name);
        }
    }
    aborted
}

/// The secure port: its certificate manager (the kept certificate installed first) and its TLS
/// accept loop, running the same pipeline as the plain port.
fn serve_secure(
    listener: TcpListener,
    slots: Arc<slots::Slots>,
    slot: Arc<outpost_certs::serving::CertSlot>,
    certificate: serving_cert::ServingCertConfig,
    pipeline: &Arc<pipeline::Pipeline>,
    shutdown: &watch::Receiver<bool>,
) -> [(&'static str, JoinHandle<()>); 2] {
    let manager = serving_cert::ServingCertManager::new(
        certificate,
        pipeline.upstream.clone(),
        slot.clone(),
        pipeline.metrics.clone(),
    );
    manager.install_kept();
    let pipeline = pipeline.clone();
    [
        (
            "serving certificate",
            tokio::spawn(manager.run(shutdown.clone())),
        ),
        (
            "secure port",
            tokio::spawn(server::serve_tls(
                listener,
                slots,
                tokio_rustls::TlsAcceptor::from(slot.server_config()),
                move |req| pipeline.clone().handle(req, callers::Entry::Secure),
                shutdown.clone(),
            )),
        ),
    ]
}

/// Keeps the cache agents in step with `yurt-hub-cfg`'s `cache_agents` key.
async fn apply_cache_agents(
    mut config: watch::Receiver<Arc<hubcfg::HubCfg>>,
    policy: edge::CachePolicy,
) {
    loop {
        let agents = edge::CacheAgents::with_extra(config.borrow_and_update().get("cache_agents"));
        if *policy.agents() != agents {
            info!(?agents, "cache agents changed");
            policy.set_agents(agents);
        }
        if config.changed().await.is_err() {
            return;
        }
    }
}

async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, what, source })
}

/// The secure port may sit on the dummy interface's address before the interface exists.
fn bind_secure(addr: SocketAddr) -> Result<TcpListener, StartError> {
    let (listener, present) = server::bind_freebind(addr).map_err(|source| StartError::Bind {
        addr,
        what: "secure proxy",
        source,
    })?;
    if !present {
        tracing::warn!(%addr, "this host has no such address yet; the secure port answers once it is configured (the dummy interface)");
    }
    Ok(listener)
}

/// The clock's time as `metav1.Time` (`2026-11-23T19:44:21Z`).
pub(crate) fn rfc3339_now() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    outpost_core::time::rfc3339(since_epoch)
}

fn local_addr(listener: &TcpListener, fallback: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Sets its flag when dropped: an aborted task drops its future.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_task_that_ignores_shutdown_is_aborted_at_the_deadline() {
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        let stuck = tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        let quick = tokio::spawn(async {});
        let started = std::time::Instant::now();
        let aborted = join_or_abort(
            vec![("stuck", stuck), ("quick", quick)],
            Duration::from_millis(100),
        )
        .await;
        assert_eq!(aborted, ["stuck"]);
        assert!(started.elapsed() < Duration::from_secs(2));
        for _ in 0..100 {
            if dropped.load(Ordering::SeqCst) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the stuck task was not aborted");
    }
}
