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
    let inspect = SledOptions {
        repair_damaged: false,
        ..SledOptions::default()
    };
    let err = SledStore::open(dir.path(), inspect).expect_err("bad CURRENT");
    assert!(matches!(err, CacheError::Io { op: "read", .. }), "{err}");
    // The daemon's setting: a CURRENT that names no database is damage, moved aside.
    let store = SledStore::open(dir.path(), SledOptions::default()).expect("repaired");
    let aside = store.moved_aside().expect("moved aside").to_owned();
    assert_eq!(
        std::fs::read(aside.join("CURRENT")).expect("kept"),
        b"../../etc\n"
    );
}

#[test]
fn a_write_that_meets_a_full_disk_goes_to_a_fresh_database() {
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
    // sled fails the write (ENOSPC) and would refuse every later one, even once space is back:
    // the store moves the entries to a fresh database (here on a real disk) and writes there.
    let failed_db = store.active_db_dir();
    store
        .put_document("/api", b"{}")
        .expect("written to a fresh database");
    assert_ne!(store.active_db_dir(), failed_db);
    let health = store.health();
    assert!(!health.degraded);
    let why = health.last_error.expect("the failure is remembered");
    assert!(why.contains("No space left"), "{why}");
    let s = scope("kubelet", &pods(), None, "", "");
    store
        .replace_scope(&s, "1", &refs(&[pod("a", "p", "1", "n1", &[])]))
        .expect("later writes go there too");
    assert_eq!(
        store.list(&s).expect("list").expect("cached").items.len(),
        1
    );
    assert_eq!(
        store.get_document("/api").expect("get").as_deref(),
        Some(&b"{}"[..])
    );
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

/// The database directories under a cache root (`db-<n>`; compaction moves to the next).
fn databases(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .expect("read root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("db-"))
        .collect();
    names.sort();
    names
}

/// A relist that repeats what the store holds writes almost nothing: it must not count towards
/// the next size check (a check walks the directory, and over the bound compacts). Over a 1-byte
/// bound every check compacts, so the database directory tells how many checks ran.
#[test]
fn an_unchanged_relist_does_not_bring_the_next_size_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SledOptions {
        compact_above_bytes: Some(1),
        ..SledOptions::default()
    };
    let store = SledStore::open(dir.path(), options).expect("open");
    let s = scope("kubelet", &pods(), None, "", "");
    // 40 pods of ~8 KiB: more than one size check's worth.
    let padding = "x".repeat(8 << 10);
    let items: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            let mut p: serde_json::Value =
                serde_json::from_slice(&pod("a", &format!("p{i}"), "7", "n1", &[])).expect("json");
            p["spec"]["padding"] = padding.clone().into();
            serde_json::to_vec(&p).expect("json")
        })
        .collect();
    store
        .replace_scope(&s, "99", &refs(&items))
        .expect("replace");
    let checked = databases(dir.path());
    assert_ne!(
        checked,
        ["db-0"],
        "the first list was checked and compacted"
    );
    for rv in ["100", "101", "102"] {
        store.replace_scope(&s, rv, &refs(&items)).expect("relist");
    }
    assert_eq!(
        databases(dir.path()),
        checked,
        "no check after unchanged relists"
    );
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(
        (list.items.len(), list.resource_version.as_str()),
        (40, "102")
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

/// A cache shaped like a node's after a while: a relist of 300 pods, then 2,000 flushed watch
/// events, so sled's file holds many segments.
fn busy_cache(root: &Path) {
    let store = open(root);
    let s = scope("kubelet", &pods(), None, "", "");
    let padded = |name: String, rv: u64| {
        let mut p: serde_json::Value =
            serde_json::from_slice(&pod("a", &name, &rv.to_string(), "n1", &[])).expect("json");
        p["spec"]["padding"] = "x".repeat(1500).into();
        serde_json::to_vec(&p).expect("json")
    };
    let items: Vec<Vec<u8>> = (0..300).map(|i| padded(format!("p{i}"), i)).collect();
    store.replace_scope(&s, "300", &refs(&items)).expect("list");
    for i in 0..2000u64 {
        let event = padded(format!("p{}", i % 300), 301 + i);
        store
            .apply_event(&s, EventType::Modified, &event)
            .expect("event");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// Ways a power cut or a dying SD card leaves sled's files. Returns what was done.
fn damage(db_dir: &Path, variant: usize) -> &'static str {
    let blob = db_dir.join("db");
    let len = std::fs::metadata(&blob).map_or(0, |m| m.len());
    let truncate = |to: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&blob)
            .expect("open")
            .set_len(to)
            .expect("truncate")
    };
    let rewrite = |at: usize, n: usize, f: &dyn Fn(u8) -> u8| {
        let mut bytes = std::fs::read(&blob).expect("read");
        for b in &mut bytes[at..at + n] {
            *b = f(*b);
        }
        std::fs::write(&blob, bytes).expect("write");
    };
    let snapshot = || {
        std::fs::read_dir(db_dir)
            .expect("read dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
            })
    };
    let len_us = len as usize;
    match variant {
        0 => truncate(len / 2),
        1 => truncate(len / 3),
        2 => truncate(len * 2 / 3),
        3 => truncate(len / 2 + 1000),
        4 => rewrite(len_us / 2, 4096, &|b| b ^ 0xff),
        5 => rewrite(0, 64, &|_| 0),
        6 => rewrite(len_us / 2, 64, &|_| 0),
        7 => rewrite(len_us * 3 / 4, 512, &|_| 0x5a),
        8 => std::fs::remove_file(&blob).expect("rm"),
        9 => truncate(0),
        10 => {
            if let Some(snap) = snapshot() {
                std::fs::remove_file(snap).expect("rm");
            }
            truncate(len / 2);
        }
        _ => {
            if let Some(snap) = snapshot() {
                let mut bytes = std::fs::read(&snap).expect("read");
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0xff;
                std::fs::write(&snap, bytes).expect("write");
            }
            rewrite(len_us / 4, 8192, &|b| b.wrapping_add(1));
        }
    }
    [
        "truncated to 1/2",
        "truncated to 1/3",
        "truncated to 2/3",
        "truncated past 1/2",
        "4 KiB flipped in the middle",
        "header zeroed",
        "64 bytes zeroed in the middle",
        "512 bytes overwritten at 3/4",
        "log file deleted",
        "log file emptied",
        "snapshot deleted and log halved",
        "snapshot and log bytes changed",
    ][variant.min(11)]
}

