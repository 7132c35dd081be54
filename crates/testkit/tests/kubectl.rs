//! Fidelity with the real `kubectl` on PATH (a dispatcher that asks `/version` first, then runs
//! the bundled kubectl matching the server). Set `OUTPOST_SKIP_KUBECTL=1` where kubectl is not
//! installed; otherwise a missing kubectl fails these tests.

mod common;

use std::path::Path;
use std::process::Output;

use outpost_testkit::FakeApiServer;
use serde_json::Value;

fn kubectl_available() -> bool {
    if std::env::var_os("OUTPOST_SKIP_KUBECTL").is_some() {
        return false;
    }
    let found = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok();
    assert!(
        found,
        "kubectl is not on PATH (set OUTPOST_SKIP_KUBECTL=1 to skip)"
    );
    true
}

async fn kubectl(fake: &FakeApiServer, dir: &Path, args: &[&str]) -> Output {
    let kubeconfig = fake.kubeconfig_for(dir, common::ADMIN, common::MASTERS);
    let cache = dir.join("cache");
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(&cache)
        .args(["--request-timeout", "10s"])
        .args(args)
        .kill_on_drop(true);
    let out = cmd.output().await.expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn get_pods_across_namespaces_and_as_json() {
    if !kubectl_available() {
        return;
    }
    let fake = common::fake().await;
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout(&kubectl(&fake, dir.path(), &["get", "pods", "-A"]).await);
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "server-side Table columns"
    );
    for pod in common::fixture_pods()["items"].as_array().unwrap() {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let row = listed
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} missing: {listed}"));
        assert!(
            row.starts_with("kube-system") && row.contains("Running"),
            "{row}"
        );
    }
    let name = "coredns-668d6bf9bc-898sq";
    let json = stdout(
        &kubectl(
            &fake,
            dir.path(),
            &["get", "pod", "-n", "kube-system", name, "-o", "json"],
        )
        .await,
    );
    let pod: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(
        pod["metadata"]["uid"],
        "c8e5477d-8b8a-41de-99f6-93245d16161f"
    );
    let paths: Vec<String> = fake.requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        paths.contains(&"/version".to_owned()),
        "the dispatcher asked /version: {paths:?}"
    );
    assert!(paths.contains(&"/api/v1/pods".to_owned()));
    assert!(fake.requests().iter().all(|r| r.user == common::ADMIN));
    fake.shutdown().await;
}

#[tokio::test]
async fn create_apply_and_delete() {
    if !kubectl_available() {
        return;
    }
    let fake = common::fake().await;
    let dir = tempfile::tempdir().unwrap();
    kubectl(
        &fake,
        dir.path(),
        &["create", "configmap", "kc", "--from-literal=a=b"],
    )
    .await;
    let cm = fake.get("v1/configmaps", Some("default"), "kc").unwrap();
    assert_eq!(cm["data"]["a"], "b");
    kubectl(&fake, dir.path(), &["delete", "configmap", "kc"]).await;
    assert!(fake.get("v1/configmaps", Some("default"), "kc").is_none());

    let manifest = dir.path().join("cm.yaml");
    let write = |value: &str| {
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: default\ndata:\n  k: {value}\n"
        );
        std::fs::write(&manifest, yaml).unwrap();
    };
    write("one");
    let file = manifest.to_str().unwrap();
    kubectl(
        &fake,
        dir.path(),
        &["apply", "--validate=false", "-f", file],
    )
    .await;
    let first = fake
        .get("v1/configmaps", Some("default"), "applied")
        .unwrap();
    assert_eq!(first["data"]["k"], "one");
    assert!(
        first["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    write("two");
    kubectl(
        &fake,
        dir.path(),
        &["apply", "--validate=false", "-f", file],
    )
    .await;
    assert_eq!(
        fake.get("v1/configmaps", Some("default"), "applied")
            .unwrap()["data"]["k"],
        "two"
    );
    let patched = fake
        .requests()
        .iter()
        .any(|r| r.method == "PATCH" && r.name == "applied" && r.status == 200);
    assert!(patched, "the second apply is a strategic merge patch");
    fake.shutdown().await;
}
