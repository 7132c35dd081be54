//! Online proxying, measured in one run against the same bundled fake apiserver (HTTPS, client
//! certificates, node authorizer), every client keep-alive with kubelet's User-Agent and
//! `Accept` (the fake answers JSON either way, so every leg moves the same bytes):
//!
//! - `direct`: HTTPS with the node's client certificate, straight to the fake.
//! - `via_hub`: plain HTTP to the hub in cloud mode (proxy only), which forwards over its pooled
//!   TLS connection.
//! - `via_hub_edge`: the same through a hub in edge mode over a sled cache (default options: every
//!   write flushed): kubelet's headers make the tee copy every response into the cache.
//! - `via_nginx`: nginx as a plain reverse proxy to the same TLS upstream (see `nginx.rs`),
//!   skipped with a message when `nginx` is not on `PATH`.
//!
//! Each hub has a tokio runtime of its own with one worker thread (nginx runs one worker
//! process); the fake and the clients share a second, two-worker runtime. The edge hub's cache
//! writer works behind the responses (every write flushed); after every timed stretch the bench
//! waits, untimed, until it has caught up, so its backlog never runs while another leg is timed.
//!
//! Groups: `online_get_node` (`GET /api/v1/nodes/edge-1`, a ~2 KB Node) and `online_list_1mb`
//! (kubelet's pod LIST `fieldSelector=spec.nodeName=edge-1` over 128 real-shape pods, ~1 MB,
//! reported as bytes/s). Criterion gives means and medians; after the groups the bench prints,
//! clearly labelled, p50/p99 of the small GET from a fixed number of sequential requests per leg,
//! taken in interleaved blocks so drift on the machine hits every leg alike, and the LIST
//! throughput of interleaved rounds, with the ratios against `direct` (and the hub against
//! nginx), and how many of the edge hub's cache writes were stored or dropped.
//! Run: `cargo bench -p outpost-benches --bench proxy`.
//!
//! First, every proxy as a process of its own ([`process_comparison`], `processes.rs`): the
//! release `outpost` binary in cloud and edge mode, nginx, haproxy (HTTP/1.1 upstream, and
//! HTTP/2 as `haproxy-h2`) and Go's `httputil.ReverseProxy`, all in front of a Go canned HTTPS
//! upstream (`go/upstream`, so the upstream is never the bottleneck): each proxy's CPU per small
//! GET (utime + stime of the process under `wrk -t1 -c8`), req/s, and p50/p99 of sequential small
//! GETs and 1 MB LISTs.
//! Build the binary first (`cargo build --release -p outpost`); a missing tool skips its leg
//! with a message. `-- processes` runs this part alone, `--quick` shortens it;
//! `OUTPOST_BENCH_BASE_BIN` and `OUTPOST_BENCH_SHAPES` add legs ([`hub_legs`]),
//! `OUTPOST_BENCH_HOLD` keeps the processes up for a profiler ([`hold_for_profiling`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_benches::nginx::Nginx;
use outpost_benches::processes::{self, Proc, UpstreamProtocol};
use outpost_benches::{
    HubThread, NODE, SledCache, Upstream, bench_runtime, cache_threads_cpu, kubelet_get,
    kubelet_request, micros, node_pods_path, percentile, plain_client, seed_pods, threads_cpu,
};
use outpost_testkit::FakeConfig;

const GET_PATH: &str = "/api/v1/nodes/edge-1";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// Pods on the node for the LIST: 128 × ~7.9 KB ≈ 1 MB of JSON.
const LIST_PODS: usize = 128;
const HUB_WORKERS: usize = 1;
/// Thread names (Linux keeps 15 bytes), for per-thread CPU accounting.
const HUB_CLOUD: &str = "hub-cloud";
const HUB_EDGE: &str = "hub-edge";

/// Small-GET percentiles: untimed warm-up per leg, then blocks of sequential requests, one block
/// per leg in turn.
const GET_WARM_UP: usize = 200;
const GET_BLOCKS: usize = 20;
const GET_BLOCK: usize = 100;
/// Untimed requests at the start of every block (the previous leg left other caches warm).
const BLOCK_WARM_UP: usize = 20;
/// LIST throughput: rounds of sequential LISTs, one batch per leg in turn.
const LIST_ROUNDS: usize = 5;
const LIST_BATCH: usize = 10;
/// LIST latency of the process legs: rounds of [`LIST_BATCH`] per leg in turn. With 5 rounds
/// (50 LISTs a leg) two legs running the same code differed by up to a fifth in p50.
const PROCESS_LIST_ROUNDS: usize = 20;

type PlainClient = Client<HttpConnector, Empty<Bytes>>;
type TlsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// One way to reach the fake.
struct Leg {
    name: &'static str,
    /// The hub's runtime thread name (for CPU accounting).
    threads: Option<&'static str>,
    client: Either,
    base: String,
}

enum Either {
    Tls(TlsClient),
    Plain(PlainClient),
}

