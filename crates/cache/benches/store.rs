//! Edge-cache storage costs on a full node: 110 real-shape pods (the kind PodList fixture's pods,
//! cloned with new names and uids) cached by kubelet under `spec.nodeName=edge-1`.
//! Run: `cargo bench -p outpost-cache --bench store`.
//!
//! - `apply_event`: one watch MODIFIED (object, membership, log entry, scope RV in one batch),
//!   flushed (the default), left to sled's background flusher (`sled_batched`), and in memory;
//! - `apply_events`: 32 MODIFIED in one call, flushed once (the cache writer's group commit),
//!   with the default event log and with none (`sled_no_log`);
//! - `list`: the offline LIST kubelet sends, served from its exact scope, and the same query
//!   answered from an unfiltered scope (selectors evaluated on every stored JSON);
//! - `get`: one pod;
//! - `replace_scope`: a relist of the 110 pods (flushed, as by default);
//! - `flush`: making one event durable, i.e. what flushing every event would cost.
//!
//! Figures and their history: `BENCHMARKS.md` and `docs/benchmarks-journal.md`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use outpost_cache::{EventType, Gvr, MemStore, ObjectKey, Scope, SledOptions, SledStore, Store};
use outpost_core::selector::{FieldSelector, LabelSelector};
use serde_json::{Value, json};

const POD_LIST: &str = include_str!("../../testkit/fixtures/kube-system-pods.json");
const NODE: &str = "edge-1";
const PODS_PER_NODE: usize = 110;

fn gvr() -> Gvr {
    Gvr::new("", "v1", "pods")
}

fn by_node() -> Scope {
    let fields = FieldSelector::parse(&format!("spec.nodeName={NODE}")).expect("selector");
    Scope::new("kubelet", &gvr(), None, LabelSelector::default(), fields)
}

/// Pod `i` at version `rv`, cloned from the fixture's pods in turn.
fn pod(templates: &[Value], i: usize, rv: u64) -> Vec<u8> {
    let mut p = templates[i % templates.len()].clone();
    p["metadata"]["name"] = json!(format!("pod-{i:03}"));
    p["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{i:012}"));
    p["metadata"]["resourceVersion"] = json!(rv.to_string());
    p["spec"]["nodeName"] = json!(NODE);
    serde_json::to_vec(&p).expect("serializes")
}

fn node_pods(templates: &[Value]) -> Vec<Vec<u8>> {
    (0..PODS_PER_NODE)
        .map(|i| pod(templates, i, 1000 + i as u64))
        .collect()
}

fn templates() -> Vec<Value> {
    let list: Value = serde_json::from_str(POD_LIST).expect("fixture");
    list["items"].as_array().expect("items").clone()
}

fn filled(store: &dyn Store, scope: &Scope, pods: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = pods.iter().map(Vec::as_slice).collect();
    store.replace_scope(scope, "2000", &refs).expect("replace");
}

fn sled(dir: &tempfile::TempDir) -> SledStore {
    SledStore::open(dir.path(), SledOptions::default()).expect("open")
}

/// Durable by sled's background flusher instead of on every call.
fn sled_batched(dir: &tempfile::TempDir) -> SledStore {
    let options = SledOptions {
        sync_every_write: false,
        ..SledOptions::default()
    };
    SledStore::open(dir.path(), options).expect("open")
}

