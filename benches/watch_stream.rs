//! Watch events per second through the hub, with an upstream that is not the bottleneck.
//! Run: `cargo bench -p outpost-benches --bench watch_stream`.
//!
//! The bundled fake apiserver builds every event as it sends it (a few thousand events/s on this
//! machine), so through it the hub's own rate cannot be seen. Here the upstream is a canned HTTPS
//! server (the fake's certificate, so the hub trusts it) that answers every watch with the same
//! pre-encoded stream of `EVENTS` real-shape events in 16 KiB chunks, as fast as TLS goes. Legs:
//!
//! - `direct`: a TLS client reading the canned stream itself (the ceiling);
//! - `via_hub`: the hub in cloud mode (proxy only), one worker thread;
//! - `via_hub_edge`: the hub in edge mode with kubelet's headers, so every event is also teed to
//!   the cache writer, which parses it. The watched scope was never listed, so the writer stores
//!   nothing (`scope_unknown`): this leg measures the tee and the hand-over, not sled (whose
//!   ingest rate the `edge` bench measures). When the writer's queue is full the tee gives up
//!   on the stream (the client is never slowed down); the bench prints the writer's counters.
//!
//! Two event shapes: a Lease (~0.5 KB, the heartbeat's object) and a recorded Pod (~8 KB).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::Connect;
use hyper_util::rt::{TokioExecutor, TokioIo};
use outpost_benches::{
    HubThread, KUBELET_ACCEPT, KUBELET_UA, PodTemplates, SledCache, Upstream, bench_runtime, median,
};
use outpost_proxy::Server;
use outpost_testkit::FakeConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const EVENTS: usize = 20_000;
const CHUNK: usize = 16 << 10;
const STALL: Duration = Duration::from_secs(60);
const WATCH_QUERY: &str = "?watch=true&resourceVersion=1&allowWatchBookmarks=true";

/// `EVENTS` MODIFIED events of `object` (its resourceVersion counting up), cut into chunks.
fn canned_stream(object: &Value) -> Vec<Bytes> {
    let mut all = Vec::new();
    let mut object = object.clone();
    for rv in 0..EVENTS {
        object["metadata"]["resourceVersion"] = json!((1000 + rv).to_string());
        serde_json::to_writer(&mut all, &json!({"type": "MODIFIED", "object": object}))
            .expect("encode");
        all.push(b'\n');
    }
    all.chunks(CHUNK).map(Bytes::copy_from_slice).collect()
}

/// A canned HTTPS upstream: `/readyz` is ok, anything else gets the stream.
async fn serve_canned(upstream: &Upstream, stream: Arc<Vec<Bytes>>) -> SocketAddr {
    let pki = upstream.fake.pki();
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pki.server.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("cert");
    let key = PrivateKeyDer::from_pem_slice(pki.server.key_pem.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, stream) = (acceptor.clone(), stream.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let stream = stream.clone();
                    async move {
                        let chunks: Vec<Result<Frame<Bytes>, Infallible>> =
                            if req.uri().path().starts_with("/readyz") {
                                vec![Ok(Frame::data(Bytes::from_static(b"ok")))]
                            } else {
                                stream.iter().cloned().map(|c| Ok(Frame::data(c))).collect()
                            };
                        let body = StreamBody::new(futures_util::stream::iter(chunks));
                        let resp = http::Response::builder()
                            .header("content-type", "application/json")
                            .body(body)
                            .expect("response");
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

/// Reads one watch to its end; returns the event lines seen.
async fn read_watch<C>(client: &Client<C, Empty<Bytes>>, uri: &http::Uri) -> usize
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let req = http::Request::get(uri.clone())
        .header("user-agent", KUBELET_UA)
        .header("accept", KUBELET_ACCEPT)
        .body(Empty::new())
        .expect("request");
    let resp = tokio::time::timeout(STALL, client.request(req))
        .await
        .expect("headers in time")
        .expect("response");
    assert!(resp.status().is_success(), "{}", resp.status());
    let mut body = resp.into_body();
    let mut lines = 0;
    let deadline = tokio::time::Instant::now() + STALL;
    while let Some(frame) = tokio::time::timeout_at(
        deadline,
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)),
    )
    .await
    .expect("stream stalled")
    {
        if let Some(data) = frame.expect("frame").data_ref() {
            lines += data.iter().filter(|b| **b == b'\n').count();
        }
    }
    assert_eq!(lines, EVENTS, "{uri}: every event arrives");
    lines
}

