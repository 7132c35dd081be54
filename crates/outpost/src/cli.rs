//! Command line: yurthub's flags with yurthub's defaults, so an operator can swap the binary in.
//!
//! [`Cli::parse_args`] only parses; [`HubFlags::validate`] turns the flags into a
//! [`ValidatedHub`] or one clear error line, which `main` prints before exiting with code 2.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use outpost_agent::FilterSettings;
use outpost_agent::health::{HealthConfig, HeartbeatConfig};
use outpost_agent::host::dummy_if::DummyIfConfig;
use outpost_agent::identity::bootstrap::{IdentityFiles, TokenBootstrap};
use outpost_agent::listen::slots::ClientLimits;
use outpost_agent::pool::DEFAULT_PORT as DEFAULT_MULTIPLEXER_PORT;
use outpost_certs::bootstrap::BootstrapToken;
use outpost_core::request_info::parse_go_duration;
use outpost_filter::FilterConfig;
use outpost_proxy::multiplexer::{DEFAULT_POOL_SCOPE, PoolScopeResource};
use outpost_proxy::upstream::Http2Config;
use outpost_proxy::{LbMode, Server};

/// Outpost: a node-local Kubernetes edge proxy, a drop-in for OpenYurt's yurthub.
#[derive(Debug, Parser)]
#[command(name = "outpost", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// With no subcommand, run the hub with these flags.
    #[command(flatten)]
    pub hub: HubFlags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a bundled fake apiserver and the hub on loopback, and show a client working through it.
    #[cfg(feature = "demo")]
    Demo,
    /// Switch this node's kubelet to Outpost (convert), or back (revert).
    Node {
        #[command(subcommand)]
        command: Box<NodeCommand>,
    },
    /// Inspect the edge cache on disk (the daemon must be stopped: sled locks the cache).
    Cache {
        #[command(subcommand)]
        command: Box<CacheCommand>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Install the static pod, wait for readyz, then redirect kubelet to 127.0.0.1:10261.
    Convert(outpost_node::ConvertArgs),
    /// Restore every file convert changed, byte for byte.
    Revert(outpost_node::RevertArgs),
}

/// yurthub's `--disk-cache-path` default, as the hub's flag spells it.
pub const DEFAULT_DISK_CACHE_PATH: &str = "/etc/kubernetes/cache/";

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Per component and resource: objects, watch events, scopes, bytes, last resourceVersion, age.
    Ls(CacheLsArgs),
    /// Print one cached object's JSON exactly as upstream sent it.
    Get(CacheGetArgs),
    /// Check every entry; corrupt ones are quarantined. Exits 1 if any was found, or if the
    /// database itself is damaged (`--repair` then moves it aside and starts a fresh one).
    Verify(CacheVerifyArgs),
    /// Write every cached object to one JSON file, grouped by component and resource.
    Export(CacheExportArgs),
}

#[derive(Debug, Clone, Args)]
pub struct CachePathArgs {
    /// Where the edge cache lives (the hub's --disk-cache-path; never created here).
    #[arg(long, default_value = DEFAULT_DISK_CACHE_PATH)]
    pub disk_cache_path: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct CacheVerifyArgs {
    #[command(flatten)]
    pub path: CachePathArgs,
    /// Repair instead of only reporting, as the hub does at start: a damaged database (one sled
    /// cannot open or read) is moved aside to `damaged-<unix time>/` in the cache directory,
    /// kept for inspection, and a fresh, empty one started, which the hub refills from the
    /// cloud; corrupt entries are quarantined. Exits 0 once the cache is usable.
    #[arg(long)]
    pub repair: bool,
}

/// `outpost cache ls --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheLsOutput {
    Table,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct CacheLsArgs {
    #[command(flatten)]
    pub path: CachePathArgs,
    /// table for people, json for scripts (same data, raw numbers).
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: CacheLsOutput,
}

#[derive(Debug, Clone, Args)]
pub struct CacheGetArgs {
    #[command(flatten)]
    pub path: CachePathArgs,
    /// The component that cached it (its user agent before `/`), e.g. kubelet.
    pub component: String,
    /// yurthub's spelling `pods.v1.core` / `leases.v1.coordination.k8s.io`, or a plain `pods`.
    pub resource: String,
    /// `<namespace>/<name>`, or `<name>` for a cluster-scoped object.
    pub name: String,
}

#[derive(Debug, Clone, Args)]
pub struct CacheExportArgs {
    #[command(flatten)]
    pub path: CachePathArgs,
    /// The JSON file to write (replaced atomically); `-` for stdout.
    pub file: PathBuf,
}

/// yurthub's `--working-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkingMode {
    Edge,
    Cloud,
}

/// yurthub's `--bootstrap-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BootstrapMode {
    /// A client certificate of its own, by CSR with a bootstrap token (`--join-token` with
    /// cluster-info discovery, or `--bootstrap-file`), kept in `<root-dir>/pki`.
    Token,
    /// Borrow kubelet's client certificate and the cluster CA.
    Kubeletcertificate,
}

