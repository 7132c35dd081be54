//! Writes watch events to a `SledStore` as fast as possible, with a relist of 110 pods every 200
//! events, and reports a stall: the regression harness for sled 0.34's I/O-pool deadlock (see
//! "A known sled 0.34 deadlock" in `sled_store`).
//! Run: `cargo run --release -p outpost-cache --example sled_stress -- <seconds> [sync|batched|grouped]`
//! (`sync`, the default, flushes every write; `batched` leaves it to sled's background flusher;
//! `grouped` flushes every write but writes the events in groups of 32, ~250 KB, as the proxy's
//! cache writer does under a burst).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outpost_cache::{EventType, Gvr, Scope, SledOptions, SledStore, Store};
use serde_json::{Value, json};

const POD_LIST: &str = include_str!("../../testkit/fixtures/kube-system-pods.json");
const STALL: Duration = Duration::from_secs(5);
const PODS: u64 = 110;
const RELIST_EVERY: u64 = 200;
/// Events per store call in `grouped` mode.
const GROUP: usize = 32;

/// Exits with status 2 if no write completes for `STALL` (with `SLED_STRESS_HOLD` set it stays
/// alive instead, for a debugger).
fn watchdog(progress: Arc<AtomicU64>, started: Instant) {
    std::thread::spawn(move || {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(STALL);
            let now = progress.load(Ordering::Relaxed);
            if now == last {
                println!("STALLED after {now} writes, {:?}", started.elapsed());
                if std::env::var_os("SLED_STRESS_HOLD").is_some() {
                    std::thread::sleep(Duration::from_secs(3600));
                }
                std::process::exit(2);
            }
            last = now;
        }
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let mode = args.next().unwrap_or_else(|| "sync".into());
    let (sync_every_write, group) = match mode.as_str() {
        "sync" => (true, 1),
        "batched" => (false, 1),
        "grouped" => (true, GROUP),
        other => panic!("unknown mode {other}: sync, batched or grouped"),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SledOptions {
        sync_every_write,
        ..SledOptions::default()
    };
    let store = SledStore::open(dir.path(), options).expect("open");
    let list: Value = serde_json::from_str(POD_LIST).expect("fixture");
    let template = list["items"][6].clone();
    let scope = Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None);
    store.replace_scope(&scope, "1", &[]).expect("replace");
    let progress = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    watchdog(progress.clone(), started);
    let mut latest: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut pending: Vec<Vec<u8>> = Vec::with_capacity(group);
    let mut rv = 10u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        rv += 1;
        let mut pod = template.clone();
        let name = format!("pod-{}", rv % PODS);
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let bytes = serde_json::to_vec(&pod).expect("serializes");
        latest.insert(name, bytes.clone());
        pending.push(bytes);
        if pending.len() == group {
            let events: Vec<_> = pending
                .iter()
                .map(|b| (EventType::Modified, b.as_slice()))
                .collect();
            store.apply_events(&scope, &events).expect("apply");
            progress.fetch_add(pending.len() as u64, Ordering::Relaxed);
            pending.clear();
        }
        if rv.is_multiple_of(RELIST_EVERY) {
            let items: Vec<&[u8]> = latest.values().map(Vec::as_slice).collect();
            store
                .replace_scope(&scope, &rv.to_string(), &items)
                .expect("relist");
        }
    }
    println!(
        "ok: {} writes in {seconds} s ({mode})",
        progress.load(Ordering::Relaxed)
    );
}
