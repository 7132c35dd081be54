//! Crash safety: `cache-writer` writes continuously (relists, watch events, compactions) and is
//! SIGKILLed at random moments, alternately with per-write and background flushing; after each
//! kill the store must reopen with every entry intact, every relist whole, the event log in
//! step with the objects, and nothing acknowledged as durable lost. Bounded: 10 rounds, 120 s.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use common::{field, pods, scope};
use outpost_cache::{EventType, ReplayError, SledOptions, SledStore, Store};

const ROUNDS: usize = 10;
const BUDGET: Duration = Duration::from_secs(120);

/// What the writer reported before it died.
#[derive(Debug, Default)]
struct Acked {
    last_relist: u64,
    /// Last durable watch event (only reported in `sync` mode).
    last_event: u64,
    compactions: usize,
}

/// Runs the writer until it has acknowledged a relist, then waits `delay` and SIGKILLs it.
fn run_and_kill(dir: &std::path::Path, compact_every: u32, mode: &str, delay: Duration) -> Acked {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cache-writer"))
        .arg(dir)
        .arg(compact_every.to_string())
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn cache-writer");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    assert!(first.is_ok(), "writer acknowledged nothing in 30 s");
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert_eq!(
        status.signal(),
        Some(9),
        "the writer died on its own: {status}"
    );
    reader.join().expect("reader thread");
    let mut acked = Acked::default();
    for line in first.into_iter().chain(rx.try_iter()) {
        match line.split_once(' ') {
            Some(("replaced", rv)) => acked.last_relist = rv.parse().expect("rv"),
            Some(("applied", rv)) => acked.last_event = rv.parse().expect("rv"),
            _ if line == "compacted" => acked.compactions += 1,
            _ => panic!("unexpected writer output {line:?}"),
        }
    }
    acked
}

/// Scope A is only ever relisted: all of one relist, and nothing else, must be there.
fn check_relisted_scope(store: &SledStore, acked: &Acked) -> (u64, usize) {
    let a = scope("kubelet", &pods(), Some("a"), "", "");
    let list = store.list(&a).expect("list").expect("scope a survives");
    assert!(list.missing.is_empty(), "missing {:?}", list.missing);
    let rv: u64 = list.resource_version.as_str().parse().expect("numeric rv");
    assert!(
        rv >= acked.last_relist,
        "acknowledged relist {} lost (store has {rv})",
        acked.last_relist
    );
    let names: Vec<String> = list
        .items
        .iter()
        .map(|o| field(&o.bytes, "/metadata/name"))
        .collect();
    let mut expected: Vec<String> = (0..names.len()).map(|i| format!("a-{i}")).collect();
    expected.sort();
    assert_eq!(names, expected, "members of one relist, no leftovers");
    for item in &list.items {
        let marker = field(&item.bytes, "/metadata/annotations/outpost.test~1list-rv");
        assert_eq!(marker, rv.to_string(), "item from another relist");
    }
    // The list RV is the relist's first item RV plus the item count.
    let first_rv = list
        .items
        .iter()
        .filter_map(|o| o.resource_version.number())
        .min()
        .expect("items");
    assert_eq!(first_rv + names.len() as u64, rv, "relist incomplete");
    (rv, names.len())
}

/// Scope B only gets watch events: its log, its RV and its objects must agree.
fn check_watched_scope(store: &SledStore) -> (u64, usize) {
    let b = scope("kubelet", &pods(), Some("b"), "app=b", "");
    let floor = match store.events_since(&b, "0") {
        Err(ReplayError::TooOld(t)) => t.oldest_available.expect("scope b exists"),
        other => panic!("rv 0 predates the log: {other:?}"),
    };
    let log = store
        .events_since(&b, floor.as_str())
        .expect("whole log replays");
    let scope_rv = store
        .scope_resource_version(&b)
        .expect("rv")
        .expect("scope b exists");
    if let Some(last) = log.last() {
        assert_eq!(
            last.resource_version, scope_rv,
            "scope RV and log written together"
        );
    }
    let list = store.list(&b).expect("list").expect("scope b survives");
    assert!(list.missing.is_empty());
    let mut last_event = BTreeMap::new();
    for event in &log {
        last_event.insert(field(&event.object, "/metadata/name"), event);
    }
    let listed: BTreeMap<String, &[u8]> = list
        .items
        .iter()
        .map(|o| (field(&o.bytes, "/metadata/name"), &o.bytes[..]))
        .collect();
    for (name, event) in &last_event {
        match event.event_type {
            EventType::Deleted => assert!(!listed.contains_key(name), "{name} deleted but listed"),
            _ => assert_eq!(
                listed.get(name),
                Some(&&event.object[..]),
                "{name} differs from its last event"
            ),
        }
    }
    (scope_rv.number().expect("numeric rv"), log.len())
}

#[test]
fn sigkill_at_random_moments_never_leaves_a_torn_or_inconsistent_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let mut rng = seed | 1;
    eprintln!("kill9 seed {seed}");
    let (mut compactions, mut interrupted) = (0, 0);
    for round in 0..ROUNDS {
        if started.elapsed() > BUDGET {
            eprintln!("time budget spent after {round} rounds");
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = Duration::from_millis(rng % 1500);
        // Odd rounds use background flushes; rounds 2-3, 6-7 compact after every relist, so
        // some kills land inside a compaction.
        let mode = if round % 2 == 0 { "sync" } else { "batched" };
        let compact_every = if round % 4 >= 2 { 1 } else { 5 };
        let acked = run_and_kill(dir.path(), compact_every, mode, delay);
        compactions += acked.compactions;
        // Two databases on disk = the kill interrupted a compaction.
        let dbs = std::fs::read_dir(dir.path()).expect("ls").flatten();
        let mid_compaction = dbs
            .filter(|e| e.file_name().to_string_lossy().starts_with("db-"))
            .count()
            > 1;
        interrupted += usize::from(mid_compaction);
        let store =
            SledStore::open(dir.path(), SledOptions::default()).expect("reopen after SIGKILL");
        let report = store.verify().expect("verify");
        assert!(
            report.corrupt.is_empty(),
            "round {round}: {:?}",
            report.corrupt
        );
        let (rv, items) = check_relisted_scope(&store, &acked);
        let (watch_rv, events) = check_watched_scope(&store);
        assert!(
            watch_rv >= acked.last_event,
            "durable event {} lost",
            acked.last_event
        );
        eprintln!(
            "round {round} ({mode}): killed after {delay:?}; acked relist {}, recovered {rv} ({items} items), \
             acked event {}, watch RV {watch_rv} ({events} logged events), {} entries verified, {} compactions, mid-compaction: {mid_compaction}",
            acked.last_relist, acked.last_event, report.checked, acked.compactions
        );
    }
    eprintln!("{compactions} compactions completed, {interrupted} kills landed mid-compaction");
}
