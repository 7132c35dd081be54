//! Health end to end: the node-lease heartbeat gated on kubelet (lesson 000), no flap when kubelet
//! calls in just before the grace period ends (lesson 001), failover between two apiservers, and
//! the offline/online transitions within two probe intervals.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use outpost_testkit::{FakeApiServer, FakeConfig};
use serde_json::{Value, json};
use support::{Cluster, HubProcess, NODE, get, metrics_text, raw_http};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

/// One round of kubelet's lease loop through the hub: GET, then PUT with the version it got.
async fn kubelet_renews(hub: &HubProcess) {
    let got = raw_http(
        hub.proxy,
        format!("GET {LEASE}/{NODE} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    let mut lease = got.json();
    lease["spec"]["renewTime"] = json!("2026-11-23T00:00:00.000000Z");
    let body = lease.to_string();
    let put = raw_http(
        hub.proxy,
        format!(
            "PUT {LEASE}/{NODE} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
}

/// The hub's own lease renewals the apiserver has seen so far.
fn renewals(fake: &FakeApiServer) -> usize {
    fake.requests()
        .iter()
        .filter(|r| {
            r.user_agent.as_deref() == Some("outpost/heartbeat")
                && r.resource == "leases"
                && r.verb == "update"
                && r.status == 200
        })
        .count()
}

fn metric(text: &str, name: &str) -> f64 {
    support::sample(text, name).unwrap_or(0.0)
}

fn start_hub(cluster: &Cluster, extra: &[&str]) -> HubProcess {
    cluster.start_hub_with_flags(extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_runs_only_while_kubelet_calls_in() {
    let cluster = Cluster::start().await;
    let hub = start_hub(&cluster, &["--kubelet-health-grace-period=3s"]);

    // kubelet alive: its lease requests stay local, and the hub renews the cloud's lease.
    cluster.fake.clear_requests();
    let alive_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < alive_until {
        kubelet_renews(&hub).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let while_alive = renewals(&cluster.fake);
    assert!(
        while_alive >= 2,
        "renewals while kubelet calls: {while_alive}"
    );
    assert!(
        cluster
            .fake
            .requests()
            .iter()
            .all(|r| r.user_agent.as_deref() != Some(KUBELET_UA) || r.verb == "get"),
        "kubelet's lease writes never reach the apiserver"
    );
    let lease = cluster
        .fake
        .get(
            "coordination.k8s.io/v1/leases",
            Some("kube-node-lease"),
            NODE,
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], NODE);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 3);
    assert_ne!(
        lease["spec"]["renewTime"], "2026-11-23T00:00:00.000000Z",
        "the cloud's lease carries the hub's renewal, not kubelet's local copy"
    );
    assert!(
        cluster
            .fake
            .requests()
            .iter()
            .filter(|r| r.user_agent.as_deref() == Some("outpost/heartbeat"))
            .all(|r| r.user == format!("system:node:{NODE}")),
        "renewals carry the node identity"
    );

    // kubelet silent past the grace period: renewals stop, the hub stays online.
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.fake.clear_requests();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        renewals(&cluster.fake),
        0,
        "no renewal for a silent kubelet"
    );
    let text = metrics_text(&hub).await;
    assert_eq!(metric(&text, "outpost_cloud_online"), 1.0, "{text}");

    // kubelet back: renewals resume within two intervals.
    kubelet_renews(&hub).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while renewals(&cluster.fake) == 0 {
        assert!(Instant::now() < deadline, "renewals did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lesson 001: kubelet goes quiet and calls in again just before the grace period ends; the hub
/// re-reads the evidence right before each renewal, so not one renewal is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_just_before_the_grace_period_ends_skips_nothing() {
    let cluster = Cluster::start().await;
    let hub = start_hub(&cluster, &["--kubelet-health-grace-period=4s"]);
    kubelet_renews(&hub).await;
    // Rounds before kubelet's first call skip (nothing vouches for it yet); count from here.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let skipped_before = metric(
        &metrics_text(&hub).await,
        "outpost_node_lease_renewals_total{result=\"skipped\"}",
    );
    kubelet_renews(&hub).await;
    for _ in 0..3 {
        // Quiet for 3 s of a 4 s grace period: the margin absorbs a loaded test machine.
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        kubelet_renews(&hub).await;
    }
    let text = metrics_text(&hub).await;
    assert!(
        metric(
            &text,
            "outpost_node_lease_renewals_total{result=\"renewed\"}"
        ) >= 6.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "outpost_node_lease_renewals_total{result=\"skipped\"}"
        ),
        skipped_before,
        "{text}\n{}",
        hub.log_text()
    );
}

/// Two apiservers sharing one CA; the same pod on both.
async fn two_servers() -> (Cluster, FakeApiServer) {
    let cluster = Cluster::start().await;
    let second =
        FakeApiServer::start_with_pki(FakeConfig::default(), Arc::clone(cluster.fake.pki()))
            .await
            .unwrap();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]}
    });
    cluster.fake.create("v1/pods", pod.clone()).unwrap();
    second.create("v1/pods", pod).unwrap();
    (cluster, second)
}