/// yurthub's `--lb-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LbModeFlag {
    Rr,
    Priority,
}

/// The hub's flags. Names and defaults follow yurthub (`cmd/yurthub/app/options/options.go`).
#[derive(Debug, Clone, Args)]
pub struct HubFlags {
    /// Apiserver addresses, comma separated. A missing scheme means https; other schemes are refused.
    #[arg(long, value_name = "ADDRS")]
    pub server_addr: Option<String>,
    /// The name of this node.
    #[arg(long)]
    pub node_name: Option<String>,
    /// The node pool this node belongs to (filters' pool scope). Unlike yurthub it may be left
    /// out: the node's `apps.openyurt.io/nodepool` label is used then.
    #[arg(long)]
    pub nodepool_name: Option<String>,
    /// edge: cache for autonomy; cloud: proxy and filters only.
    #[arg(long, value_enum, default_value = "edge")]
    pub working_mode: WorkingMode,
    /// Address of the plain-HTTP proxy that kubelet and other components talk to.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_proxy_address: IpAddr,
    #[arg(long, default_value_t = 10261)]
    pub proxy_port: u16,
    /// Address of the admin server (/v1/healthz, /v1/readyz, /metrics).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    #[arg(long, default_value_t = 10267)]
    pub serve_port: u16,
    /// HTTPS proxy port for in-cluster clients, on `--dummy-if-ip` (or `--bind-proxy-address`
    /// with `--enable-dummy-if=false`). Its certificate is requested from the cluster
    /// (kubelet-serving CSR); callers must bring bearer tokens.
    #[arg(long, default_value_t = 10268)]
    pub proxy_secure_port: u16,
    /// The hub's working directory.
    #[arg(long, default_value = "/var/lib/yurthub")]
    pub root_dir: PathBuf,
    /// Where the edge cache lives (created at start in edge mode).
    #[arg(long, default_value = "/etc/kubernetes/cache/")]
    pub disk_cache_path: PathBuf,
    /// Outpost only: compact the edge cache once its directory exceeds this many MiB (sled grows
    /// with overwrites; compaction rewrites the live entries). 0 disables.
    #[arg(long, default_value_t = 256)]
    pub disk_cache_compact_above_mib: u64,
    /// Outpost only: stop caching while the file system under `--disk-cache-path` has less than
    /// this free (bytes, or with a Ki/Mi/Gi suffix), and resume once it has more: the cache
    /// never fills the disk (sled cannot recover from a full one), scopes whose watch events
    /// could not be cached meanwhile answer 503 offline until relisted, and readyz says why.
    /// The default leaves room for several relists between two checks and for the node's other
    /// writers. 0 disables.
    #[arg(long, default_value = "64Mi", value_parser = byte_size)]
    pub cache_min_free_bytes: u64,
    /// Outpost only: objects larger than this (bytes, or with a Ki/Mi/Gi suffix) are proxied
    /// but not cached, nor a LIST holding one (a watch event over it marks its scope stale).
    /// The default is kube-apiserver's own request size limit: no stored object is larger.
    #[arg(long, default_value = "3Mi", value_parser = byte_size)]
    pub cache_max_object_bytes: u64,
    /// How the hub gets its client certificate.
    #[arg(long, value_enum, default_value = "token")]
    pub bootstrap_mode: BootstrapMode,
    /// token mode: a bootstrap kubeconfig (server, CA, bootstrap token), as yurtadm writes it.
    /// Empty means none, as in yurthub.
    #[arg(long)]
    pub bootstrap_file: Option<String>,
    /// token mode: a kubeadm bootstrap token; the cluster CA is discovered from
    /// `kube-public/cluster-info`, signed with it.
    #[arg(long)]
    pub join_token: Option<String>,
    /// token mode: `sha256:<hex>` of the cluster CA's public key (comma separated for several),
    /// as `kubeadm token create --print-join-command` prints it.
    #[arg(long, value_delimiter = ',')]
    pub discovery_token_ca_cert_hash: Vec<String>,
    /// token mode: trust the discovered CA without a pinned hash.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub discovery_token_unsafe_skip_ca_verification: bool,
    /// kubeletcertificate mode: kubelet's client certificate and key, in one PEM file.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/pki/kubelet-client-current.pem"
    )]
    pub kubelet_client_certificate: PathBuf,
    /// kubeletcertificate mode: the cluster CA that signs the apiserver's certificate.
    #[arg(long, default_value = "/etc/kubernetes/pki/ca.crt")]
    pub kubelet_ca_file: PathBuf,
    /// Seconds between health probes / lease renewals.
    #[arg(long, default_value_t = 10)]
    pub heartbeat_interval_seconds: u64,
    /// Consecutive successful probes that make a server healthy again.
    #[arg(long, default_value_t = 2)]
    pub heartbeat_healthy_threshold: u32,
    /// Lease-update attempts per probe.
    #[arg(long, default_value_t = 3)]
    pub heartbeat_failed_retry: u32,
    /// Timeout of each probe request, in seconds.
    #[arg(long, default_value_t = 2)]
    pub heartbeat_timeout_seconds: u64,
    /// How long kubelet may stay silent before the hub stops renewing its lease (Go duration).
    #[arg(long, default_value = "40s", value_parser = go_duration)]
    pub kubelet_health_grace_period: Duration,
    /// Outpost only: kubelet's health endpoint, checked before the heartbeat stops or resumes;
    /// empty disables it.
    #[arg(long, default_value = "http://127.0.0.1:10248/healthz")]
    pub kubelet_healthz_url: String,
    /// How requests are spread over several servers.
    #[arg(long, value_enum, default_value = "rr")]
    pub lb_mode: LbModeFlag,
    /// Outpost only: talk HTTP/1.1 to the apiservers (one connection per concurrent request),
    /// as client-go does with `DISABLE_HTTP2`. By default the hub speaks HTTP/2 to a server
    /// that offers it: every request over one connection per server.
    #[arg(long, default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub disable_http2: bool,
    /// Outpost only: seconds without a frame from an apiserver after which the hub PINGs its
    /// HTTP/2 connection (client-go's `HTTP2_READ_IDLE_TIMEOUT_SECONDS`); 0 sends no PING.
    #[arg(long, default_value_t = 30)]
    pub http2_read_idle_timeout_seconds: u64,
    /// Outpost only: seconds a PING may go unanswered before the connection is closed, ending
    /// every request and watch on it, and the server is probed (client-go's
    /// `HTTP2_PING_TIMEOUT_SECONDS`).
    #[arg(long, default_value_t = 15)]
    pub http2_ping_timeout_seconds: u64,
    /// Whether the hub answers in-cluster clients on the dummy interface's IP: when true it keeps
    /// `--dummy-if-name` (a dummy link, or `lo` on a kernel without them) holding `--dummy-if-ip`,
    /// checked every minute and removed at exit (needs CAP_NET_ADMIN; without it the hub says so
    /// and serves on), and rewritten Services and the secure port use that IP; when false they use
    /// `--bind-proxy-address`.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub enable_dummy_if: bool,
    /// IP of the dummy interface: where masterservice and friends point in-cluster clients.
    /// Empty means the default, 169.254.2.1 (fd00::2:1 when `--bind-address` is IPv6).
    #[arg(long, default_value = "169.254.2.1")]
    pub dummy_if_ip: String,
    /// Enable response filters (yurthub's seven; see `--disabled-resource-filters`).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub enable_resource_filter: bool,
    /// Filters to disable, comma separated; `*` disables all.
    #[arg(long, value_delimiter = ',')]
    pub disabled_resource_filters: Vec<String>,
    /// Namespace of the yurt-hub-cfg ConfigMap.
    #[arg(long, default_value = "kube-system")]
    pub namespace: String,
    /// Log verbosity, klog style: 0-1 info, 2-3 debug (one line per request), 4+ trace.
    #[arg(long = "v", default_value_t = 0)]
    pub verbosity: u8,
    /// An offline watch without `timeoutSeconds` ends after a random 1x-2x of this, so that
    /// clients reconnect spread out (Go duration).
    #[arg(long, default_value = "1800s", value_parser = go_duration)]
    pub min_request_timeout: Duration,
    /// Outpost only: how long a client of the proxy, secure and admin ports may take to send a
    /// request's head, from connecting or from the first byte after an idle keep-alive; a
    /// slower connection is closed, as kube-apiserver's ReadHeaderTimeout does (Go duration).
    #[arg(long, default_value = "32s", value_parser = go_duration)]
    pub client_header_timeout: Duration,
    /// Outpost only: how long a keep-alive client connection may sit idle between requests
    /// before the hub closes it, as kube-apiserver's IdleTimeout does (Go duration).
    #[arg(long, default_value = "90s", value_parser = go_duration)]
    pub client_idle_timeout: Duration,
    /// Outpost only: connections each of the proxy and secure ports keeps open. A full port
    /// closes the connection that waited longest for a request head and admits the new one;
    /// it refuses (503) only when every connection is serving a request. 0 sizes the caps from
    /// the open-files limit, keeping a reserve for the hub's own files (the admin port always
    /// has 32 of its own).
    #[arg(long, default_value_t = 0)]
    pub max_connections_per_port: usize,
    /// Token mode: more organizations (O=) in the hub's client certificate, comma separated;
    /// `openyurt:tenant:<namespace>` is the one yurt-manager approves.
    #[arg(long, value_delimiter = ',')]
    pub hub_cert_organizations: Vec<String>,
    /// Another address the secure port's serving certificate names (the Node's addresses are
    /// named anyway). Empty means none.
    #[arg(long)]
    pub node_ip: Option<String>,
    /// Name of the dummy interface (see `--enable-dummy-if`), at most 15 characters.
    #[arg(long, default_value = "hub-dummy0")]
    pub dummy_if_name: String,
    /// Pool topology (servicetopology's `openyurt.io/nodepool` keys) from NodeBuckets labelled
    /// `openyurt.io/pool-name=<pool>` instead of `NodePool.status.nodes`.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub enable_pool_service_topology: bool,
    /// What the shared cache holds (`group/version/resource`, comma separated; `/v1/services`
    /// is the core group). Every node-local LIST and WATCH of these is answered from one list
    /// and watch kept in memory. Unlike yurthub's, the value replaces the default rather than
    /// adding to it, and an empty value turns the shared cache off.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_POOL_SCOPE)]
    pub pool_scope_resources: Vec<String>,
    /// Pool sharing: where this hub serves its pool's shared cache (HTTPS, nodes of the pool
    /// only) while ConfigMap `<--namespace>/leader-hub-<pool>` names it a leader, on its address
    /// there. See docs/pool-sharing.md.
    #[arg(long, default_value_t = DEFAULT_MULTIPLEXER_PORT)]
    pub multiplexer_port: u16,
    /// Pool sharing without yurt-manager: while no ConfigMap `<--namespace>/leader-hub-<pool>`
    /// exists, the hubs of a pool take as leaders the first `--pool-leader-replicas` Nodes by
    /// name that are labelled with the pool, Ready and have an InternalIP — the same answer on
    /// every hub. Needs the ClusterRole of manifests/cluster/pool-sharing-rbac.yaml (nodes may
    /// list and watch Nodes). See docs/pool-sharing.md.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub enable_pool_leader_election: bool,
    /// How many leaders `--enable-pool-leader-election` elects per pool.
    #[arg(long, default_value_t = 2)]
    pub pool_leader_replicas: usize,
    #[command(flatten)]
    pub inert: InertFlags,
}

