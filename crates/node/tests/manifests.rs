//! The committed manifests under `manifests/`: the node ones are exactly what convert writes, and
//! every one passes kubectl's client-side dry run and a typed round trip.
//!
//! When the rendering changes on purpose (or the version, which is the image tag), regenerate with
//! `OUTPOST_BLESS=1 cargo test -p outpost-node --test manifests`.

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::*;

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests")
}

/// Asserts the committed file equals `expected`, or rewrites it under OUTPOST_BLESS=1.
fn assert_committed(relative: &str, expected: &str) {
    let path = manifests_dir().join(relative);
    if std::env::var_os("OUTPOST_BLESS").is_some() {
        fs::write(&path, expected).unwrap();
    }
    let committed = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == expected,
        "manifests/{relative} differs from what convert writes; run \
         `OUTPOST_BLESS=1 cargo test -p outpost-node --test manifests` and review the diff"
    );
}

#[test]
fn the_node_manifests_are_what_convert_writes() {
    let pod = outpost_node::static_pod(&example_convert_args()).unwrap();
    assert_committed("node/outpost.yaml", &pod);
    assert_committed("node/kubelet.conf", outpost_node::hub_kubeconfig());
}

#[test]
fn every_manifest_passes_kubectl_dry_run_and_a_typed_round_trip() {
    let mut kinds = BTreeSet::new();
    for dir in ["cluster", "node"] {
        for entry in fs::read_dir(manifests_dir().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let objects =
                validate_manifest(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for o in objects {
                kinds.insert(format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                ));
            }
        }
    }
    let expected = [
        "ClusterRole/outpost",
        "ClusterRole/outpost-pool-election",
        "ClusterRoleBinding/outpost",
        "ClusterRoleBinding/outpost-pool-election",
        "ConfigMap/yurt-hub-cfg",
        "Pod/outpost",
        "Role/outpost-leader-hub",
        "RoleBinding/outpost-leader-hub",
    ];
    assert_eq!(kinds, expected.iter().map(|s| s.to_string()).collect());
}

#[test]
fn the_validation_rejects_misspelled_fields_and_wrong_types() {
    let dir = tempfile::tempdir().unwrap();
    let good = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: kube-system\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
    let cases = [
        (
            "typo.yaml",
            good.replace("    image:", "    imagee:"),
            "lost or changed",
        ),
        (
            "type.yaml",
            good.replace("  - name: c\n    image: busybox\n", "    name: c\n"),
            "does not decode",
        ),
        ("yaml.yaml", format!("{good}  hostNetwork: [\n"), "kubectl"),
    ];
    let path = dir.path().join("good.yaml");
    fs::write(&path, good).unwrap();
    assert!(validate_manifest(&path).is_ok());
    for (name, text, expected) in cases {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        let err = validate_manifest(&path).expect_err(name);
        assert!(err.contains(expected), "{name}: {err}");
    }
}

/// The reviewable summary of the role; `tests/e2e_rbac.rs` proves it against the calls the hub
/// really makes (each allowed, each grant needed).
#[test]
fn the_hub_role_grants_exactly_the_listed_calls() {
    let objects = validate_manifest(&manifests_dir().join("cluster/rbac.yaml")).unwrap();
    let role = objects.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    let mut grants = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let mut names: Vec<String> = strings(&rule["resourceNames"])
            .into_iter()
            .map(|n| format!("[{n}]"))
            .collect();
        if names.is_empty() {
            names.push(String::new());
        }
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for name in &names {
                    for verb in strings(&rule["verbs"]) {
                        grants.insert(format!("{group}/{resource}{name}:{verb}"));
                    }
                }
            }
        }
    }
    let expected = [
        "/configmaps[yurt-hub-cfg]:get",
        "/configmaps[yurt-hub-cfg]:watch",
        "apps.openyurt.io/nodebuckets:list",
        "apps.openyurt.io/nodebuckets:watch",
        "apps.openyurt.io/nodepools:list",
        "apps.openyurt.io/nodepools:watch",
        "discovery.k8s.io/endpointslices:list",
        "discovery.k8s.io/endpointslices:watch",
    ];
    assert_eq!(grants, expected.iter().map(|s| s.to_string()).collect());

    let binding = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "outpost"})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}])
    );
}

#[test]
fn the_hub_config_map_is_found_by_its_label() {
    let objects = validate_manifest(&manifests_dir().join("cluster/yurt-hub-cfg.yaml")).unwrap();
    let cm: &Value = &objects[0];
    assert_eq!(cm["metadata"]["namespace"], "kube-system");
    assert_eq!(
        cm["metadata"]["labels"]["openyurt.io/configmap-name"],
        "yurt-hub-cfg"
    );
    let keys: BTreeSet<&str> = cm["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert!(
        keys.contains("cache_agents") && keys.contains("servicetopology"),
        "{keys:?}"
    );
}