impl Leg {
    /// The edge hub: its cache writer works behind the responses.
    fn caches(&self) -> bool {
        self.name == "via_hub_edge"
    }

    fn uri(&self, path: &str) -> http::Uri {
        format!("{}{path}", self.base).parse().expect("uri")
    }

    /// One kubelet-like GET, read whole; panics unless it is a 200 from upstream. Returns the
    /// body's length.
    async fn get(&self, uri: &http::Uri) -> usize {
        let resp = match &self.client {
            Either::Tls(c) => kubelet_get(c, uri).await,
            Either::Plain(c) => kubelet_get(c, uri).await,
        };
        assert!(
            resp.status == 200 && !resp.from_cache,
            "{} {uri}: {} (from cache: {})",
            self.name,
            resp.status,
            resp.from_cache
        );
        resp.body.len()
    }
}

/// `outpost_cache_writes_total` by op (every outcome) and `outpost_cache_dropped_total` by op.
async fn cache_counts(
    client: &PlainClient,
    metrics: &http::Uri,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let body = kubelet_get(client, metrics).await.body;
    let text = String::from_utf8_lossy(&body);
    let mut written = BTreeMap::new();
    let mut dropped = BTreeMap::new();
    for line in text.lines() {
        let target = if line.starts_with("outpost_cache_writes_total{") {
            &mut written
        } else if line.starts_with("outpost_cache_dropped_total{") {
            &mut dropped
        } else {
            continue;
        };
        let op = line
            .split("op=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?")
            .to_owned();
        let value = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        *target.entry(op).or_insert(0) += value;
    }
    (written, dropped)
}

/// Waits (bounded) until the edge hub's cache writer has caught up: its write counters stop
/// moving. The writer runs behind the responses; without this, its backlog from one leg would
/// run on the CPUs while the next leg is timed.
fn settle(rt: &tokio::runtime::Runtime, admin: &PlainClient, metrics: &http::Uri) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let total = || {
        let (w, d) = rt.block_on(cache_counts(admin, metrics));
        w.values().sum::<u64>() + d.values().sum::<u64>()
    };
    let mut last = total();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = total();
        if now == last {
            return;
        }
        last = now;
    }
}

fn online(c: &mut Criterion) {
    let rt = bench_runtime();
    let upstream = rt.block_on(Upstream::start(FakeConfig::default()));
    seed_pods(&upstream.fake, LIST_PODS, 0);
    process_comparison(&rt, &upstream);
    if std::env::args().any(|a| a == "processes") {
        // `-- processes`: the process comparison alone (no criterion benchmark has that name).
        rt.block_on(upstream.shutdown());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = SledCache::open(dir.path());
    let hub = HubThread::start(upstream.hub_config(None), HUB_CLOUD, HUB_WORKERS);
    let edge_hub = HubThread::start(
        upstream.hub_config(Some(cache.edge_config())),
        HUB_EDGE,
        HUB_WORKERS,
    );

    let pem = tempfile::tempdir().expect("tempdir");
    let identity = upstream
        .write_node_pem_files(pem.path())
        .expect("node PEM files");
    let nginx = match Nginx::find() {
        None => {
            println!("via_nginx: skipped: no `nginx` on PATH (apt-get install nginx-light)");
            None
        }
        Some(binary) => match Nginx::start(&binary, upstream.fake.addr(), &identity) {
            Ok(nginx) => Some(nginx),
            Err(e) => {
                println!("via_nginx: skipped: {e}");
                None
            }
        },
    };

    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(upstream.tls.with_identity.as_ref().clone())
        .https_only()
        .enable_http1()
        .build();
    let mut legs = vec![
        Leg {
            name: "direct",
            threads: None,
            client: Either::Tls(Client::builder(TokioExecutor::new()).build(https)),
            base: upstream.fake.url(),
        },
        Leg {
            name: "via_hub",
            threads: Some(HUB_CLOUD),
            client: Either::Plain(plain_client()),
            base: format!("http://{}", hub.proxy_addr()),
        },
        Leg {
            name: "via_hub_edge",
            threads: Some(HUB_EDGE),
            client: Either::Plain(plain_client()),
            base: format!("http://{}", edge_hub.proxy_addr()),
        },
    ];
    if let Some(nginx) = &nginx {
        legs.push(Leg {
            name: "via_nginx",
            threads: None,
            client: Either::Plain(plain_client()),
            base: format!("http://{}", nginx.addr()),
        });
    }
    let list_path = node_pods_path();
    let list_len = rt.block_on(async {
        let mut len = None;
        for leg in &legs {
            leg.get(&leg.uri(GET_PATH)).await;
            let n = leg.get(&leg.uri(&list_path)).await;
            assert!(
                len.is_none_or(|l| l == n),
                "{}: LIST of {n} bytes",
                leg.name
            );
            len = Some(n);
        }
        len.expect("legs")
    });
    println!("online: LIST body {list_len} bytes ({LIST_PODS} pods)");

    let metrics = edge_hub.metrics_uri();
    let admin = plain_client();
    let settled = || settle(&rt, &admin, &metrics);
    settled();

    let mut group = c.benchmark_group("online_get_node");
    for leg in &legs {
        let uri = leg.uri(GET_PATH);
        group.bench_function(leg.name, |b| b.iter(|| rt.block_on(leg.get(&uri))));
        settled();
    }
    group.finish();
    let mut group = c.benchmark_group("online_list_1mb");
    group.throughput(Throughput::Bytes(list_len as u64));
    for leg in &legs {
        let uri = leg.uri(&list_path);
        group.bench_function(leg.name, |b| b.iter(|| rt.block_on(leg.get(&uri))));
        settled();
    }
    group.finish();

    let nginx_cpu = || nginx.as_ref().map(Nginx::cpu);
    get_percentiles(&rt, &legs, &settled, &nginx_cpu);
    let before = rt.block_on(cache_counts(&admin, &metrics));
    list_throughput(&rt, &legs, &list_path, list_len, &settled, &nginx_cpu);
    // `list_throughput` let the writer catch up after every batch.
    let after = rt.block_on(cache_counts(&admin, &metrics));
    let lists_sent = (LIST_ROUNDS * (LIST_BATCH + 1)) as u64;
    let delta = |m: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        m.get("list").copied().unwrap_or(0) - b.get("list").copied().unwrap_or(0)
    };
    println!(
        "via_hub_edge cache, LIST rounds: {lists_sent} LISTs sent, {} applied by the writer, {} dropped (queue full); totals by op since start: written {:?}, dropped {:?}",
        delta(&after.0, &before.0),
        delta(&after.1, &before.1),
        after.0,
        after.1,
    );

    drop(legs);
    drop(admin);
    drop(nginx);
    hub.stop();
    edge_hub.stop();
    cache.wait_released();
    rt.block_on(upstream.shutdown());
}

