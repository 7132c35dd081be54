//! The online proxy end to end: the real `outpost` binary between real clients (kubectl, kube-rs,
//! raw HTTP/1.1) and the TLS fake apiserver, which authenticates the hub by its node client
//! certificate and enforces the 1.32 node authorizer.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use support::{
    ADMIN_TOKEN, Cluster, HubProcess, NODE, assert_ok, eventually, get, hub_kubeconfig,
    kube_client, kubectl, raw_http,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
/// A component the edge cache does not serve, so upstream failures reach the client as such
/// (cache agents are answered from the cache instead: `e2e_edge.rs`).
const UNCACHED_UA: &str = "e2e-client/v1.0";

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "e2e"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_as_kubelet_through_the_hub() {
    let cluster = Cluster::start().await;
    cluster.fake.create("v1/pods", pod("mine-1", NODE)).unwrap();
    cluster
        .fake
        .create("v1/pods", pod("elsewhere", "edge-2"))
        .unwrap();
    let hub = cluster.start_hub();
    let client = kube_client(&hub, KUBELET_UA);

    // LIST scoped to this node passes the node authorizer, and sees only this node's pods.
    let pods: Api<Pod> = Api::all(client.clone());
    let scoped = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
    let names: Vec<String> = pods
        .list(&scoped)
        .await
        .expect("scoped list")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, vec!["mine-1".to_owned()]);

    // An unscoped list is refused upstream, and the apiserver's 403 Status reaches the client.
    let err = pods.list(&ListParams::default()).await.unwrap_err();
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected a 403 Status, got {other:?}"),
    }

    // WATCH: initial ADDED, then a live event arrives through the open stream.
    let wp = WatchParams::default()
        .fields(&format!("spec.nodeName={NODE}"))
        .timeout(20);
    let mut stream = pods.watch(&wp, "0").await.expect("watch").boxed();
    let first = next_event(&mut stream).await;
    assert!(
        matches!(first, WatchEvent::Added(ref p) if p.metadata.name.as_deref() == Some("mine-1"))
    );
    cluster.fake.create("v1/pods", pod("mine-2", NODE)).unwrap();
    let live = next_event(&mut stream).await;
    assert!(
        matches!(live, WatchEvent::Added(ref p) if p.metadata.name.as_deref() == Some("mine-2")),
        "{live:?}"
    );

    // Node status PATCH and lease update, as kubelet does.
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "kubelet is posting ready status"}]}});
    let patched = nodes
        .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("node status patch");
    assert!(
        patched
            .status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready")
    );
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut lease = leases.get(NODE).await.expect("lease get");
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(NODE.into());
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    let updated = leases
        .replace(NODE, &PostParams::default(), &lease)
        .await
        .expect("lease update");
    assert_ne!(
        updated.metadata.resource_version,
        lease.metadata.resource_version
    );

    // Upstream saw the node's certificate identity on every request, and kubelet's User-Agent
    // on every request it forwarded for kubelet (the hub's own, e.g. its yurt-hub-cfg watch,
    // say `outpost`).
    let log = cluster.fake.requests();
    let api_calls: Vec<_> = log.iter().filter(|r| r.path.starts_with("/api")).collect();
    let (own, forwarded): (Vec<_>, Vec<_>) = api_calls.into_iter().partition(|r| {
        r.user_agent
            .as_deref()
            .is_some_and(|ua| ua.starts_with("outpost"))
    });
    // list, refused list, watch, status patch, lease GET (which seeds the hub's local copy);
    // kubelet's lease PUT is answered by the hub in edge mode and never reaches the apiserver.
    assert!(forwarded.len() >= 5, "{log:?}");
    assert!(
        !forwarded
            .iter()
            .any(|r| r.resource == "leases" && r.method == "PUT"),
        "{log:?}"
    );
    for r in forwarded.iter().chain(&own) {
        assert_eq!(r.user, format!("system:node:{NODE}"), "{r:?}");
    }
    for r in forwarded {
        assert_eq!(r.user_agent.as_deref(), Some(KUBELET_UA), "{r:?}");
    }
}

