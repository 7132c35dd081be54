//! Shared set-up for the criterion benchmarks beside this file (one `[[bench]]` each; run them
//! with `cargo bench -p outpost-benches`): the bundled fake apiserver with the node identity the
//! hub presents to it, hub configurations (cloud mode, or edge mode over a sled cache), a hub on a
//! runtime of its own, a keep-alive plain-HTTP client with kubelet's headers, and real-shape pods.
//! [`full_node`] seeds a full node's objects; [`nginx`] runs nginx as a reverse-proxy baseline.

pub mod full_node;
pub mod nginx;
pub mod processes;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use outpost_agent::{EdgeConfig, Hub, HubConfig, LbMode, Server, UpstreamConfig};
use outpost_cache::{Gvr, Scope, SledOptions, SledStore, Store};
use outpost_certs::UpstreamTls;
use outpost_core::selector::{FieldSelector, LabelSelector};
use outpost_proxy::edge::CacheAgents;
use outpost_testkit::{FakeApiServer, FakeConfig};
use serde_json::{Value, json};

/// The node the hub acts for; the fake's node authorizer knows it.
pub const NODE: &str = "edge-1";
pub const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/bench";
/// What kubelet really sends (the hub asks upstream for JSON when it caches).
pub const KUBELET_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";

/// The recorded PodList (8 real pods of a kind v1.32 cluster, ~8 KB each, see
/// `crates/testkit/fixtures/README.md`).
const POD_LIST: &str = include_str!("../crates/testkit/fixtures/kube-system-pods.json");

/// The fake apiserver and the node identity (`system:node:edge-1`) the hub presents to it.
pub struct Upstream {
    pub fake: FakeApiServer,
    pub tls: UpstreamTls,
    _certs: tempfile::TempDir,
}

impl Upstream {
    pub async fn start(config: FakeConfig) -> Upstream {
        let certs = tempfile::tempdir().expect("tempdir");
        let fake = FakeApiServer::start(config).await.expect("fake apiserver");
        let files = fake
            .pki()
            .write_node_files(certs.path(), NODE)
            .expect("node certificate files");
        let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).expect("upstream tls");
        Upstream {
            fake,
            tls,
            _certs: certs,
        }
    }

    /// A hub on ephemeral loopback ports in front of the fake; `edge: None` is cloud mode.
    pub fn hub_config(&self, edge: Option<EdgeConfig>) -> HubConfig {
        HubConfig {
            proxy_addr: "127.0.0.1:0".parse().expect("addr"),
            admin_addr: "127.0.0.1:0".parse().expect("addr"),
            edge,
            ..HubConfig::new(
                NODE,
                UpstreamConfig {
                    servers: vec![Server::parse(&self.fake.url()).expect("server")],
                    lb_mode: LbMode::RoundRobin,
                    connect_timeout: Duration::from_secs(5),
                    request_timeout: Duration::from_secs(30),
                    tls: self.tls.clone(),
                    http2: Default::default(),
                },
            )
        }
    }

    pub async fn shutdown(self) {
        self.fake.shutdown().await;
    }

    /// Writes the node's identity (`system:node:edge-1`) as separate certificate and key PEM
    /// files, plus the cluster CA, into `dir` (for proxies other than the hub, e.g. nginx).
    pub fn write_node_pem_files(&self, dir: &Path) -> std::io::Result<NodePemFiles> {
        let pair = self
            .fake
            .pki()
            .client(&format!("system:node:{NODE}"), &["system:nodes"])
            .map_err(std::io::Error::other)?;
        let files = NodePemFiles {
            cert: dir.join("node.crt"),
            key: dir.join("node.key"),
            ca: dir.join("ca.crt"),
        };
        std::fs::write(&files.cert, &pair.cert_pem)?;
        std::fs::write(&files.key, &pair.key_pem)?;
        std::fs::write(&files.ca, &self.fake.pki().ca_pem)?;
        Ok(files)
    }
}

/// The node's client certificate, its key and the CA, one PEM file each.
#[derive(Debug, Clone)]
pub struct NodePemFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
}

/// An edge cache as the binary opens it: sled in `dir` with default options (every write
/// flushed), yurthub's default cache agents.
pub struct SledCache {
    pub store: Arc<SledStore>,
}

impl SledCache {
    pub fn open(dir: &Path) -> SledCache {
        let store = SledStore::open(dir, SledOptions::default()).expect("open sled cache");
        SledCache {
            store: Arc::new(store),
        }
    }

    pub fn edge_config(&self) -> EdgeConfig {
        EdgeConfig {
            store: self.store.clone(),
            agents: CacheAgents::default(),
            volatile: None,
            min_request_timeout: outpost_proxy::edge::watch::DEFAULT_MIN_REQUEST_TIMEOUT,
            max_object_bytes: outpost_proxy::edge::writer::DEFAULT_MAX_OBJECT_BYTES,
            hung_after: outpost_agent::admin::CACHE_HUNG_AFTER,
        }
    }