/// Real damage, as sled's files are left by a power cut: the store always opens (sled's panics
/// and corruption errors are damage; the database is moved aside and a fresh one started), a
/// full read never takes the process down, and the store takes writes afterwards.
/// Each way of [`damage`] applied to a fresh copy of `template`, handed to `visit` (what was
/// done, and the cache's root) until `visit` returns `true`; whether one did.
fn each_damaged_copy(template: &Path, mut visit: impl FnMut(&'static str, &Path) -> bool) -> bool {
    (0..12).any(|variant| {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(template, dir.path());
        let what = damage(&dir.path().join("db-0"), variant);
        visit(what, dir.path())
    })
}

#[test]
fn a_damaged_database_never_stops_the_store() {
    let s = scope("kubelet", &pods(), None, "", "");
    let mut detected = Vec::new();
    // Which damage sled notices varies with where its segments fell: up to three caches.
    for _ in 0..3 {
        let template = tempfile::tempdir().expect("tempdir");
        busy_cache(template.path());
        each_damaged_copy(template.path(), |what, dir| {
            let store = SledStore::open(dir, SledOptions::default())
                .unwrap_or_else(|e| panic!("{what}: the store must open: {e}"));
            if let Some(aside) = store.moved_aside() {
                assert!(aside.join("db-0").is_dir(), "{what}: kept for inspection");
            }
            // A full read: damage it meets is an error, never a panic, and the store says so.
            let read = store.verify().map(drop).and(store.list(&s).map(drop));
            if let Err(e) = read {
                assert!(e.is_damage(), "{what}: {e}");
                let health = store.health();
                assert!(health.degraded, "{what}: damage found by a read degrades");
                assert!(health.last_error.is_some_and(|why| why.contains("damaged")));
            }
            store
                .put_document("after", b"{}")
                .unwrap_or_else(|e| panic!("{what}: the store must take writes: {e}"));
            store
                .replace_scope(&s, "5000", &refs(&[pod("a", "p", "5000", "n1", &[])]))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let list = store.list(&s).expect("list").expect("cached");
            assert_eq!(list.resource_version.as_str(), "5000", "{what}");
            assert!(!store.health().degraded, "{what}: healthy again");
            if store.active_db_dir() != dir.join("db-0") {
                detected.push(what);
            }
            false
        });
        if !detected.is_empty() {
            eprintln!("damage detected and repaired for: {detected:?}");
            return;
        }
    }
    panic!("sled reports or panics on none of these");
}

#[test]
fn damage_is_an_error_without_repair_and_moved_aside_with_it() {
    let inspect = SledOptions {
        repair_damaged: false,
        ..SledOptions::default()
    };
    // Which damage sled notices at open varies with where its segments fell: try until one.
    for _ in 0..3 {
        let template = tempfile::tempdir().expect("tempdir");
        busy_cache(template.path());
        let seen = each_damaged_copy(template.path(), |what, dir| {
            let Err(err) = SledStore::open(dir, inspect.clone()) else {
                return false;
            };
            assert!(err.is_damage(), "{what}: {err}");
            assert!(dir.join("db-0").is_dir(), "left alone without repair");
            let store = SledStore::open(dir, SledOptions::default()).expect("repaired");
            let aside = store.moved_aside().expect("moved aside");
            assert!(
                aside.join("db-0").join("conf").exists(),
                "{what}: kept whole"
            );
            assert_eq!(
                std::fs::read_to_string(dir.join("CURRENT")).expect("CURRENT"),
                "db-1\n"
            );
            true
        });
        if seen {
            return;
        }
    }
    panic!("sled opened every damaged copy without an error or a panic");
}

/// At most `DAMAGED_KEPT` damaged copies stay, and they never count towards the cache's size.
#[test]
fn damaged_copies_are_bounded_and_not_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..4 {
        std::fs::create_dir_all(dir.path().join(format!("db-{round}"))).expect("mkdir");
        std::fs::write(dir.path().join("CURRENT"), format!("bad {round}\n")).expect("write");
        let store = SledStore::open(dir.path(), SledOptions::default()).expect("open");
        let size = store.size_on_disk().expect("size");
        std::fs::write(
            store.moved_aside().expect("aside").join("ballast"),
            vec![0; 1 << 20],
        )
        .expect("ballast");
        assert!(store.size_on_disk().expect("size") < size + (1 << 20));
        drop(store);
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let damaged = std::fs::read_dir(dir.path())
        .expect("read dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .count();
    assert_eq!(damaged, outpost_cache::sled_store::DAMAGED_KEPT);
}

/// With the free-space floor above what the file system has, every write is refused with a
/// typed error and nothing is written, except deletions (an upstream 404 must still make a
/// stale object go) and the marks of scopes that missed events.
#[test]
fn under_the_free_space_floor_writes_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("kubelet", &pods(), None, "", "");
    {
        let store = open(dir.path());
        store
            .replace_scope(&s, "10", &refs(&[pod("a", "p1", "9", "n1", &[])]))
            .expect("list");
        store
            .put_object("kubelet", &pods(), &pod("a", "p2", "11", "n1", &[]))
            .expect("get");
    }
    let floored = SledOptions {
        min_free_bytes: Some(u64::MAX),
        ..SledOptions::default()
    };
    let store = SledStore::open(dir.path(), floored).expect("open");
    let err = store
        .apply_event(&s, EventType::Added, &pod("a", "p3", "12", "n1", &[]))
        .expect_err("refused");
    assert!(matches!(err, CacheError::LowSpace { .. }), "{err}");
    assert!(err.to_string().contains("floor"), "{err}");
    let health = store.health();
    assert!(health.degraded);
    assert!(health.last_error.expect("why").contains("floor"));
    for refused in [
        store
            .replace_scope(&s, "13", &refs(&[]))
            .map(|_| ())
            .expect_err("list"),
        store.put_document("x", b"{}").expect_err("document"),
        store
            .put_object("kubelet", &pods(), &pod("a", "p4", "14", "n1", &[]))
            .map(|_| ())
            .expect_err("object"),
    ] {
        assert!(matches!(refused, CacheError::LowSpace { .. }), "{refused}");
    }
    assert!(store.delete_object(&key("a", "p2")).expect("deletion"));
    assert!(store.mark_missed(&s.id(), "no space").expect("mark"));
    drop(store);
    let store = open(dir.path());
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(list.resource_version.as_str(), "10", "nothing else written");
    assert_eq!(
        list.missed.as_deref(),
        Some("no space"),
        "the mark survived"
    );
    assert_eq!(store.get(&key("a", "p2")).expect("get"), Lookup::NotCached);
}

/// A scope is never renewed across a switch to another database: a fresh one after a failed
/// write holds only what could be copied, so what the list left may be gone.
#[test]
fn no_scope_is_renewed_across_a_switch_of_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let s = scope("kubelet", &pods(), None, "", "");
    let items = [pod("a", "p1", "7", "n1", &[])];
    store.replace_scope(&s, "10", &refs(&items)).expect("list");
    let seq = store.write_seq();
    assert!(store.renew_scope(&s, "11", seq).expect("renew").is_some());
    store.compact().expect("compact");
    assert_eq!(store.renew_scope(&s, "12", seq).expect("renew"), None);
    let list = store.list(&s).expect("list").expect("cached");
    assert_eq!(list.resource_version.as_str(), "11");
}
