//! End to end: pool sharing, the leader hub. Several real hubs, each on its own loopback address
//! (127.0.0.2, 127.0.0.3, …) with its own node certificate, in front of one fake apiserver:
//!
//! - a hub follows ConfigMap `kube-system/leader-hub-<pool>` live, its pool from its node's label;
//! - a leader serves its shared cache over HTTPS on `<its ip>:--multiplexer-port` to the nodes of
//!   its pool only (401 without a certificate of the cluster CA, 403 for another pool's node, a
//!   user that is not a node, or a read that is not pool-scope);
//! - a follower's kube-proxy sees the cloud's EndpointSlices through a leader, the cloud sees no
//!   watch from the follower, and when its leader is killed (kill -9) the same watch goes on from
//!   the other leader within seconds, missing no event.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use outpost_testkit::{CertPair, TestPki};
use serde_json::{Value, json};
use support::{Cluster, HubProcess, RawResponse, eventually, kube_client, metrics_text, sample};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POOL: &str = "pool-a";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const SLICES_GVR: &str = "discovery.k8s.io/v1/endpointslices";
const LEADER_HUB: &str = "leader-hub-pool-a";

/// A hub of the pool: its node, and the loopback address it serves the pool on.
struct Member {
    node: &'static str,
    ip: IpAddr,
}

fn member(node: &'static str, last_octet: u8) -> Member {
    Member {
        node,
        ip: IpAddr::from([127, 0, 0, last_octet]),
    }
}

/// A port free on every member's address, for `--multiplexer-port` (the same on every hub, as
/// in a real pool).
fn free_port(members: &[Member]) -> u16 {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind((members[0].ip, 0)).expect("bind");
        let port = first.local_addr().unwrap().port();
        let rest: Result<Vec<_>, _> = members[1..]
            .iter()
            .map(|m| std::net::TcpListener::bind((m.ip, port)))
            .collect();
        if rest.is_ok() {
            return port;
        }
    }
    panic!("no port free on every member's address");
}

/// The hub of `m`: its own certificate, directories and `--node-ip`.
fn start_member(cluster: &Cluster, m: &Member, port: u16, extra: &[String]) -> HubProcess {
    let dir = cluster.dir.path().join(m.node);
    let files = cluster
        .fake
        .pki()
        .write_node_files(&dir.join("pki"), m.node)
        .expect("node cert files");
    let mut args: Vec<String> = vec![
        format!("--node-name={}", m.node),
        format!("--node-ip={}", m.ip),
        format!("--multiplexer-port={port}"),
        format!(
            "--kubelet-client-certificate={}",
            files.client_pem.display()
        ),
        format!("--kubelet-ca-file={}", files.ca_crt.display()),
        format!("--root-dir={}", dir.join("root").display()),
        format!("--disk-cache-path={}", dir.join("cache").display()),
    ];
    args.extend(extra.iter().cloned());
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_owned();
    let overridden: Vec<String> = args.iter().map(|a| flag(a)).collect();
    let mut all: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .filter(|a| !overridden.contains(&flag(a)))
        .collect();
    all.extend(args);
    HubProcess::spawn(&all)
}

/// `leader-hub-<pool>` as yurt-manager writes it.
fn leader_hub_config(pool: &str, leaders: &[&Member]) -> Value {
    let leaders: Vec<String> = leaders
        .iter()
        .map(|m| format!("{}/{}", m.node, m.ip))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("leader-hub-{pool}"), "namespace": "kube-system",
                     "labels": {"openyurt.io/configmap-name": format!("leader-hub-{pool}")}},
        "data": {
            "leaders": leaders.join(","),
            "pool-scoped-metadata": "/v1/services,discovery.k8s.io/v1/endpointslices",
            "interconnectivity": "true",
            "enable-leader-election": "true",
        }
    })
}

/// NodePool `name` with these nodes, as its controller reports them.
fn node_pool(cluster: &Cluster, name: &str, nodes: &[&str]) {
    let fake = &cluster.fake;
    let mut pool = fake
        .create(
            "apps.openyurt.io/v1beta1/nodepools",
            json!({"apiVersion": "apps.openyurt.io/v1beta1", "kind": "NodePool",
                   "metadata": {"name": name}, "spec": {"type": "Edge"}}),
        )
        .expect("nodepool");
    pool["status"] = json!({ "nodes": nodes });
    fake.update("apps.openyurt.io/v1beta1/nodepools", pool)
        .expect("nodepool status");
}

