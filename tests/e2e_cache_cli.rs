//! `outpost cache ls|get|verify|export` from the binary, against a real sled cache written through
//! the `outpost-cache` API: the numbers and bytes it prints are the cache's, corruption is found
//! and reported with exit 1, a cache held by a running hub and a missing cache are one clear line.

use std::path::Path;
use std::process::{Command, Output};

use outpost_cache::{EventType, Gvr, Scope, SledOptions, SledStore, Store};
use outpost_core::selector::{FieldSelector, LabelSelector};
use serde_json::Value;

const NODE: &str = "edge-1";

fn outpost(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outpost"))
        .arg("cache")
        .args(args)
        .arg(format!("--disk-cache-path={}", cache.display()))
        .env_remove("RUST_LOG")
        .output()
        .expect("outpost runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}\nstdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    let err = stderr(out);
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{what}: {err}"
    );
}

/// Exit `code` with exactly one `outpost: error:` line on stderr that mentions `expected`.
fn assert_error(out: &Output, code: i32, expected: &str) {
    assert_exit(out, code, expected);
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("outpost: error: "), "{err}");
    assert!(err.contains(expected), "expected {expected:?} in {err}");
}

fn pods() -> Gvr {
    Gvr::new("", "v1", "pods")
}

fn pod(name: &str, rv: u64, phase: &str) -> Vec<u8> {
    format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"default","uid":"0b6f3c2e-{rv:04}-4c1d-9a7e-5f2d1c3b4a59","resourceVersion":"{rv}","creationTimestamp":"2025-01-01T00:00:00Z","labels":{{"app":"web"}}}},"spec":{{"nodeName":"{NODE}","containers":[{{"name":"web","image":"nginx:1.27","ports":[{{"containerPort":80,"protocol":"TCP"}}]}}]}},"status":{{"phase":"{phase}","podIP":"10.244.1.{rv}"}}}}"#
    ).into_bytes()
}

fn node() -> Vec<u8> {
    format!(
        r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"{NODE}","uid":"6a1e0c8d-2f4b-4e3a-8c7d-1b2a3c4d5e6f","resourceVersion":"120","labels":{{"kubernetes.io/hostname":"{NODE}"}}}},"spec":{{"podCIDR":"10.244.1.0/24"}},"status":{{"conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
    ).into_bytes()
}

fn lease() -> Vec<u8> {
    format!(
        r#"{{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{{"name":"{NODE}","namespace":"kube-node-lease","uid":"9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a","resourceVersion":"125"}},"spec":{{"holderIdentity":"{NODE}","leaseDurationSeconds":40}}}}"#
    ).into_bytes()
}

fn kubelet_pods_scope() -> Scope {
    Scope::new(
        "kubelet",
        &pods(),
        None,
        LabelSelector::default(),
        FieldSelector::parse(&format!("spec.nodeName={NODE}")).expect("selector"),
    )
}

/// What kubelet caches on an edge node: its pods (a LIST, then one MODIFIED event), its Node
/// (a GET) and its Lease. Returns the sled directory; the store is closed (lock released).
struct Cached {
    db_dir: std::path::PathBuf,
    /// The current bytes of web-0, web-1, web-2.
    pods: Vec<Vec<u8>>,
}

fn populate(dir: &Path) -> Cached {
    let store = SledStore::open(dir, SledOptions::default()).expect("open");
    let items = [
        pod("web-0", 101, "Pending"),
        pod("web-1", 102, "Running"),
        pod("web-2", 103, "Running"),
    ];
    let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
    store
        .replace_scope(&kubelet_pods_scope(), "110", &refs)
        .expect("replace");
    let web0 = pod("web-0", 130, "Running");
    store
        .apply_event(&kubelet_pods_scope(), EventType::Modified, &web0)
        .expect("event");
    store
        .put_object("kubelet", &Gvr::new("", "v1", "nodes"), &node())
        .expect("node");
    store
        .put_object(
            "kubelet",
            &Gvr::new("coordination.k8s.io", "v1", "leases"),
            &lease(),
        )
        .expect("lease");
    let db_dir = store.active_db_dir();
    drop(store);
    Cached {
        db_dir,
        pods: vec![web0, items[1].clone(), items[2].clone()],
    }
}

