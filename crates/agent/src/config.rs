//! What the hub is started with ([`HubConfig`]), and why a start can fail ([`StartError`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::listen::slots::ClientLimits;
use outpost_proxy::edge::CacheAgents;
use outpost_proxy::multiplexer::PoolScopeResource;
use outpost_proxy::upstream::UpstreamConfig;

use crate::health::HealthConfig;
use crate::host::dummy_if::DummyIfConfig;
use crate::identity::bootstrap::TokenBootstrap;
use crate::pool::PoolSettings;
use crate::side::filters::FilterSettings;

/// Everything the hub needs to start. [`HubConfig::new`] gives yurthub's defaults for all but
/// the node and its apiservers (their TLS identity has no default).
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `--node-name`: whose certificate the hub borrows, whose lease it renews, whose pods
    /// `/pods` lists, and the node the filters and the serving certificate are for.
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
    pub health: HealthConfig,
    /// Response filters; `None` turns filtering off entirely (as does
    /// `--enable-resource-filter=false`).
    pub filters: Option<FilterSettings>,
    /// `--pool-scope-resources`: what the shared cache holds (empty: no shared cache).
    pub pool_scope: Vec<PoolScopeResource>,
    /// Pool sharing (the leader hub, [`crate::pool`]); `None` keeps the shared cache's feeds
    /// on the cloud. Needs the shared cache (`pool_scope`) and, to serve as a leader, `secure`
    /// (its serving certificate).
    pub pool_sharing: Option<PoolSettings>,
    /// The HTTPS port for in-cluster clients; `None` serves none.
    pub secure: Option<SecureConfig>,
    /// `--enable-dummy-if`: the interface holding the address in-cluster clients are pointed at
    /// (the secure port's); `None` configures nothing.
    pub dummy_if: Option<DummyIfConfig>,
    /// Token mode: the client certificate is the hub's own, renewed in place and re-bootstrapped
    /// by `/v1/token`; `None` when it is kubelet's.
    pub token_bootstrap: Option<TokenBootstrap>,
    /// Header-read and idle timeouts of client connections, and the ports' caps.
    pub clients: ClientLimits,
}

impl HubConfig {
    /// A cloud-mode hub for `node_name` in front of `upstream`, on yurthub's ports, with
    /// yurthub's defaults for the rest.
    pub fn new(node_name: &str, upstream: UpstreamConfig) -> HubConfig {
        HubConfig {
            node_name: node_name.to_owned(),
            proxy_addr: SocketAddr::from(([127, 0, 0, 1], 10261)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 10267)),
            upstream,
            edge: None,
            namespace: "kube-system".into(),
            health: HealthConfig::default(),
            filters: None,
            pool_scope: Vec::new(),
            pool_sharing: None,
            secure: None,
            dummy_if: None,
            token_bootstrap: None,
            clients: ClientLimits::default(),
        }
    }
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
    pub agents: CacheAgents,
    /// Why the disk cache could not be opened, when `store` is an in-memory stand-in: the hub
    /// still proxies and caches for its own lifetime, and readiness says the cache is degraded.
    pub volatile: Option<String>,
    /// `--min-request-timeout`: an offline watch without `timeoutSeconds` lasts 1x-2x of it.
    pub min_request_timeout: Duration,
    /// `--cache-max-object-bytes`: larger objects are proxied but not cached.
    pub max_object_bytes: usize,
    /// How long a store call may go without progress before `/v1/healthz` fails
    /// ([`crate::admin::CACHE_HUNG_AFTER`]).
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
