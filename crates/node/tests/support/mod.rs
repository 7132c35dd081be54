//! Test support: a kubeadm worker node's files in a temp dir, a tiny HTTP server (the hub's readyz,
//! or a discovery-only apiserver for kubectl), and kubectl-based manifest validation.

#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use clap::Parser;
use outpost_node::{ConvertArgs, NodeError, Outcome, RevertArgs};
use serde_json::Value;

pub const FLAGS_ENV: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n";
pub const REDIRECTED_FLAGS_ENV: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10 --kubeconfig=/var/lib/openyurt/kubelet.conf --bootstrap-kubeconfig=\"\n";

pub const MANIFEST: &str = "/etc/kubernetes/manifests/outpost.yaml";
pub const HUB_KUBECONFIG: &str = "/var/lib/openyurt/kubelet.conf";
pub const KUBEADM_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
pub const KUBELET_CONF: &str = "/etc/kubernetes/kubelet.conf";
pub const CA: &str = "/etc/kubernetes/pki/ca.crt";

const KUBELET_CONF_TEXT: &str = "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://10.0.0.10:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: system:node:edge-node-1
  name: system:node:edge-node-1@kubernetes
current-context: system:node:edge-node-1@kubernetes
kind: Config
preferences: {}
users:
- name: system:node:edge-node-1
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
";

const KUBEADM_DROP_IN: &str = "[Service]
Environment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\"
Environment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
";

const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";

/// A kubeadm worker node's files, under a temp dir used as `--root`.
pub struct NodeTree {
    dir: tempfile::TempDir,
}

impl NodeTree {
    pub fn kubeadm() -> Self {
        let tree = NodeTree {
            dir: tempfile::tempdir().unwrap(),
        };
        fs::create_dir_all(tree.path("/etc/kubernetes/manifests")).unwrap();
        tree.write(CA, PEM);
        tree.write(KUBELET_CONF, KUBELET_CONF_TEXT);
        tree.write(KUBEADM_FLAGS, FLAGS_ENV);
        tree.write(
            "/var/lib/kubelet/config.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
        );
        tree.write(
            "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
            KUBEADM_DROP_IN,
        );
        let dated = "/var/lib/kubelet/pki/kubelet-client-2025-01-01-00-00-00.pem";
        tree.write(
            dated,
            &format!("{PEM}-----BEGIN EC PRIVATE KEY-----\nfake\n-----END EC PRIVATE KEY-----\n"),
        );
        fs::set_permissions(tree.path(dated), fs::Permissions::from_mode(0o600)).unwrap();
        // kubelet's real link is absolute, so it dangles under a temp root: convert must cope.
        symlink(
            dated,
            tree.path("/var/lib/kubelet/pki/kubelet-client-current.pem"),
        )
        .unwrap();
        tree
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, node_path: &str) -> PathBuf {
        self.dir.path().join(node_path.trim_start_matches('/'))
    }

