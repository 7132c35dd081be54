//! Edge mode end to end: the real `outpost` binary caching what kubelet-like clients read into
//! sled on disk, serving it with Kubernetes semantics when the fake apiserver goes away (also
//! after a restart), and converging when it returns.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Cluster, HubProcess, NODE, get, raw_http};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
/// What kubelet really sends.
const KUBELET_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";

fn pod(name: &str, node: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    })
}

/// `GET` with kubelet's real headers.
async fn kubelet_get(hub: &HubProcess, path: &str) -> support::RawResponse {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nAccept: {KUBELET_ACCEPT}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
    );
    raw_http(hub.proxy, req.as_bytes()).await
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn served_from_cache(resp: &support::RawResponse) -> bool {
    resp.header("x-outpost-served-from") == Some("edge-cache")
}

/// Polls until the hub answers `path` from its cache (the writer applies asynchronously).
async fn until_cached(hub: &HubProcess, path: &str) -> support::RawResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = kubelet_get(hub, path).await;
        if resp.status == 200 && served_from_cache(&resp) {
            return resp;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never served from cache: {} {}\n{}",
            resp.status,
            String::from_utf8_lossy(&resp.body),
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_get_and_list_follow_kubernetes_semantics() {
    let cluster = Cluster::start().await;
    for (name, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        cluster
            .fake
            .create("v1/pods", pod(name, NODE, app))
            .unwrap();
    }
    let hub = cluster.start_hub();
    let node_path = format!("/api/v1/nodes/{NODE}");
    let pods_path =
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit=500&resourceVersion=0");

    let online = kubelet_get(&hub, &node_path).await;
    assert_eq!(online.status, 200);
    assert_eq!(
        online.header("content-type"),
        Some("application/json"),
        "kubelet accepts JSON as well as protobuf; the hub asks for JSON"
    );
    let online_list = kubelet_get(&hub, &pods_path).await;
    assert_eq!(online_list.status, 200);
    assert_eq!(names(&online_list.json()), ["a", "b", "c"]);
    let list_rv = online_list.json()["metadata"]["resourceVersion"].clone();

    cluster.fake.refuse_connections();
    let node = until_cached(&hub, &node_path).await;
    assert_eq!(node.json()["metadata"]["name"], NODE);
    assert_eq!(node.json()["kind"], "Node");

    let list = until_cached(&hub, &pods_path).await;
    let list = list.json();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["metadata"]["resourceVersion"], list_rv);
    assert_eq!(names(&list), ["a", "b", "c"]);

    // A label selector the cache never saw is evaluated on the cached objects.
    let web = kubelet_get(
        &hub,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&labelSelector=app%3Dweb"),
    )
    .await;
    assert_eq!(web.status, 200, "{}", String::from_utf8_lossy(&web.body));
    assert_eq!(names(&web.json()), ["a", "c"]);
    let not_web = kubelet_get(
        &hub,
        &format!("/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3D{NODE}&labelSelector=app+notin+%28web%29"),
    )
    .await;
    assert_eq!(names(&not_web.json()), ["b"]);

    // Paging: limit/continue walk the list once.
    let first = kubelet_get(&hub, &format!("{pods_path}&limit=2"))
        .await
        .json();
    assert_eq!(names(&first), ["a", "b"]);
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("continue token");
    let second = kubelet_get(
        &hub,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit=2&continue={token}"),
    )
    .await
    .json();
    assert_eq!(names(&second), ["c"]);
    assert!(second["metadata"].get("continue").is_none());

    // GET of a pod known only from the list; a pod never seen is a 404 Status.
    let a = kubelet_get(&hub, "/api/v1/namespaces/default/pods/a").await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.json()["kind"],
        "Pod",
        "list items are served as whole objects"
    );
    let missing = kubelet_get(&hub, "/api/v1/namespaces/default/pods/zz").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["reason"], "NotFound");

    // A list nobody cached is a 503 Status, never an empty list.
    let unknown = kubelet_get(&hub, "/api/v1/configmaps").await;
    assert_eq!(unknown.status, 503);
    assert_eq!(unknown.json()["kind"], "Status");

    // Writes are refused with a Status saying why, never faked.
    let patch = raw_http(
        hub.proxy,
        format!("PATCH /api/v1/namespaces/default/pods/a HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nContent-Type: application/merge-patch+json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes(),
    )
    .await;
    assert_eq!(patch.status, 503);
    assert_eq!(patch.json()["reason"], "ServiceUnavailable");

    let ready = get(hub.admin, "/v1/readyz", "test").await;
    let text = String::from_utf8_lossy(&ready.body).into_owned();
    assert_eq!(ready.status, 200, "{text}");
    assert!(
        text.contains("[+]cloud degraded: offline, serving from cache"),
        "{text}"
    );

    // Protobuf-only clients are never handed JSON they did not ask for.
    let proto_only = raw_http(
        hub.proxy,
        format!("GET {node_path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nAccept: application/vnd.kubernetes.protobuf\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(proto_only.status, 503);
    assert_ne!(
        proto_only.header("x-outpost-served-from"),
        Some("edge-cache")
    );

    cluster.fake.restore().await;
    wait_online(&hub).await;
    let fresh = kubelet_get(&hub, &node_path).await;
    assert_eq!(fresh.status, 200);
    assert!(
        !served_from_cache(&fresh),
        "online again: answered by the cloud"
    );
}

/// Waits (bounded) until readyz no longer reports the hub offline.
async fn wait_online(hub: &HubProcess) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ready = get(hub.admin, "/v1/readyz", "test").await;
        if !String::from_utf8_lossy(&ready.body).contains("offline") {
            return;
        }
        assert!(Instant::now() < deadline, "hub stayed offline");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
