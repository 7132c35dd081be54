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
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, WatchEvent, WatchParams};
use outpost_testkit::{CertPair, TestPki};
use serde_json::{Value, json};
use support::{Cluster, HubProcess, RawResponse, eventually, kube_client, metrics_text, sample};

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
    let connector = support::tls_client_as(ca_pem, client);
    support::https_get_with(connector, addr, path, "test", None).await
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
    cloud_watches(cluster, "endpointslices")
}

/// The cloud's watches of `resource`, by user.
fn cloud_watches(cluster: &Cluster, resource: &str) -> Vec<String> {
    cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.verb == "watch" && r.resource == resource)
        .map(|r| r.user)
        .collect()
}

/// Polls (bounded) until the follower's shared cache answers a LIST of EndpointSlices.
async fn until_follower_shares(follower: &HubProcess) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = support::get(follower.proxy, SLICES, "kube-proxy/v1.32.0").await;
        if resp.status == 200 && resp.header("x-outpost-served-from") == Some("shared-cache") {
            return resp.json();
        }
        assert!(
            Instant::now() < deadline,
            "never served from the shared cache:\n{}",
            follower.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader the follower's EndpointSlice watch was last opened on, from its log.
fn watch_feed_leader(follower: &HubProcess) -> Option<String> {
    let log = follower.log_text();
    let line = log.lines().rev().find(|l| {
        l.contains("pool-scope feed from a leader hub")
            && l.contains("endpointslices")
            && l.contains("watch=true")
    })?;
    let start = line.find("leader=")? + "leader=".len();
    Some(line[start..].split_whitespace().next()?.to_owned())
}

/// A reader's EndpointSlice watch through a follower, and the names it saw added.
struct SliceWatch {
    events: futures_util::stream::BoxStream<'static, kube::Result<WatchEvent<EndpointSlice>>>,
    seen: Vec<String>,
}

impl SliceWatch {
    /// kube-proxy on `follower`: a LIST answered by its shared cache, then a watch from the
    /// list's resourceVersion; the list too.
    async fn through(follower: &HubProcess) -> (Value, SliceWatch) {
        let listed = until_follower_shares(follower).await;
        let rv = listed["metadata"]["resourceVersion"]
            .as_str()
            .expect("the list's resourceVersion")
            .to_owned();
        let client = kube_client(follower, "kube-proxy/v1.32.0 (linux/amd64) kubernetes/e2e");
        let slices: Api<EndpointSlice> = Api::all(client);
        let events = slices
            .watch(&WatchParams::default().timeout(290), &rv)
            .await
            .expect("watch through the follower")
            .boxed();
        let watch = SliceWatch {
            events,
            seen: Vec::new(),
        };
        (listed, watch)
    }

    /// The next event, which must be an ADDED within `within`.
    async fn next_added(&mut self, within: Duration) {
        match tokio::time::timeout(within, self.events.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(s)))) => {
                self.seen.push(s.metadata.name.unwrap_or_default());
            }
            other => panic!("expected an ADDED event, got {other:?}"),
        }
    }
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

