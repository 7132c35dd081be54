//! Response-filter costs, each against a baseline of copying the same bytes in the same run.
//! Run: `cargo bench -p outpost-filter --bench filter`.
//!
//! - `endpointslice_list`: kube-proxy's LIST of 50 EndpointSlices holding 5,000 endpoints
//!   (1.13 MB; servicetopology + forwardkubesvctraffic). `filter_some` has a quarter of the
//!   Services annotated for pool topology (those slices are trimmed); `filter_none` has no
//!   annotated Service (every slice is only peeked at and copied).
//! - `endpointslice_watch`: 10,000 watch event lines of 20-endpoint slices, filtered one by one
//!   as the proxy would, a quarter of them annotated.
//! - `pod_watch`: kubelet's pod watch (serviceenvupdater), 10,000 lines cycling through the
//!   recorded kind pods.
//! - `for_request`: the per-request lookup when no filter applies (the zero-cost path) and
//!   when one does.
//!
//! Figures and their history: `BENCHMARKS.md` and `docs/benchmarks-journal.md`.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use outpost_core::Verb;
use outpost_filter::{Chain, FilterConfig, FilterContext, FilterSet, Outcome};

const POD_WATCH: &str = include_str!("../tests/fixtures/watch-list-pods.jsonl");
const NODES: usize = 12;
const TOPOLOGY: &str = "openyurt.io/topologyKeys";

fn ctx(annotated_every: usize, services: usize) -> FilterContext {
    let mut ctx = FilterContext::new("edge-0")
        .with_pool_name("pool-a")
        .with_pool("pool-a", &["edge-0", "edge-1", "edge-2"]);
    for s in 0..services {
        let annotations: &[(&str, &str)] = if annotated_every > 0 && s % annotated_every == 0 {
            &[(TOPOLOGY, "openyurt.io/nodepool")]
        } else {
            &[]
        };
        ctx = ctx.with_service("shop", &format!("svc-{s}"), annotations);
    }
    ctx
}

/// An EndpointSlice of Service `svc-{service}` with `endpoints` endpoints spread over the nodes,
/// its fields in kube-apiserver's order (`kind`, `apiVersion` when `typed`, then `metadata`…):
/// `serde_json::Value` would sort them.
fn slice(service: usize, index: usize, endpoints: usize, typed: bool) -> String {
    let eps: Vec<String> = (0..endpoints)
        .map(|e| {
            format!(
                r#"{{"addresses":["10.{}.{}.{}"],"conditions":{{"ready":true,"serving":true,"terminating":false}},"targetRef":{{"kind":"Pod","namespace":"shop","name":"svc-{service}-{e}","uid":"00000000-0000-4000-8000-{service:06}{e:06}"}},"nodeName":"edge-{}"}}"#,
                service % 250,
                e / 250,
                e % 250,
                e % NODES
            )
        })
        .collect();
    let type_meta = if typed {
        r#""kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","#
    } else {
        ""
    };
    format!(
        r#"{{{type_meta}"metadata":{{"name":"svc-{service}-{index}","generateName":"svc-{service}-","namespace":"shop","uid":"11111111-0000-4000-8000-{service:06}{index:06}","resourceVersion":"1000","generation":1,"creationTimestamp":"2026-02-27T01:23:30Z","labels":{{"endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io","kubernetes.io/service-name":"svc-{service}"}},"annotations":{{"endpoints.kubernetes.io/last-change-trigger-time":"2026-02-27T01:23:30Z"}}}},"addressType":"IPv4","endpoints":[{}],"ports":[{{"name":"http","protocol":"TCP","port":8080}}]}}"#,
        eps.join(",")
    )
}

fn slice_list() -> Bytes {
    let items: Vec<String> = (0..50).map(|s| slice(s, 0, 100, false)).collect();
    let list = format!(
        r#"{{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{{"resourceVersion":"1000"}},"items":[{}]}}"#,
        items.join(",")
    );
    serde_json::from_str::<serde::de::IgnoredAny>(&list).expect("valid JSON");
    Bytes::from(list)
}