/// p50 / p99 of the small GET per leg, from interleaved blocks of sequential requests.
/// The CPU a leg's proxy used so far: the hub's runtime threads, or nginx's processes.
fn proxy_cpu(leg: &Leg, nginx_cpu: &dyn Fn() -> Option<Duration>) -> Option<Duration> {
    match leg.threads {
        Some(t) => Some(threads_cpu(t)),
        None if leg.name == "via_nginx" => nginx_cpu(),
        None => None,
    }
}

fn get_percentiles(
    rt: &tokio::runtime::Runtime,
    legs: &[Leg],
    settle: &dyn Fn(),
    nginx_cpu: &dyn Fn() -> Option<Duration>,
) {
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); legs.len()];
    for leg in legs {
        let uri = leg.uri(GET_PATH);
        rt.block_on(async {
            for _ in 0..GET_WARM_UP {
                leg.get(&uri).await;
            }
        });
        settle();
    }
    let mut proxy_used = vec![Duration::ZERO; legs.len()];
    let mut cache_cpu = Duration::ZERO;
    for _ in 0..GET_BLOCKS {
        for ((leg, out), cpu) in legs
            .iter()
            .zip(samples.iter_mut())
            .zip(proxy_used.iter_mut())
        {
            let cpu_before = (proxy_cpu(leg, nginx_cpu), cache_threads_cpu());
            let uri = leg.uri(GET_PATH);
            rt.block_on(async {
                for _ in 0..BLOCK_WARM_UP {
                    leg.get(&uri).await;
                }
                for _ in 0..GET_BLOCK {
                    let started = Instant::now();
                    leg.get(&uri).await;
                    out.push(started.elapsed());
                }
            });
            if leg.caches() {
                settle();
                cache_cpu += cache_threads_cpu().saturating_sub(cpu_before.1);
            }
            if let (Some(before), Some(after)) = (cpu_before.0, proxy_cpu(leg, nginx_cpu)) {
                *cpu += after.saturating_sub(before);
            }
        }
    }
    println!(
        "online_get_node latency (not criterion): {} sequential GETs per leg after {GET_WARM_UP} warm-up, \
         in {GET_BLOCKS} interleaved blocks of {GET_BLOCK} (each after {BLOCK_WARM_UP} untimed):",
        GET_BLOCKS * GET_BLOCK
    );
    let mut p = Vec::new();
    for (leg, s) in legs.iter().zip(samples.iter_mut()) {
        s.sort();
        let (p50, p99) = (percentile(s, 0.50), percentile(s, 0.99));
        println!(
            "  {:<13} p50 {:>7}  p90 {:>7}  p99 {:>7}  max {:>7}",
            leg.name,
            micros(p50),
            micros(percentile(s, 0.90)),
            micros(p99),
            micros(*s.last().expect("samples")),
        );
        p.push((leg.name, p50, p99));
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let (_, d50, d99) = p[0];
    for &(name, p50, p99) in &p[1..] {
        println!(
            "  {name} ÷ direct: p50 {:.3}  p99 {:.3}  (adds {} at p50)",
            ratio(p50, d50),
            ratio(p99, d99),
            micros(p50.saturating_sub(d50)),
        );
    }
    let per_get = |cpu: Duration| micros(cpu / (GET_BLOCKS * (GET_BLOCK + BLOCK_WARM_UP)) as u32);
    for (leg, cpu) in legs.iter().zip(&proxy_used).filter(|(_, c)| !c.is_zero()) {
        println!(
            "  {} proxy CPU per GET (hub runtime threads / nginx processes): {}",
            leg.name,
            per_get(*cpu)
        );
    }
    println!(
        "  via_hub_edge cache writer + sled CPU per GET: {}",
        per_get(cache_cpu)
    );
    if let Some(&(_, n50, n99)) = p.iter().find(|(name, _, _)| *name == "via_nginx") {
        for &(name, p50, p99) in p.iter().filter(|(n, _, _)| n.starts_with("via_hub")) {
            println!(
                "  {name} ÷ via_nginx: p50 {:.3}  p99 {:.3}",
                ratio(p50, n50),
                ratio(p99, n99)
            );
        }
    }
}

