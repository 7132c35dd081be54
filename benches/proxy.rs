//! Online small GET, measured two ways in one run: straight to the (fake) apiserver over TLS with
//! the node certificate, and through the hub (plain HTTP in, TLS out). The ratio of the two is the
//! hub's cost; absolute times depend on the machine. Both clients keep connections alive, as
//! kubelet does. Run: `cargo bench -p outpost-benches --bench proxy`.

use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_certs::UpstreamTls;
use outpost_proxy::{Hub, HubConfig, LbMode, Server, UpstreamConfig};
use outpost_testkit::{FakeApiServer, FakeConfig};

const PATH: &str = "/api/v1/nodes/edge-1";
const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/bench";

async fn fetch<C>(client: &Client<C, Empty<Bytes>>, uri: &http::Uri) -> usize
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let req = http::Request::get(uri.clone())
        .header("user-agent", KUBELET_UA)
        .header("accept", "application/json")
        .body(Empty::new())
        .expect("valid request");
    let resp = client.request(req).await.expect("response");
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .len()
}

fn online_get(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (fake, hub, tls) = rt.block_on(async {
        let fake = FakeApiServer::start(FakeConfig::default())
            .await
            .expect("fake");
        let files = fake
            .pki()
            .write_node_files(dir.path(), "edge-1")
            .expect("certs");
        let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt).expect("tls");
        let hub = Hub::start(HubConfig {
            proxy_addr: "127.0.0.1:0".parse().expect("addr"),
            admin_addr: "127.0.0.1:0".parse().expect("addr"),
            upstream: UpstreamConfig {
                servers: vec![Server::parse(&fake.url()).expect("server")],
                lb_mode: LbMode::RoundRobin,
                connect_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(30),
                tls: tls.clone(),
            },
            edge: None,
            namespace: "kube-system".into(),
        })
        .await
        .expect("hub");
        (fake, hub, tls)
    });

    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.with_identity.as_ref().clone())
        .https_only()
        .enable_http1()
        .build();
    let direct: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let plain: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let direct_uri: http::Uri = format!("{}{PATH}", fake.url()).parse().expect("uri");
    let hub_uri: http::Uri = format!("http://{}{PATH}", hub.proxy_addr())
        .parse()
        .expect("uri");

    let mut group = c.benchmark_group("online_get_node");
    group.bench_function("direct", |b| {
        b.iter(|| rt.block_on(fetch(&direct, &direct_uri)))
    });
    group.bench_function("via_hub", |b| {
        b.iter(|| rt.block_on(fetch(&plain, &hub_uri)))
    });
    group.finish();

    rt.block_on(async {
        hub.shutdown().await;
        fake.shutdown().await;
    });
}

criterion_group!(benches, online_get);
criterion_main!(benches);
