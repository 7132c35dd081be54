//! Response filters through the hub, against plain proxying of the same bytes in the same run:
//! the bundled fake apiserver, the hub in cloud mode (no cache, so only filtering differs) on a
//! runtime of its own with one worker thread, and a keep-alive HTTP/1.1 client, all on loopback.
//! Run: `cargo bench -p outpost-benches --bench filter_path`.
//!
//! The fake holds a Service annotated `openyurt.io/topologyKeys: kubernetes.io/hostname` whose 50
//! EndpointSlices carry 5,000 endpoints on 10 nodes (a tenth on this node), and the
//! `default/kubernetes` slice. Requests carry kube-proxy's User-Agent and a bearer token (its
//! service account) and ask for JSON in every leg, so upstream sends the same bytes each time.
//!
//! - `filter_path/list_5000_endpoints/…`: the EndpointSliceList.
//!   - `filtered`: a hub with yurthub's filters; servicetopology trims every slice and
//!     forwardkubesvctraffic rewrites `default/kubernetes`.
//!   - `plain`: a hub without filters (`filters: None`), same request: plain proxying.
//!   - `no_filter_applies`: the filtering hub, with kubectl's User-Agent (no filter applies):
//!     what a request pays for filtering being on.
//! - `filter_path/watch_10000_events/{filtered,plain}`: a watch replaying 10,000 slice updates
//!   from the fake's event log (each event a 20-endpoint slice that servicetopology trims), timed
//!   from the request until the client holds every event.
//!
//! After the criterion legs the bench prints interleaved rounds (filtered, plain, … in turn) and
//! the ratio of their medians, which drift on a busy machine affects alike.

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use http_body::Body;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use outpost_agent::FilterSettings;
use outpost_benches::{HubThread, NODE, Upstream, bench_runtime, median, plain_client};
use outpost_filter::FilterConfig;
use outpost_testkit::FakeConfig;
use serde_json::{Value, json};

type PlainClient = Client<HttpConnector, Empty<Bytes>>;

const TOKEN: &str = "kube-proxy-bench-token";
const KUBE_PROXY_UA: &str = "kube-proxy/v1.32.4 (linux/amd64) kubernetes/bench";
const KUBECTL_UA: &str = "kubectl/v1.32.4 (linux/amd64) kubernetes/bench";
const SLICES: usize = 50;
const ENDPOINTS_PER_SLICE: usize = 100;
const NODES: usize = 10;
const WATCH_EVENTS: usize = 10_000;
const WATCH_SLICE_ENDPOINTS: usize = 20;
/// Interleaved rounds after the criterion legs.
const LIST_ROUNDS: usize = 60;
const WATCH_ROUNDS: usize = 8;
const STALL: Duration = Duration::from_secs(60);

fn node(i: usize) -> String {
    if i == 0 {
        NODE.to_owned()
    } else {
        format!("edge-{}", i + 1)
    }
}

