//! The edge cache end to end: the bundled fake apiserver, the hub in edge mode over a sled cache
//! (default options: every write flushed), and keep-alive HTTP/1.1 clients, all over loopback
//! sockets. The node carries 110 real-shape pods (the recorded PodList's pods, renamed, ~8 KB
//! each) among 330 pods of other nodes. The hub runs on a runtime of its own with **one** worker
//! thread; the fake and the clients share a second, two-worker runtime.
//! Run: `cargo bench -p outpost-benches --bench edge`.
//!
//! - `edge_offline/list_110_pods_by_node`: kubelet's pod LIST (`fieldSelector=spec.nodeName=edge-1`)
//!   answered from the cache while the fake refuses connections. Criterion gives the median; the
//!   bench also prints percentiles (p99 included) of separate fixed runs of timed requests, each
//!   taking turns with the same bytes from a bare hyper server: one with the cache unchanged (the
//!   hub answers from its memo, as on an offline node), one with a write before each LIST (so
//!   the hub reads the store); and the percentiles of the store's own `list` of that scope.
//! - `edge_offline/get_pod`: one pod GET from the cache, sequential (criterion reports it as
//!   requests/s); the bench also prints the throughput of 8 keep-alive connections hammering the
//!   same hub, and the CPU the hub's threads (its one worker plus its blocking pool, where cache
//!   reads run) spent per request, i.e. requests per CPU-second.
//! - `edge_watch/…_{live,backlog}/{cache_on,cache_off}`: a pod WATCH through the hub carrying
//!   2,000 pod updates. Cache on = edge mode, kubelet's watch teed into the cache; cache off = the
//!   same hub with `edge: None`. `live`: the watch is open and the fake commits the updates as
//!   fast as it can, timed from the first update until the client holds every event (the issue's
//!   definition). `backlog`: the updates are committed first, untimed, and the watch replays them
//!   from the fake's event log, timed from the watch request; no producer runs while timed. The
//!   producer side is the same in both legs. The cache writer works asynchronously; between
//!   rounds the bench waits (untimed) until the cache holds every event, so a round never pays
//!   for the previous one, and checks that no cache write was dropped. After the criterion legs
//!   the bench prints an interleaved on/off comparison per mode (drift from other work on the
//!   machine hits both legs alike) with CPU per event of the hub's runtime and of the cache
//!   writer and sled threads, when the cache held every event, and how many memory trims each
//!   hub ran during those rounds.
//!
//! What holding ADDED/DELETED until they are on disk costs per event is `deleted_event.rs`'s.
//!
//! The printed extras run even when a criterion filter skips their group.
//! Writing one watch event into the cache on its own (`Store::apply_event`) is benched in
//! `crates/cache/benches/store.rs` (`apply_event/modified_pod/sled`), not repeated here.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use http_body::Body;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use outpost_benches::{
    Fetched, HUB_OFF, HUB_ON, HubPair, HubThread, SledCache, Upstream, bench_runtime,
    cache_threads_cpu, kubelet_get, kubelet_request, median, micros, node_pods_path, node_scope,
    percentile, plain_client, pod_path, seed_pods, threads_cpu,
};
use outpost_cache::{SledStore, Store};
use outpost_testkit::FakeConfig;
use serde_json::{Value, json};

type PlainClient = Client<HttpConnector, Empty<Bytes>>;

const ON_NODE: usize = 110;
const ELSEWHERE: usize = 330;
/// Worker threads of the hub's runtime.
const HUB_WORKERS: usize = 1;
/// Thread names (Linux keeps 15 bytes), for per-thread CPU accounting.
const OFFLINE_HUB: &str = "hub-offline";
const BARE: &str = "bare-server";

/// Timed offline LISTs for the percentiles, after untimed warm-up ones.
const LIST_SAMPLES: usize = 2_000;
const LIST_WARM_UP: usize = 200;
/// Requests per turn when the offline LIST and the bare server take turns.
const LIST_BLOCK: usize = 10;
/// Offline GETs spread over concurrent keep-alive connections.
const GET_LOAD: usize = 40_000;
const GET_CONNECTIONS: usize = 8;