/// Bytes/s of sequential 1 MB LISTs per leg, from interleaved rounds.
fn list_throughput(
    rt: &tokio::runtime::Runtime,
    legs: &[Leg],
    path: &str,
    len: usize,
    settle: &dyn Fn(),
    nginx_cpu: &dyn Fn() -> Option<Duration>,
) {
    let mut elapsed = vec![Duration::ZERO; legs.len()];
    let mut each: Vec<Vec<Duration>> = vec![Vec::new(); legs.len()];
    // CPU of each proxy (hub runtime or nginx), and of the cache writer + sled threads, over its
    // batches (and the untimed wait for the writer that follows).
    let mut proxy_used = vec![Duration::ZERO; legs.len()];
    let mut cache_cpu = Duration::ZERO;
    for _ in 0..LIST_ROUNDS {
        for (i, leg) in legs.iter().enumerate() {
            let cpu_before = (proxy_cpu(leg, nginx_cpu), cache_threads_cpu());
            let uri = leg.uri(path);
            rt.block_on(async {
                leg.get(&uri).await;
                let started = Instant::now();
                for _ in 0..LIST_BATCH {
                    let one = Instant::now();
                    leg.get(&uri).await;
                    each[i].push(one.elapsed());
                }
                elapsed[i] += started.elapsed();
            });
            if leg.caches() {
                settle();
            }
            if let (Some(before), Some(after)) = (cpu_before.0, proxy_cpu(leg, nginx_cpu)) {
                proxy_used[i] += after.saturating_sub(before);
            }
            if leg.caches() {
                cache_cpu += cache_threads_cpu().saturating_sub(cpu_before.1);
            }
        }
    }
    let n = LIST_ROUNDS * LIST_BATCH;
    println!(
        "online_list_1mb throughput (not criterion): {n} sequential LISTs of {len} bytes per leg, \
         in {LIST_ROUNDS} interleaved rounds of {LIST_BATCH} (each after one untimed):"
    );
    let mbps = |d: Duration| (n * len) as f64 / d.as_secs_f64() / 1e6;
    for ((leg, d), s) in legs.iter().zip(&elapsed).zip(each.iter_mut()) {
        s.sort();
        println!(
            "  {:<13} {:>7.1} MB/s  (per LIST p50 {:.2} ms, p99 {:.2} ms)",
            leg.name,
            mbps(*d),
            percentile(s, 0.5).as_secs_f64() * 1e3,
            percentile(s, 0.99).as_secs_f64() * 1e3,
        );
    }
    for (leg, d) in legs.iter().zip(&elapsed).skip(1) {
        println!(
            "  {} ÷ direct throughput: {:.3}",
            leg.name,
            mbps(*d) / mbps(elapsed[0])
        );
    }
    // Each batch also made one untimed LIST.
    let per_list = |cpu: Duration| micros(cpu / (LIST_ROUNDS * (LIST_BATCH + 1)) as u32);
    for (leg, cpu) in legs.iter().zip(&proxy_used).filter(|(_, c)| !c.is_zero()) {
        println!(
            "  {} proxy CPU per LIST (hub runtime threads / nginx processes): {}",
            leg.name,
            per_list(*cpu)
        );
    }
    println!(
        "  via_hub_edge cache writer + sled CPU per LIST: {}",
        per_list(cache_cpu)
    );
}

criterion_group!(benches, online);
criterion_main!(benches);

/// How long and how often the process comparison runs (`--quick`: about a fifth).
struct ProcessShape {
    wrk_rounds: usize,
    wrk_seconds: u64,
    get_blocks: usize,
    list_rounds: usize,
    list_batch: usize,
}