async fn next_event(
    stream: &mut (impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
) -> WatchEvent<Pod> {
    // kube-rs asks for bookmarks; they carry no object change, so skip them as clients do.
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("event within 10s")
            .expect("stream ok")
            .expect("stream open");
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_as_the_node_through_the_hub() {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .create("v1/pods", pod("kubectl-pod", NODE))
        .unwrap();
    let hub = cluster.start_hub();
    let kc = hub_kubeconfig(cluster.dir.path(), &hub);

    let out = assert_ok(
        &kubectl(
            &kc,
            &[
                "get",
                "pods",
                "-A",
                "--field-selector",
                &format!("spec.nodeName={NODE}"),
                "-o",
                "name",
            ],
        ),
        "scoped pod list",
    );
    assert_eq!(out.trim(), "pod/kubectl-pod");

    let denied = kubectl(&kc, &["get", "pods", "-A"]);
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("forbidden") || stderr.contains("Forbidden"),
        "{stderr}"
    );

    let lease = assert_ok(
        &kubectl(
            &kc,
            &["get", "lease", "-n", "kube-node-lease", NODE, "-o", "json"],
        ),
        "lease get",
    );
    let lease: serde_json::Value = serde_json::from_str(&lease).unwrap();
    assert_eq!(lease["metadata"]["name"], NODE);

    // The node may patch its own Node object (kubectl GETs it first, then PATCHes).
    assert_ok(
        &kubectl(&kc, &["annotate", "node", NODE, "outpost.test/seen=yes"]),
        "node annotate",
    );
    let node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
    assert_eq!(node["metadata"]["annotations"]["outpost.test/seen"], "yes");

    // Lease delete and re-create with the node's own identity.
    assert_ok(
        &kubectl(&kc, &["delete", "lease", "-n", "kube-node-lease", NODE]),
        "lease delete",
    );
    assert!(
        cluster
            .fake
            .get(
                "coordination.k8s.io/v1/leases",
                Some("kube-node-lease"),
                NODE
            )
            .is_none()
    );
    let manifest = cluster.dir.path().join("lease.json");
    std::fs::write(
        &manifest,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": NODE, "namespace": "kube-node-lease"},
               "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40}})
        .to_string(),
    )
    .unwrap();
    assert_ok(
        &kubectl(
            &kc,
            &[
                "create",
                "--validate=false",
                "-f",
                manifest.to_str().unwrap(),
            ],
        ),
        "lease create",
    );
    assert!(
        cluster
            .fake
            .get(
                "coordination.k8s.io/v1/leases",
                Some("kube-node-lease"),
                NODE
            )
            .is_some()
    );
}

/// A caller with its own bearer token is forwarded with that token and without the node's
/// certificate. (kubectl cannot show this against `http://`: client-go never sends a token over
/// plain HTTP, so the requests are written by hand, as an in-cluster client would send them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_callers_keep_their_own_identity() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    cluster.fake.clear_requests();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "demo", "namespace": "default"}, "data": {"a": "b"}})
    .to_string();
    let base = "/api/v1/namespaces/default/configmaps";
    let created = bearer(&hub, "POST", base, "application/json", &cm).await;
    assert_eq!(
        created.status,
        201,
        "{:?}",
        String::from_utf8_lossy(&created.body)
    );
    let patched = bearer(
        &hub,
        "PATCH",
        &format!("{base}/demo"),
        "application/merge-patch+json",
        r#"{"data":{"a":"c"}}"#,
    )
    .await;
    assert_eq!(patched.status, 200);
    assert_eq!(patched.json()["data"]["a"], "c");
    let deleted = bearer(
        &hub,
        "DELETE",
        &format!("{base}/demo"),
        "application/json",
        "",
    )
    .await;
    assert_eq!(deleted.status, 200);
    assert!(
        cluster
            .fake
            .get("v1/configmaps", Some("default"), "demo")
            .is_none()
    );

    // The node itself may not write ConfigMaps: the same request without a token is refused.
    let as_node = raw_http(
        hub.proxy,
        format!(
            "POST {base} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{cm}",
            cm.len()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(as_node.status, 403);

    let users: Vec<String> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with(base))
        .map(|r| r.user)
        .collect();
    assert_eq!(
        users,
        vec!["admin", "admin", "admin", &format!("system:node:{NODE}")],
        "bearer requests must not carry the node certificate"
    );
}

async fn bearer(
    hub: &HubProcess,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> support::RawResponse {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: app/1.0\r\n\
         Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_http(hub.proxy, req.as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watch_sees_events_as_they_happen() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let kc = hub_kubeconfig(cluster.dir.path(), &hub);
    let mut child = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kc.display()))
        .arg(format!(
            "--cache-dir={}",
            cluster.dir.path().join("kc-watch").display()
        ))
        .args([
            "get",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={NODE}"),
            "-w",
            "-o",
            "name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watch");
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    // Let the initial list+watch settle, then change the world upstream.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster
        .fake
        .create("v1/pods", pod("watched", NODE))
        .unwrap();
    let seen = eventually(Duration::from_secs(15), || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.trim() == "pod/watched")
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen, "kubectl -w output: {:?}", lines.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_become_status_bodies() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let node_path = format!("/api/v1/nodes/{NODE}");

    let ok = get(hub.proxy, &node_path, UNCACHED_UA).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["metadata"]["name"], NODE);

    cluster.fake.refuse_connections();
    let down = get(hub.proxy, &node_path, UNCACHED_UA).await;
    assert_status(&down, 503, "ServiceUnavailable");
    cluster.fake.restore().await;
    // The server is healthy again after two good probes (one interval apart in these tests).
    let back = until_ok(&hub, &node_path).await;
    assert_eq!(back.status, 200);

    cluster.fake.blackhole();
    let slow = get(hub.proxy, &format!("{node_path}?timeout=1s"), UNCACHED_UA).await;
    assert_status(&slow, 504, "Timeout");
    cluster.fake.restore().await;
    until_ok(&hub, &node_path).await;

    // An upstream Status (here a 500) is relayed as the apiserver sent it.
    cluster.fake.fail_requests(Some(500));
    let failed = get(hub.proxy, &node_path, UNCACHED_UA).await;
    assert_eq!(failed.status, 500);
    assert_eq!(failed.json()["kind"], "Status");
    cluster.fake.restore().await;

    let metrics = get(hub.admin, "/metrics", "test").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("outpost_upstream_errors_total"), "{text}");
    assert!(text.contains(r#"kind="unreachable""#), "{text}");
    assert!(text.contains(r#"kind="timeout""#), "{text}");
}

/// In cloud mode too, a proxied watch ends once its apiserver turns unhealthy, instead of
/// hanging on a link that went silent
/// (`e2e_edge::an_online_watch_ends_when_its_apiserver_goes_silent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_mode_watch_ends_when_its_apiserver_goes_silent() {
    let cluster = Cluster::start().await;
    let mut args = cluster.hub_args();
    args.push("--working-mode=cloud".into());
    let hub = cluster.start_hub_with(&args);
    let pods: Api<Pod> = Api::all(kube_client(&hub, UNCACHED_UA));
    let fields = format!("spec.nodeName={NODE}");
    let list = pods
        .list(&ListParams::default().fields(&fields))
        .await
        .expect("list");
    let wp = WatchParams::default().fields(&fields).timeout(300);
    let mut watch = pods
        .watch(&wp, list.metadata.resource_version.as_deref().unwrap())
        .await
        .expect("watch")
        .boxed();

    cluster.fake.blackhole();
    let ended = support::ends_without_changes(&mut watch, Duration::from_secs(20)).await;
    cluster.fake.restore().await;
    assert!(
        ended,
        "the watch must end once its apiserver is unhealthy\n{}",
        hub.log_text()
    );
}

/// Retries `GET path` (bounded) until the hub answers 200: after an outage the server must pass
/// its probes again before the hub sends it requests.
async fn until_ok(hub: &HubProcess, path: &str) -> support::RawResponse {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let resp = get(hub.proxy, path, UNCACHED_UA).await;
        if resp.status == 200 {
            return resp;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} never recovered: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_status(resp: &support::RawResponse, code: u16, reason: &str) {
    assert_eq!(
        resp.status,
        code,
        "{:?}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["apiVersion"], "v1");
    assert_eq!(body["status"], "Failure");
    assert_eq!(body["code"], code);
    assert_eq!(body["reason"], reason, "{body}");
    assert!(!body["message"].as_str().unwrap_or_default().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_and_never_reach_upstream() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    cluster.fake.clear_requests();
    for path in [
        "/api/v1/pods?labelSelector=a%3D%3D%3Db",
        "/api/v1/pods?watch=perhaps",
        "/api/v1/pods?limit=-5",
        "/api/v1/pods?fieldSelector=%zz",
    ] {
        let resp = get(hub.proxy, path, KUBELET_UA).await;
        assert_status(&resp, 400, "BadRequest");
    }
    // Only the hub's own requests (start-up probe, config watch) may have reached the apiserver.
    let reached: Vec<_> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| !r.user_agent.as_deref().unwrap_or("").starts_with("outpost"))
        .collect();
    assert!(reached.is_empty(), "{reached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_watch_streams_end_instead_of_hanging() {
    let cluster = Cluster::start().await;
    cluster.fake.create("v1/pods", pod("p", NODE)).unwrap();
    let hub = cluster.start_hub();
    let path =
        format!("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3D{NODE}&timeoutSeconds=60");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nConnection: close\r\n\r\n"
    );
    let mut stream = tokio::net::TcpStream::connect(hub.proxy).await.unwrap();
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut first))
        .await
        .expect("headers and first event")
        .unwrap();
    let head = String::from_utf8_lossy(&first[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    cluster.fake.cut_watches();
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(
        ended.is_ok(),
        "the client stream must end when upstream cuts it"
    );
    // A cut stream must not look like a clean end: no terminating zero-length chunk.
    let tail = String::from_utf8_lossy(&rest);
    assert!(
        !tail.ends_with("0\r\n\r\n"),
        "cut stream ended cleanly: {tail:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let _ = get(hub.proxy, &format!("/api/v1/nodes/{NODE}"), KUBELET_UA).await;

    let health = get(hub.admin, "/v1/healthz", "probe").await;
    assert_eq!(
        (health.status, health.body.as_slice()),
        (200, b"OK".as_slice())
    );
    // Ready once its side data (the filters' Services and NodePools) is read: a few
    // milliseconds after the start, which a probe may come before.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ready = loop {
        let ready = get(hub.admin, "/v1/readyz?verbose", "probe").await;
        if ready.status == 200 || std::time::Instant::now() >= deadline {
            break ready;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        ready.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&ready.body),
        hub.log_text()
    );
    assert!(String::from_utf8_lossy(&ready.body).contains("[+]certificate ok"));
    let verbose = get(hub.admin, "/v1/readyz?verbose", "probe").await;
    assert!(String::from_utf8_lossy(&verbose.body).contains("system:node:edge-1"));

    let metrics = get(hub.admin, "/metrics", "probe").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"outpost_requests_total{code="200",component="kubelet",resource="nodes",verb="get"} 1"#),
        "{text}"
    );
    let sample = |series: &str| -> f64 {
        support::sample(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    let bytes = sample(
        r#"outpost_proxied_response_bytes_total{component="kubelet",resource="nodes",subresource="",verb="get"}"#,
    );
    assert!(bytes > 100.0, "{bytes}");
    assert!(text.contains("outpost_in_flight_requests"));
    assert!(text.contains("outpost_request_duration_seconds_bucket"));

    // yurthub's names, for the dashboards and alerts written for it.
    assert_eq!(
        sample(
            r#"node_yurthub_proxy_traffic_collector{client="kubelet",resource="nodes",subresources="",verb="get"}"#
        ),
        bytes
    );
    let server = cluster.fake.url();
    assert_eq!(
        sample(&format!(
            r#"node_yurthub_server_healthy_status{{server="{}"}}"#,
            server.trim_end_matches('/')
        )),
        1.0
    );
    assert_eq!(sample("node_yurthub_in_flight_requests_total"), 0.0);
    // A watch stays in flight while its stream is open.
    let watch = open_pod_watch(&hub).await;
    let metrics = get(hub.admin, "/metrics", "probe").await;
    let watching = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        watching.contains(r#"node_yurthub_in_flight_requests_collector{client="kubelet",resource="pods",subresources="",verb="watch"} 1"#)
            && watching.contains("node_yurthub_in_flight_requests_total 1"),
        "{watching}"
    );
    drop(watch);
    assert_eq!(sample("node_yurthub_error_keys_persistency_status"), 1.0);
    // The process collector yurthub's registry has too.
    assert!(sample("process_resident_memory_bytes") > 1e6);
    assert!(sample("process_open_fds") > 3.0);
    assert!(
        text.lines().any(|l| l.starts_with("openyurt_version_info{")
            && l.contains(r#"component_name="yurthub""#)
            && l.ends_with(" 1")),
        "{text}"
    );
}

/// exec/attach/port-forward: the hub forwards the upgrade and splices both directions.
/// kubelet's watch of its pods, open (headers read) on a raw socket.
async fn open_pod_watch(hub: &HubProcess) -> tokio::net::TcpStream {
    let mut watch = tokio::net::TcpStream::connect(hub.proxy).await.unwrap();
    let req = format!(
        "GET /api/v1/pods?watch=true&fieldSelector=spec.nodeName%3D{NODE} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\n\r\n"
    );
    watch.write_all(req.as_bytes()).await.unwrap();
    let head = support::read_head(&mut watch).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    watch
}

/// The value of `series` on the hub's `/metrics` (0 when absent).
async fn metric(hub: &HubProcess, series: &str) -> f64 {
    support::sample(&support::metrics_text(hub).await, series).unwrap_or(0.0)
}

/// yurthub's `node_yurthub_closable_conns_collector`: the open connections to each apiserver,
/// counted when made and again when closed, over HTTP/1.1 (`--disable-http2`) and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_upstream_connections_are_counted() {
    for http1 in [true, false] {
        upstream_connections_are_counted(http1).await;
    }
}

async fn upstream_connections_are_counted(http1: bool) {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub_with_flags(&[&format!("--disable-http2={http1}")]);
    let server = cluster.fake.url().trim_end_matches('/').to_owned();
    let yurthub = format!(r#"node_yurthub_closable_conns_collector{{server="{server}"}}"#);
    let outpost = format!(r#"outpost_upstream_connections{{server="{server}"}}"#);

    // Over HTTP/1.1 a watch holds one connection, so the GET beside it needs another; over
    // HTTP/2 both share one.
    let watch = open_pod_watch(&hub).await;
    let node = get(hub.proxy, &format!("/api/v1/nodes/{NODE}"), KUBELET_UA).await;
    assert_eq!(node.status, 200);
    // Both names from one scrape: the hub's own tasks open and close connections beside the test.
    let text = support::metrics_text(&hub).await;
    let open = support::sample(&text, &yurthub).unwrap_or(0.0);
    if http1 {
        assert!(open >= 2.0, "{yurthub} = {open}");
    } else {
        assert_eq!(open, 1.0, "{yurthub} over HTTP/2");
    }
    assert_eq!(support::sample(&text, &outpost), Some(open), "{text}");

    // The apiserver drops every connection: none is counted any more.
    cluster.fake.refuse_connections();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&hub, &yurthub).await != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "closed connections still counted: {}",
            metric(&hub, &yurthub).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(watch);
    cluster.fake.restore().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_requests_are_tunnelled_both_ways() {
    let cluster = Cluster::start().await;
    cluster.fake.create("v1/pods", pod("p", NODE)).unwrap();
    let hub = cluster.start_hub();
    let req = "POST /api/v1/namespaces/default/pods/p/exec?command=cat&stdin=true&stdout=true HTTP/1.1\r\n\
               Host: x\r\nUser-Agent: kubectl/v1.32.4\r\nAuthorization: Bearer admin-token-for-tests\r\n\
               Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
               X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n";
    let mut stream = tokio::net::TcpStream::connect(hub.proxy).await.unwrap();
    stream.write_all(req.as_bytes()).await.unwrap();
    let head = support::read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: spdy/3.1"),
        "{head}"
    );
    support::assert_echoes(&mut stream).await;
    let r = cluster
        .fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/exec"))
        .expect("exec reached upstream");
    assert_eq!(r.user, "admin");
}

/// An upstream that completes TLS and then answers with bytes that are not HTTP → 502 Status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_upstream_is_a_502() {
    let cluster = Cluster::start().await;
    let garbage = garbage_tls_server(&cluster).await;
    let mut args = cluster.hub_args();
    args.retain(|a| !a.starts_with("--server-addr="));
    args.push(format!("--server-addr=https://{garbage}"));
    let hub = HubProcess::spawn(&args);
    let resp = raw_http(
        hub.proxy,
        format!("GET /api/v1/nodes/{NODE} HTTP/1.1\r\nHost: x\r\nUser-Agent: {UNCACHED_UA}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert_status(&resp, 502, "InternalError");
}

async fn garbage_tls_server(cluster: &Cluster) -> std::net::SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let pki = cluster.fake.pki();
    let certs = CertificateDer::pem_slice_iter(pki.server.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.server.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let mut buf = [0u8; 1024];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls.write_all(b"SSH-2.0-definitely-not-http\r\n\r\n").await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    addr
}

/// The issue's reference set-up: the apiserver refuses TLS handshakes without a client
/// certificate; kubectl, with no credentials of its own, gets through only thanks to the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_an_apiserver_that_demands_client_certificates() {
    let cluster = Cluster::start_with(outpost_testkit::FakeConfig {
        require_client_cert: true,
        ..Default::default()
    })
    .await;
    let hub = cluster.start_hub();
    let kc = hub_kubeconfig(cluster.dir.path(), &hub);
    let node = assert_ok(
        &kubectl(
            &kc,
            &["get", "node", NODE, "-o", "jsonpath={.metadata.name}"],
        ),
        "get node through the hub",
    );
    assert_eq!(node, NODE);

    // Without the hub, a client that has no certificate cannot even complete the handshake.
    let direct = cluster.dir.path().join("direct.kubeconfig");
    std::fs::write(
        &direct,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             users:\n- name: u\n  user: {{}}\ncurrent-context: c\n",
            cluster.fake.url()
        ),
    )
    .unwrap();
    let refused = kubectl(&direct, &["get", "node", NODE]);
    assert!(
        !refused.status.success(),
        "direct access without a certificate must fail"
    );
}

/// kubelet rotates its client certificate in place (a new file, the symlink re-pointed). The
/// hub presents the new one without a restart, also when it started with an expired one;
/// yurthub reloads only after expiry, by which time the node has been failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_kubelet_certificate_is_picked_up_without_a_restart() {
    let cluster = Cluster::start().await;
    let user = format!("system:node:{NODE}");
    let pki = cluster.fake.pki().clone();
    let expired = pki.expired_client(&user, &["system:nodes"]).unwrap();
    std::fs::write(&cluster.node_files.client_pem, expired.combined_pem()).unwrap();
    let hub = cluster.start_hub();
    let path = format!("/api/v1/nodes/{NODE}");
    let before = get(hub.proxy, &path, UNCACHED_UA).await;
    assert!(
        matches!(before.status, 401 | 503),
        "an expired certificate cannot succeed: {}",
        before.status
    );

    let rotated = pki.client(&user, &["system:nodes", "rotated"]).unwrap();
    let staged = cluster.dir.path().join("pki/kubelet-client-rotated.pem");
    std::fs::write(&staged, rotated.combined_pem()).unwrap();
    std::fs::rename(&staged, &cluster.node_files.client_pem).unwrap();

    let mut after = before;
    for _ in 0..150 {
        after = get(hub.proxy, &path, UNCACHED_UA).await;
        if after.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(after.status, 200, "log:\n{}", hub.log_text());
    let seen = cluster.fake.requests();
    let last = seen
        .iter()
        .rev()
        .find(|r| r.resource == "nodes" && r.user_agent.as_deref() == Some(UNCACHED_UA))
        .unwrap();
    assert!(last.groups.iter().any(|g| g == "rotated"), "{last:?}");
    let metrics =
        String::from_utf8_lossy(&get(hub.admin, "/metrics", "test").await.body).into_owned();
    let expiry: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("outpost_client_certificate_expiry_timestamp_seconds{"))
        .collect();
    assert_eq!(expiry.len(), 1, "{expiry:?}");
    assert!(hub.log_text().contains("client certificate rotated"));
    assert!(hub.terminate().success());
}
