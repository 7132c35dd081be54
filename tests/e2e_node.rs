//! `outpost node convert` / `revert` from the binary, against a running hub: convert waits for
//! the real hub's readyz, the kubelet kubeconfig it writes works through the hub with kubectl, and
//! revert leaves the node tree byte-for-byte as it was.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{Cluster, NODE, assert_ok, kubectl, outpost_bin};

const KUBEADM_FLAGS: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n";

/// A kubeadm node's files, as far as convert reads or writes them.
fn kubeadm_tree(root: &Path, ca_pem: &str) {
    let files = [
        ("var/lib/kubelet/kubeadm-flags.env", KUBEADM_FLAGS),
        ("etc/kubernetes/pki/ca.crt", ca_pem),
        (
            "etc/kubernetes/kubelet.conf",
            "apiVersion: v1\nkind: Config\n",
        ),
        (
            "etc/kubernetes/manifests/kube-proxy-placeholder.yaml",
            "# not a real manifest\n",
        ),
        (
            "var/lib/kubelet/pki/kubelet-client-current.pem",
            "placeholder\n",
        ),
    ];
    for (rel, content) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
}

/// Every file under `root` with its bytes (directories by name only).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if path.is_dir() {
                out.insert(rel, None);
                stack.push(path);
            } else {
                out.insert(rel, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

/// `dir` and every path under it, with its permission bits.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        out.push((path, mode));
    }
    assert!(out.len() > 2, "{out:?}");
    out
}

fn node_cmd(args: &[String]) -> std::process::Output {
    Command::new(outpost_bin())
        .arg("node")
        .args(args)
        .output()
        .expect("outpost node runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn convert_uses_the_hub_then_revert_restores_every_byte() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let root = cluster.dir.path().join("node-root");
    kubeadm_tree(&root, &cluster.fake.pki().ca_pem);
    let before = snapshot(&root);

    let convert_args = vec![
        "convert".to_owned(),
        format!("--root={}", root.display()),
        format!("--server-addr={}", cluster.fake.url()),
        format!("--node-name={NODE}"),
        "--nodepool-name=pool-a".to_owned(),
        format!("--readyz-url=http://{}/v1/readyz", hub.admin),
        "--wait-ready-timeout=10s".to_owned(),
    ];
    let mut dry = convert_args.clone();
    dry.push("--dry-run".into());
    let out = node_cmd(&dry);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("+++"),
        "dry-run prints a diff"
    );
    assert_eq!(snapshot(&root), before, "dry-run changed the tree");

    let out = node_cmd(&convert_args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flags = std::fs::read_to_string(root.join("var/lib/kubelet/kubeadm-flags.env")).unwrap();
    assert!(flags.contains("--kubeconfig=/var/lib/openyurt/kubelet.conf --bootstrap-kubeconfig="));
    let manifest =
        std::fs::read_to_string(root.join("etc/kubernetes/manifests/outpost.yaml")).unwrap();
    assert!(manifest.contains(&format!("--node-name={NODE}")));
    // The originals may hold kubelet's credentials: only root reads the backups.
    let backup = root.join("var/lib/outpost/backup");
    for (path, mode) in modes(&backup) {
        let private = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, private, "{}", path.display());
    }
    let after_convert = snapshot(&root);
    let again = node_cmd(&convert_args);
    assert!(again.status.success());
    assert_eq!(
        snapshot(&root),
        after_convert,
        "a second convert changed something"
    );

    // The kubeconfig written for kubelet has no credentials; through the hub it still works,
    // because the hub presents the node's certificate upstream.
    let kubelet_conf = root.join("var/lib/openyurt/kubelet.conf");
    let hub_server = format!("--server={}", hub.proxy_url());
    let name = assert_ok(
        &kubectl(
            &kubelet_conf,
            &[
                &hub_server,
                "get",
                "node",
                NODE,
                "-o",
                "jsonpath={.metadata.name}",
            ],
        ),
        "kubectl with kubelet.conf through the hub",
    );
    assert_eq!(name, NODE);

    let out = node_cmd(&["revert".into(), format!("--root={}", root.display())]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !kubelet_conf.exists(),
        "revert must remove the kubelet.conf it wrote"
    );
    // kubectl's --cache-dir lives beside the kubeconfig; it is the test's, not convert's.
    let mut after = snapshot(&root);
    after.retain(|p, _| !p.starts_with("var/lib/openyurt"));
    assert_eq!(
        after, before,
        "revert did not restore the tree byte for byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn convert_leaves_kubelet_alone_when_the_hub_never_gets_ready() {
    let cluster = Cluster::start().await;
    let root = cluster.dir.path().join("node-root");
    kubeadm_tree(&root, &cluster.fake.pki().ca_pem);
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = unused.local_addr().unwrap().port();
    drop(unused);
    let out = node_cmd(&[
        "convert".into(),
        format!("--root={}", root.display()),
        format!("--server-addr={}", cluster.fake.url()),
        format!("--node-name={NODE}"),
        "--nodepool-name=pool-a".into(),
        format!("--readyz-url=http://127.0.0.1:{port}/v1/readyz"),
        "--wait-ready-timeout=1s".into(),
    ]);
    assert!(!out.status.success());
    let flags = std::fs::read_to_string(root.join("var/lib/kubelet/kubeadm-flags.env")).unwrap();
    assert_eq!(flags, KUBEADM_FLAGS, "kubelet must stay untouched");
    assert!(!root.join("var/lib/openyurt/kubelet.conf").exists());
}
