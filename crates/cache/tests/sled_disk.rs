//! What only the on-disk store has: persistence across reopen, corruption of raw sled values,
//! unusable directories, and bounded size through compaction.

mod common;

use std::path::Path;

use common::{field, pod, pods, refs, scope};
use outpost_cache::{CacheError, EventType, Lookup, ObjectKey, SledOptions, SledStore, Store};

fn open(dir: &Path) -> SledStore {
    SledStore::open(dir, SledOptions::default()).expect("open")
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new("kubelet", &pods(), ns, name)
}

/// A node's worth of pods in one scope plus a few logged events.
fn populate(store: &SledStore) {
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let items: Vec<Vec<u8>> = (0..20)
        .map(|i| pod("a", &format!("p{i:02}"), &i.to_string(), "n1", &[]))
        .collect();
    store
        .replace_scope(&s, "19", &refs(&items))
        .expect("replace");
    // Three objects, so a replay from 19 sends all three entries (it sends an object once).
    for (i, rv) in (20..23).enumerate() {
        store
            .apply_event(
                &s,
                EventType::Modified,
                &pod("a", &format!("p{i:02}"), &rv.to_string(), "n1", &[]),
            )
            .expect("event");
    }
}

/// Raw sled, waiting (like `SledStore::open`) for a just-dropped handle to release its lock.
fn raw_open(db_dir: &Path) -> sled::Db {
    for _ in 0..40 {
        if let Ok(db) = sled::open(db_dir) {
            return db;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    sled::open(db_dir).expect("raw open")
}

/// Flips one byte in the middle of every value whose key contains `needle`, via raw sled.
fn corrupt_raw(db_dir: &Path, needle: &[&[u8]]) -> usize {
    let db = raw_open(db_dir);
    let tree = db.open_tree("cache").expect("tree");
    let mut flipped = 0;
    for entry in tree.iter() {
        let (k, v) = entry.expect("entry");
        if v.is_empty() || !needle.iter().any(|n| k.windows(n.len()).any(|w| w == *n)) {
            continue;
        }
        let mut bad = v.to_vec();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x01;
        tree.insert(k, bad).expect("insert");
        flipped += 1;
    }
    db.flush().expect("flush");
    flipped
}

#[test]
fn everything_survives_a_clean_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    populate(&open(dir.path()));
    let store = open(dir.path());
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(
        (list.items.len(), list.resource_version.as_str()),
        (20, "22")
    );
    assert_eq!(store.events_since(&s, "19").expect("replay").len(), 3);
}

#[test]
fn corrupt_raw_values_are_found_by_verify_quarantined_and_never_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_dir = {
        let store = open(dir.path());
        populate(&store);
        store.active_db_dir()
    };
    // Objects p03 and p07, and the second logged event (key ends in sequence number 1).
    assert_eq!(corrupt_raw(&db_dir, &[b"p03", b"p07"]), 2);
    assert_eq!(corrupt_raw(&db_dir, &[&1u64.to_be_bytes()]), 1);

    let store = open(dir.path());
    let report = store.verify().expect("verify");
    let mut bad: Vec<&str> = report.corrupt.iter().map(|c| c.key.as_str()).collect();
    bad.sort();
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(
        bad[0].starts_with("event #1 of kubelet/pods.v1.core/*"),
        "{bad:?}"
    );
    assert!(
        bad[1].ends_with("a/p03") && bad[2].ends_with("a/p07"),
        "{bad:?}"
    );
    assert!(report.corrupt.iter().all(|c| c.reason.contains("checksum")));
    assert_eq!(store.health().quarantined, 3);
    assert_eq!(store.get(&key("a", "p03")).expect("get"), Lookup::NotCached);
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(
        list.missing,
        [key("a", "p03"), key("a", "p07")],
        "the list says it is incomplete"
    );
    assert!(
        store.events_since(&s, "19").is_err(),
        "a hole in the log refuses replay"
    );
    drop(store);

    let store = open(dir.path());
    assert!(store.verify().expect("verify").corrupt.is_empty());
    assert_eq!(store.health().quarantined, 3, "quarantine persists");
}

#[test]
fn a_corrupt_value_is_caught_by_a_plain_get() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_dir = {
        let store = open(dir.path());
        populate(&store);
        store.active_db_dir()
    };
    assert_eq!(corrupt_raw(&db_dir, &[b"p05"]), 1);
    let store = open(dir.path());
    assert_eq!(
        store.get(&key("a", "p05")).expect("get"),
        Lookup::Quarantined
    );
    assert_eq!(store.get(&key("a", "p05")).expect("get"), Lookup::NotCached);
    assert!(matches!(store.get(&key("a", "p06")), Ok(Lookup::Found(_))));
}

const POD_KIND: &[u8] = br#"{"kind":"Pod","listKind":"PodList"}"#;
const API: &[u8] = br#"{"kind":"APIVersions","versions":["v1"]}"#;