/// yurthub flags that Outpost accepts so that a yurthub command line starts unchanged, but that
/// change nothing: unused in yurthub too, or for features Outpost does not have. Setting one to
/// anything but its default is logged at start ([`InertFlags::set`]).
#[derive(Debug, Clone, Args)]
pub struct InertFlags {
    /// yurthub's pprof on the admin port. Outpost has none; profile it with `perf`.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub profiling: bool,
    /// Unused, as in yurthub.
    #[arg(long, default_value_t = 250)]
    pub max_requests_in_flight: u32,
    /// Unused, as in yurthub.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub enable_iptables: bool,
    /// Deprecated in yurthub. Pools come from `NodePool.status.nodes`, or from NodeBuckets
    /// with `--enable-pool-service-topology`.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub enable_node_pool: bool,
    /// yurthub's period (minutes) for collecting cached events the cloud deleted. Outpost caches
    /// no events kubelet writes, and relists converge everything else.
    #[arg(long, default_value_t = 120)]
    pub gc_frequency: u64,
    /// yurthub's `local` working mode only, which Outpost does not have.
    #[arg(long, default_value = "")]
    pub host_control_plane_address: String,
}

impl InertFlags {
    /// The flags given a value other than their default, as `--flag=value`.
    pub fn set(&self) -> Vec<String> {
        let mut set = Vec::new();
        let mut note = |changed: bool, flag: &str, value: String| {
            if changed {
                set.push(format!("--{flag}={value}"));
            }
        };
        note(!self.profiling, "profiling", "false".into());
        note(
            self.max_requests_in_flight != 250,
            "max-requests-in-flight",
            self.max_requests_in_flight.to_string(),
        );
        note(self.enable_iptables, "enable-iptables", "true".into());
        note(!self.enable_node_pool, "enable-node-pool", "false".into());
        note(
            self.gc_frequency != 120,
            "gc-frequency",
            self.gc_frequency.to_string(),
        );
        note(
            !self.host_control_plane_address.is_empty(),
            "host-control-plane-address",
            self.host_control_plane_address.clone(),
        );
        set
    }
}