/// Step 2: a leader serves its shared cache on `<its ip>:--multiplexer-port` to the nodes of its
/// pool, and refuses everyone else as kube-apiserver would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_serves_the_nodes_of_its_pool_and_refuses_everyone_else() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    for name in ["web-1", "web-2"] {
        fake.create(SLICES_GVR, endpoint_slice(name)).unwrap();
    }
    node_pool(&cluster, POOL, &["edge-1", "edge-2", "edge-3"]);
    node_pool(&cluster, "pool-b", &["edge-9"]);
    let edge1 = member("edge-1", 2);
    fake.create("v1/configmaps", leader_hub_config(POOL, &[&edge1]))
        .unwrap();
    let port = free_port(&[member("edge-1", 2)]);
    let leader = start_member(&cluster, &edge1, port, &[]);
    let addr = SocketAddr::new(edge1.ip, port);
    let pki = fake.pki();
    let ca = pki.ca_pem.clone();
    let edge2 = node_cert(pki, "edge-2");
    until_leader_serves(&leader, addr, &ca, &edge2).await;

    // A node of the pool: the cloud's objects, from the leader's shared cache.
    let list = leader_get(addr, &ca, Some(&edge2), SLICES).await.unwrap();
    assert_eq!(list.status, 200);
    assert_eq!(list.header("x-outpost-served-from"), Some("shared-cache"));
    let cloud = json!({"items": fake.list(SLICES_GVR, None)});
    assert_eq!(names(&list.json()), names(&cloud));
    let rv = list.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    // A watch resumed from the list's resourceVersion gets what changed since, and ends at its
    // timeout; one from before the leader's window is 410, as the apiserver answers it.
    fake.create(SLICES_GVR, endpoint_slice("web-3")).unwrap();
    let path = format!("{SLICES}?watch=true&resourceVersion={rv}&timeoutSeconds=1");
    let watch = leader_get(addr, &ca, Some(&edge2), &path).await.unwrap();
    let events = String::from_utf8_lossy(&watch.body).into_owned();
    assert!(
        events.contains("\"ADDED\"") && events.contains("web-3") && !events.contains("web-1"),
        "{events}"
    );
    let gone = format!("{SLICES}?watch=true&resourceVersion=1");
    let gone = leader_get(addr, &ca, Some(&edge2), &gone).await.unwrap();
    assert_eq!(gone.status, 410, "{}", String::from_utf8_lossy(&gone.body));
    assert_eq!(gone.json()["reason"], "Expired");

    // Everyone else.
    let refused = |resp: RawResponse, code: u16, reason: &str, what: &str| {
        assert_eq!(
            resp.status,
            code,
            "{what}: {}",
            String::from_utf8_lossy(&resp.body)
        );
        let status = resp.json();
        assert_eq!(
            (status["kind"].as_str(), status["reason"].as_str()),
            (Some("Status"), Some(reason)),
            "{what}: {status}"
        );
    };
    let anonymous = leader_get(addr, &ca, None, SLICES).await.unwrap();
    refused(anonymous, 401, "Unauthorized", "no client certificate");
    let other_ca = TestPki::new().unwrap();
    let forged = node_cert(&other_ca, "edge-2");
    let forged = leader_get(addr, &ca, Some(&forged), SLICES).await.unwrap();
    refused(forged, 401, "Unauthorized", "a certificate of another CA");
    let alice = pki.client("alice", &["system:authenticated"]).unwrap();
    let alice = leader_get(addr, &ca, Some(&alice), SLICES).await.unwrap();
    refused(alice, 403, "Forbidden", "not a node");
    let stranger = node_cert(pki, "edge-9");
    let stranger = leader_get(addr, &ca, Some(&stranger), SLICES)
        .await
        .unwrap();
    refused(stranger, 403, "Forbidden", "a node of another pool");
    let unknown = node_cert(pki, "edge-404");
    let unknown = leader_get(addr, &ca, Some(&unknown), SLICES).await.unwrap();
    refused(unknown, 403, "Forbidden", "an unknown node");
    let pods = leader_get(addr, &ca, Some(&edge2), "/api/v1/pods")
        .await
        .unwrap();
    refused(pods, 403, "Forbidden", "not a pool-scope resource");
    let outcome = |o: &str| format!("outpost_pool_port_requests_total{{outcome=\"{o}\"}}");
    assert_eq!(metric(&leader, &outcome("unauthenticated")).await, 2.0);
    assert_eq!(metric(&leader, &outcome("forbidden")).await, 4.0);

    // No longer named a leader: the port closes.
    let mut cm = fake
        .get("v1/configmaps", Some("kube-system"), LEADER_HUB)
        .unwrap();
    cm["data"]["leaders"] = json!("edge-2/127.0.0.3");
    fake.update("v1/configmaps", cm).unwrap();
    let closed = eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
    })
    .await;
    assert!(closed, "the port stays open:\n{}", leader.log_text());
}