    /// Waits (bounded) until the store holds a list of `scope` (the writer applies LISTs
    /// asynchronously).
    pub fn until_listed(&self, scope: &Scope) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.store.list(scope).expect("list").is_none() {
            assert!(
                Instant::now() < deadline,
                "the LIST never reached the cache"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) until the hub's cache writer thread has let go of the store, i.e. ended.
    pub fn wait_released(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&self.store) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Thread names of a [`HubPair`]'s hubs.
pub const HUB_ON: &str = "hub-cache-on";
pub const HUB_OFF: &str = "hub-cache-off";

/// The same hub twice in front of one upstream, each on its own runtime: in edge mode over a
/// sled cache ([`HUB_ON`]'s threads), and in cloud mode, without a cache ([`HUB_OFF`]'s).
pub struct HubPair {
    pub cache: SledCache,
    pub on: HubThread,
    pub off: HubThread,
}

impl HubPair {
    /// The cache lives in `dir`; each hub's runtime has `workers` worker threads.
    pub fn start(upstream: &Upstream, dir: &Path, workers: usize) -> HubPair {
        let cache = SledCache::open(dir);
        let on = HubThread::start(
            upstream.hub_config(Some(cache.edge_config())),
            HUB_ON,
            workers,
        );
        let off = HubThread::start(upstream.hub_config(None), HUB_OFF, workers);
        HubPair { cache, on, off }
    }
}

/// A hub serving on a tokio runtime of its own, on its own thread, with `workers` worker threads
/// (`HubConfig` has no knob for that; the binary's runtime is the caller's choice too).
/// Blocking-pool threads (cache reads) and the cache writer thread come on top of the workers.
/// Every thread of the runtime (workers and blocking pool) is called `name` (at most 15 bytes,
/// so [`threads_cpu`] can find them).
pub struct HubThread {
    proxy_addr: SocketAddr,
    admin_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HubThread {
    pub fn start(config: HubConfig, name: &str, workers: usize) -> HubThread {
        assert!(name.len() <= 15, "Linux cuts thread names at 15 bytes");
        let name = name.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-hub".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(workers)
                    .thread_name(name)
                    .enable_all()
                    .build()
                    .expect("hub runtime");
                rt.block_on(async move {
                    let hub = Hub::start(config).await.expect("hub");
                    ready_tx
                        .send((hub.proxy_addr(), hub.admin_addr()))
                        .expect("bench thread waits");
                    // Either a stop or the handle dropped.
                    let _ = stopped.await;
                    hub.shutdown().await;
                });
                rt.shutdown_timeout(Duration::from_secs(5));
            })
            .expect("spawn hub thread");
        let (proxy_addr, admin_addr) = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("hub started");
        HubThread {
            proxy_addr,
            admin_addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// `http://<proxy addr><path>`.
    pub fn uri(&self, path: &str) -> http::Uri {
        format!("http://{}{path}", self.proxy_addr)
            .parse()
            .expect("uri")
    }

    /// `http://<admin addr>/metrics`.
    pub fn metrics_uri(&self) -> http::Uri {
        format!("http://{}/metrics", self.admin_addr)
            .parse()
            .expect("uri")
    }

    /// Stops the hub (open connections get the hub's grace period) and joins its thread.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("hub thread");
        }
    }
}

impl Drop for HubThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// A keep-alive HTTP/1.1 client for the hub's plain-HTTP port.
pub fn plain_client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A GET with kubelet's User-Agent and the given `Accept`.
pub fn kubelet_request(uri: &http::Uri, accept: &str) -> http::Request<Empty<Bytes>> {
    http::Request::get(uri.clone())
        .header("user-agent", KUBELET_UA)
        .header("accept", accept)
        .body(Empty::new())
        .expect("valid request")
}

/// One kubelet-like JSON GET; panics unless it succeeds. Returns the body's length.
pub async fn fetch<C>(client: &Client<C, Empty<Bytes>>, uri: &http::Uri) -> usize
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let resp = client
        .request(kubelet_request(uri, "application/json"))
        .await
        .expect("response");
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .len()
}

/// A response read whole.
pub struct Fetched {
    pub status: http::StatusCode,
    pub from_cache: bool,
    pub body: Bytes,
}

/// One GET with kubelet's real headers, read whole (any status).
pub async fn kubelet_get<C>(client: &Client<C, Empty<Bytes>>, uri: &http::Uri) -> Fetched
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let resp = client
        .request(kubelet_request(uri, KUBELET_ACCEPT))
        .await
        .expect("response");
    let status = resp.status();
    let from_cache = resp
        .headers()
        .get("x-outpost-served-from")
        .is_some_and(|v| v == "edge-cache");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Fetched {
        status,
        from_cache,
        body,
    }
}

/// Real pod shapes: the recorded PodList's pods, renamed.
pub struct PodTemplates {
    templates: Vec<Value>,
}