fn with_servers(cluster: &Cluster, second: &FakeApiServer, extra: &[&str]) -> HubProcess {
    let mut args: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .filter(|a| !a.starts_with("--server-addr="))
        .collect();
    args.push(format!(
        "--server-addr={},{}",
        cluster.fake.url(),
        second.url()
    ));
    args.extend(extra.iter().map(|a| a.to_string()));
    HubProcess::spawn(&args)
}

async fn get_pod(hub: &HubProcess, ua: &str) -> (u16, Value) {
    let resp = get(hub.proxy, "/api/v1/namespaces/default/pods/p", ua).await;
    let body = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
    (resp.status, body)
}

async fn wait_for_online(hub: &HubProcess, online: bool, within: Duration) {
    until_metrics(hub, within, |text| {
        metric(text, "outpost_cloud_online") == f64::from(u8::from(online))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_fail_over_to_the_other_server_and_both_down_is_offline() {
    let (cluster, second) = two_servers().await;
    let hub = with_servers(&cluster, &second, &["--working-mode=cloud"]);
    // An uncached component: only failover, not the cache, can keep its reads working.
    let ua = "e2e-client/v1.0";
    for i in 0..40 {
        if i == 10 {
            cluster.fake.refuse_connections();
        }
        let (code, body) = get_pod(&hub, ua).await;
        assert_eq!(code, 200, "read {i} failed: {body}");
    }
    let text = metrics_text(&hub).await;
    assert!(text.contains("outpost_server_healthy{server=\""), "{text}");

    // Both down: offline within two intervals; cloud mode answers 503.
    second.refuse_connections();
    wait_for_online(&hub, false, Duration::from_secs(3)).await;
    let (code, body) = get_pod(&hub, ua).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["reason"], "ServiceUnavailable");
    // Cloud mode with no apiserver is not ready (once that has lasted two intervals).
    let ready = until_readyz(&hub, 500, "[-]cloud failed").await;
    assert!(ready.contains("0 of 2 apiservers healthy"), "{ready}");

    // Both back: online within two intervals (the healthy threshold is 2).
    cluster.fake.restore().await;
    second.restore().await;
    wait_for_online(&hub, true, Duration::from_secs(3)).await;
    assert_eq!(get_pod(&hub, ua).await.0, 200);
    until_readyz(&hub, 200, "[+]cloud ok").await;
}

/// A read the first server is too slow to answer goes to the other one at once, not to the slow
/// one again. The slow answer only has the first server suspected (a slow LIST is no outage);
/// the probes decide, and find this one silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_times_out_is_retried_on_the_other_server() {
    let (cluster, second) = two_servers().await;
    let hub = with_servers(
        &cluster,
        &second,
        &["--working-mode=cloud", "--lb-mode=priority"],
    );
    let ua = "e2e-client/v1.0";
    assert_eq!(get_pod(&hub, ua).await.0, 200);

    cluster.fake.blackhole();
    let started = Instant::now();
    let resp = get(
        hub.proxy,
        "/api/v1/namespaces/default/pods/p?timeout=2s",
        ua,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "one timeout, then the other server: {took:?}"
    );
    // The probes find the silent server out; the other keeps the hub online.
    let text = until_metrics(&hub, Duration::from_secs(15), |text| {
        text.lines()
            .any(|l| l.starts_with("outpost_server_healthy{") && l.ends_with(" 0"))
    })
    .await;
    assert!(text.contains("outpost_cloud_online 1"), "{text}");
    cluster.fake.restore().await;
}

/// Polls `/metrics` until `ok` holds for its text, for at most `within`.
async fn until_metrics(hub: &HubProcess, within: Duration, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = metrics_text(hub).await;
        if ok(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "never reached:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `/v1/readyz` (bounded) until it answers `code` with `needle` in its body.
async fn until_readyz(hub: &HubProcess, code: u16, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = get(hub.admin, "/v1/readyz", "test").await;
        let body = String::from_utf8_lossy(&resp.body).into_owned();
        if resp.status == code && body.contains(needle) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never {code} with {needle:?}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lesson 002: a hub whose RBAC is missing cannot read its configuration; readiness names it,
/// and recovers once the grant is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_a_configuration_it_cannot_read() {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .delete(
            "rbac.authorization.k8s.io/v1/clusterrolebindings",
            None,
            "outpost",
        )
        .expect("the e2e cluster carries the hub's binding");
    // Pool sharing's Role grants kube-system's ConfigMaps too (manifests/cluster/pool-sharing-rbac.yaml).
    cluster
        .fake
        .delete(
            "rbac.authorization.k8s.io/v1/rolebindings",
            Some("kube-system"),
            "outpost-leader-hub",
        )
        .expect("the e2e cluster carries the hub's pool-sharing binding");
    let hub = start_hub(&cluster, &[]);
    // At first "not read yet", then the reason the read fails.
    let body = until_readyz(&hub, 500, "403").await;
    assert!(body.contains("[-]config failed"), "{body}");
    assert!(body.contains("[+]cloud ok"), "{body}");

    let rbac = outpost_testkit::manifest::load_yaml(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../manifests/cluster/rbac.yaml"
    ))
    .unwrap();
    cluster.fake.apply_rbac(&rbac).unwrap();
    let body = until_readyz(&hub, 200, "[+]config ok").await;
    assert!(body.contains("readyz check passed"), "{body}");
}

/// At start-up the hub is not ready until its configuration (`yurt-hub-cfg`) is read: a check
/// that never passed gets no grace period (that grace is for flaps of a check that passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_configuration_at_start() {
    let cluster = Cluster::start().await;
    cluster.fake.delay_requests_under(
        "/api/v1/namespaces/kube-system/configmaps",
        Some(Duration::from_secs(4)),
    );
    // Slow probe rounds: a grace of two rounds (20 s) would cover the whole delay.
    let hub = start_hub(&cluster, &["--heartbeat-interval-seconds=10"]);
    let early = get(hub.admin, "/v1/readyz", "test").await;
    let body = String::from_utf8_lossy(&early.body).into_owned();
    assert_eq!(early.status, 500, "{body}");
    assert!(
        body.contains("[-]config failed: yurt-hub-cfg not read yet"),
        "{body}"
    );
    let body = until_readyz(&hub, 200, "[+]config ok").await;
    assert!(body.contains("readyz check passed"), "{body}");
}