/// The hub's settings after validation.
#[derive(Debug, Clone)]
pub struct ValidatedHub {
    pub servers: Vec<Server>,
    pub node_name: String,
    /// `--nodepool-name`; `None`: the node's pool label.
    pub nodepool_name: Option<String>,
    pub working_mode: WorkingMode,
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub root_dir: PathBuf,
    pub disk_cache_path: PathBuf,
    /// `--disk-cache-compact-above-mib` in bytes; `None` = never compact by itself.
    pub compact_above_bytes: Option<u64>,
    /// `--cache-min-free-bytes`; `None` = no floor.
    pub min_free_bytes: Option<u64>,
    /// `--cache-max-object-bytes`.
    pub max_object_bytes: usize,
    pub identity: IdentitySource,
    pub lb_mode: LbMode,
    /// `--disable-http2`, `--http2-read-idle-timeout-seconds`, `--http2-ping-timeout-seconds`.
    pub http2: Http2Config,
    /// `--namespace`: where `yurt-hub-cfg` lives.
    pub namespace: String,
    pub health: HealthConfig,
    pub filters: FilterSettings,
    pub min_request_timeout: Duration,
    /// `--node-ip`: named by the serving certificate.
    pub node_ip: Option<IpAddr>,
    /// `--pool-scope-resources`.
    pub pool_scope: Vec<PoolScopeResource>,
    /// `--multiplexer-port`: the leader hub's port.
    pub multiplexer_port: u16,
    /// `--enable-pool-leader-election`: how many leaders (`--pool-leader-replicas`); `None`: off.
    pub pool_leader_election: Option<usize>,
    /// `--enable-dummy-if`: the interface to keep, holding `--dummy-if-ip`.
    pub dummy_if: Option<DummyIfConfig>,
    /// `--client-header-timeout`, `--client-idle-timeout`, `--max-connections-per-port`.
    pub clients: ClientLimits,
}