fn apply_event(c: &mut Criterion) {
    let templates = templates();
    let pods = node_pods(&templates);
    let (dir, batched_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let stores: [(&str, Box<dyn Store>); 3] = [
        ("sled", Box::new(sled(&dir))),
        ("sled_batched", Box::new(sled_batched(&batched_dir))),
        ("mem", Box::new(MemStore::new())),
    ];
    let scope = by_node();
    for (name, store) in stores {
        filled(store.as_ref(), &scope, &pods);
        let mut rv = 3000;
        let mut next_pod = || {
            rv += 1;
            pod(&templates, (rv % PODS_PER_NODE as u64) as usize, rv)
        };
        c.bench_function(&format!("apply_event/modified_pod/{name}"), |b| {
            b.iter_batched(
                &mut next_pod,
                |p| {
                    black_box(
                        store
                            .apply_event(&scope, EventType::Modified, &p)
                            .expect("apply"),
                    )
                },
                BatchSize::SmallInput,
            )
        });
    }
}

/// A group commit: `GROUP` MODIFIED events in one `apply_events` call, flushed once, as the
/// proxy's cache writer applies a burst. Criterion reports it per event. `no_log` is the same
/// store keeping no event log (`max_events_per_scope: 0`): what the log's copy of each object
/// costs, measured in the same run.
fn apply_events(c: &mut Criterion) {
    const GROUP: usize = 32;
    let templates = templates();
    let pods = node_pods(&templates);
    let scope = by_node();
    let mut group = c.benchmark_group("apply_events");
    group.throughput(criterion::Throughput::Elements(GROUP as u64));
    for (name, max_events_per_scope) in [
        ("sled", SledOptions::default().max_events_per_scope),
        ("sled_no_log", 0),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let options = SledOptions {
            max_events_per_scope,
            ..SledOptions::default()
        };
        let store = SledStore::open(dir.path(), options).expect("open");
        filled(&store, &scope, &pods);
        let mut rv = 3000;
        let mut next_group = || {
            (0..GROUP)
                .map(|_| {
                    rv += 1;
                    pod(&templates, (rv % PODS_PER_NODE as u64) as usize, rv)
                })
                .collect::<Vec<_>>()
        };
        group.bench_function(format!("{GROUP}_modified_pods/{name}"), |b| {
            b.iter_batched(
                &mut next_group,
                |pods| {
                    let events: Vec<_> = pods
                        .iter()
                        .map(|p| (EventType::Modified, p.as_slice()))
                        .collect();
                    black_box(store.apply_events(&scope, &events).expect("apply"))
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn list_and_get(c: &mut Criterion) {
    let templates = templates();
    let pods = node_pods(&templates);
    let (exact_dir, broad_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let exact = sled(&exact_dir);
    filled(&exact, &by_node(), &pods);
    let broad = sled(&broad_dir);
    filled(&broad, &Scope::unfiltered("kubelet", &gvr(), None), &pods);
    for (name, store) in [
        ("exact_scope", &exact),
        ("filtered_from_unfiltered_scope", &broad),
    ] {
        let n = store
            .list(&by_node())
            .expect("list")
            .expect("cached")
            .items
            .len();
        assert_eq!(n, PODS_PER_NODE);
        c.bench_function(&format!("list/110_pods_by_node/{name}"), |b| {
            b.iter(|| black_box(store.list(&by_node()).expect("list")))
        });
    }
    let ns = templates[7]["metadata"]["namespace"]
        .as_str()
        .expect("namespace");
    let key = ObjectKey::new("kubelet", &gvr(), ns, "pod-007");
    c.bench_function("get/one_pod", |b| {
        b.iter(|| black_box(exact.get(&key).expect("get")))
    });
}

fn replace_scope_and_flush(c: &mut Criterion) {
    let templates = templates();
    let pods = node_pods(&templates);
    let refs: Vec<&[u8]> = pods.iter().map(Vec::as_slice).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sled(&dir);
    let mut rv = 5000u64;
    c.bench_function("replace_scope/110_pods_flushed", |b| {
        b.iter(|| {
            rv += 1;
            black_box(
                store
                    .replace_scope(&by_node(), &rv.to_string(), &refs)
                    .expect("replace"),
            )
        })
    });
    // What a flush per event costs on its own: one event's writes made durable.
    let batched_dir = tempfile::tempdir().expect("tempdir");
    let batched = sled_batched(&batched_dir);
    filled(&batched, &by_node(), &pods);
    let scope = by_node();
    c.bench_function("flush/after_one_event", |b| {
        b.iter_batched(
            || {
                rv += 1;
                let p = pod(&templates, (rv % PODS_PER_NODE as u64) as usize, rv);
                batched
                    .apply_event(&scope, EventType::Modified, &p)
                    .expect("apply");
            },
            |()| batched.flush().expect("flush"),
            BatchSize::PerIteration,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(4));
    targets = apply_event, apply_events, list_and_get, replace_scope_and_flush
}
criterion_main!(benches);
