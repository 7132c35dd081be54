//! What the edge cache's writer spends on finding a relisted 1 MB pod list's items, against
//! storing them: kubelet's pod LIST of the `proxy` bench (128 real-shape pods, ~1 MB), read by
//! serde (`List::parse`, every item read as JSON) and located (`LocatedList::parse`, items found
//! by their braces; the store reads whole only those it does not hold byte for byte), and
//! `Store::replace_scope` of that list into a sled cache that holds it already (a relist of an
//! unchanged scope: each item looked up and compared). Run: `cargo bench -p outpost-benches
//! --bench list_items`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use outpost_benches::{NODE, PodTemplates, SledCache, node_scope};
use outpost_cache::Store;
use outpost_core::wire::{List, LocatedList};
use serde_json::{Value, json};

const PODS: usize = 128;

/// The list as kube-apiserver writes it (items without kind), and its items as the cache stores
/// them (with kind).
fn pod_list() -> (Vec<u8>, Vec<Vec<u8>>) {
    let templates = PodTemplates::default();
    let pods: Vec<Value> = (0..PODS)
        .map(|i| {
            let mut pod = templates.pod(NODE, i);
            pod["metadata"]["resourceVersion"] = json!(format!("{}", 100 + i));
            pod["metadata"]["uid"] = json!(format!("uid-{i}"));
            pod
        })
        .collect();
    let body = json!({"kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "500"}, "items": pods});
    let stored = pods
        .iter()
        .map(|pod| {
            let mut typed = json!({"kind": "Pod", "apiVersion": "v1"});
            typed
                .as_object_mut()
                .unwrap()
                .extend(pod.as_object().unwrap().clone());
            serde_json::to_vec(&typed).unwrap()
        })
        .collect();
    (serde_json::to_vec(&body).unwrap(), stored)
}

fn list_items(c: &mut Criterion) {
    let (body, stored) = pod_list();
    let mut group = c.benchmark_group("list_items");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("read_by_serde", |b| {
        b.iter(|| List::parse(black_box(&body)).unwrap().items().len())
    });
    group.bench_function("located", |b| {
        b.iter(|| LocatedList::parse(black_box(&body)).unwrap().items.len())
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = SledCache::open(dir.path());
    let items: Vec<&[u8]> = stored.iter().map(Vec::as_slice).collect();
    let scope = node_scope();
    cache.store.replace_scope(&scope, "500", &items).unwrap();
    group.bench_function("replace_scope_unchanged", |b| {
        b.iter(|| {
            cache
                .store
                .replace_scope(&scope, "500", black_box(&items))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, list_items);
criterion_main!(benches);
