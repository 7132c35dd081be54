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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_benches::nginx::Nginx;
use outpost_benches::{
    HubThread, SledCache, Upstream, bench_runtime, cache_threads_cpu, kubelet_get, micros,
    node_pods_path, percentile, plain_client, seed_pods, threads_cpu,
};
use outpost_testkit::FakeConfig;

const GET_PATH: &str = "/api/v1/nodes/edge-1";
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