/// Steps 3–4: a follower's kube-proxy sees the cloud's EndpointSlices through a leader; the cloud
/// sees no watch from the follower (one per leader at most); the leader serving it killed, the
/// same watch goes on from the other leader within seconds and misses no event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_reader_is_served_through_a_leader_and_survives_its_death() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    for name in ["web-1", "web-2"] {
        fake.create(SLICES_GVR, endpoint_slice(name)).unwrap();
    }
    let (edge1, edge2, edge3) = (
        member("edge-1", 2),
        member("edge-2", 3),
        member("edge-3", 4),
    );
    node_pool(&cluster, POOL, &["edge-1", "edge-2", "edge-3"]);
    fake.create("v1/configmaps", leader_hub_config(POOL, &[&edge1, &edge2]))
        .unwrap();
    let port = free_port(&[
        member("edge-1", 2),
        member("edge-2", 3),
        member("edge-3", 4),
    ]);
    let mut leaders = vec![
        (edge1.node, start_member(&cluster, &edge1, port, &[])),
        (edge2.node, start_member(&cluster, &edge2, port, &[])),
    ];
    // Both leaders serve (their serving certificates issued) before the follower starts: until
    // then it would read from the cloud, as it should.
    let pki = fake.pki();
    let as_follower = node_cert(pki, "edge-3");
    for (m, (_, hub)) in [&edge1, &edge2].into_iter().zip(&leaders) {
        until_leader_serves(hub, SocketAddr::new(m.ip, port), &pki.ca_pem, &as_follower).await;
    }
    let follower = start_member(&cluster, &edge3, port, &[]);
    until_metric(&follower, "outpost_pool_role{role=\"follower\"}", 1.0).await;

    // kube-proxy on the follower: a list answered by the follower's shared cache (fed by a
    // leader), then a watch from it.
    let (listed, mut watch) = SliceWatch::through(&follower).await;
    let cloud = json!({"items": fake.list(SLICES_GVR, None)});
    assert_eq!(names(&listed), names(&cloud), "the cloud's EndpointSlices");
    fake.create(SLICES_GVR, endpoint_slice("web-3")).unwrap();
    watch.next_added(Duration::from_secs(10)).await;
    assert_eq!(watch.seen, ["web-3"]);

    // The cloud: the pool's EndpointSlices are watched by leaders only, once each at most; the
    // follower's Services (its filters') come from a leader too.
    let watches = cloud_slice_watches(&cluster);
    assert!(
        !watches.iter().any(|u| u == "system:node:edge-3"),
        "the follower watched the cloud itself: {watches:?}"
    );
    let service_watches = cloud_watches(&cluster, "services");
    assert!(
        !service_watches.iter().any(|u| u == "system:node:edge-3"),
        "the follower watched Services in the cloud: {service_watches:?}"
    );
    for leader in ["system:node:edge-1", "system:node:edge-2"] {
        assert!(
            watches.iter().filter(|u| *u == leader).count() <= 1,
            "{watches:?}"
        );
    }
    assert!(!watches.is_empty(), "the leader watches the cloud");
    let feeding = watch_feed_leader(&follower).expect("the follower's watch is fed by a leader");
    let served = "outpost_pool_port_requests_total{outcome=\"served\"}";
    let serving = leaders
        .iter()
        .position(|(node, _)| *node == feeding)
        .unwrap();
    let (killed, hub) = leaders.remove(serving);
    let (_, survivor) = &leaders[0];
    let before = metric(survivor, served).await;

    // kill -9 the leader serving the follower, and change the cloud at once.
    hub.signal("KILL");
    let killed_at = Instant::now();
    fake.create(SLICES_GVR, endpoint_slice("web-4")).unwrap();
    fake.create(SLICES_GVR, endpoint_slice("web-5")).unwrap();
    watch.next_added(Duration::from_secs(5)).await;
    watch.next_added(Duration::from_secs(5)).await;
    let took = killed_at.elapsed();
    assert_eq!(
        watch.seen,
        ["web-3", "web-4", "web-5"],
        "nothing missed, nothing twice"
    );
    assert!(took < Duration::from_secs(5), "failover took {took:?}");
    assert!(
        metric(survivor, served).await > before,
        "the other leader took over from {killed}:\n{}",
        follower.log_text()
    );
    let watches = cloud_slice_watches(&cluster);
    assert!(
        !watches.iter().any(|u| u == "system:node:edge-3"),
        "the follower fell back to the cloud although a leader was left: {watches:?}"
    );
    assert_ne!(watch_feed_leader(&follower).as_deref(), Some(killed));
    drop(hub);

    // No leader left: the cloud, within seconds, the same watch going on.
    let (_, last) = leaders.remove(0);
    last.signal("KILL");
    let killed_at = Instant::now();
    fake.create(SLICES_GVR, endpoint_slice("web-6")).unwrap();
    watch.next_added(Duration::from_secs(5)).await;
    assert!(killed_at.elapsed() < Duration::from_secs(5));
    assert_eq!(watch.seen, ["web-3", "web-4", "web-5", "web-6"]);
    let watches = cloud_slice_watches(&cluster);
    assert_eq!(
        watches
            .iter()
            .filter(|u| *u == "system:node:edge-3")
            .count(),
        1,
        "the follower watches the cloud itself now: {watches:?}"
    );
    drop(last);
}