impl HubFlags {
    /// Checks the flags in yurthub's order; the error is one line naming the problem.
    pub fn validate(&self) -> Result<ValidatedHub, String> {
        let node_name = required(&self.node_name, "--node-name")?;
        let health = self.health_config()?;
        let servers = parse_servers(&required(&self.server_addr, "--server-addr")?)?;
        let identity = self.identity_source(&node_name, &servers)?;
        let nodepool_name = given(&self.nodepool_name).map(str::to_owned);
        if self.heartbeat_timeout_seconds == 0 {
            return Err("--heartbeat-timeout-seconds must be at least 1".into());
        }
        let dummy_if_ip = self.dummy_if_ip()?;
        let node_ip = self.node_ip()?;
        if self.dummy_if_name.len() > 15 {
            return Err(format!(
                "--dummy-if-name: {:?} is longer than 15 characters",
                self.dummy_if_name
            ));
        }
        if self.min_request_timeout.is_zero() {
            return Err("--min-request-timeout must be more than 0".into());
        }
        if self.client_header_timeout.is_zero() || self.client_idle_timeout.is_zero() {
            return Err(
                "--client-header-timeout and --client-idle-timeout must be more than 0".into(),
            );
        }
        let pool_scope = self.pool_scope()?;
        if self.enable_pool_leader_election && self.pool_leader_replicas == 0 {
            return Err("--pool-leader-replicas must be at least 1".into());
        }
        if self.http2_read_idle_timeout_seconds > 0 && self.http2_ping_timeout_seconds == 0 {
            return Err("--http2-ping-timeout-seconds must be at least 1".into());
        }
        Ok(ValidatedHub {
            servers,
            node_name: node_name.clone(),
            nodepool_name: nodepool_name.clone(),
            working_mode: self.working_mode,
            proxy_addr: SocketAddr::new(self.bind_proxy_address, self.proxy_port),
            admin_addr: SocketAddr::new(self.bind_address, self.serve_port),
            root_dir: self.root_dir.clone(),
            disk_cache_path: self.disk_cache_path.clone(),
            compact_above_bytes: (self.disk_cache_compact_above_mib > 0)
                .then(|| self.disk_cache_compact_above_mib.saturating_mul(1 << 20)),
            min_free_bytes: (self.cache_min_free_bytes > 0).then_some(self.cache_min_free_bytes),
            max_object_bytes: usize::try_from(self.cache_max_object_bytes).unwrap_or(usize::MAX),
            identity,
            lb_mode: match self.lb_mode {
                LbModeFlag::Rr => LbMode::RoundRobin,
                LbModeFlag::Priority => LbMode::Priority,
            },
            http2: Http2Config {
                enabled: !self.disable_http2,
                read_idle_timeout: Duration::from_secs(self.http2_read_idle_timeout_seconds),
                ping_timeout: Duration::from_secs(self.http2_ping_timeout_seconds),
            },
            namespace: self.namespace.clone(),
            filters: self.filter_settings(nodepool_name.clone(), dummy_if_ip),
            health,
            min_request_timeout: self.min_request_timeout,
            node_ip,
            pool_scope,
            multiplexer_port: self.multiplexer_port,
            pool_leader_election: self
                .enable_pool_leader_election
                .then_some(self.pool_leader_replicas),
            dummy_if: self.enable_dummy_if.then(|| DummyIfConfig {
                name: self.dummy_if_name.clone(),
                ip: dummy_if_ip,
            }),
            clients: self.client_limits(),
        })
    }
}

/// Where the hub's client certificate comes from.
#[derive(Debug, Clone)]
pub enum IdentitySource {
    /// `kubeletcertificate`: kubelet's files, used as they are.
    Files(IdentityFiles),
    /// `token`: obtained (or kept from an earlier start) before the hub serves.
    Token(TokenBootstrap),
}

