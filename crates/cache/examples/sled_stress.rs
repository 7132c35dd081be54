//! Writes watch events to a `SledStore` as fast as possible, with a relist of 110 pods every 200
//! events, and reports a stall: the regression harness for sled 0.34's I/O-pool deadlock (see
//! "A known sled 0.34 deadlock" in `sled_store`).
//! Run: `cargo run --release -p outpost-cache --example sled_stress -- <seconds> [sync|batched]`
//! (`sync`, the default, flushes every write; `batched` leaves it to sled's background flusher).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outpost_cache::{EventType, Gvr, Scope, SledOptions, SledStore, Store};
use serde_json::{Value, json};

const POD_LIST: &str = include_str!("../../testkit/fixtures/kube-system-pods.json");
const STALL: Duration = Duration::from_secs(5);

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
    let sync_every_write = args.next().as_deref() != Some("batched");
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
    let mut rv = 10u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        rv += 1;
        let mut pod = template.clone();
        pod["metadata"]["name"] = json!(format!("pod-{}", rv % 110));
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let bytes = serde_json::to_vec(&pod).expect("serializes");
        store
            .apply_event(&scope, EventType::Modified, &bytes)
            .expect("apply");
        progress.fetch_add(1, Ordering::Relaxed);
    }
    println!(
        "ok: {} writes in {seconds} s",
        progress.load(Ordering::Relaxed)
    );
}