/// Flips one byte in the middle of every value whose key contains `needle`, via raw sled (as
/// `crates/cache/tests/sled_disk.rs` does). Waits for the last handle's lock like `SledStore`.
fn corrupt_raw(db_dir: &Path, needle: &[u8]) -> usize {
    let mut db = sled::open(db_dir);
    for _ in 0..40 {
        if db.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        db = sled::open(db_dir);
    }
    let db = db.expect("raw open");
    let tree = db.open_tree("cache").expect("tree");
    let mut flipped = 0;
    for entry in tree.iter() {
        let (k, v) = entry.expect("entry");
        if v.is_empty() || !k.windows(needle.len()).any(|w| w == needle) {
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
fn ls_shows_counts_as_a_table_and_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    populate(dir.path());

    let out = outpost(&["ls"], dir.path());
    assert_exit(&out, 0, "ls");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "COMPONENT",
            "RESOURCE",
            "OBJECTS",
            "EVENTS",
            "SCOPES",
            "BYTES",
            "LAST-RV",
            "AGE"
        ],
        "{text}"
    );
    let row = |resource: &str| -> Vec<&str> {
        lines
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.get(1) == Some(&resource))
            .unwrap_or_else(|| panic!("no {resource} row in\n{text}"))
    };
    let p = row("pods.v1.core");
    assert_eq!(
        (p[0], p[2], p[3], p[4], p[6]),
        ("kubelet", "3", "1", "1", "130"),
        "{text}"
    );
    assert!(p[7].ends_with('s'), "age in seconds: {text}");
    let n = row("nodes.v1.core");
    assert_eq!((n[2], n[3], n[4], n[6]), ("1", "0", "0", "120"), "{text}");
    let l = row("leases.v1.coordination.k8s.io");
    assert_eq!((l[2], l[6]), ("1", "125"), "{text}");
    // Columns are aligned: every row's RESOURCE column starts where the header's does.
    let col = lines[0].find("RESOURCE").expect("header");
    for line in &lines[1..4] {
        assert_eq!(&line[col - 3..col], "   ", "{text}");
        assert_ne!(line.as_bytes()[col], b' ', "{text}");
    }
    let summary = lines.last().expect("summary");
    assert!(
        summary.contains("1 component(s), 3 resource(s), 5 object(s)")
            && summary.contains("on disk")
            && summary.contains("not degraded")
            && summary.contains("0 entries quarantined"),
        "{text}"
    );

    let out = outpost(&["ls", "--output", "json"], dir.path());
    assert_exit(&out, 0, "ls json");
    let v: Value = serde_json::from_slice(&out.stdout).expect("ls json parses");
    assert!(v["sizeOnDisk"].as_u64().expect("size") > 0, "{v}");
    assert_eq!(
        (&v["degraded"], &v["quarantined"]),
        (&Value::Bool(false), &Value::from(0))
    );
    let rows = v["resources"].as_array().expect("resources");
    assert_eq!(rows.len(), 3, "{v}");
    let pods = rows
        .iter()
        .find(|r| r["resource"] == "pods.v1.core")
        .expect("pods row");
    assert_eq!(pods["component"], "kubelet");
    assert_eq!(
        (&pods["objects"], &pods["events"], &pods["scopes"]),
        (&Value::from(3), &Value::from(1), &Value::from(1))
    );
    assert_eq!(pods["lastResourceVersion"], "130");
    assert!(pods["bytes"].as_u64().expect("bytes") > 3 * 300, "{pods}");
    assert!(pods["ageSeconds"].as_u64().expect("age") < 600);
}

#[test]
fn get_prints_the_stored_bytes_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cached = populate(dir.path());

    for resource in ["pods.v1.core", "pods"] {
        let out = outpost(&["get", "kubelet", resource, "default/web-0"], dir.path());
        assert_exit(&out, 0, resource);
        assert_eq!(
            out.stdout, cached.pods[0],
            "{resource}: the MODIFIED version"
        );
    }
    let out = outpost(&["get", "kubelet", "nodes", NODE], dir.path());
    assert_exit(&out, 0, "node");
    assert_eq!(out.stdout, node());
    let lease_path = format!("kube-node-lease/{NODE}");
    let out = outpost(
        &[
            "get",
            "kubelet",
            "leases.v1.coordination.k8s.io",
            &lease_path,
        ],
        dir.path(),
    );
    assert_exit(&out, 0, "lease");
    assert_eq!(out.stdout, lease());

    let out = outpost(&["get", "kubelet", "pods", "default/web-9"], dir.path());
    assert_error(&out, 1, "kubelet/pods.v1.core/default/web-9 is not cached");
    assert!(out.stdout.is_empty());
    let out = outpost(&["get", "kube-proxy", "pods", "default/web-0"], dir.path());
    assert_error(&out, 1, "nothing of pods.v1.core is cached for kube-proxy");
    let out = outpost(&["get", "kubelet", "pods.v1", "default/web-0"], dir.path());
    assert_error(&out, 2, "expected <resource>.<version>.<group>");
    let out = outpost(&["get", "kubelet", "pods", "a/b/c"], dir.path());
    assert_error(&out, 2, "expected <namespace>/<name>");
}