    pub fn write(&self, node_path: &str, content: &str) {
        let path = self.path(node_path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    pub fn read(&self, node_path: &str) -> String {
        fs::read_to_string(self.path(node_path)).unwrap()
    }

    pub fn exists(&self, node_path: &str) -> bool {
        fs::symlink_metadata(self.path(node_path)).is_ok()
    }

    /// Every file, directory and symlink with its mode and content.
    pub fn snapshot(&self) -> Snapshot {
        let mut items = BTreeMap::new();
        walk(self.root(), self.root(), &mut items);
        Snapshot(items)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(PathBuf),
}

#[derive(Clone, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<String, Item>);

impl Snapshot {
    /// Panics naming the first path that differs, with readable contents.
    pub fn assert_same(&self, other: &Snapshot, context: &str) {
        if self == other {
            return;
        }
        let keys: std::collections::BTreeSet<&String> =
            self.0.keys().chain(other.0.keys()).collect();
        for key in keys {
            let (a, b) = (self.0.get(key), other.0.get(key));
            if a != b {
                panic!(
                    "{context}: {key} differs:\nbefore: {}\nafter:  {}",
                    show(a),
                    show(b)
                );
            }
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

fn show(item: Option<&Item>) -> String {
    match item {
        None => "(absent)".into(),
        Some(Item::Dir(mode)) => format!("dir {mode:o}"),
        Some(Item::Link(to)) => format!("symlink to {}", to.display()),
        Some(Item::File(mode, bytes)) => {
            format!("file {mode:o} {:?}", String::from_utf8_lossy(bytes))
        }
    }
}

fn walk(root: &Path, dir: &Path, items: &mut BTreeMap<String, Item>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = fs::symlink_metadata(&path).unwrap();
        let key = path.strip_prefix(root).unwrap().display().to_string();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            items.insert(key, Item::Link(fs::read_link(&path).unwrap()));
        } else if meta.is_dir() {
            items.insert(key, Item::Dir(mode));
            walk(root, &path, items);
        } else {
            items.insert(key, Item::File(mode, fs::read(&path).unwrap()));
        }
    }
}

#[derive(Parser)]
struct ConvertCli {
    #[command(flatten)]
    args: ConvertArgs,
}

#[derive(Parser)]
struct RevertCli {
    #[command(flatten)]
    args: RevertArgs,
}

/// The example node used throughout: what an operator would type, with `extra` flags added or
/// replacing the ones of the same name.
pub fn convert_args(tree: &NodeTree, readyz_url: &str, extra: &[&str]) -> ConvertArgs {
    let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
    let replaced: Vec<String> = extra.iter().map(|a| flag(a)).collect();
    let mut argv: Vec<String> = [
        "convert".to_owned(),
        format!("--root={}", tree.root().display()),
        "--server-addr=https://10.0.0.10:6443".into(),
        "--node-name=edge-node-1".into(),
        "--nodepool-name=edge-pool-1".into(),
        format!("--readyz-url={readyz_url}"),
        "--wait-ready-timeout=10s".into(),
    ]
    .into_iter()
    .filter(|a| !replaced.contains(&flag(a)))
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    ConvertCli::try_parse_from(argv).unwrap().args
}

/// The example node of `manifests/node/`: what an operator would type, nothing else.
pub fn example_convert_args() -> ConvertArgs {
    ConvertCli::try_parse_from([
        "convert",
        "--server-addr=https://10.0.0.10:6443",
        "--node-name=edge-node-1",
        "--nodepool-name=edge-pool-1",
    ])
    .unwrap()
    .args
}

pub fn revert_args(tree: &NodeTree, extra: &[&str]) -> RevertArgs {
    let mut argv = vec![
        "revert".to_owned(),
        format!("--root={}", tree.root().display()),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    RevertCli::try_parse_from(argv).unwrap().args
}

/// Runs convert and returns its result and what it printed.
pub fn convert(args: &ConvertArgs) -> (Result<Outcome, NodeError>, String) {
    let mut out = Vec::new();
    let result = outpost_node::convert(args, &mut out);
    (result, String::from_utf8(out).unwrap())
}

pub fn revert(args: &RevertArgs) -> (Result<Outcome, NodeError>, String) {
    let mut out = Vec::new();
    let result = outpost_node::revert(args, &mut out);
    (result, String::from_utf8(out).unwrap())
}

/// Asserts a refusal: exit code 2, one line naming `path` and containing `found`.
pub fn assert_refused(result: Result<Outcome, NodeError>, path: &Path, found: &str) {
    let err = result.expect_err("expected a refusal");
    let line = err.to_string();
    assert_eq!(err.exit_code(), 2, "{line}");
    assert!(!line.contains('\n'), "one line expected: {line}");
    assert!(
        line.contains(&path.display().to_string()),
        "{path:?} not named in: {line}"
    );
    assert!(line.contains(found), "{found:?} not in: {line}");
}

/// A one-request-per-connection HTTP/1.1 server on loopback.
pub struct MiniHttp {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

type Handler = dyn Fn(&str) -> (u16, String) + Send + 'static;

impl MiniHttp {
    /// `handler` maps a request path (without the query) to a status and a JSON or text body.
    pub fn start(handler: impl Fn(&str) -> (u16, String) + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, h, s) = (requests.clone(), hits.clone(), stop.clone());
        let handler: Box<Handler> = Box::new(handler);
        let thread = thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    serve(stream, &*handler, &r, &h);
                }
            }
        });
        MiniHttp {
            addr,
            requests,
            hits,
            stop,
            thread: Some(thread),
        }
    }

    /// A hub admin server whose readyz always answers `status`.
    pub fn readyz(status: u16) -> Self {
        MiniHttp::start(move |_| {
            (
                status,
                if status == 200 {
                    "ok"
                } else {
                    "not ready: cache"
                }
                .into(),
            )
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The request heads seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for MiniHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the stop flag.
        let _wake = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn serve(
    mut stream: TcpStream,
    handler: &Handler,
    requests: &Mutex<Vec<String>>,
    hits: &AtomicUsize,
) {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split(' ').nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_owned();
    hits.fetch_add(1, Ordering::SeqCst);
    requests.lock().unwrap().push(head);
    let (status, body) = handler(&path);
    let response = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The client may have gone away already; nothing to do about it.
    stream.write_all(response.as_bytes()).ok();
}

/// Just enough of an apiserver for kubectl's client-side dry run: version, discovery for the kinds
/// our manifests use, and 404 for every object (so `apply` takes its "create" path).
pub fn discovery_apiserver() -> MiniHttp {
    MiniHttp::start(|path| {
        match path {
        "/version" => (200, r#"{"major":"1","minor":"32","gitVersion":"v1.32.4"}"#.into()),
        "/api" => (200, r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1:6443"}]}"#.into()),
        "/apis" => (200, r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"rbac.authorization.k8s.io","versions":[{"groupVersion":"rbac.authorization.k8s.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"rbac.authorization.k8s.io/v1","version":"v1"}}]}"#.into()),
        "/api/v1" => (200, resource_list("v1", &[("pods", "Pod", true), ("configmaps", "ConfigMap", true), ("namespaces", "Namespace", false)])),
        "/apis/rbac.authorization.k8s.io/v1" => (200, resource_list("rbac.authorization.k8s.io/v1", &[("clusterroles", "ClusterRole", false), ("clusterrolebindings", "ClusterRoleBinding", false), ("roles", "Role", true), ("rolebindings", "RoleBinding", true)])),
        _ => (404, r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404}"#.into()),
    }
    })
}

fn resource_list(group_version: &str, resources: &[(&str, &str, bool)]) -> String {
    let items: Vec<Value> = resources
        .iter()
        .map(|(name, kind, namespaced)| {
            serde_json::json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
                               "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        })
        .collect();
    serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": items})
        .to_string()
}

/// kubectl with a kubeconfig pointing at `server`.
pub fn kubectl(server: &MiniHttp, args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            server.url("")
        ),
    )
    .unwrap();
    kubectl_with(&kubeconfig, args)
}

/// kubectl with the given kubeconfig and a throwaway discovery cache.
pub fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cache-dir={}", cache.path().display()))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl is on PATH")
}

/// `kubectl apply --dry-run=client --validate=false -f file -o json`, then a typed round trip of
/// every object through k8s-openapi. kubectl parses the YAML and maps each kind; the round trip
/// catches misspelled fields (dropped by the typed model) and wrong types (refused by it).
pub fn validate_manifest(file: &Path) -> Result<Vec<Value>, String> {
    let server = discovery_apiserver();
    let path = file.display().to_string();
    let output = kubectl(
        &server,
        &[
            "apply",
            "--dry-run=client",
            "--validate=false",
            "-o",
            "json",
            "-f",
            &path,
        ],
    );
    if !output.status.success() {
        return Err(format!(
            "kubectl: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let printed: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
    let objects = match printed.get("kind").and_then(Value::as_str) {
        Some("List") => printed["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![printed],
    };
    objects
        .into_iter()
        .map(without_last_applied)
        .map(|o| typed_round_trip(&o).map(|()| o))
        .collect()
}

fn without_last_applied(mut obj: Value) -> Value {
    let meta = obj["metadata"].as_object_mut().expect("metadata");
    if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            meta.remove("annotations");
        }
    }
    obj
}

pub fn typed_round_trip(obj: &Value) -> Result<(), String> {
    use k8s_openapi::api::{core::v1 as core, rbac::v1 as rbac};
    match obj["kind"].as_str() {
        Some("Pod") => round_trip::<core::Pod>(obj),
        Some("ConfigMap") => round_trip::<core::ConfigMap>(obj),
        Some("ClusterRole") => round_trip::<rbac::ClusterRole>(obj),
        Some("ClusterRoleBinding") => round_trip::<rbac::ClusterRoleBinding>(obj),
        Some("Role") => round_trip::<rbac::Role>(obj),
        Some("RoleBinding") => round_trip::<rbac::RoleBinding>(obj),
        other => Err(format!("no typed model for kind {other:?}")),
    }
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(
    obj: &Value,
) -> Result<(), String> {
    let typed: T =
        serde_json::from_value(obj.clone()).map_err(|e| format!("does not decode: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    if back == *obj {
        Ok(())
    } else {
        Err(format!(
            "fields lost or changed in a typed round trip:\nin:  {obj}\nout: {back}"
        ))
    }
}