impl Default for PodTemplates {
    fn default() -> Self {
        let list: Value = serde_json::from_str(POD_LIST).expect("fixture");
        let templates = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .cloned()
            .map(|mut pod| {
                let meta = pod["metadata"].as_object_mut().expect("metadata");
                for server_set in ["uid", "resourceVersion", "creationTimestamp"] {
                    meta.remove(server_set);
                }
                pod
            })
            .collect();
        PodTemplates { templates }
    }
}

impl PodTemplates {
    /// Pod `i` of `node`: fixture pod `i mod 8` (status, containers, volumes, managedFields and
    /// all) under the name `<fixture name>-<node>-<i>`, in the fixture's namespace (kube-system).
    pub fn pod(&self, node: &str, i: usize) -> Value {
        let mut pod = self.templates[i % self.templates.len()].clone();
        let base = pod["metadata"]["name"].as_str().expect("name").to_owned();
        pod["metadata"]["name"] = json!(format!("{base}-{node}-{i:03}"));
        pod["spec"]["nodeName"] = json!(node);
        pod
    }
}

/// Creates `on_node` pods bound to [`NODE`] and `elsewhere` pods spread over three other nodes,
/// through the fake's API; returns the [`NODE`] pods as stored (with kind and resourceVersion).
pub fn seed_pods(fake: &FakeApiServer, on_node: usize, elsewhere: usize) -> Vec<Value> {
    let templates = PodTemplates::default();
    for i in 0..elsewhere {
        let node = format!("edge-{}", 2 + i % 3);
        fake.create("v1/pods", templates.pod(&node, i))
            .expect("create pod");
    }
    (0..on_node)
        .map(|i| {
            fake.create("v1/pods", templates.pod(NODE, i))
                .expect("create pod")
        })
        .collect()
}

/// `/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1`: kubelet's pod LIST (and, with
/// `&watch=true`, its pod WATCH).
pub fn node_pods_path() -> String {
    format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}")
}

/// kubelet's pod scope in the cache: what [`node_pods_path`] lists and watches.
pub fn node_scope() -> Scope {
    let fields = FieldSelector::parse(&format!("spec.nodeName={NODE}")).expect("selector");
    Scope::new(
        "kubelet",
        &Gvr::new("", "v1", "pods"),
        None,
        LabelSelector::default(),
        fields,
    )
}

/// `/api/v1/namespaces/<ns>/pods/<name>` of a stored pod.
pub fn pod_path(pod: &Value) -> String {
    format!(
        "/api/v1/namespaces/{}/pods/{}",
        pod["metadata"]["namespace"].as_str().expect("namespace"),
        pod["metadata"]["name"].as_str().expect("name")
    )
}

/// The edge hub's cache writer thread and sled's own threads (names as Linux keeps them).
pub const CACHE_THREADS: &[&str] = &["outpost-cache-w", "sled-io", "log flusher"];

/// CPU used so far by the cache writer and sled's threads ([`CACHE_THREADS`]).
pub fn cache_threads_cpu() -> Duration {
    CACHE_THREADS.iter().map(|name| threads_cpu(name)).sum()
}

/// A duration as whole microseconds, for printed reports.
pub fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// CPU time (user + system) used so far by this process's live threads whose name starts with
/// `prefix`: the scheduler's nanosecond count (`/proc/self/task/*/schedstat`), else `stat`'s
/// clock ticks (USER_HZ = 100). Linux only; zero elsewhere. Threads that have ended are not
/// counted, so take both readings of a delta while the threads are alive.
pub fn threads_cpu(prefix: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let mut total = Duration::ZERO;
    for task in tasks.flatten() {
        let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) else {
            continue;
        };
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok();
        let on_cpu_ns = schedstat
            .as_deref()
            .and_then(|s| s.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok());
        total += match on_cpu_ns {
            Some(ns) => Duration::from_nanos(ns),
            None => stat_cpu(&task.path()),
        };
    }
    total
}

/// utime + stime of the task or process at `task` (`/proc/<pid>[/task/<tid>]`), in clock ticks
/// (USER_HZ = 100); for a process, every thread it had.
fn stat_cpu(task: &Path) -> Duration {
    let Ok(stat) = std::fs::read_to_string(task.join("stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised name start at field 3; utime and stime are fields 14, 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

/// Percentiles of a sample, nearest rank (`q` in 0..=1).
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    assert!(!sorted.is_empty());
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A loopback port that was free a moment ago (bound to port 0, then released), for programs
/// that take a port number rather than a listener.
pub fn free_loopback_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Milliseconds with two decimals, for printed tables.
pub fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The runtime the fake apiserver and the bench's clients share: two workers, as the machine
/// has two cores (hubs run on runtimes of their own, see [`HubThread`]).
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The middle value (the upper one of an even count), for interleaved rounds.
pub fn median<T: PartialOrd>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).expect("comparable values"));
    values.swap_remove(values.len() / 2)
}