impl ProcessShape {
    fn from_args() -> ProcessShape {
        if std::env::args().any(|a| a == "--quick") {
            ProcessShape {
                wrk_rounds: 1,
                wrk_seconds: 2,
                get_blocks: 5,
                list_rounds: 2,
                list_batch: 5,
            }
        } else {
            ProcessShape {
                wrk_rounds: 3,
                wrk_seconds: 4,
                get_blocks: GET_BLOCKS,
                list_rounds: PROCESS_LIST_ROUNDS,
                list_batch: LIST_BATCH,
            }
        }
    }
}

/// A proxy running as a process of its own, for the per-request CPU comparison.
struct ProcLeg {
    name: &'static str,
    base: String,
    pid: u32,
    /// The hub in edge mode: let its cache writer finish before reading its CPU.
    caches: bool,
}

impl ProcLeg {
    fn cpu(&self) -> Duration {
        processes::process_tree_cpu(self.pid)
    }

    /// Waits (bounded) until the process's CPU stops moving, so that work behind the answers
    /// (the edge hub's cache writer) is counted with the requests that caused it.
    fn settle(&self) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = self.cpu();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(if self.caches { 300 } else { 50 }));
            let now = self.cpu();
            if now == last {
                return now;
            }
            last = now;
        }
        last
    }
}

/// The canned bodies the Go upstream serves, read once from the fake: the Node and the pod LIST.
fn canned_bodies(rt: &tokio::runtime::Runtime, upstream: &Upstream, dir: &Path) -> [String; 2] {
    let client = tls_client(upstream);
    let read = |path: &str, accept: &str| {
        let uri = format!("{}{path}", upstream.fake.url())
            .parse()
            .expect("uri");
        rt.block_on(async {
            let resp = client
                .request(kubelet_request(&uri, accept))
                .await
                .expect("response");
            assert_eq!(resp.status(), 200, "{path}");
            resp.into_body().collect().await.expect("body").to_bytes()
        })
    };
    // The Node in both encodings, each checked, so that the upstream answers each client as
    // kube-apiserver would: protobuf to kubelet's Accept, JSON to the edge hub's (which asks
    // JSON for what it caches). The pod LIST is JSON only: the testkit fake encodes no
    // protobuf lists (kube-apiserver would send kubelet one).
    let json = |path: &str, name: &str| {
        let body = read(path, "application/json");
        assert!(body.starts_with(b"{"), "{path} as JSON");
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, body).expect("JSON body");
        file.display().to_string()
    };
    let node_protobuf = read(GET_PATH, PROTOBUF);
    assert!(node_protobuf.starts_with(b"k8s\0"), "the Node as protobuf");
    let node_pb_file = dir.join("node.pb");
    std::fs::write(&node_pb_file, node_protobuf).expect("protobuf body");
    [
        format!("{},{}", json(GET_PATH, "node"), node_pb_file.display()),
        json(&node_pods_path(), "list"),
    ]
}

fn tls_client(upstream: &Upstream) -> TlsClient {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(upstream.tls.with_identity.as_ref().clone())
        .https_only()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(https)
}

/// [`tls_client`] speaking HTTP/2 (ALPN `h2` only), as the hubs and client-go speak to an
/// apiserver: the `direct-h2` leg, what the upstream's own HTTP/2 costs a request.
fn tls_client_h2(upstream: &Upstream) -> TlsClient {
    let mut tls = upstream.tls.with_identity.as_ref().clone();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpsConnector::from((http, tls)))
}

/// The Go canned upstream when `go` is there (the proxies then never wait on the fake), else
/// the fake itself.
fn fast_upstream(upstream: &Upstream, dir: &Path, bodies: &[String; 2]) -> Option<Proc> {
    let pki = upstream.fake.pki();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("PEM file");
        path.display().to_string()
    };
    let args = vec![
        format!("-cert={}", write("server.crt", &pki.server.cert_pem)),
        format!("-key={}", write("server.key", &pki.server.key_pem)),
        format!("-ca={}", write("ca.crt", &pki.ca_pem)),
        format!("{GET_PATH}={}", bodies[0]),
        format!("/api/v1/pods={}", bodies[1]),
    ];
    match processes::go_build("upstream").and_then(|b| Proc::go("go-upstream", &b, &args)) {
        Ok(proc) => Some(proc),
        Err(e) => {
            println!("processes: the Go upstream is skipped ({e}); the fake serves instead");
            None
        }
    }
}