/// Pod updates per watch round.
const WATCH_EVENTS: usize = 2_000;
/// Interleaved on/off rounds after the criterion legs.
const WATCH_ROUNDS: usize = 10;
/// No single wait in this bench lasts longer.
const STALL: Duration = Duration::from_secs(60);

fn items(list: &Fetched) -> usize {
    let v: Value = serde_json::from_slice(&list.body).expect("list JSON");
    v["items"].as_array().expect("items").len()
}

/// Polls (bounded) until the hub answers `uri` from its cache: the writer applies asynchronously,
/// and the first request after the fake went away is the one that finds out.
async fn until_cached(client: &PlainClient, uri: &http::Uri) -> Fetched {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = kubelet_get(client, uri).await;
        if resp.status == 200 && resp.from_cache {
            return resp;
        }
        assert!(
            Instant::now() < deadline,
            "{uri} never served from the cache: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One offline request; panics unless the cache answered it.
async fn offline(client: &PlainClient, uri: &http::Uri) -> usize {
    let resp = kubelet_get(client, uri).await;
    assert!(
        resp.status == 200 && resp.from_cache,
        "{uri}: {} (from cache: {})",
        resp.status,
        resp.from_cache
    );
    resp.body.len()
}

/// One GET from the bare server; panics unless it sent the whole body.
async fn bare_get(client: &PlainClient, uri: &http::Uri, len: usize) {
    let resp = kubelet_get(client, uri).await;
    assert!(
        resp.status == 200 && resp.body.len() == len,
        "bare server: {}",
        resp.status
    );
}

/// A hyper HTTP/1.1 server on a one-worker runtime of its own that answers every request with
/// the same bytes: what serving the offline LIST costs without the cache or the pipeline.
struct BareServer {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BareServer {
    fn start(body: Bytes) -> BareServer {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(BARE)
                .enable_all()
                .build()
                .expect("bare runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                ready_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("bench waits");
                let serve = async {
                    while let Ok((stream, _)) = listener.accept().await {
                        let body = body.clone();
                        let service = hyper::service::service_fn(move |_req| {
                            let response = http::Response::builder()
                                .header(http::header::CONTENT_TYPE, "application/json")
                                .body(http_body_util::Full::new(body.clone()))
                                .expect("response");
                            std::future::ready(Ok::<_, std::convert::Infallible>(response))
                        });
                        tokio::spawn(
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                        );
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        });
        let addr = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("bare server started");
        BareServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sorted samples of the hub and of the bare server, taken in turns.
struct Phase {
    hub: Vec<Duration>,
    bare: Vec<Duration>,
}

/// [`LIST_SAMPLES`] timed calls of each leg, in turns of [`LIST_BLOCK`]; each call gets its
/// sequence number.
async fn take_turns<H, HF, B, BF>(mut hub: H, mut bare: B) -> Phase
where
    H: FnMut(usize) -> HF,
    HF: std::future::Future<Output = Duration>,
    B: FnMut(usize) -> BF,
    BF: std::future::Future<Output = Duration>,
{
    let mut phase = Phase {
        hub: Vec::with_capacity(LIST_SAMPLES),
        bare: Vec::with_capacity(LIST_SAMPLES),
    };
    for block in 0..LIST_SAMPLES / LIST_BLOCK {
        for i in block * LIST_BLOCK..(block + 1) * LIST_BLOCK {
            phase.hub.push(hub(i).await);
        }
        for i in block * LIST_BLOCK..(block + 1) * LIST_BLOCK {
            phase.bare.push(bare(i).await);
        }
    }
    phase.hub.sort();
    phase.bare.sort();
    phase
}

fn print_phase(name: &str, phase: &Phase) {
    let (hub, bare) = (&phase.hub, &phase.bare);
    println!(
        "  {name}: p50 {} p90 {} p99 {} p99.9 {} max {}; bare server p50 {} p90 {} p99 {}; hub ÷ bare p50 {:.2} p99 {:.2}",
        micros(percentile(hub, 0.50)),
        micros(percentile(hub, 0.90)),
        micros(percentile(hub, 0.99)),
        micros(percentile(hub, 0.999)),
        micros(*hub.last().expect("samples")),
        micros(percentile(bare, 0.50)),
        micros(percentile(bare, 0.90)),
        micros(percentile(bare, 0.99)),
        percentile(hub, 0.50).as_secs_f64() / percentile(bare, 0.50).as_secs_f64(),
        percentile(hub, 0.99).as_secs_f64() / percentile(bare, 0.99).as_secs_f64(),
    );
}

fn offline_reads(c: &mut Criterion) {
    let rt = bench_runtime();
    let upstream = rt.block_on(Upstream::start(FakeConfig::default()));
    let pods = seed_pods(&upstream.fake, ON_NODE, ELSEWHERE);
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = SledCache::open(dir.path());
    let hub = HubThread::start(
        upstream.hub_config(Some(cache.edge_config())),
        OFFLINE_HUB,
        HUB_WORKERS,
    );
    let client = plain_client();
    let list_uri = hub.uri(&node_pods_path());
    let get_uri = hub.uri(&pod_path(&pods[0]));

    let list_body = rt.block_on(async {
        // Online, kubelet-like: the responses are teed into the cache.
        let list = kubelet_get(&client, &list_uri).await;
        assert!(list.status == 200 && !list.from_cache, "{}", list.status);
        assert_eq!(items(&list), ON_NODE);
        let pod = kubelet_get(&client, &get_uri).await;
        assert!(pod.status == 200 && !pod.from_cache, "{}", pod.status);
        upstream.fake.refuse_connections();
        let list = until_cached(&client, &list_uri).await;
        assert_eq!(items(&list), ON_NODE);
        let pod = until_cached(&client, &get_uri).await;
        println!(
            "edge_offline: LIST body {} bytes ({ON_NODE} pods), GET body {} bytes",
            list.body.len(),
            pod.body.len()
        );
        list.body
    });

    let mut group = c.benchmark_group("edge_offline");
    group.bench_function("list_110_pods_by_node", |b| {
        b.iter(|| rt.block_on(offline(&client, &list_uri)))
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function("get_pod", |b| {
        b.iter(|| rt.block_on(offline(&client, &get_uri)))
    });
    group.finish();

    // Percentiles of the offline LIST: criterion reports none. Two phases, each taking turns in
    // small blocks with the same bytes from a bare hyper server (the HTTP floor), so drift hits
    // both legs of a phase alike:
    // 1. the cache unchanged, as on an offline node (after the first, the hub answers from its
    //    memo: nothing was written since);
    // 2. each LIST right after an untimed write to the store (the memo misses and the store is
    //    read). The writes leave sled background work behind; it stays out of phase 1's figures.
    let bare = BareServer::start(list_body.clone());
    let bare_uri: http::Uri = format!("http://{}/api/v1/pods", bare.addr)
        .parse()
        .expect("uri");
    let bump = |n: usize| {
        let doc = format!("{{\"n\":{n}}}");
        cache
            .store
            .put_document("bench/bump", doc.as_bytes())
            .expect("bump");
    };
    let (unchanged, after_write) = rt.block_on(async {
        for _ in 0..LIST_WARM_UP {
            offline(&client, &list_uri).await;
            bare_get(&client, &bare_uri, list_body.len()).await;
        }
        let hub_leg = |write: bool| {
            let client = &client;
            let list_uri = &list_uri;
            move |i: usize| async move {
                if write {
                    bump(i);
                }
                let started = Instant::now();
                offline(client, list_uri).await;
                started.elapsed()
            }
        };
        let bare_leg = |_: usize| async {
            let started = Instant::now();
            bare_get(&client, &bare_uri, list_body.len()).await;
            started.elapsed()
        };
        let unchanged = take_turns(hub_leg(false), bare_leg).await;
        let after_write = take_turns(hub_leg(true), bare_leg).await;
        (unchanged, after_write)
    });
    drop(bare);
    // The floor under it: the same scope read straight from the store, as the hub's blocking
    // task does (no HTTP, no body assembly, no copy to the client).
    let mut floor: Vec<Duration> = (0..LIST_SAMPLES)
        .map(|_| {
            let started = Instant::now();
            let list = cache
                .store
                .list(&node_scope())
                .expect("list")
                .expect("cached");
            assert_eq!(list.items.len(), ON_NODE);
            started.elapsed()
        })
        .collect();
    floor.sort();
    println!(
        "edge_offline/list_110_pods_by_node: {LIST_SAMPLES} sequential requests per leg after {LIST_WARM_UP} warm-up, \
         each phase taking turns in blocks of {LIST_BLOCK} with the same {} bytes from a bare hyper server (one worker, no cache)",
        list_body.len()
    );
    print_phase("cache unchanged (memo)", &unchanged);
    print_phase("right after a write (the store is read)", &after_write);
    println!(
        "  floor: SledStore::list of the same scope called directly, {LIST_SAMPLES} times: p50 {} p99 {}",
        micros(percentile(&floor, 0.50)),
        micros(percentile(&floor, 0.99)),
    );

    // Offline GET throughput with concurrent keep-alive connections (first round warms them up).
    for round in ["warm-up", "measured"] {
        let cpu = threads_cpu(OFFLINE_HUB);
        let elapsed = rt.block_on(async {
            let started = Instant::now();
            let tasks: Vec<_> = (0..GET_CONNECTIONS)
                .map(|_| {
                    let (client, uri) = (client.clone(), get_uri.clone());
                    tokio::spawn(async move {
                        for _ in 0..GET_LOAD / GET_CONNECTIONS {
                            offline(&client, &uri).await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                tokio::time::timeout(STALL, task)
                    .await
                    .expect("GET load stalled")
                    .expect("GET task");
            }
            started.elapsed()
        });
        let cpu = threads_cpu(OFFLINE_HUB).saturating_sub(cpu);
        if round == "measured" {
            println!(
                "edge_offline/get_pod: {GET_LOAD} GETs over {GET_CONNECTIONS} keep-alive connections in {:.3} s = {:.0} requests/s; \
                 hub threads (1 worker + blocking pool) used {:.3} CPU-s = {:.1} µs CPU per request = {:.0} requests per CPU-second",
                elapsed.as_secs_f64(),
                GET_LOAD as f64 / elapsed.as_secs_f64(),
                cpu.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / GET_LOAD as f64,
                GET_LOAD as f64 / cpu.as_secs_f64(),
            );
        }
    }

    drop(client);
    hub.stop();
    cache.wait_released();
    rt.block_on(upstream.shutdown());
}

/// Counts complete watch lines, checking each one is a MODIFIED event.
#[derive(Default)]
struct EventCounter {
    /// The start of the current line (enough to read its type).
    head: Vec<u8>,
    events: usize,
}

impl EventCounter {
    const MODIFIED: &'static [u8] = br#"{"type":"MODIFIED""#;

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let end = data.iter().position(|&b| b == b'\n');
            let line = &data[..end.unwrap_or(data.len())];
            let wanted = Self::MODIFIED.len().saturating_sub(self.head.len());
            self.head.extend_from_slice(&line[..wanted.min(line.len())]);
            let Some(end) = end else { return };
            assert!(
                self.head.as_slice() == Self::MODIFIED,
                "unexpected watch line: {}…",
                String::from_utf8_lossy(&self.head)
            );
            self.events += 1;
            self.head.clear();
            data = &data[end + 1..];
        }
    }
}

/// Reads a watch body until `n` events arrived; returns when the last one did.
async fn read_events<B>(mut body: B, n: usize) -> Instant
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Debug,
{
    let mut counter = EventCounter::default();
    while counter.events < n {
        let frame = tokio::time::timeout(STALL, body.frame())
            .await
            .expect("watch stalled")
            .unwrap_or_else(|| panic!("watch ended after {} events", counter.events))
            .expect("watch frame");
        if let Some(data) = frame.data_ref() {
            counter.feed(data);
        }
    }
    Instant::now()
}

/// Sum of `outpost_cache_writes_total{op="event"}` over outcomes, and of `outpost_cache_dropped_total`.
async fn cache_event_writes(client: &PlainClient, metrics: &http::Uri) -> (u64, u64) {
    let body = kubelet_get(client, metrics).await.body;
    let text = String::from_utf8_lossy(&body);
    let mut written = 0;
    let mut dropped = 0;
    for line in text.lines() {
        if line.starts_with("outpost_cache_writes_total{") && line.contains(r#"op="event""#) {
            assert!(
                line.contains(r#"outcome="stored""#),
                "an event was not stored: {line}"
            );
            written += metric_value(line);
        } else if line.starts_with("outpost_cache_dropped_total{") {
            dropped += metric_value(line);
        }
    }
    (written, dropped)
}

/// The value at the end of a Prometheus text line, 0 if it does not parse.
fn metric_value(line: &str) -> u64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `outpost_memory_trims_total` of `hub`: a trim (100+ ms here, the process also holds the fake's
/// heap) inside a leg's rounds shows as that leg's CPU.
async fn memory_trims(client: &PlainClient, hub: &HubThread) -> u64 {
    let body = kubelet_get(client, &hub.metrics_uri()).await.body;
    String::from_utf8_lossy(&body)
        .lines()
        .find(|line| line.starts_with("outpost_memory_trims_total "))
        .map_or(0, metric_value)
}

/// Pod updates, the same for both legs: the node's pods in turn, each with a new annotation.
struct Producer {
    pods: Vec<Value>,
    seq: u64,
}

impl Producer {
    fn batch(&mut self, n: usize) -> Vec<Value> {
        (0..n)
            .map(|_| {
                self.seq += 1;
                let mut pod = self.pods[self.seq as usize % self.pods.len()].clone();
                let meta = &mut pod["metadata"];
                // No resourceVersion: an unconditional replace.
                meta.as_object_mut()
                    .expect("metadata")
                    .remove("resourceVersion");
                meta["annotations"]["bench.outpost.dev/seq"] = json!(self.seq.to_string());
                pod
            })
            .collect()
    }
}

/// One hub under test.
struct Leg {
    name: &'static str,
    /// Its runtime's thread name.
    threads: &'static str,
    hub: HubThread,
    cache: Option<LegCache>,
}

/// The cache-on leg's cache.
struct LegCache {
    store: Arc<SledStore>,
    /// The hub's admin `/metrics`.
    metrics: http::Uri,
    /// Watch events the hub has been sent so far.
    sent: u64,
}

/// What one watch round measured.
struct Round {
    /// Live: first update → the producer's loop has returned from the last update (an upper
    /// bound on the last commit: the producer thread can be preempted before it reads the clock).
    produced: Option<Duration>,
    /// First update → the client holds every event.
    delivered: Duration,
    /// CPU of the hub's runtime threads over the round (until delivery), and of the cache
    /// writer and sled threads (until the cache holds every event).
    hub_cpu: Duration,
    cache_cpu: Duration,
    /// First update → the cache holds every event (cache on only).
    cached: Option<Duration>,
}

struct WatchBench {
    rt: tokio::runtime::Runtime,
    upstream: Upstream,
    client: PlainClient,
    producer: Producer,
}

/// How the events reach the watch.
#[derive(Clone, Copy)]
enum Mode {
    /// The watch is open, then the fake commits the updates as fast as it can; timed from the
    /// first update.
    Live,
    /// The fake commits the updates first (untimed), then the watch opens at the resourceVersion
    /// before them and replays them from the fake's event log as fast as the path allows; timed
    /// from sending the watch request. No producer runs while timed.
    Backlog,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Live => "live",
            Mode::Backlog => "backlog",
        }
    }
}

impl WatchBench {
    /// Opens a pod watch through `leg`'s hub; JSON in both legs, so the upstream exchange is the
    /// same whether the hub caches or not.
    fn open_watch(&self, leg: &Leg, from_rv: u64) -> hyper::body::Incoming {
        let path = format!("{}&watch=true&resourceVersion={from_rv}", node_pods_path());
        let uri = leg.hub.uri(&path);
        let resp = self
            .rt
            .block_on(async {
                tokio::time::timeout(
                    STALL,
                    self.client
                        .request(kubelet_request(&uri, "application/json")),
                )
                .await
            })
            .expect("watch headers in time")
            .expect("watch response");
        assert_eq!(resp.status(), 200, "{}: watch", leg.name);
        resp.into_body()
    }

    fn round(&mut self, leg: &mut Leg, mode: Mode) -> Round {
        let updates = self.producer.batch(WATCH_EVENTS);
        let fake = &self.upstream.fake;
        let from_rv = fake.current_resource_version();
        let produce = || {
            for pod in updates {
                fake.update("v1/pods", pod).expect("update pod");
            }
        };
        let (started, produced, reader, cpu) = match mode {
            Mode::Live => {
                let body = self.open_watch(leg, from_rv);
                let reader = self.rt.spawn(read_events(body, WATCH_EVENTS));
                let cpu = (threads_cpu(leg.threads), cache_threads_cpu());
                let started = Instant::now();
                produce();
                (started, Some(started.elapsed()), reader, cpu)
            }
            Mode::Backlog => {
                produce();
                let cpu = (threads_cpu(leg.threads), cache_threads_cpu());
                let started = Instant::now();
                let body = self.open_watch(leg, from_rv);
                let reader = self.rt.spawn(read_events(body, WATCH_EVENTS));
                (started, None, reader, cpu)
            }
        };
        let last_rv = fake.current_resource_version();
        let done = self.rt.block_on(reader).expect("watch reader");
        let delivered = done - started;
        let hub_cpu = threads_cpu(leg.threads).saturating_sub(cpu.0);
        // Wait (untimed, polling the store rather than the hub) for the writer to catch up.
        let cached = leg.cache.as_ref().map(|cache| {
            let deadline = Instant::now() + STALL;
            loop {
                let rv = cache
                    .store
                    .scope_resource_version(&node_scope())
                    .expect("scope rv")
                    .and_then(|rv| rv.as_str().parse::<u64>().ok());
                if rv >= Some(last_rv) {
                    break started.elapsed();
                }
                assert!(
                    Instant::now() < deadline,
                    "the cache is at {rv:?}, the fake at {last_rv}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let cache_cpu = cache_threads_cpu().saturating_sub(cpu.1);
        if let Some(cache) = &mut leg.cache {
            cache.sent += WATCH_EVENTS as u64;
            // The store holds the last event a moment before the writer counts it (after the
            // flush), so the counters are polled too, bounded.
            let deadline = Instant::now() + STALL;
            let (stored, dropped) = loop {
                let counted = self
                    .rt
                    .block_on(cache_event_writes(&self.client, &cache.metrics));
                if counted.0 >= cache.sent || Instant::now() >= deadline {
                    break counted;
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            assert_eq!(dropped, 0, "the cache writer dropped operations");
            assert_eq!(stored, cache.sent, "events stored in the cache");
        }
        Round {
            produced,
            delivered,
            hub_cpu,
            cache_cpu,
            cached,
        }
    }
}

fn events_per_s(d: Duration) -> f64 {
    WATCH_EVENTS as f64 / d.as_secs_f64()
}

fn per_event_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / WATCH_EVENTS as f64
}

/// Per-field medians of a leg's rounds.
struct Summary {
    produced: Option<Duration>,
    delivered: Duration,
    hub_cpu: Duration,
    cache_cpu: Duration,
    cached: Option<Duration>,
}

impl Summary {
    fn of(rounds: &[Round]) -> Summary {
        let field = |f: fn(&Round) -> Duration| median(rounds.iter().map(f).collect());
        let some = |f: fn(&Round) -> Option<Duration>| {
            let v: Vec<Duration> = rounds.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median(v))
        };
        Summary {
            produced: some(|r| r.produced),
            delivered: field(|r| r.delivered),
            hub_cpu: field(|r| r.hub_cpu),
            cache_cpu: field(|r| r.cache_cpu),
            cached: some(|r| r.cached),
        }
    }
}

fn watch_throughput(c: &mut Criterion) {
    let rt = bench_runtime();
    let upstream = rt.block_on(Upstream::start(FakeConfig {
        // Room for a burst even if the watcher lags (a lagging watcher past the window gets 410).
        event_window: 2 * WATCH_EVENTS,
        ..FakeConfig::default()
    }));
    let pods = seed_pods(&upstream.fake, ON_NODE, ELSEWHERE);
    let dir = tempfile::tempdir().expect("tempdir");
    let HubPair { cache, on, off } = HubPair::start(&upstream, dir.path(), HUB_WORKERS);
    let metrics = on.metrics_uri();
    let client = plain_client();

    // kubelet lists before it watches; the events then land in a listed scope, as they do for
    // kubelet's reflector. The cache-off hub gets the same LIST so both hold a warm upstream pool.
    rt.block_on(async {
        for hub in [&on, &off] {
            let list = kubelet_get(&client, &hub.uri(&node_pods_path())).await;
            assert_eq!(list.status, 200);
            assert_eq!(items(&list), ON_NODE);
        }
    });
    cache.until_listed(&node_scope());

    let mut bench = WatchBench {
        rt,
        upstream,
        client,
        producer: Producer { pods, seq: 0 },
    };
    let mut legs = [
        Leg {
            name: "cache_on",
            threads: HUB_ON,
            hub: on,
            cache: Some(LegCache {
                store: cache.store.clone(),
                metrics,
                sent: 0,
            }),
        },
        Leg {
            name: "cache_off",
            threads: HUB_OFF,
            hub: off,
            cache: None,
        },
    ];

    let mut group = c.benchmark_group("edge_watch");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .throughput(Throughput::Elements(WATCH_EVENTS as u64));
    for mode in [Mode::Live, Mode::Backlog] {
        for leg in &mut legs {
            let name = format!("{WATCH_EVENTS}_pod_updates_{}/{}", mode.name(), leg.name);
            group.bench_function(name, |b| {
                b.iter_custom(|iters| (0..iters).map(|_| bench.round(leg, mode).delivered).sum())
            });
        }
    }
    group.finish();

    // Interleaved: on, off, off, on, … so drift (other builds on the machine) hits both legs alike.
    for mode in [Mode::Live, Mode::Backlog] {
        let trims = |bench: &WatchBench, legs: &[Leg; 2]| {
            legs.each_ref()
                .map(|leg| bench.rt.block_on(memory_trims(&bench.client, &leg.hub)))
        };
        let trims_before = trims(&bench, &legs);
        let mut rounds: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
        for round in 0..WATCH_ROUNDS {
            for step in 0..2 {
                let i = (round + step) % 2;
                rounds[i].push(bench.round(&mut legs[i], mode));
            }
        }
        let trims_after = trims(&bench, &legs);
        report(mode, rounds.map(|rounds| Summary::of(&rounds)));
        println!(
            "  memory trims during these rounds: cache_on {}, cache_off {}",
            trims_after[0] - trims_before[0],
            trims_after[1] - trims_before[1]
        );
    }

    let WatchBench {
        rt,
        upstream,
        client,
        ..
    } = bench;
    drop(client);
    let [on_leg, off_leg] = legs;
    drop(on_leg.cache);
    on_leg.hub.stop();
    off_leg.hub.stop();
    cache.wait_released();
    rt.block_on(upstream.shutdown());
}

fn report(mode: Mode, [on, off]: [Summary; 2]) {
    println!(
        "edge_watch/{} interleaved, {WATCH_ROUNDS} rounds per leg of {WATCH_EVENTS} events, medians:",
        mode.name()
    );
    for (name, s) in [("cache_on", &on), ("cache_off", &off)] {
        println!(
            "  {name:9}: delivered in {:.1} ms = {:.0} events/s{}; hub runtime CPU {:.1} µs/event; \
             cache writer + sled CPU {:.1} µs/event{}",
            s.delivered.as_secs_f64() * 1e3,
            events_per_s(s.delivered),
            s.produced.map_or(String::new(), |p| format!(
                " (the producer's update loop ended after {:.1} ms)",
                p.as_secs_f64() * 1e3
            )),
            per_event_us(s.hub_cpu),
            per_event_us(s.cache_cpu),
            s.cached.map_or(String::new(), |c| format!(
                "; the cache held every event after {:.1} ms",
                c.as_secs_f64() * 1e3
            )),
        );
    }
    println!(
        "  throughput ratio on/off {:.3} (caching costs {:+.1}% in delivery time); \
         CPU per event on/off (hub runtime + cache threads) {:.1}x",
        off.delivered.as_secs_f64() / on.delivered.as_secs_f64(),
        (on.delivered.as_secs_f64() / off.delivered.as_secs_f64() - 1.0) * 100.0,
        (on.hub_cpu + on.cache_cpu).as_secs_f64() / (off.hub_cpu + off.cache_cpu).as_secs_f64(),
    );
}

criterion_group!(benches, offline_reads, watch_throughput);
criterion_main!(benches);