fn put_documents(store: &SledStore) {
    store
        .put_document("kinds/pods.v1.core", POD_KIND)
        .expect("put");
    store.put_document("/api", API).expect("put");
}

#[test]
fn documents_survive_reopen_and_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = open(dir.path());
        populate(&store);
        put_documents(&store);
    }
    let store = open(dir.path());
    let doc = |name| store.get_document(name).expect("get");
    assert_eq!(doc("kinds/pods.v1.core").as_deref(), Some(POD_KIND));
    assert_eq!(doc("/api").as_deref(), Some(API));
    let report = store.compact().expect("compact");
    assert_eq!(
        report.entries,
        20 + 20 + 1 + 3 + 2,
        "populate() plus two documents"
    );
    assert_eq!(doc("/api").as_deref(), Some(API));
    let live = store.active_db_dir();
    drop(store);

    let store = open(dir.path());
    assert_eq!(store.active_db_dir(), live);
    let got = store.get_document("kinds/pods.v1.core").expect("get");
    assert_eq!(
        got.as_deref(),
        Some(POD_KIND),
        "the compacted copy is durable"
    );
}

#[test]
fn corrupt_documents_on_disk_are_quarantined_by_get_and_verify_and_never_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_dir = {
        let store = open(dir.path());
        put_documents(&store);
        store.active_db_dir()
    };
    assert_eq!(corrupt_raw(&db_dir, &[b"kinds/pods"]), 1);
    let store = open(dir.path());
    assert_eq!(store.get_document("kinds/pods.v1.core").expect("get"), None);
    assert_eq!(store.health().quarantined, 1);
    assert_eq!(store.get_document("kinds/pods.v1.core").expect("get"), None);
    assert_eq!(
        store.get_document("/api").expect("get").as_deref(),
        Some(API)
    );
    let db_dir = store.active_db_dir();
    drop(store);

    assert_eq!(corrupt_raw(&db_dir, &[b"/api"]), 1);
    let store = open(dir.path());
    let report = store.verify().expect("verify");
    let bad: Vec<&str> = report.corrupt.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(bad, ["document /api"]);
    assert!(report.corrupt[0].reason.contains("checksum"), "{report:?}");
    assert_eq!(store.get_document("/api").expect("get"), None);
    assert_eq!(store.health().quarantined, 2);
    assert!(
        !store.health().degraded,
        "corruption is not a storage failure"
    );
    drop(store);

    let store = open(dir.path());
    assert!(store.verify().expect("verify").corrupt.is_empty());
    assert_eq!(store.health().quarantined, 2, "quarantine persists");
    store.put_document("/api", API).expect("refetched");
    assert_eq!(
        store.get_document("/api").expect("get").as_deref(),
        Some(API)
    );
}

#[test]
fn reopening_waits_for_the_previous_handle_but_a_live_one_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..20 {
        let store = SledStore::open(dir.path(), SledOptions::default())
            .unwrap_or_else(|e| panic!("reopen {round}: {e}"));
        populate(&store);
    }
    let live = open(dir.path());
    let err = SledStore::open(dir.path(), SledOptions::default()).expect_err("locked");
    assert!(matches!(err, CacheError::Sled { op: "open", .. }), "{err}");
    drop(live);
}

#[test]
fn an_unusable_directory_is_a_typed_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    // Running as root, permissions do not stop writes; a path below a regular file does.
    let err = SledStore::open(file.join("cache"), SledOptions::default()).expect_err("fails");
    assert!(matches!(err, CacheError::Io { op: "create", .. }), "{err}");
    assert!(err.is_storage());
    // /proc is read-only even for root.
    assert!(SledStore::open("/proc/outpost-cache", SledOptions::default()).is_err());

    std::fs::write(dir.path().join("CURRENT"), b"../../etc\n").expect("write");
    let err = SledStore::open(dir.path(), SledOptions::default()).expect_err("bad CURRENT");
    assert!(matches!(err, CacheError::Io { op: "read", .. }), "{err}");
}

#[test]
fn a_full_disk_fails_writes_with_a_typed_error_and_marks_the_store_degraded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_dir = dir.path().join("db-0");
    std::fs::create_dir_all(&db_dir).expect("mkdir");
    // sled's log file on /dev/full: opens fine, every write fails with ENOSPC.
    std::os::unix::fs::symlink("/dev/full", db_dir.join("db")).expect("symlink");
    let opened = SledStore::open(
        dir.path(),
        SledOptions {
            flush_every_ms: None,
            ..SledOptions::default()
        },
    );
    let store = match opened {
        Err(e) => {
            assert!(e.is_storage(), "{e}");
            return;
        }
        Ok(store) => store,
    };
    let err = store
        .put_document("/api", b"{}")
        .expect_err("a full disk cannot persist a document");
    assert!(err.is_storage(), "{err}");
    assert!(
        store.health().degraded,
        "documents share the health tracking"
    );
    let s = scope("kubelet", &pods(), None, "", "");
    let result = store.replace_scope(&s, "1", &refs(&[pod("a", "p", "1", "n1", &[])]));
    let err = result.expect_err("a full disk cannot persist a relist");
    assert!(err.is_storage(), "{err}");
    let health = store.health();
    assert!(health.degraded);
    assert!(health.last_error.is_some());
}