/// Every proxy as a process of its own in front of one fast upstream, in the same run: the
/// proxy's CPU per request (utime + stime of the process, all its threads, over `wrk -t1 -c8`
/// on the small GET, after its cache writer settled), req/s, and p50/p99 of sequential
/// keep-alive GETs of the small GET and the 1 MB LIST (interleaved blocks).
fn process_comparison(rt: &tokio::runtime::Runtime, upstream: &Upstream) {
    let shape = ProcessShape::from_args();
    let outpost = match processes::outpost_bin() {
        Ok(bin) => bin,
        Err(e) => {
            println!("processes: skipped: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let bodies = canned_bodies(rt, upstream, dir.path());
    let go_upstream = fast_upstream(upstream, dir.path(), &bodies);
    let upstream_addr = go_upstream
        .as_ref()
        .map_or(upstream.fake.addr(), Proc::addr);
    let identity = upstream
        .write_node_pem_files(dir.path())
        .expect("node PEM files");
    let node_files = upstream
        .fake
        .pki()
        .write_node_files(&dir.path().join("kubelet"), NODE)
        .expect("node files");

    let mut procs: Vec<Proc> = Vec::new();
    for hub in hub_legs(&outpost) {
        let root = dir.path().join(hub.name);
        let mut args = vec![
            format!("--server-addr=https://{upstream_addr}"),
            format!("--node-name={NODE}"),
            "--nodepool-name=pool-a".into(),
            "--bootstrap-mode=kubeletcertificate".into(),
            format!(
                "--kubelet-client-certificate={}",
                node_files.client_pem.display()
            ),
            format!("--kubelet-ca-file={}", node_files.ca_crt.display()),
            "--proxy-port=0".into(),
            "--serve-port=0".into(),
            "--proxy-secure-port=0".into(),
            format!("--root-dir={}", root.join("root").display()),
            format!("--disk-cache-path={}", root.join("cache").display()),
            "--enable-dummy-if=false".into(),
            "--kubelet-healthz-url=".into(),
            format!("--working-mode={}", hub.mode),
        ];
        args.extend(hub.args.iter().map(|a| (*a).to_owned()));
        match Proc::outpost(hub.name, &hub.binary, &args, hub.envs) {
            Ok(p) => procs.push(p),
            Err(e) => println!("processes: {} skipped: {e}", hub.name),
        }
    }
    let nginx = Nginx::find().and_then(|bin| {
        Nginx::start(&bin, upstream_addr, &identity)
            .map_err(|e| println!("processes: nginx skipped: {e}"))
            .ok()
    });
    match processes::on_path("haproxy") {
        None => println!("processes: haproxy skipped: not on PATH (apt-get install haproxy)"),
        // Also over HTTP/2 upstream, as the hubs speak it: the same upstream protocol's cost.
        Some(bin) => {
            for protocol in [UpstreamProtocol::Http1, UpstreamProtocol::Http2] {
                match Proc::haproxy(&bin, upstream_addr, &identity, protocol) {
                    Ok(p) => procs.push(p),
                    Err(e) => println!("processes: haproxy ({protocol:?} upstream) skipped: {e}"),
                }
            }
        }
    }
    let go_rp = processes::go_build("reverseproxy").and_then(|bin| {
        let args = [
            format!("-upstream=https://{upstream_addr}"),
            format!("-cert={}", identity.cert.display()),
            format!("-key={}", identity.key.display()),
            format!("-ca={}", identity.ca.display()),
        ];
        Proc::go("go-reverseproxy", &bin, &args)
    });
    match go_rp {
        Ok(p) => procs.push(p),
        Err(e) => println!("processes: go-reverseproxy skipped: {e}"),
    }
    let mut legs: Vec<ProcLeg> = procs
        .iter()
        .map(|p| ProcLeg {
            name: p.name,
            base: format!("http://{}", p.addr()),
            pid: p.pid(),
            caches: p.name.ends_with("-edge"),
        })
        .collect();
    if let Some(n) = &nginx {
        legs.push(ProcLeg {
            name: "nginx",
            base: format!("http://{}", n.addr()),
            pid: n.pid(),
            caches: false,
        });
    }
    println!(
        "processes: upstream {}, outpost {}; legs: {}",
        if go_upstream.is_some() {
            "Go canned"
        } else {
            "the fake"
        },
        outpost.display(),
        legs.iter().map(|l| l.name).collect::<Vec<_>>().join(", ")
    );
    hold_for_profiling(&legs);
    cpu_per_request(&legs, &shape);
    process_latencies(rt, upstream, upstream_addr, &legs, &shape);
    drop(procs);
    drop(nginx);
    drop(go_upstream);
}

/// With `OUTPOST_BENCH_HOLD=<seconds>`, every leg's URL and pid are printed and the processes
/// are kept up that long before they are measured, for `perf` or `strace` from another shell.
fn hold_for_profiling(legs: &[ProcLeg]) {
    let Some(seconds) = std::env::var("OUTPOST_BENCH_HOLD")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    for leg in legs {
        println!(
            "processes: hold: {} {}{GET_PATH} pid {}",
            leg.name, leg.base, leg.pid
        );
    }
    std::thread::sleep(Duration::from_secs(seconds));
}

/// One hub process of the comparison.
struct HubLeg {
    name: &'static str,
    binary: PathBuf,
    mode: &'static str,
    args: &'static [&'static str],
    envs: &'static [(&'static str, &'static str)],
}

/// The hub in cloud and edge mode; with `OUTPOST_BENCH_BASE_BIN=<binary>`, that binary too
/// (`base-cloud`, `base-edge`: a before/after in one run); with `OUTPOST_BENCH_SHAPES=1`, the
/// cloud hub on tokio's multi-thread scheduler with one and with two workers
/// (`TOKIO_WORKER_THREADS`; the shipped default is the current-thread scheduler) and with an
/// HTTP/1.1 upstream.
fn hub_legs(outpost: &Path) -> Vec<HubLeg> {
    let leg = |name, binary: &Path, mode, args, envs| HubLeg {
        name,
        binary: binary.to_path_buf(),
        mode,
        args,
        envs,
    };
    let mut legs = vec![
        leg("outpost-cloud", outpost, "cloud", &[], &[]),
        leg("outpost-edge", outpost, "edge", &[], &[]),
    ];
    if let Some(base) = std::env::var_os("OUTPOST_BENCH_BASE_BIN") {
        let base = PathBuf::from(base);
        legs.push(leg("base-cloud", &base, "cloud", &[], &[]));
        legs.push(leg("base-edge", &base, "edge", &[], &[]));
    }
    if std::env::var("OUTPOST_BENCH_SHAPES").is_ok_and(|v| v == "1") {
        legs.push(leg(
            "cloud-1-worker",
            outpost,
            "cloud",
            &[],
            &[("TOKIO_WORKER_THREADS", "1")],
        ));
        legs.push(leg(
            "cloud-2-workers",
            outpost,
            "cloud",
            &[],
            &[("TOKIO_WORKER_THREADS", "2")],
        ));
        legs.push(leg(
            "cloud-http1",
            outpost,
            "cloud",
            &["--disable-http2"],
            &[],
        ));
    }
    legs
}

/// `wrk -t1 -c8` on the small GET per leg, in interleaved rounds; CPU per request and req/s.
fn cpu_per_request(legs: &[ProcLeg], shape: &ProcessShape) {
    if processes::on_path("wrk").is_none() {
        println!("processes: CPU per request skipped: no `wrk` on PATH (apt-get install wrk)");
        return;
    }
    let mut per_request: Vec<Vec<Duration>> = vec![Vec::new(); legs.len()];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); legs.len()];
    let duration = Duration::from_secs(shape.wrk_seconds);
    for _ in 0..shape.wrk_rounds {
        for (i, leg) in legs.iter().enumerate() {
            let url = format!("{}{GET_PATH}", leg.base);
            // Warm-up: connections, pools, the cache's first write.
            processes::wrk(&url, 8, Duration::from_secs(1)).expect("wrk warm-up");
            let before = leg.settle();
            let run = processes::wrk(&url, 8, duration).expect("wrk");
            let after = leg.settle();
            per_request[i].push(after.saturating_sub(before) / run.requests as u32);
            rates[i].push(run.per_second());
        }
    }
    println!(
        "proxy CPU per small GET (utime+stime of the process, all threads, /proc/<pid>/stat; \
         wrk -t1 -c8 -d{}s, {} interleaved rounds; median, range):",
        shape.wrk_seconds, shape.wrk_rounds
    );
    let medians: Vec<Duration> = per_request
        .iter()
        .map(|v| outpost_benches::median(v.clone()))
        .collect();
    for ((leg, cpu), rate) in legs.iter().zip(&per_request).zip(&rates) {
        println!(
            "  {:<16} CPU/GET {:>7} ({} … {})  req/s {:>8.0} ({:.0} … {:.0})",
            leg.name,
            micros(outpost_benches::median(cpu.clone())),
            micros(*cpu.iter().min().expect("runs")),
            micros(*cpu.iter().max().expect("runs")),
            outpost_benches::median(rate.clone()),
            rate.iter().copied().fold(f64::INFINITY, f64::min),
            rate.iter().copied().fold(0.0, f64::max),
        );
    }
    let find = |name: &str| legs.iter().position(|l| l.name == name).map(|i| medians[i]);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    if let Some(cloud) = find("outpost-cloud") {
        for base in ["nginx", "haproxy", "haproxy-h2", "go-reverseproxy"] {
            if let Some(b) = find(base) {
                println!("  outpost-cloud ÷ {base} CPU/GET: {:.3}", ratio(cloud, b));
            }
        }
    }
    for (a, b) in [
        ("outpost-edge", "outpost-cloud"),
        ("outpost-cloud", "base-cloud"),
        ("outpost-edge", "base-edge"),
        ("cloud-1-worker", "outpost-cloud"),
        ("cloud-2-workers", "outpost-cloud"),
        ("cloud-1-worker", "cloud-2-workers"),
        ("cloud-http1", "outpost-cloud"),
        // The hub over nginx's and haproxy's usual upstream protocol: the stack's share of the
        // gap, apart from HTTP/2's.
        ("cloud-http1", "nginx"),
        ("cloud-http1", "haproxy"),
    ] {
        if let (Some(x), Some(y)) = (find(a), find(b)) {
            println!("  {a} ÷ {b} CPU/GET: {:.3}", ratio(x, y));
        }
    }
}