/// Step 5: while the cloud is gone the pool keeps one view: the follower's feed keeps reading
/// the leader's copy (served from the leader's cache), so its readers' watches stay open (a
/// hub fed by the cloud ends them, and answers from its own copy), and it converges after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_keeps_the_leaders_view_while_the_cloud_is_gone() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    for name in ["web-1", "web-2"] {
        fake.create(SLICES_GVR, endpoint_slice(name)).unwrap();
    }
    let (edge1, edge2) = (member("edge-1", 2), member("edge-2", 3));
    node_pool(&cluster, POOL, &["edge-1", "edge-2"]);
    fake.create("v1/configmaps", leader_hub_config(POOL, &[&edge1]))
        .unwrap();
    let port = free_port(&[member("edge-1", 2), member("edge-2", 3)]);
    let leader = start_member(&cluster, &edge1, port, &[]);
    let pki = fake.pki();
    let as_follower = node_cert(pki, "edge-2");
    let addr = SocketAddr::new(edge1.ip, port);
    until_leader_serves(&leader, addr, &pki.ca_pem, &as_follower).await;
    let follower = start_member(&cluster, &edge2, port, &[]);
    until_metric(&follower, "outpost_pool_role{role=\"follower\"}", 1.0).await;
    let listed = until_follower_shares(&follower).await;
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let client = kube_client(&follower, "kube-proxy/v1.32.0 (linux/amd64) kubernetes/e2e");
    let slices: Api<EndpointSlice> = Api::all(client);
    let mut events = slices
        .watch(&WatchParams::default().timeout(120), &rv)
        .await
        .unwrap()
        .boxed();

    let feeds_before = follower
        .log_text()
        .matches("pool-scope feed from a leader hub")
        .count();
    fake.refuse_connections();
    until_metric(&leader, "outpost_cloud_online", 0.0).await;
    until_metric(&follower, "outpost_cloud_online", 0.0).await;
    // The leader's feed broke, which ended its watches; the follower watches its copy again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while follower
        .log_text()
        .matches("pool-scope feed from a leader hub")
        .count()
        == feeds_before
    {
        assert!(
            Instant::now() < deadline,
            "the follower no longer reads the leader:\n{}",
            follower.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !support::ends_without_changes(&mut events, Duration::from_secs(5)).await,
        "the follower's reader lost its watch while the cloud is gone\n{}",
        follower.log_text()
    );
    let offline = support::get(follower.proxy, SLICES, "kube-proxy/v1.32.0").await;
    assert_eq!(
        offline.header("x-outpost-served-from"),
        Some("shared-cache")
    );
    assert_eq!(names(&offline.json()), names(&listed), "the leader's view");

    // The cloud is back, with a change: the pool converges on it.
    fake.restore().await;
    fake.create(SLICES_GVR, endpoint_slice("web-3")).unwrap();
    let cloud = json!({"items": fake.list(SLICES_GVR, None)});
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = support::get(follower.proxy, SLICES, "kube-proxy/v1.32.0").await;
        if resp.header("x-outpost-served-from") == Some("shared-cache")
            && names(&resp.json()) == names(&cloud)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never converged:\n{}",
            follower.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let watches = cloud_slice_watches(&cluster);
    assert!(
        !watches.iter().any(|u| u == "system:node:edge-2"),
        "the follower watched the cloud itself: {watches:?}"
    );
}