fn watch_stream(c: &mut Criterion) {
    let rt = bench_runtime();
    let upstream = rt.block_on(Upstream::start(FakeConfig::default()));
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "edge-1", "namespace": "kube-node-lease", "uid": "3f0c6a2e-1b7d-4c1e-9a5f-0000000000aa",
                     "resourceVersion": "1", "creationTimestamp": "2026-11-20T08:00:00Z",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "edge-1", "uid": "3f0c6a2e-1b7d-4c1e-9a5f-0000000000bb"}]},
        "spec": {"holderIdentity": "edge-1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-11-23T21:00:00.000000Z"}});
    let pod = PodTemplates::default().pod("edge-1", 0);
    let shapes = [
        (
            "lease",
            lease,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        ),
        ("pod", pod, "/api/v1/namespaces/kube-system/pods"),
    ];
    for (shape, object, collection) in shapes {
        let watch_path = format!("{collection}{WATCH_QUERY}");
        let stream = Arc::new(canned_stream(&object));
        let bytes: usize = stream.iter().map(Bytes::len).sum();
        let addr = rt.block_on(serve_canned(&upstream, stream));
        let server = Server::parse(&format!("https://{addr}")).expect("server");
        let mut cloud = upstream.hub_config(None);
        cloud.upstream.servers = vec![server.clone()];
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = SledCache::open(dir.path());
        let mut edge = upstream.hub_config(Some(cache.edge_config()));
        edge.upstream.servers = vec![server];
        let hub = HubThread::start(cloud, "hub-watch", 1);
        let hub_edge = HubThread::start(edge, "hub-watch-edge", 1);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(upstream.tls.with_identity.as_ref().clone())
            .https_only()
            .enable_http1()
            .build();
        let tls_client = Client::builder(TokioExecutor::new()).build(https);
        let plain = outpost_benches::plain_client();
        let direct_uri: http::Uri = format!("https://{addr}{watch_path}").parse().expect("uri");
        let hub_uri = hub.uri(&watch_path);
        let edge_uri = hub_edge.uri(&watch_path);
        println!(
            "watch_stream/{shape}: {EVENTS} events, {bytes} bytes ({} bytes per event)",
            bytes / EVENTS
        );

        let mut group = c.benchmark_group(format!("watch_stream/{shape}"));
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(10);
        group.throughput(Throughput::Elements(EVENTS as u64));
        group.bench_function("direct", |b| {
            b.iter(|| rt.block_on(read_watch(&tls_client, &direct_uri)))
        });
        group.bench_function("via_hub", |b| {
            b.iter(|| rt.block_on(read_watch(&plain, &hub_uri)))
        });
        group.bench_function("via_hub_edge", |b| {
            b.iter(|| rt.block_on(read_watch(&plain, &edge_uri)))
        });
        group.finish();

        // Interleaved rounds: events/s of each leg under the same drift.
        let rate = |uri: &http::Uri, tls: bool| {
            let started = Instant::now();
            if tls {
                rt.block_on(read_watch(&tls_client, uri));
            } else {
                rt.block_on(read_watch(&plain, uri));
            }
            EVENTS as f64 / started.elapsed().as_secs_f64()
        };
        let (mut d, mut h, mut e) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..5 {
            d.push(rate(&direct_uri, true));
            h.push(rate(&hub_uri, false));
            e.push(rate(&edge_uri, false));
        }
        let (d, h, e) = (median(d), median(h), median(e));
        println!(
            "watch_stream/{shape} interleaved, 5 rounds, median events/s: direct {d:.0}, via_hub {h:.0} ({:.2} of direct), via_hub_edge {e:.0} ({:.2} of direct)",
            h / d,
            e / d
        );
        let metrics = rt.block_on(async {
            let resp = plain.get(hub_edge.metrics_uri()).await.expect("metrics");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            String::from_utf8_lossy(&body).into_owned()
        });
        let cache_lines: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("outpost_cache_writes_total")
                    || l.starts_with("outpost_cache_dropped_total")
            })
            .collect();
        println!("watch_stream/{shape} edge hub cache counters: {cache_lines:?}");
        hub.stop();
        hub_edge.stop();
    }
    rt.block_on(upstream.shutdown());
}

criterion_group!(benches, watch_stream);
criterion_main!(benches);
