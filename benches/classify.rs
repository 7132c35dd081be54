//! Request classification cost: every proxied request is classified exactly once, so this is a
//! floor under the hub's per-request overhead. URLs are kubelet's real steady-state mix (see
//! `../shared/traffic/README.md`). Run: `cargo bench -p outpost-benches --bench classify`.

use criterion::{Criterion, criterion_group, criterion_main};
use http::Method;
use outpost_core::RequestInfo;
use std::hint::black_box;

const KUBELET_MIX: &[(&str, &str)] = &[
    (
        "PUT",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1?timeout=10s",
    ),
    ("GET", "/api/v1/nodes/edge-1?resourceVersion=0&timeout=10s"),
    (
        "PATCH",
        "/api/v1/namespaces/kube-system/pods/coredns-668d6bf9bc-898sq/status",
    ),
    (
        "GET",
        "/api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dedge-1&resourceVersion=4211&timeoutSeconds=412&watch=true",
    ),
    (
        "GET",
        "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dkube-proxy&limit=500&resourceVersion=0",
    ),
    (
        "GET",
        "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name&limit=500&resourceVersion=0",
    ),
];

fn classify_mix(c: &mut Criterion) {
    let requests: Vec<(Method, &str)> = KUBELET_MIX
        .iter()
        .map(|(m, u)| (m.parse().expect("valid method"), *u))
        .collect();
    c.bench_function("classify/kubelet_mix_6", |b| {
        b.iter(|| {
            for (method, url) in &requests {
                let info = RequestInfo::classify(
                    method,
                    url,
                    Some("kubelet/v1.32.4 (linux/amd64) kubernetes/abc"),
                );
                black_box(info.expect("valid request"));
            }
        })
    });
}

criterion_group!(benches, classify_mix);
criterion_main!(benches);