/// p50/p99 of sequential keep-alive GETs (small GET, 1 MB LIST) per leg and direct, in
/// interleaved blocks.
fn process_latencies(
    rt: &tokio::runtime::Runtime,
    upstream: &Upstream,
    upstream_addr: std::net::SocketAddr,
    legs: &[ProcLeg],
    shape: &ProcessShape,
) {
    let direct = [tls_client(upstream), tls_client_h2(upstream)];
    let plain = plain_client();
    let direct_base = format!("https://localhost:{}", upstream_addr.port());
    let list_path = node_pods_path();
    // Leg i: the upstream directly over HTTP/1.1 (0) and HTTP/2 (1), then the proxies.
    let get = |base: &str, path: &str, i: usize| {
        let uri: http::Uri = format!("{base}{path}").parse().expect("uri");
        let started = Instant::now();
        let fetched = rt.block_on(async {
            match direct.get(i) {
                Some(client) => kubelet_get(client, &uri).await,
                None => kubelet_get(&plain, &uri).await,
            }
        });
        assert_eq!(fetched.status, 200, "{uri}");
        started.elapsed()
    };
    let names: Vec<&str> = ["direct", "direct-h2"]
        .into_iter()
        .chain(legs.iter().map(|l| l.name))
        .collect();
    let bases: Vec<&str> = [direct_base.as_str(); 2]
        .into_iter()
        .chain(legs.iter().map(|l| l.base.as_str()))
        .collect();
    let settle = |i: usize| {
        if let Some(leg) = i.checked_sub(direct.len()).map(|l| &legs[l])
            && leg.caches
        {
            leg.settle();
        }
    };
    let mut gets: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    let mut lists: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    // Each round starts one leg later, so that no leg always follows the same one: a leg's
    // place in the round moved its p50 by a tenth with the order fixed.
    let legs_in_round = bases.len();
    let order = |round: usize| (0..legs_in_round).map(move |k| (round + k) % legs_in_round);
    for round in 0..shape.get_blocks {
        for i in order(round) {
            let base = bases[i];
            for _ in 0..BLOCK_WARM_UP {
                get(base, GET_PATH, i);
            }
            for _ in 0..GET_BLOCK {
                gets[i].push(get(base, GET_PATH, i));
            }
            settle(i);
        }
    }
    for round in 0..shape.list_rounds {
        for i in order(round) {
            let base = bases[i];
            get(base, &list_path, i);
            for _ in 0..shape.list_batch {
                lists[i].push(get(base, &list_path, i));
            }
            settle(i);
        }
    }
    println!(
        "sequential keep-alive latency ({} small GETs, {} 1 MB LISTs per leg, interleaved):",
        shape.get_blocks * GET_BLOCK,
        shape.list_rounds * shape.list_batch
    );
    let mut table = Vec::new();
    for ((name, g), l) in names.iter().zip(gets.iter_mut()).zip(lists.iter_mut()) {
        g.sort();
        l.sort();
        let row = [
            percentile(g, 0.5),
            percentile(g, 0.99),
            percentile(l, 0.5),
            percentile(l, 0.99),
        ];
        println!(
            "  {name:<16} GET p50 {:>7} p99 {:>7}   LIST p50 {:>9} p99 {:>9}",
            micros(row[0]),
            micros(row[1]),
            outpost_benches::millis(row[2]),
            outpost_benches::millis(row[3]),
        );
        table.push((*name, row));
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let row = |name: &str| table.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
    for base in [
        "direct",
        "direct-h2",
        "nginx",
        "haproxy-h2",
        "outpost-cloud",
        "base-cloud",
    ] {
        let Some(b) = row(base) else { continue };
        let hub = |n: &str| {
            ["outpost", "base-", "cloud-"]
                .iter()
                .any(|p| n.starts_with(p))
        };
        for (name, r) in table.iter().filter(|(n, _)| hub(n) && *n != base) {
            println!(
                "  {name} ÷ {base}: GET p50 {:.3} p99 {:.3}   LIST p50 {:.3} p99 {:.3}",
                ratio(r[0], b[0]),
                ratio(r[1], b[1]),
                ratio(r[2], b[2]),
                ratio(r[3], b[3]),
            );
        }
    }
    // What each proxy adds to its upstream protocol's own time: the hubs speak HTTP/2 to the
    // upstream, nginx and haproxy HTTP/1.1.
    if let (Some(h1), Some(h2)) = (row("direct"), row("direct-h2")) {
        let added = |r: &[Duration; 4], d: &[Duration; 4]| {
            format!(
                "GET p50 +{} LIST p50 +{}",
                micros(r[0].saturating_sub(d[0])),
                outpost_benches::millis(r[2].saturating_sub(d[2]))
            )
        };
        for (name, r) in table.iter().filter(|(n, _)| !n.starts_with("direct")) {
            let own = if matches!(*name, "nginx" | "haproxy" | "cloud-http1") {
                &h1
            } else {
                &h2
            };
            println!(
                "  {name} added to its upstream protocol's direct time: {}",
                added(r, own)
            );
        }
    }
}