#[test]
fn verify_finds_corruption_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cached = populate(dir.path());

    let out = outpost(&["verify"], dir.path());
    assert_exit(&out, 0, "clean verify");
    assert!(stdout(&out).contains("no corruption"), "{}", stdout(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));

    assert_eq!(corrupt_raw(&cached.db_dir, b"web-1"), 1);
    let out = outpost(&["verify"], dir.path());
    assert_error(&out, 1, "1 corrupt cache entry found");
    let text = stdout(&out);
    assert!(text.contains("1 corrupt (now quarantined)"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("object kubelet/pods.v1.core/default/web-1")
                && l.contains("checksum")),
        "{text}"
    );

    // Quarantined by verify: the next run is clean, and ls and get say what happened.
    let out = outpost(&["verify"], dir.path());
    assert_exit(&out, 0, "verify after quarantine");
    let out = outpost(&["ls"], dir.path());
    assert_exit(&out, 0, "ls");
    assert!(
        stdout(&out).contains("1 entry quarantined"),
        "{}",
        stdout(&out)
    );
    let out = outpost(&["ls", "-o", "json"], dir.path());
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["quarantined"], 1);
    let out = outpost(&["get", "kubelet", "pods", "default/web-1"], dir.path());
    assert_error(&out, 1, "is not cached");

    // A corrupt entry met by `get` first is reported as quarantined.
    assert_eq!(corrupt_raw(&cached.db_dir, b"web-2"), 1);
    let out = outpost(&["get", "kubelet", "pods", "default/web-2"], dir.path());
    assert_error(&out, 1, "is corrupt and has been quarantined");
}

#[test]
fn export_writes_every_object_grouped_by_component_and_resource() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cached = populate(dir.path());
    let out_dir = tempfile::tempdir().expect("tempdir");
    let file = out_dir.path().join("cache.json");

    let out = outpost(&["export", file.to_str().expect("utf-8")], dir.path());
    assert_exit(&out, 0, "export");
    assert!(
        stdout(&out).contains("exported 5 object(s)"),
        "{}",
        stdout(&out)
    );
    let entries: Vec<_> = std::fs::read_dir(out_dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(entries, ["cache.json"], "no temp file left behind");

    let doc: Value = serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    assert_eq!(doc["objects"], 5);
    let kubelet = doc["components"]["kubelet"].as_object().expect("kubelet");
    let mut resources: Vec<&str> = kubelet.keys().map(String::as_str).collect();
    resources.sort();
    assert_eq!(
        resources,
        [
            "leases.v1.coordination.k8s.io",
            "nodes.v1.core",
            "pods.v1.core"
        ]
    );
    let expected_pods: Vec<Value> = cached
        .pods
        .iter()
        .map(|p| serde_json::from_slice(p).expect("pod"))
        .collect();
    assert_eq!(kubelet["pods.v1.core"], Value::Array(expected_pods));
    let expected_node: Value = serde_json::from_slice(&node()).expect("node");
    assert_eq!(kubelet["nodes.v1.core"], Value::Array(vec![expected_node]));

    let out = outpost(&["export", "-"], dir.path());
    assert_exit(&out, 0, "export to stdout");
    let piped: Value = serde_json::from_slice(&out.stdout).expect("stdout is the document");
    assert_eq!(piped["components"], doc["components"]);
}

#[test]
fn a_cache_held_by_a_running_hub_is_named_as_such() {
    let dir = tempfile::tempdir().expect("tempdir");
    populate(dir.path());
    let held = SledStore::open(dir.path(), SledOptions::default()).expect("open");
    for command in [
        &["ls"][..],
        &["verify"],
        &["get", "kubelet", "pods", "default/web-0"],
    ] {
        let out = outpost(command, dir.path());
        assert_error(
            &out,
            2,
            &format!(
                "the cache at {} is in use by a running outpost (sled holds its lock); stop the \
                 daemon or use its admin endpoints",
                dir.path().display()
            ),
        );
    }
    // Still whole for its holder.
    assert_eq!(held.stats().expect("stats").len(), 3);
}

#[test]
fn a_missing_cache_is_reported_and_never_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope");
    for command in [&["ls"][..], &["verify"], &["export", "-"]] {
        let out = outpost(command, &missing);
        assert_error(&out, 1, &format!("no cache at {}", missing.display()));
        assert!(!missing.exists(), "{command:?} created the cache directory");
    }
    // An existing directory without a cache is not turned into one either.
    let out = outpost(&["ls"], dir.path());
    assert_error(&out, 1, "no cache at");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "still empty"
    );
}