fn slice(name: &str, endpoints: usize, generation: usize) -> Value {
    let endpoints: Vec<Value> = (0..endpoints)
        .map(|i| {
            json!({
                "addresses": [format!("10.{}.{}.{}", generation % 250, i / 250, i % 250)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": node(i % NODES),
                "targetRef": {"kind": "Pod", "namespace": "shop", "name": format!("web-{i}")},
                "zone": "zone-a"
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web",
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                     "annotations": {"generation": generation.to_string()}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

/// The Service, its 5,000 endpoints and `default/kubernetes`'s slice.
fn seed(upstream: &Upstream) {
    let fake = &upstream.fake;
    fake.add_token(
        TOKEN,
        "system:serviceaccount:kube-system:kube-proxy",
        &["system:masters"],
    );
    fake.create("v1/namespaces", json!({"metadata": {"name": "shop"}}))
        .expect("namespace");
    fake.create(
        "v1/services",
        json!({"metadata": {"name": "web", "namespace": "shop",
                            "annotations": {"openyurt.io/topologyKeys": "kubernetes.io/hostname"}},
               "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80}]}}),
    )
    .expect("service");
    for i in 0..SLICES {
        fake.create(
            "discovery.k8s.io/v1/endpointslices",
            slice(&format!("web-{i:03}"), ENDPOINTS_PER_SLICE, 0),
        )
        .expect("slice");
    }
    fake.create(
        "discovery.k8s.io/v1/endpointslices",
        json!({"metadata": {"name": "kubernetes", "namespace": "default",
                            "labels": {"kubernetes.io/service-name": "kubernetes"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["172.18.0.2"], "conditions": {"ready": true}}],
               "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}),
    )
    .expect("kubernetes slice");
}

fn filter_settings() -> FilterSettings {
    FilterSettings {
        config: FilterConfig::default(),
        pool_name: Some("pool-a".into()),
        hub_host: "169.254.2.1".parse().expect("ip"),
        hub_port: 10268,
        node_buckets: false,
    }
}

fn request(uri: &http::Uri, user_agent: &str) -> http::Request<Empty<Bytes>> {
    http::Request::get(uri.clone())
        .header("user-agent", user_agent)
        .header("accept", "application/json")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Empty::new())
        .expect("valid request")
}

async fn get(client: &PlainClient, uri: &http::Uri, user_agent: &str) -> Bytes {
    let resp = client
        .request(request(uri, user_agent))
        .await
        .expect("response");
    assert!(resp.status().is_success(), "{uri}: {}", resp.status());
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// Endpoints in a list body.
fn endpoint_count(body: &[u8]) -> usize {
    let list: Value = serde_json::from_slice(body).expect("list JSON");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| s["endpoints"].as_array().map_or(0, Vec::len))
        .sum()
}

/// Reads a watch until it has delivered `events` lines; returns the bytes read.
async fn watch(client: &PlainClient, uri: &http::Uri, user_agent: &str, events: usize) -> usize {
    let resp = client
        .request(request(uri, user_agent))
        .await
        .expect("watch response");
    assert!(resp.status().is_success(), "{}", resp.status());
    let mut body = resp.into_body();
    let (mut lines, mut bytes) = (0, 0);
    let deadline = Instant::now() + STALL;
    while lines < events {
        let frame = tokio::time::timeout_at(
            deadline.into(),
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)),
        )
        .await
        .expect("watch stalled")
        .expect("watch ended early")
        .expect("watch frame");
        if let Some(data) = frame.data_ref() {
            lines += data.iter().filter(|b| **b == b'\n').count();
            bytes += data.len();
        }
    }
    bytes
}

fn filter_path(c: &mut Criterion) {
    let rt = bench_runtime();
    // The watch replays 10,000 events from the fake's event log: keep them all.
    let upstream = rt.block_on(Upstream::start(FakeConfig {
        event_window: WATCH_EVENTS + 1_000,
        ..FakeConfig::default()
    }));
    seed(&upstream);
    let mut with_filters = upstream.hub_config(None);
    with_filters.filters = Some(filter_settings());
    let filtering = HubThread::start(with_filters, "hub-filters", 1);
    let plain = HubThread::start(upstream.hub_config(None), "hub-plain", 1);
    let client = plain_client();
    let list_path = "/apis/discovery.k8s.io/v1/endpointslices";
    let (filtered_uri, plain_uri) = (filtering.uri(list_path), plain.uri(list_path));

    rt.block_on(async {
        // The hub's Service watch must have seen the annotation before anything is timed.
        let deadline = Instant::now() + STALL;
        loop {
            let body = get(&client, &filtered_uri, KUBE_PROXY_UA).await;
            if endpoint_count(&body) == SLICES * ENDPOINTS_PER_SLICE / NODES + 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the filter never applied");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let plain_body = get(&client, &plain_uri, KUBE_PROXY_UA).await;
        let filtered_body = get(&client, &filtered_uri, KUBE_PROXY_UA).await;
        println!(
            "filter_path: EndpointSliceList {} bytes with {} endpoints upstream; {} bytes with {} endpoints filtered",
            plain_body.len(),
            endpoint_count(&plain_body),
            filtered_body.len(),
            endpoint_count(&filtered_body)
        );
    });

    let mut group = c.benchmark_group("filter_path/list_5000_endpoints");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(1));
    group.bench_function("filtered", |b| {
        b.iter(|| rt.block_on(get(&client, &filtered_uri, KUBE_PROXY_UA)))
    });
    group.bench_function("plain", |b| {
        b.iter(|| rt.block_on(get(&client, &plain_uri, KUBE_PROXY_UA)))
    });
    group.bench_function("no_filter_applies", |b| {
        b.iter(|| rt.block_on(get(&client, &filtered_uri, KUBECTL_UA)))
    });
    group.finish();

    // The watch: 10,000 updates of one 20-endpoint slice, replayed from the fake's log.
    let start_rv = upstream.fake.current_resource_version();
    let name = "watched";
    let mut current = upstream
        .fake
        .create(
            "discovery.k8s.io/v1/endpointslices",
            slice(name, WATCH_SLICE_ENDPOINTS, 0),
        )
        .expect("watched slice");
    for generation in 1..WATCH_EVENTS {
        let mut next = slice(name, WATCH_SLICE_ENDPOINTS, generation);
        next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        current = upstream
            .fake
            .update("discovery.k8s.io/v1/endpointslices", next)
            .expect("update");
    }
    let watch_path = format!(
        "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices?fieldSelector=metadata.name%3D{name}&watch=true&resourceVersion={start_rv}&timeoutSeconds=300"
    );
    let (filtered_watch, plain_watch) = (filtering.uri(&watch_path), plain.uri(&watch_path));
    let sizes = rt.block_on(async {
        (
            watch(&client, &plain_watch, KUBE_PROXY_UA, WATCH_EVENTS).await,
            watch(&client, &filtered_watch, KUBE_PROXY_UA, WATCH_EVENTS).await,
        )
    });
    println!(
        "filter_path: watch of {WATCH_EVENTS} events: {} bytes upstream, {} bytes filtered",
        sizes.0, sizes.1
    );
    let mut group = c.benchmark_group("filter_path/watch_10000_events");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.throughput(Throughput::Elements(WATCH_EVENTS as u64));
    group.bench_function("filtered", |b| {
        b.iter(|| rt.block_on(watch(&client, &filtered_watch, KUBE_PROXY_UA, WATCH_EVENTS)))
    });
    group.bench_function("plain", |b| {
        b.iter(|| rt.block_on(watch(&client, &plain_watch, KUBE_PROXY_UA, WATCH_EVENTS)))
    });
    group.finish();

    // Criterion runs the legs one after the other; drift from other work on a small machine
    // hits them unevenly. Interleaved rounds see the same drift, so their ratio is the figure.
    let timed = |leg: &dyn Fn()| {
        let started = Instant::now();
        leg();
        started.elapsed()
    };
    let (mut f, mut p, mut n) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..LIST_ROUNDS {
        f.push(timed(&|| {
            rt.block_on(get(&client, &filtered_uri, KUBE_PROXY_UA));
        }));
        p.push(timed(&|| {
            rt.block_on(get(&client, &plain_uri, KUBE_PROXY_UA));
        }));
        n.push(timed(&|| {
            rt.block_on(get(&client, &filtered_uri, KUBECTL_UA));
        }));
    }
    let (f, p, n) = (median(f), median(p), median(n));
    println!(
        "filter_path/list_5000_endpoints interleaved, {LIST_ROUNDS} rounds, medians: filtered {f:?}, plain {p:?}, no filter applies {n:?}; filtered/plain {:.3}, no-filter-applies/plain {:.3}",
        f.as_secs_f64() / p.as_secs_f64(),
        n.as_secs_f64() / p.as_secs_f64()
    );
    let (mut f, mut p) = (Vec::new(), Vec::new());
    for _ in 0..WATCH_ROUNDS {
        f.push(timed(&|| {
            rt.block_on(watch(&client, &filtered_watch, KUBE_PROXY_UA, WATCH_EVENTS));
        }));
        p.push(timed(&|| {
            rt.block_on(watch(&client, &plain_watch, KUBE_PROXY_UA, WATCH_EVENTS));
        }));
    }
    let (f, p) = (median(f), median(p));
    println!(
        "filter_path/watch_10000_events interleaved, {WATCH_ROUNDS} rounds, medians: filtered {f:?}, plain {p:?}; filtered/plain {:.3}",
        f.as_secs_f64() / p.as_secs_f64()
    );

    filtering.stop();
    plain.stop();
    rt.block_on(upstream.shutdown());
}

criterion_group!(benches, filter_path);
criterion_main!(benches);