/// Autonomy: kubelet's status PATCH while offline succeeds locally, kubelet reads its own status
/// back from the cache, and after reconnect the cloud's node carries it (newer data only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_node_status_reaches_the_cloud_after_reconnect() {
    let cluster = Cluster::start().await;
    let hub = start_hub(&cluster, &[]);
    let node_path = format!("/api/v1/nodes/{NODE}");
    assert_eq!(get(hub.proxy, &node_path, KUBELET_UA).await.status, 200);

    cluster.fake.refuse_connections();
    wait_for_online(&hub, false, Duration::from_secs(3)).await;
    let beat = "2030-01-01T00:00:00Z";
    let patch = json!({"status": {
        "$setElementOrder/conditions": [{"type": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status (offline)", "lastHeartbeatTime": beat}]
    }})
    .to_string();
    let resp = raw_http(
        hub.proxy,
        format!(
            "PATCH {node_path}/status HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nContent-Type: application/strategic-merge-patch+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{patch}",
            patch.len()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let ready = |node: &Value| {
        node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(ready(&resp.json())["lastHeartbeatTime"], beat);
    let reread = get(hub.proxy, &node_path, KUBELET_UA).await;
    assert_eq!(reread.status, 200);
    assert_eq!(
        ready(&reread.json())["lastHeartbeatTime"],
        beat,
        "kubelet reads its own status"
    );
    let cloud_before = cluster.fake.get("v1/nodes", None, NODE).unwrap();
    assert_ne!(ready(&cloud_before)["lastHeartbeatTime"], beat);

    cluster.fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let cloud = cluster.fake.get("v1/nodes", None, NODE).unwrap();
        if ready(&cloud)["lastHeartbeatTime"] == beat {
            let other_types = cloud["status"]["conditions"].as_array().unwrap().len();
            assert!(other_types >= 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cloud never got the offline status: {cloud}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Autonomy condition honours the recommended `autonomy-duration` annotation (yurthub only
/// reads the deprecated one) and follows the annotation when it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_autonomy_condition_follows_the_node_annotations() {
    let cluster = Cluster::start().await;
    let mut node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
    node["metadata"]["annotations"]["node.openyurt.io/autonomy-duration"] = json!("0");
    cluster.fake.update("v1/nodes", node).unwrap();
    let _hub = start_hub(&cluster, &[]);
    let autonomy = || {
        let node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
        node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Autonomy").cloned())
            .unwrap_or(Value::Null)
    };
    let wait_for = |status: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(5);
        while autonomy()["status"] != status {
            assert!(
                Instant::now() < deadline,
                "Autonomy never {status}: {}",
                autonomy()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    wait_for("True").await;
    assert_eq!(autonomy()["reason"], "autonomy enabled successfully");

    let mut node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
    node["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("node.openyurt.io/autonomy-duration");
    cluster.fake.update("v1/nodes", node).unwrap();
    wait_for("False").await;
    assert_eq!(autonomy()["reason"], "autonomy disabled");
}

/// A kubelet health endpoint answering whatever `code` holds; aborted by the caller.
async fn fake_kubelet_healthz(
    code: Arc<std::sync::atomic::AtomicU16>,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let code = code.load(std::sync::atomic::Ordering::SeqCst);
            let reply =
                format!("HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            let _ = conn.write_all(reply.as_bytes()).await;
        }
    });
    (addr, task)
}

fn renewed(text: &str) -> f64 {
    metric(
        text,
        "outpost_node_lease_renewals_total{result=\"renewed\"}",
    )
}

/// kubelet keeps calling while `for_how_long` passes.
async fn kubelet_calls_for(hub: &HubProcess, for_how_long: Duration) {
    let until = Instant::now() + for_how_long;
    while Instant::now() < until {
        kubelet_renews(hub).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// kubelet's health endpoint fails while kubelet keeps calling its lease: kubelet is alive and
/// reports its own conditions, so the hub keeps renewing (a vanilla node's lease would stay
/// fresh too), exports `outpost_kubelet_healthz_ok 0` and logs it. A kubelet that comes back
/// after a quiet period while its endpoint fails is not trusted: renewals resume only once the
/// endpoint answers OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_kubelet_healthz_with_lease_calls_keeps_renewing() {
    use std::sync::atomic::{AtomicU16, Ordering};
    let cluster = Cluster::start().await;
    let code = Arc::new(AtomicU16::new(200));
    let (healthz, server) = fake_kubelet_healthz(code.clone()).await;
    let url = format!("--kubelet-healthz-url=http://{healthz}/healthz");
    let hub = start_hub(&cluster, &["--kubelet-health-grace-period=3s", &url]);
    kubelet_calls_for(&hub, Duration::from_secs(2)).await;
    let before = renewed(&metrics_text(&hub).await);
    assert!(before >= 1.0, "renewing while healthy");

    code.store(500, Ordering::SeqCst);
    kubelet_calls_for(&hub, Duration::from_secs(3)).await;
    let text = metrics_text(&hub).await;
    assert_eq!(metric(&text, "outpost_kubelet_healthz_ok"), 0.0, "{text}");
    assert!(
        renewed(&text) >= before + 2.0,
        "lease calls continue, so do renewals: {text}"
    );
    assert!(
        hub.log_text()
            .contains("health endpoint fails while it keeps calling")
    );

    // Quiet past the grace period, then back with the endpoint still failing: no renewal.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let stopped = renewed(&metrics_text(&hub).await);
    kubelet_calls_for(&hub, Duration::from_secs(2)).await;
    assert_eq!(
        renewed(&metrics_text(&hub).await),
        stopped,
        "not trusted on return"
    );

    code.store(200, Ordering::SeqCst);
    kubelet_calls_for(&hub, Duration::from_secs(2)).await;
    assert!(
        renewed(&metrics_text(&hub).await) > stopped,
        "resumed once healthy"
    );
    server.abort();
}

/// A missing cloud lease is created by the heartbeat, owned by the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_creates_a_missing_lease_owned_by_the_node() {
    let cluster = Cluster::start().await;
    let lease_gvr = "coordination.k8s.io/v1/leases";
    kubelet_lease_deleted(&cluster, lease_gvr);
    let hub = start_hub(&cluster, &[]);
    // kubelet's own lease loop: the local copy is created by kubelet's POST.
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": NODE, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40}})
    .to_string();
    let created = raw_http(
        hub.proxy,
        format!(
            "POST {LEASE} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{lease}",
            lease.len()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let cloud = loop {
        if let Some(lease) = cluster.fake.get(lease_gvr, Some("kube-node-lease"), NODE) {
            break lease;
        }
        assert!(
            Instant::now() < deadline,
            "the heartbeat never created the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
    let owner = &cloud["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["name"], NODE);
    assert_eq!(owner["uid"], node["metadata"]["uid"]);
    assert_eq!(cloud["spec"]["holderIdentity"], NODE);
}

fn kubelet_lease_deleted(cluster: &Cluster, gvr: &str) {
    if cluster
        .fake
        .get(gvr, Some("kube-node-lease"), NODE)
        .is_some()
    {
        cluster
            .fake
            .delete(gvr, Some("kube-node-lease"), NODE)
            .unwrap();
    }
}