fn endpoint_slice(name: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}}],
        "ports": [{"port": 80, "protocol": "TCP"}],
    })
}

/// The value of `series` on `hub`'s `/metrics` (0 when absent).
async fn metric(hub: &HubProcess, series: &str) -> f64 {
    sample(&metrics_text(hub).await, series).unwrap_or(0.0)
}

/// Polls (bounded) until `series` on `hub` has `value`.
async fn until_metric(hub: &HubProcess, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if metric(hub, series).await == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never became {value}: {}\n{}",
            metric(hub, series).await,
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` over TLS to a leader's port, presenting `client` (none when `None`), trusting
/// `ca_pem`; the whole answer (`Connection: close`).
async fn leader_get(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&CertPair>,
    path: &str,
) -> Result<RawResponse, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match client {
        Some(pair) => {
            let chain = CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::IpAddress(addr.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: test\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut buf)).await;
    match read {
        Ok(Ok(_)) => {}
        Ok(Err(_)) if !buf.is_empty() => {}
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("no answer within 30 s".into()),
    }
    Ok(RawResponse::parse(&buf))
}

/// Polls (bounded) until the leader's port answers a member's LIST.
async fn until_leader_serves(
    leader: &HubProcess,
    addr: SocketAddr,
    ca: &str,
    as_member: &CertPair,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(resp) = leader_get(addr, ca, Some(as_member), SLICES).await
            && resp.status == 200
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the leader's port never served:\n{}",
            leader.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn node_cert(pki: &TestPki, node: &str) -> CertPair {
    pki.client(&format!("system:node:{node}"), &["system:nodes"])
        .expect("node cert")
}

fn names(list: &Value) -> Vec<String> {
    let mut names = support::names(list);
    names.sort();
    names
}

/// The cloud's watches of EndpointSlices, by user.
fn cloud_slice_watches(cluster: &Cluster) -> Vec<String> {
    cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.verb == "watch" && r.resource == "endpointslices")
        .map(|r| r.user)
        .collect()
}

/// Step 1: the hub's pool from its node's label, and `leader-hub-<pool>` followed live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_follows_its_pools_leader_hub_config_map_live() {
    let cluster = Cluster::start().await;
    let edge1 = member("edge-1", 2);
    let edge2 = member("edge-2", 3);
    let port = free_port(&[member("edge-1", 2)]);
    let fake = &cluster.fake;
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "edge-1", "labels": {"apps.openyurt.io/nodepool": POOL}}});
    match fake.get("v1/nodes", None, "edge-1") {
        Some(mut existing) => {
            existing["metadata"]["labels"] = node["metadata"]["labels"].clone();
            fake.update("v1/nodes", existing).expect("node label");
        }
        None => {
            fake.create("v1/nodes", node).expect("node");
        }
    }
    let hub = start_member(&cluster, &edge1, port, &["--nodepool-name=".into()]);
    let role = |r: &str| format!("outpost_pool_role{{role=\"{r}\"}}");
    until_metric(&hub, &role("none"), 1.0).await;

    fake.create("v1/configmaps", leader_hub_config(POOL, &[&edge1]))
        .expect("leader-hub configmap");
    until_metric(&hub, &role("leader"), 1.0).await;
    assert!(
        hub.log_text().contains("pool leaders changed"),
        "{}",
        hub.log_text()
    );

    let mut cm = fake
        .get("v1/configmaps", Some("kube-system"), LEADER_HUB)
        .unwrap();
    cm["data"]["leaders"] = json!(format!("edge-2/{}", edge2.ip));
    fake.update("v1/configmaps", cm).expect("leaders changed");
    until_metric(&hub, &role("follower"), 1.0).await;

    fake.delete("v1/configmaps", Some("kube-system"), LEADER_HUB)
        .expect("deleted");
    until_metric(&hub, &role("none"), 1.0).await;

    // The node moves to another pool: that pool's ConfigMap is followed.
    fake.create("v1/configmaps", leader_hub_config("pool-b", &[&edge1]))
        .expect("pool-b configmap");
    let mut node = fake.get("v1/nodes", None, "edge-1").unwrap();
    node["metadata"]["labels"]["apps.openyurt.io/nodepool"] = json!("pool-b");
    fake.update("v1/nodes", node).expect("relabelled");
    until_metric(&hub, &role("leader"), 1.0).await;
    let changes = metric(&hub, "outpost_pool_leader_changes_total").await;
    assert!(changes >= 4.0, "one count per change: {changes}");
}