impl HubFlags {
    /// `--node-ip`, when given.
    fn node_ip(&self) -> Result<Option<IpAddr>, String> {
        given(&self.node_ip)
            .map(|ip| {
                ip.parse::<IpAddr>()
                    .map_err(|e| format!("--node-ip: {ip:?}: {e}"))
            })
            .transpose()
    }

    /// `--pool-scope-resources`.
    fn pool_scope(&self) -> Result<Vec<PoolScopeResource>, String> {
        self.pool_scope_resources
            .iter()
            .filter(|r| !r.trim().is_empty())
            .map(|r| {
                r.parse()
                    .map_err(|e| format!("--pool-scope-resources: {e}"))
            })
            .collect()
    }

    /// The filter flags, with where rewritten Services send in-cluster clients.
    fn filter_settings(&self, pool_name: Option<String>, dummy_if_ip: IpAddr) -> FilterSettings {
        FilterSettings {
            config: FilterConfig {
                enabled: self.enable_resource_filter,
                disabled: self.disabled_resource_filters.clone(),
                cloud_mode: self.working_mode == WorkingMode::Cloud,
            },
            pool_name,
            hub_host: if self.enable_dummy_if {
                dummy_if_ip
            } else {
                self.bind_proxy_address
            },
            hub_port: self.proxy_secure_port,
            node_buckets: self.enable_pool_service_topology,
        }
    }

    /// `--client-header-timeout`, `--client-idle-timeout`, `--max-connections-per-port`.
    fn client_limits(&self) -> ClientLimits {
        ClientLimits {
            header_timeout: self.client_header_timeout,
            idle_timeout: self.client_idle_timeout,
            max_per_port: (self.max_connections_per_port > 0)
                .then_some(self.max_connections_per_port),
        }
    }

    /// yurthub's token-mode checks: a token source, and a CA pin unless explicitly skipped.
    fn identity_source(
        &self,
        node_name: &str,
        servers: &[Server],
    ) -> Result<IdentitySource, String> {
        if self.bootstrap_mode == BootstrapMode::Kubeletcertificate {
            return Ok(IdentitySource::Files(IdentityFiles {
                client_pem: self.kubelet_client_certificate.clone(),
                ca_file: self.kubelet_ca_file.clone(),
            }));
        }
        let join_token = self.join_token.clone().filter(|t| !t.trim().is_empty());
        let bootstrap_file = given(&self.bootstrap_file).map(PathBuf::from);
        if join_token.is_none() && bootstrap_file.is_none() {
            return Err(
                "--bootstrap-mode=token needs --join-token or --bootstrap-file \
                        (or use --bootstrap-mode=kubeletcertificate)"
                    .into(),
            );
        }
        if let Some(token) = &join_token {
            BootstrapToken::parse(token).map_err(|e| format!("--join-token: {e}"))?;
        }
        let ca_pins = given_list(&self.discovery_token_ca_cert_hash);
        if ca_pins.is_empty() && !self.discovery_token_unsafe_skip_ca_verification {
            return Err(
                "--bootstrap-mode=token needs --discovery-token-ca-cert-hash \
                        (or --discovery-token-unsafe-skip-ca-verification)"
                    .into(),
            );
        }
        Ok(IdentitySource::Token(TokenBootstrap {
            node_name: node_name.to_owned(),
            servers: servers.to_vec(),
            root_dir: self.root_dir.clone(),
            bootstrap_file,
            join_token,
            ca_pins,
            skip_ca_verification: self.discovery_token_unsafe_skip_ca_verification,
            extra_organizations: given_list(&self.hub_cert_organizations),
            deadline: Duration::from_secs(240),
        }))
    }

    /// Probes for every mode; the heartbeat (lease renewal gated on kubelet) in edge mode only.
    fn health_config(&self) -> Result<HealthConfig, String> {
        let kubelet_healthz_url = match self.kubelet_healthz_url.trim() {
            "" => None,
            url => Some(
                url.parse::<http::Uri>()
                    .ok()
                    .filter(|u| u.scheme_str() == Some("http"))
                    .ok_or_else(|| {
                        format!("--kubelet-healthz-url: {url:?} is not an http:// URL")
                    })?,
            ),
        };
        let heartbeat = (self.working_mode == WorkingMode::Edge).then(|| HeartbeatConfig {
            grace: self.kubelet_health_grace_period,
            kubelet_healthz_url,
        });
        Ok(HealthConfig {
            interval: Duration::from_secs(self.heartbeat_interval_seconds.max(1)),
            healthy_threshold: self.heartbeat_healthy_threshold.max(1),
            failed_retry: self.heartbeat_failed_retry.max(1),
            probe_timeout: Duration::from_secs(self.heartbeat_timeout_seconds),
            heartbeat,
            state_file: Some(self.root_dir.join("servers.json")),
        })
    }
}