/// Node `m` of `pool` as kubelet registers it and the node lifecycle controller marks it: the
/// pool label, its address, `Ready` as given.
fn pool_node(cluster: &Cluster, m: &Member, pool: &str, ready: bool) {
    let status = if ready { "True" } else { "Unknown" };
    let node = json!({"apiVersion": "v1", "kind": "Node",
    "metadata": {"name": m.node, "labels": {"apps.openyurt.io/nodepool": pool}},
    "status": {
        "conditions": [{"type": "Ready", "status": status}],
        "addresses": [{"type": "InternalIP", "address": m.ip.to_string()},
                      {"type": "Hostname", "address": m.node}],
    }});
    let fake = &cluster.fake;
    match fake.get("v1/nodes", None, m.node) {
        Some(existing) => {
            let mut node = node;
            node["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
            fake.update("v1/nodes", node).expect("node updated");
        }
        None => {
            fake.create("v1/nodes", node).expect("node");
        }
    }
}

/// The bytes of `resource` `hub` counts as received from the cloud.
async fn wan_bytes(hub: &HubProcess, resource: &str) -> f64 {
    let label = format!("resource=\"{resource}\"");
    metrics_text(hub)
        .await
        .lines()
        .filter(|l| l.starts_with("outpost_upstream_received_bytes_total{"))
        .filter(|l| l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls (bounded) until every hub has the role given for it.
async fn until_roles(hubs: &[(&Member, &HubProcess, &str)]) {
    for (m, hub, role) in hubs {
        let series = format!("outpost_pool_role{{role=\"{role}\"}}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while metric(hub, &series).await != 1.0 {
            assert!(
                Instant::now() < deadline,
                "{} never became {role}:\n{}",
                m.node,
                hub.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Without yurt-manager (no `leader-hub-<pool>`, no NodePool status): with
/// `--enable-pool-leader-election` the hubs of a pool agree on their leaders from the pool's
/// Nodes — the first ready ones by name — serve each other with membership from the pool label,
/// and elect a new leader once the cloud marks a dead leader's Node not ready, while a
/// follower's reader misses nothing; a follower restarted while the cloud is gone knows its
/// leaders from its cache. A ConfigMap, once written, has the last word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_of_a_pool_elect_their_leaders_without_a_controller() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    for name in ["web-1", "web-2"] {
        fake.create(SLICES_GVR, endpoint_slice(name)).unwrap();
    }
    let members = [
        member("edge-1", 2),
        member("edge-2", 3),
        member("edge-3", 4),
        member("edge-4", 5),
    ];
    for m in &members {
        pool_node(&cluster, m, POOL, true);
    }
    // A ready node of another pool, first by name: not a leader of this one.
    pool_node(&cluster, &member("edge-0", 9), "pool-b", true);
    let port = free_port(&members);
    let election: Vec<String> = vec![
        "--enable-pool-leader-election".into(),
        "--pool-leader-replicas=2".into(),
    ];
    // The first two by name start first and serve (their serving certificates issued) before
    // the others start: until then a follower would read from the cloud, as it should.
    let mut hubs: Vec<HubProcess> = members[..2]
        .iter()
        .map(|m| start_member(&cluster, m, port, &election))
        .collect();
    let pki = fake.pki();
    let as_follower = node_cert(pki, "edge-4");
    for (i, m) in members[..2].iter().enumerate() {
        let addr = SocketAddr::new(m.ip, port);
        until_leader_serves(&hubs[i], addr, &pki.ca_pem, &as_follower).await;
    }
    hubs.extend(
        members[2..]
            .iter()
            .map(|m| start_member(&cluster, m, port, &election)),
    );
    until_roles(&[
        (&members[0], &hubs[0], "leader"),
        (&members[1], &hubs[1], "leader"),
        (&members[2], &hubs[2], "follower"),
        (&members[3], &hubs[3], "follower"),
    ])
    .await;

    // The leaders serve the pool's nodes, known from the pool label alone (no NodePool).
    let stranger = node_cert(pki, "edge-0");
    let addr = SocketAddr::new(members[0].ip, port);
    let refused = leader_get(addr, &pki.ca_pem, Some(&stranger), SLICES)
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "a node of another pool");

    // kube-proxy on edge-4: the cloud's EndpointSlices through a leader, then a watch.
    let (listed, mut watch) = SliceWatch::through(&hubs[3]).await;
    let cloud = json!({"items": fake.list(SLICES_GVR, None)});
    assert_eq!(names(&listed), names(&cloud));
    // What a follower read from a leader (its filters' Services, edge-3 has no other reader)
    // is not counted as bytes from the cloud.
    let from_leader = "outpost_pool_feed_requests_total{outcome=\"ok\",source=\"leader\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&hubs[2], from_leader).await < 1.0 {
        assert!(Instant::now() < deadline, "edge-3 never read a leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(wan_bytes(&hubs[2], "services").await, 0.0);
    assert!(
        wan_bytes(&hubs[0], "services").await > 0.0,
        "the leader listed the cloud"
    );
    fake.create(SLICES_GVR, endpoint_slice("web-3")).unwrap();
    watch.next_added(Duration::from_secs(10)).await;

    // edge-1's hub dies (kill -9); the cloud marks its Node not ready (the node lifecycle
    // controller's part, once the node's Lease is stale): edge-3 is elected in its place.
    hubs[0].signal("KILL");
    fake.create(SLICES_GVR, endpoint_slice("web-4")).unwrap();
    watch.next_added(Duration::from_secs(5)).await;
    let watches = cloud_slice_watches(&cluster);
    for follower in ["system:node:edge-3", "system:node:edge-4"] {
        assert!(
            !watches.iter().any(|u| u == follower),
            "{follower} watched the cloud itself: {watches:?}"
        );
    }
    pool_node(&cluster, &members[0], POOL, false);
    until_roles(&[
        (&members[1], &hubs[1], "leader"),
        (&members[2], &hubs[2], "leader"),
        (&members[3], &hubs[3], "follower"),
    ])
    .await;
    let addr = SocketAddr::new(members[2].ip, port);
    until_leader_serves(&hubs[2], addr, &pki.ca_pem, &as_follower).await;
    fake.create(SLICES_GVR, endpoint_slice("web-5")).unwrap();
    watch.next_added(Duration::from_secs(5)).await;
    assert_eq!(
        watch.seen,
        ["web-3", "web-4", "web-5"],
        "nothing missed, nothing twice"
    );
    // The new leader watches the cloud; the follower still does not.
    let watches = cloud_slice_watches(&cluster);
    assert!(
        watches.iter().any(|u| u == "system:node:edge-3"),
        "{watches:?}"
    );
    assert!(
        !watches.iter().any(|u| u == "system:node:edge-4"),
        "the follower watched the cloud itself: {watches:?}"
    );

    // The cloud goes away and edge-4's hub restarts: it knows its leaders from the Nodes it
    // saved, and its kube-proxy gets the leaders' view.
    fake.refuse_connections();
    let before = hubs.pop().expect("edge-4");
    tokio::task::spawn_blocking(move || before.terminate())
        .await
        .expect("terminated");
    hubs.push(start_member(&cluster, &members[3], port, &election));
    until_roles(&[(&members[3], &hubs[3], "follower")]).await;
    let offline = until_follower_shares(&hubs[3]).await;
    assert_eq!(
        names(&offline),
        names(&json!({"items": fake.list(SLICES_GVR, None)}))
    );
    fake.restore().await;

    // yurt-manager writes the pool's ConfigMap: its leaders, not the elected ones.
    fake.create("v1/configmaps", leader_hub_config(POOL, &[&members[3]]))
        .unwrap();
    until_roles(&[
        (&members[1], &hubs[1], "follower"),
        (&members[2], &hubs[2], "follower"),
        (&members[3], &hubs[3], "leader"),
    ])
    .await;
}

/// A leader that hangs with its connections open (SIGSTOP: its kernel still accepts and
/// acknowledges, so no reset and no keepalive failure) is noticed by the follower's probes of
/// its `/healthz`, and the reader's watch goes on from the other leader, missing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_leader_is_left_for_the_other_within_seconds() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    fake.create(SLICES_GVR, endpoint_slice("web-1")).unwrap();
    let members = [
        member("edge-1", 2),
        member("edge-2", 3),
        member("edge-3", 4),
    ];
    node_pool(&cluster, POOL, &["edge-1", "edge-2", "edge-3"]);
    fake.create(
        "v1/configmaps",
        leader_hub_config(POOL, &[&members[0], &members[1]]),
    )
    .unwrap();
    let port = free_port(&members);
    let pki = fake.pki();
    let as_follower = node_cert(pki, "edge-3");
    let leaders: Vec<HubProcess> = members[..2]
        .iter()
        .map(|m| start_member(&cluster, m, port, &[]))
        .collect();
    for (m, hub) in members.iter().zip(&leaders) {
        until_leader_serves(hub, SocketAddr::new(m.ip, port), &pki.ca_pem, &as_follower).await;
    }
    let follower = start_member(&cluster, &members[2], port, &[]);
    until_metric(&follower, "outpost_pool_role{role=\"follower\"}", 1.0).await;
    let (_, mut watch) = SliceWatch::through(&follower).await;
    fake.create(SLICES_GVR, endpoint_slice("web-2")).unwrap();
    watch.next_added(Duration::from_secs(10)).await;

    let feeding = watch_feed_leader(&follower).expect("fed by a leader");
    let hung = &leaders[members.iter().position(|m| m.node == feeding).unwrap()];
    hung.signal("STOP");
    let stopped_at = Instant::now();
    fake.create(SLICES_GVR, endpoint_slice("web-3")).unwrap();
    watch.next_added(Duration::from_secs(10)).await;
    let took = stopped_at.elapsed();
    hung.signal("CONT");
    assert_eq!(
        watch.seen,
        ["web-2", "web-3"],
        "nothing missed, nothing twice"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_ne!(
        watch_feed_leader(&follower).as_deref(),
        Some(feeding.as_str())
    );
    assert!(
        follower
            .log_text()
            .contains("leader hub stopped answering its probes"),
        "{}",
        follower.log_text()
    );
    let watches = cloud_slice_watches(&cluster);
    assert!(
        !watches.iter().any(|u| u == "system:node:edge-3"),
        "the follower fell back to the cloud although a leader was left: {watches:?}"
    );
}