fn slice_events() -> Vec<Bytes> {
    (0..10_000)
        .map(|i| {
            let line = format!(
                r#"{{"type":"MODIFIED","object":{}}}"#,
                slice(i % 100, i, 20, true)
            );
            Bytes::from(line + "\n")
        })
        .collect()
}

fn pod_events() -> Vec<Bytes> {
    let lines: Vec<&str> = POD_WATCH.lines().collect();
    (0..10_000)
        .map(|i| Bytes::from(format!("{}\n", lines[i % lines.len()])))
        .collect()
}

fn chain(set: &FilterSet, component: &str, group: &str, resource: &str, verb: Verb) -> Chain {
    set.for_parts(component, group, "v1", resource, "", verb)
        .expect("a filter applies")
}

fn total(lines: &[Bytes]) -> u64 {
    lines.iter().map(|l| l.len() as u64).sum()
}

fn copy_lines(lines: &[Bytes]) -> usize {
    lines.iter().map(|l| Bytes::copy_from_slice(l).len()).sum()
}

fn filter_lines(chain: &Chain, lines: &[Bytes], ctx: &FilterContext) -> usize {
    lines
        .iter()
        .map(|l| chain.filter_event(l, ctx).into_bytes(l.clone()).len())
        .sum()
}

fn bench_list(c: &mut Criterion) {
    let set = FilterSet::new(&FilterConfig::default());
    let chain = chain(
        &set,
        "kube-proxy",
        "discovery.k8s.io",
        "endpointslices",
        Verb::List,
    );
    let body = slice_list();
    let some = ctx(4, 100);
    let none = ctx(0, 100);
    assert!(matches!(
        chain.filter_list(&body, &some),
        Outcome::Replaced(_)
    ));
    assert!(matches!(
        chain.filter_list(&body, &none),
        Outcome::Unchanged
    ));

    let mut group = c.benchmark_group("endpointslice_list");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("copy", |b| {
        b.iter(|| Bytes::copy_from_slice(black_box(&body)))
    });
    group.bench_function("filter_some", |b| {
        b.iter(|| {
            chain
                .filter_list(black_box(&body), &some)
                .into_bytes(body.clone())
        })
    });
    group.bench_function("filter_none", |b| {
        b.iter(|| {
            chain
                .filter_list(black_box(&body), &none)
                .into_bytes(body.clone())
        })
    });
    group.finish();
}

fn bench_watch(c: &mut Criterion) {
    let set = FilterSet::new(&FilterConfig::default());
    let slices = chain(
        &set,
        "kube-proxy",
        "discovery.k8s.io",
        "endpointslices",
        Verb::Watch,
    );
    let lines = slice_events();
    let some = ctx(4, 100);
    let mut group = c.benchmark_group("endpointslice_watch");
    group.throughput(Throughput::Bytes(total(&lines)));
    group.bench_function("copy", |b| b.iter(|| copy_lines(black_box(&lines))));
    group.bench_function("filter", |b| {
        b.iter(|| filter_lines(&slices, black_box(&lines), &some))
    });
    group.finish();

    let pods = chain(&set, "kubelet", "", "pods", Verb::Watch);
    let lines = pod_events();
    let node = FilterContext::new("v1.32-control-plane");
    let mut group = c.benchmark_group("pod_watch");
    group.throughput(Throughput::Bytes(total(&lines)));
    group.bench_function("copy", |b| b.iter(|| copy_lines(black_box(&lines))));
    group.bench_function("filter", |b| {
        b.iter(|| filter_lines(&pods, black_box(&lines), &node))
    });
    group.finish();
}

fn bench_for_request(c: &mut Criterion) {
    let set = FilterSet::new(&FilterConfig::default());
    let mut group = c.benchmark_group("for_request");
    group.bench_function("none_applies", |b| {
        b.iter(|| set.for_parts(black_box("kubelet"), "", "v1", "nodes", "", Verb::Get))
    });
    group.bench_function("chain", |b| {
        b.iter(|| {
            set.for_parts(
                black_box("kube-proxy"),
                "discovery.k8s.io",
                "v1",
                "endpointslices",
                "",
                Verb::Watch,
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench_list, bench_watch, bench_for_request);
criterion_main!(benches);