impl HubFlags {
    /// `--dummy-if-ip`, defaulted and checked as yurthub does.
    fn dummy_if_ip(&self) -> Result<IpAddr, String> {
        let ip = match self.dummy_if_ip.trim() {
            "" if self.bind_address.is_ipv6() => {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 2, 1))
            }
            "" => IpAddr::V4(Ipv4Addr::new(169, 254, 2, 1)),
            ip => ip
                .parse()
                .map_err(|e| format!("--dummy-if-ip: {ip:?}: {e}"))?,
        };
        check_dummy_if_ip(ip)?;
        Ok(ip)
    }
}

/// yurthub's rule: an IPv4 dummy address is link-local, outside 169.254.31.0/24 and not
/// 169.254.1.1 (both used by other node agents).
fn check_dummy_if_ip(ip: IpAddr) -> Result<(), String> {
    let IpAddr::V4(v4) = ip else { return Ok(()) };
    let [a, b, c, _] = v4.octets();
    if !v4.is_link_local() || (a, b, c) == (169, 254, 31) || v4 == Ipv4Addr::new(169, 254, 1, 1) {
        return Err(format!(
            "--dummy-if-ip: {ip} must be in 169.254.0.0/16, outside 169.254.31.0/24, and not 169.254.1.1"
        ));
    }
    Ok(())
}

/// A flag's value, trimmed; `None` when it is absent or empty (Go's `--flag=` means unset).
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// A list flag's values, trimmed, the empty ones left out.
fn given_list(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .collect()
}

fn required(value: &Option<String>, flag: &str) -> Result<String, String> {
    given(value)
        .map(str::to_owned)
        .ok_or_else(|| format!("{flag} is required"))
}