/// 100 pods of ~8 KiB, each overwritten `rounds` times through watch events.
fn overwrite_workload(store: &SledStore, rounds: u64) -> u64 {
    let s = scope("kubelet", &pods(), None, "", "");
    let padding = "x".repeat(8 << 10);
    let padded = |i: u64, rv: u64| {
        let mut p: serde_json::Value =
            serde_json::from_slice(&pod("a", &format!("p{i}"), &rv.to_string(), "n1", &[]))
                .expect("json");
        p["spec"]["padding"] = padding.clone().into();
        serde_json::to_vec(&p).expect("json")
    };
    let items: Vec<Vec<u8>> = (0..100).map(|i| padded(i, i)).collect();
    store
        .replace_scope(&s, "99", &refs(&items))
        .expect("replace");
    let mut peak = 0;
    for round in 1..=rounds {
        for i in 0..100 {
            let p = padded(i, round * 100 + i);
            store
                .apply_event(&s, EventType::Modified, &p)
                .expect("event");
        }
        peak = peak.max(store.size_on_disk().expect("size"));
    }
    store.flush().expect("flush");
    peak
}

#[test]
fn compaction_keeps_repeated_overwrites_under_the_bound() {
    const ROUNDS: u64 = 15;
    let options = SledOptions {
        max_events_per_scope: 100,
        ..SledOptions::default()
    };
    // Control run without a bound: how big sled grows, and how small a fresh copy is.
    let control_dir = tempfile::tempdir().expect("tempdir");
    let control = SledStore::open(control_dir.path(), options.clone()).expect("open");
    overwrite_workload(&control, ROUNDS);
    let grown = control.size_on_disk().expect("size");
    let fresh = control.compact().expect("compact").after_bytes;
    assert!(
        grown > fresh + fresh / 4,
        "overwrites must leave garbage: grown {grown}, fresh {fresh}"
    );

    let bound = (grown + fresh) / 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let bounded = SledOptions {
        compact_above_bytes: Some(bound),
        ..options
    };
    let store = SledStore::open(dir.path(), bounded).expect("open");
    let peak = overwrite_workload(&store, ROUNDS);
    let size = store.size_on_disk().expect("size");
    eprintln!(
        "fresh copy {fresh} B, grown {grown} B, bound {bound} B: final {size} B, peak {peak} B"
    );
    // Size is checked after every 256 KiB written (objects count twice: object and log entry),
    // and sled amplifies writes up to ~4x, so that much overshoot is expected.
    let overshoot = ((256 << 10) + 2 * (9 << 10)) * 4;
    assert!(
        grown > bound + overshoot,
        "the control run must break the bound"
    );
    assert!(
        peak <= bound + overshoot,
        "peak {peak} > {bound} + {overshoot}"
    );
    assert!(
        size <= bound + overshoot,
        "final {size} > {bound} + {overshoot}"
    );
    assert!(
        !dir.path().join("db-0").exists(),
        "auto-compaction replaced the first db"
    );
    let s = scope("kubelet", &pods(), None, "", "");
    let list = store.list(&s).expect("list").expect("cached");
    let expected_rv = (ROUNDS * 100 + 99).to_string();
    assert_eq!(
        (list.items.len(), list.resource_version.as_str()),
        (100, expected_rv.as_str())
    );
    assert!(
        list.items
            .iter()
            .all(|o| field(&o.bytes, "/metadata/namespace") == "a")
    );
}

#[test]
fn compaction_preserves_every_entry_and_cleans_interrupted_attempts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    populate(&store);
    let s = scope("kubelet", &pods(), None, "", "spec.nodeName=n1");
    let before = store.list(&s).expect("list");
    let report = store.compact().expect("compact");
    assert_eq!(
        report.entries,
        20 + 20 + 1 + 3,
        "objects, members, scope, events"
    );
    assert_eq!(store.list(&s).expect("list"), before);
    assert_eq!(store.events_since(&s, "19").expect("replay").len(), 3);
    let live = store.active_db_dir();
    drop(store);

    let stale = dir.path().join("db-7");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("db"), b"half a copy").expect("write");
    let store = open(dir.path());
    assert_eq!(store.active_db_dir(), live);
    assert!(
        !stale.exists(),
        "leftover of an interrupted compaction removed"
    );
    assert_eq!(store.list(&s).expect("list"), before);
}
