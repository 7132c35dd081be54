//! Online small GET, measured two ways in one run: straight to the (fake) apiserver over TLS with
//! the node certificate, and through the hub (plain HTTP in, TLS out). The ratio of the two is the
//! hub's cost; absolute times depend on the machine. Both clients keep connections alive, as
//! kubelet does. Run: `cargo bench -p outpost-benches --bench proxy`.

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outpost_benches::{Upstream, fetch, plain_client};
use outpost_proxy::Hub;
use outpost_testkit::FakeConfig;

const PATH: &str = "/api/v1/nodes/edge-1";

fn online_get(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (upstream, hub) = rt.block_on(async {
        let upstream = Upstream::start(FakeConfig::default()).await;
        let hub = Hub::start(upstream.hub_config(None)).await.expect("hub");
        (upstream, hub)
    });

    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(upstream.tls.with_identity.as_ref().clone())
        .https_only()
        .enable_http1()
        .build();
    let direct: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let plain = plain_client();
    let direct_uri: http::Uri = format!("{}{PATH}", upstream.fake.url())
        .parse()
        .expect("uri");
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
        upstream.shutdown().await;
    });
}

criterion_group!(benches, online_get);
criterion_main!(benches);