fn parse_servers(list: &str) -> Result<Vec<Server>, String> {
    let servers = list
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| Server::parse(s).map_err(|e| format!("--server-addr: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err("--server-addr is required".into());
    }
    Ok(servers)
}

fn go_duration(value: &str) -> Result<Duration, String> {
    parse_go_duration(value).map_err(|e| e.to_string())
}

/// A size in bytes: a plain number, or one with a Kubernetes binary suffix (`Ki`, `Mi`, `Gi`).
fn byte_size(value: &str) -> Result<u64, String> {
    let value = value.trim();
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => value.split_at(at),
        None => (value, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        other => return Err(format!("unknown unit {other:?} (use Ki, Mi or Gi)")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{value:?} is not a size in bytes"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{value:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("outpost").chain(args.iter().copied()))
    }

    const GOOD: &[&str] = &[
        "--server-addr=10.0.0.1:6443,https://10.0.0.2:6443",
        "--node-name=edge-1",
        "--nodepool-name=pool-a",
        "--bootstrap-mode=kubeletcertificate",
    ];

    #[test]
    fn cache_sizes_take_plain_bytes_or_binary_suffixes() {
        assert_eq!(byte_size("4096"), Ok(4096));
        assert_eq!(byte_size("64Mi"), Ok(64 << 20));
        assert_eq!(byte_size("3Mi"), Ok(3 << 20));
        assert_eq!(byte_size("1Gi"), Ok(1 << 30));
        assert_eq!(byte_size("0"), Ok(0));
        for bad in ["", "Mi", "3MB", "-1", "1.5Mi", "99999999999999999999Gi"] {
            assert!(byte_size(bad).is_err(), "{bad}");
        }
        let v = parse(GOOD).unwrap().hub.validate().unwrap();
        assert_eq!(v.min_free_bytes, Some(64 << 20));
        assert_eq!(v.max_object_bytes, 3 << 20);
        let mut args = GOOD.to_vec();
        args.extend(["--cache-min-free-bytes=0", "--cache-max-object-bytes=1Ki"]);
        let v = parse(&args).unwrap().hub.validate().unwrap();
        assert_eq!((v.min_free_bytes, v.max_object_bytes), (None, 1024));
    }

    #[test]
    fn yurthub_defaults() {
        let cli = parse(GOOD).unwrap();
        let v = cli.hub.validate().unwrap();
        assert_eq!(v.proxy_addr, "127.0.0.1:10261".parse().unwrap());
        assert_eq!(v.admin_addr, "127.0.0.1:10267".parse().unwrap());
        assert_eq!(v.servers.len(), 2);
        assert_eq!(v.servers[0].label(), "https://10.0.0.1:6443");
        assert_eq!(v.lb_mode, LbMode::RoundRobin);
        assert_eq!(v.disk_cache_path, PathBuf::from("/etc/kubernetes/cache/"));
        assert_eq!(cli.hub.kubelet_health_grace_period, Duration::from_secs(40));
        assert!(cli.hub.enable_dummy_if);
        assert_eq!(cli.hub.namespace, "kube-system");
        assert_eq!(cli.hub.heartbeat_interval_seconds, 10);
        assert_eq!(v.clients, ClientLimits::default());
    }

    #[test]
    fn client_limits_come_from_their_flags() {
        let mut args = GOOD.to_vec();
        args.extend([
            "--client-header-timeout=5s",
            "--client-idle-timeout=2m",
            "--max-connections-per-port=100",
        ]);
        let v = parse(&args).unwrap().hub.validate().unwrap();
        assert_eq!(
            v.clients,
            ClientLimits {
                header_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(120),
                max_per_port: Some(100),
            }
        );
        let mut args = GOOD.to_vec();
        args.push("--client-idle-timeout=0s");
        let err = parse(&args).unwrap().hub.validate().unwrap_err();
        assert!(err.contains("--client-idle-timeout"), "{err}");
    }

    #[test]
    fn go_style_bools_and_lists() {
        let mut args = GOOD.to_vec();
        args.extend([
            "--enable-dummy-if=false",
            "--disabled-resource-filters=servicetopology,masterservice",
            "--lb-mode=priority",
            "--v=4",
        ]);
        let cli = parse(&args).unwrap();
        assert!(!cli.hub.enable_dummy_if);
        assert_eq!(cli.hub.disabled_resource_filters.len(), 2);
        assert_eq!(cli.hub.validate().unwrap().lb_mode, LbMode::Priority);
        assert_eq!(cli.hub.verbosity, 4);
    }

    #[test]
    fn validation_errors_name_the_flag() {
        let no_node = parse(&["--server-addr=a:1", "--bootstrap-mode=kubeletcertificate"]).unwrap();
        assert_eq!(
            no_node.hub.validate().unwrap_err(),
            "--node-name is required"
        );
        let http = parse(&[
            "--server-addr=http://a:1",
            "--node-name=n",
            "--nodepool-name=p",
            "--bootstrap-mode=kubeletcertificate",
        ])
        .unwrap();
        assert!(http.hub.validate().unwrap_err().contains("must use https"));
        // yurthub's default mode: a token source, then a CA pin or the explicit opt-out.
        let token = parse(&["--server-addr=a:1", "--node-name=n", "--nodepool-name=p"]).unwrap();
        let err = token.hub.validate().unwrap_err();
        assert!(
            err.contains("needs --join-token or --bootstrap-file"),
            "{err}"
        );
        let token = [
            "--server-addr=a:1",
            "--node-name=n",
            "--join-token=abcdef.0123456789abcdef",
        ];
        let err = parse(&token).unwrap().hub.validate().unwrap_err();
        assert!(
            err.contains("needs --discovery-token-ca-cert-hash"),
            "{err}"
        );
        let unpinned = [
            &token[..],
            &["--discovery-token-unsafe-skip-ca-verification"],
        ]
        .concat();
        let v = parse(&unpinned)
            .unwrap()
            .hub
            .validate()
            .expect("explicitly unpinned");
        assert!(matches!(v.identity, IdentitySource::Token(ref t) if t.skip_ca_verification));
        let no_pool = parse(&[
            "--server-addr=a:1",
            "--node-name=n",
            "--bootstrap-mode=kubeletcertificate",
        ])
        .unwrap();
        // Unlike yurthub, the pool may come from the node's label instead.
        assert_eq!(no_pool.hub.validate().unwrap().nodepool_name, None);
    }

    /// Go's flags take `--flag=` for "unset"; yurthub defaults those, and so does Outpost.
    #[test]
    fn empty_values_mean_the_default() {
        let mut args = GOOD.to_vec();
        args.extend([
            "--dummy-if-ip=",
            "--node-ip=",
            "--bootstrap-file=",
            "--hub-cert-organizations=",
        ]);
        let v = parse(&args).unwrap().hub.validate().unwrap();
        assert_eq!(v.filters.hub_host, "169.254.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(v.node_ip, None);
        args.push("--bind-address=::1");
        let v = parse(&args).unwrap().hub.validate().unwrap();
        assert_eq!(v.filters.hub_host, "fd00::2:1".parse::<IpAddr>().unwrap());
        assert_eq!(v.min_request_timeout, Duration::from_secs(1800));
    }

    #[test]
    fn inert_flags_are_named_only_when_changed() {
        let mut args = GOOD.to_vec();
        args.extend(["--profiling=true", "--max-requests-in-flight=250"]);
        assert!(parse(&args).unwrap().hub.inert.set().is_empty());
        args.extend([
            "--enable-node-pool=false",
            "--gc-frequency=5",
            "--host-control-plane-address=10.0.0.1:6443",
        ]);
        assert_eq!(
            parse(&args).unwrap().hub.inert.set(),
            [
                "--enable-node-pool=false",
                "--gc-frequency=5",
                "--host-control-plane-address=10.0.0.1:6443"
            ]
        );
    }

    #[test]
    fn clap_rejects_unknown_values() {
        assert!(parse(&["--working-mode=local"]).is_err());
        assert!(parse(&["--lb-mode=consistent-hashing"]).is_err());
        assert!(parse(&["--kubelet-health-grace-period=forty"]).is_err());
        assert!(parse(&["--no-such-flag"]).is_err());
    }
}
