//! Edge mode end to end: the real `outpost` binary caching what kubelet-like clients read into
//! sled on disk, serving it with Kubernetes semantics when the fake apiserver goes away (also
//! after a restart), and converging when it returns.

mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use support::{
    Cluster, HubProcess, KUBELET_UA, NODE, assert_ok, cluster_with_pods, ends_without_changes,
    eventually, get, hub_kubeconfig, kube_client, kubectl, kubelet_get, metrics_text, pod,
    raw_http, sample, served_from_cache, stdout, until_cached, until_durable, wait_online,
};

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_get_and_list_follow_kubernetes_semantics() {
    let cluster = Cluster::start().await;
    for (name, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut pod = pod(name, NODE, app);
        // An optional ConfigMap that does not exist (the node authorizer lets kubelet read it).
        pod["spec"]["volumes"] =
            json!([{"name": "v", "configMap": {"name": "absent", "optional": true}}]);
        cluster.fake.create("v1/pods", pod).unwrap();
    }
    let hub = cluster.start_hub();
    let node_path = format!("/api/v1/nodes/{NODE}");
    let pods_path =
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit=500&resourceVersion=0");

    let online = kubelet_get(hub.proxy, &node_path).await;
    assert_eq!(online.status, 200);
    assert_eq!(
        online.header("content-type"),
        Some("application/json"),
        "kubelet accepts JSON as well as protobuf; the hub asks for JSON"
    );
    let online_list = kubelet_get(hub.proxy, &pods_path).await;
    assert_eq!(online_list.status, 200);
    // kubelet's per-object reflector of a ConfigMap that does not exist: an empty list.
    let absent_cm = "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dabsent&limit=500&resourceVersion=0";
    let empty = kubelet_get(hub.proxy, absent_cm).await;
    assert_eq!(
        empty.json()["items"],
        json!([]),
        "{}",
        String::from_utf8_lossy(&empty.body)
    );
    assert_eq!(names(&online_list.json()), ["a", "b", "c"]);
    let list_rv = online_list.json()["metadata"]["resourceVersion"].clone();

    // A resourceVersion that is not a number: the cloud's answer, to compare offline.
    let bad_rv = [
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&resourceVersion=abc"),
        format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&resourceVersion=abc&watch=true"),
    ];
    let mut cloud_said = Vec::new();
    for path in &bad_rv {
        let resp = kubelet_get(hub.proxy, path).await;
        cloud_said.push((resp.status, resp.json()["message"].clone()));
    }
    assert_eq!(cloud_said[0].0, 400);

    cluster.fake.refuse_connections();
    let node = until_cached(&hub, &node_path).await;
    assert_eq!(node.json()["metadata"]["name"], NODE);
    assert_eq!(node.json()["kind"], "Node");

    let listed = until_cached(&hub, &pods_path).await;
    let relisted = kubelet_get(hub.proxy, &pods_path).await;
    assert_eq!(
        relisted.body, listed.body,
        "an unchanged cache: the same answer"
    );
    // Whole answers declare their length, as the apiserver's do (no chunked framing), whether
    // read from the store or reused from memory.
    for resp in [&node, &listed, &relisted] {
        let length = resp.body.len().to_string();
        assert_eq!(resp.header("content-length"), Some(length.as_str()));
        assert_eq!(resp.header("transfer-encoding"), None);
    }
    let list = listed.json();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["metadata"]["resourceVersion"], list_rv);
    assert_eq!(names(&list), ["a", "b", "c"]);

    // A label selector the cache never saw is evaluated on the cached objects.
    let web = kubelet_get(
        hub.proxy,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&labelSelector=app%3Dweb"),
    )
    .await;
    assert_eq!(web.status, 200, "{}", String::from_utf8_lossy(&web.body));
    assert_eq!(names(&web.json()), ["a", "c"]);
    let not_web = kubelet_get(
        hub.proxy,
        &format!("/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3D{NODE}&labelSelector=app+notin+%28web%29"),
    )
    .await;
    assert_eq!(names(&not_web.json()), ["b"]);

    // Paging: limit/continue walk the list once. From resourceVersion=0 ("any") the list is
    // served whole, as the apiserver's watch cache does (`pods_path` carries limit=500).
    let whole = kubelet_get(hub.proxy, &pods_path.replace("limit=500", "limit=2"))
        .await
        .json();
    assert_eq!(names(&whole), ["a", "b", "c"]);
    assert!(whole["metadata"].get("continue").is_none());
    let first = kubelet_get(
        hub.proxy,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit=2"),
    )
    .await
    .json();
    assert_eq!(names(&first), ["a", "b"]);
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("continue token");
    let second = kubelet_get(
        hub.proxy,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit=2&continue={token}"),
    )
    .await
    .json();
    assert_eq!(names(&second), ["c"]);
    assert!(second["metadata"].get("continue").is_none());

    // GET of a pod known only from the list.
    let a = kubelet_get(hub.proxy, "/api/v1/namespaces/default/pods/a").await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.json()["kind"],
        "Pod",
        "list items are served as whole objects"
    );
    // An object the cache lacks is NotFound only where a cached list says it did not exist
    // (kubelet's per-name ConfigMap list came back empty); otherwise the cache cannot know.
    let gone = until_cached(&hub, absent_cm).await;
    assert_eq!(gone.json()["items"], json!([]));
    let missing = kubelet_get(hub.proxy, "/api/v1/namespaces/default/configmaps/absent").await;
    assert_eq!(
        missing.status,
        404,
        "{}",
        String::from_utf8_lossy(&missing.body)
    );
    assert_eq!(missing.json()["reason"], "NotFound");
    let unknown = kubelet_get(hub.proxy, "/api/v1/namespaces/default/pods/zz").await;
    assert_eq!(
        (unknown.status, &unknown.json()["reason"]),
        (503, &json!("ServiceUnavailable")),
        "no cached list covers pod zz: {}",
        String::from_utf8_lossy(&unknown.body)
    );

    // The same validation as the cloud's, for a list and a watch alike.
    for (path, cloud) in bad_rv.iter().zip(&cloud_said) {
        let resp = kubelet_get(hub.proxy, path).await;
        assert_eq!(
            &(resp.status, resp.json()["message"].clone()),
            cloud,
            "{path}"
        );
    }

    // A list nobody cached is a 503 Status, never an empty list.
    let unknown = kubelet_get(hub.proxy, "/api/v1/configmaps").await;
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
    let fresh = kubelet_get(hub.proxy, &node_path).await;
    assert_eq!(fresh.status, 200);
    assert!(
        !served_from_cache(&fresh),
        "online again: answered by the cloud"
    );
}

fn node_pods(hub: &HubProcess) -> (Api<Pod>, String) {
    (
        Api::all(kube_client(hub, KUBELET_UA)),
        format!("spec.nodeName={NODE}"),
    )
}

/// The next event of a watch stream, bounded in time.
async fn next_event<S>(stream: &mut S) -> WatchEvent<Pod>
where
    S: futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(15), stream.next())
        .await
        .expect("an event within 15 s")
        .expect("the stream is open")
        .expect("a decodable event")
}

fn event_name(event: &WatchEvent<Pod>) -> (String, String) {
    match event {
        WatchEvent::Added(p) => ("ADDED".into(), p.name_any()),
        WatchEvent::Modified(p) => ("MODIFIED".into(), p.name_any()),
        WatchEvent::Deleted(p) => ("DELETED".into(), p.name_any()),
        WatchEvent::Bookmark(b) => ("BOOKMARK".into(), b.metadata.resource_version.clone()),
        WatchEvent::Error(e) => ("ERROR".into(), e.code.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_watch_is_a_real_stream() {
    let cluster = cluster_with_pods(&["a", "b"]).await;
    let hub = cluster.start_hub();
    let (pods, fields) = node_pods(&hub);
    let list = pods
        .list(&ListParams::default().fields(&fields))
        .await
        .expect("online list");
    let list_rv = list.metadata.resource_version.clone().unwrap();

    // Online: a watch from the list's version sees two changes, and the hub caches them.
    let wp = WatchParams::default().fields(&fields).timeout(60);
    let mut online = pods.watch(&wp, &list_rv).await.unwrap().boxed();
    for label in ["changed", "changed-again"] {
        let mut changed = cluster.fake.get("v1/pods", Some("default"), "a").unwrap();
        changed["metadata"]["labels"]["app"] = json!(label);
        cluster.fake.update("v1/pods", changed).unwrap();
        assert_eq!(
            event_name(&next_event(&mut online).await),
            ("MODIFIED".into(), "a".into())
        );
    }

    cluster.fake.refuse_connections();
    cluster.fake.cut_watches();
    drop(online);
    until_cached(
        &hub,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"),
    )
    .await;

    // Offline, from the list's version: the cached changes are replayed as the object's latest
    // version (what a reflector keeps), then bookmarks follow.
    let mut replay = pods
        .watch(&wp, &list_rv)
        .await
        .expect("offline watch")
        .boxed();
    let first = next_event(&mut replay).await;
    assert_eq!(event_name(&first), ("MODIFIED".into(), "a".into()));
    let WatchEvent::Modified(a) = first else {
        unreachable!()
    };
    assert_eq!(a.labels()["app"], "changed-again");
    assert_eq!(event_name(&next_event(&mut replay).await).0, "BOOKMARK");

    // Offline, from "0": the current state as ADDED events.
    let mut fresh = pods
        .watch(&wp, "0")
        .await
        .expect("offline watch from 0")
        .boxed();
    let mut added = vec![
        event_name(&next_event(&mut fresh).await),
        event_name(&next_event(&mut fresh).await),
    ];
    added.sort();
    assert_eq!(
        added,
        [("ADDED".into(), "a".into()), ("ADDED".into(), "b".into())]
    );

    // A version older than the cache can replay: 410 Expired, as the apiserver answers.
    let mut old = pods
        .watch(&wp, "1")
        .await
        .expect("offline watch from 1")
        .boxed();
    assert_eq!(
        event_name(&next_event(&mut old).await),
        ("ERROR".into(), "410".into())
    );

    // The cloud returns: open offline watches end, so clients go back to the cloud.
    cluster.fake.restore().await;
    assert!(
        ends_without_changes(&mut replay, Duration::from_secs(10)).await,
        "the offline watch must end when the cloud is back"
    );
}

/// kubelet's pods listed through the hub, then watched from the list's version (a long watch);
/// the stream and its parameters.
async fn list_then_watch(
    hub: &HubProcess,
) -> (
    impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
    WatchParams,
) {
    let (pods, fields) = node_pods(hub);
    let list = pods
        .list(&ListParams::default().fields(&fields))
        .await
        .expect("online list");
    let wp = WatchParams::default().fields(&fields).timeout(300);
    let watch = pods
        .watch(&wp, list.metadata.resource_version.as_deref().unwrap())
        .await
        .expect("online watch")
        .boxed();
    (watch, wp)
}

/// An online watch ends as soon as its apiserver turns unhealthy: a link that went silent
/// sends no FIN, and yurthub's watch hangs on it until its timeout (openyurt#2792), missing
/// whatever changes after the link returns. Here the client watches again at once, the cache
/// answers from where it was, and that offline watch ends when the cloud is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_watch_ends_when_its_apiserver_goes_silent() {
    let cluster = cluster_with_pods(&["a", "b"]).await;
    let hub = cluster.start_hub();
    let (mut online, wp) = list_then_watch(&hub).await;
    let (pods, _) = node_pods(&hub);
    let mut changed = cluster.fake.get("v1/pods", Some("default"), "a").unwrap();
    changed["metadata"]["labels"]["app"] = json!("changed");
    cluster.fake.update("v1/pods", changed).unwrap();
    let WatchEvent::Modified(a) = next_event(&mut online).await else {
        panic!("expected the change of a");
    };
    let seen_rv = a.resource_version().unwrap();

    cluster.fake.blackhole();
    let went_silent = Instant::now();
    assert!(
        ends_without_changes(&mut online, Duration::from_secs(20)).await,
        "the watch must end once its apiserver is unhealthy\n{}",
        hub.log_text()
    );
    let took = went_silent.elapsed();

    // Watched again from the last version seen: the cache answers and has nothing newer.
    let mut offline = pods
        .watch(&wp, &seen_rv)
        .await
        .expect("offline watch")
        .boxed();
    assert_eq!(event_name(&next_event(&mut offline).await).0, "BOOKMARK");
    cluster.fake.restore().await;
    assert!(
        ends_without_changes(&mut offline, Duration::from_secs(15)).await,
        "the offline watch must end when the cloud is back"
    );
    eprintln!("the online watch ended {took:?} after the apiserver went silent");
}

/// A hub whose probe rounds are a minute apart: within a test only a probe that a failed request
/// triggers can change a server's state.
fn start_hub_with_slow_rounds(cluster: &Cluster) -> HubProcess {
    let mut args = cluster.hub_args();
    args.retain(|a| !a.starts_with("--heartbeat-interval-seconds"));
    args.push("--heartbeat-interval-seconds=60".into());
    cluster.start_hub_with(&args)
}

/// After time for the probe a failed request triggered: the hub is still online, its open pod
/// `watch` gets the next change, and a node GET comes from the cloud, not the cache.
async fn still_online_and_watching(
    cluster: &Cluster,
    hub: &HubProcess,
    watch: &mut (impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ready = get(hub.admin, "/v1/readyz", "test").await;
    assert!(
        !String::from_utf8_lossy(&ready.body).contains("offline"),
        "{}\n{}",
        String::from_utf8_lossy(&ready.body),
        hub.log_text()
    );
    let mut changed = cluster.fake.get("v1/pods", Some("default"), "a").unwrap();
    changed["metadata"]["labels"]["app"] = json!("changed");
    cluster.fake.update("v1/pods", changed).unwrap();
    let change = loop {
        match next_event(watch).await {
            WatchEvent::Bookmark(_) => continue,
            event => break event_name(&event),
        }
    };
    assert_eq!(change, ("MODIFIED".into(), "a".into()), "the watch goes on");
    let node = kubelet_get(hub.proxy, &format!("/api/v1/nodes/{NODE}")).await;
    assert_eq!(node.status, 200);
    assert!(!served_from_cache(&node), "online, from the cloud");
}

/// kube-apiserver answers 503 for an aggregated API whose backend is down (`metrics.k8s.io`
/// without metrics-server) and serves everything else. Such answers are relayed and the server
/// stays healthy: open watches go on and nothing is served from the cache. A server that
/// answers 503 to everything, `/readyz` included (a load balancer with no backend), is found out
/// by the probe the answer triggers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_from_an_aggregated_api_is_not_an_outage() {
    const CLIENT: &str = "e2e-client/v1.0";
    let cluster = cluster_with_pods(&["a"]).await;
    let hub = start_hub_with_slow_rounds(&cluster);
    let (mut watch, _) = list_then_watch(&hub).await;

    cluster
        .fake
        .fail_requests_under("/apis/metrics.k8s.io", Some(503));
    for _ in 0..3 {
        let metrics = get(hub.proxy, "/apis/metrics.k8s.io/v1beta1/nodes", CLIENT).await;
        assert_eq!(metrics.status, 503, "relayed as the apiserver answered");
    }
    still_online_and_watching(&cluster, &hub, &mut watch).await;

    cluster.fake.fail_requests(Some(503));
    let down = get(hub.proxy, &format!("/api/v1/nodes/{NODE}"), CLIENT).await;
    assert_eq!(down.status, 503);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = get(hub.admin, "/v1/readyz", "test").await;
        if String::from_utf8_lossy(&ready.body).contains("offline") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a server answering 503 to everything stayed healthy"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.fake.restore().await;
}

/// A healthy apiserver that fails one read (a 500, or no answer within the request's deadline)
/// is not an outage: for an object the cache does not hold, kubelet gets the upstream's answer
/// (or the timeout), never a 404 "served from the edge cache" that would tell it the object is
/// gone. An object the cache holds is still answered from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_of_an_uncached_object_is_never_a_404_from_the_cache() {
    let cluster = cluster_with_pods(&["a"]).await;
    let hub = start_hub_with_slow_rounds(&cluster);
    let cached = "/api/v1/namespaces/default/pods/a";
    let uncached = "/api/v1/namespaces/default/configmaps/settings";
    assert_eq!(kubelet_get(hub.proxy, cached).await.status, 200);
    until_durable(&hub, &[r#"op="object",outcome="stored""#]).await;

    cluster
        .fake
        .fail_requests_under("/api/v1/namespaces/default", Some(500));
    let failed = kubelet_get(hub.proxy, uncached).await;
    assert_eq!(
        (failed.status, failed.json()["reason"].clone()),
        (500, json!("InternalError")),
        "the upstream's answer: {}",
        String::from_utf8_lossy(&failed.body)
    );
    assert!(!served_from_cache(&failed));
    let from_cache = kubelet_get(hub.proxy, cached).await;
    assert_eq!(from_cache.status, 200);
    assert!(served_from_cache(&from_cache), "the cache holds this one");

    // No headers within the deadline (the request's timeout less the cache's margin).
    cluster
        .fake
        .fail_requests_under("/api/v1/namespaces/default", None);
    cluster.fake.delay_requests_under(
        "/api/v1/namespaces/default/configmaps",
        Some(Duration::from_secs(8)),
    );
    let slow = kubelet_get(hub.proxy, &format!("{uncached}?timeout=4s")).await;
    assert_eq!(
        (slow.status, slow.json()["reason"].clone()),
        (504, json!("Timeout")),
        "{}",
        String::from_utf8_lossy(&slow.body)
    );
    let ready = get(hub.admin, "/v1/readyz", "test").await;
    assert!(
        !String::from_utf8_lossy(&ready.body).contains("offline"),
        "the apiserver stayed healthy"
    );
    cluster.fake.restore().await;
}

/// A connection lost under one request that had been sent (a NAT that forgot a pooled
/// connection, a reset on a bad link) says little about the server. The read is sent again on a
/// fresh connection, the server stays healthy, and open watches go on: marking it unhealthy
/// would send the node to its cache and end every watch for two probe rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_under_one_request_is_not_an_outage() {
    const CLIENT: &str = "e2e-client/v1.0";
    let cluster = cluster_with_pods(&["a"]).await;
    let hub = start_hub_with_slow_rounds(&cluster);
    let (mut watch, _) = list_then_watch(&hub).await;
    // A read the node may make that is proxied (Services would be answered by the shared cache).
    let drivers = "/apis/storage.k8s.io/v1/csidrivers";

    // Once: the read is sent again on a fresh connection and answered.
    cluster.fake.hang_up_under(drivers, 1);
    let read = get(hub.proxy, drivers, CLIENT).await;
    assert_eq!(read.status, 200, "{}", String::from_utf8_lossy(&read.body));
    // Every time: the client gets a 503 saying why, after the hub's three tries.
    cluster.fake.hang_up_under(drivers, usize::MAX);
    let lost = get(hub.proxy, drivers, CLIENT).await;
    assert_eq!(
        (lost.status, &lost.json()["reason"]),
        (503, &json!("ServiceUnavailable"))
    );
    assert!(
        lost.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("closed the connection before answering")),
        "{}",
        String::from_utf8_lossy(&lost.body)
    );
    still_online_and_watching(&cluster, &hub, &mut watch).await;
    let metrics = support::metrics_text(&hub).await;
    let lost_connections: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("outpost_upstream_errors_total{"))
        .filter(|l| l.contains(r#"kind="connection_lost""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(lost_connections, 4.0, "one, then three tries:\n{metrics}");
    cluster.fake.restore().await;
}

/// The pods of a streaming list (`sendInitialEvents=true`: kube-rs `streaming_lists()`,
/// client-go's WatchListClient), up to its end-of-initial-events bookmark.
async fn streamed_list(pods: Api<Pod>, fields: &str) -> Vec<String> {
    use kube::runtime::watcher;
    let config = watcher::Config::default().fields(fields).streaming_lists();
    let mut events = watcher(pods, config).boxed();
    let mut names = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(15), events.next())
            .await
            .expect("the streaming list goes on within 15 s")
            .expect("the stream is open")
            .expect("a good event");
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(pod) => names.push(pod.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected before the end of the initial events: {other:?}"),
        }
    }
    names.sort();
    names
}

/// A streaming list is a LIST as much as a watch: its initial events, up to the
/// `k8s.io/initial-events-end` bookmark, are the scope's whole state. The cache replaces the
/// scope with them, as with a LIST: an object deleted while the hub was offline does not come
/// back, and a client that only ever streams its lists is served offline too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_replaces_the_cached_scope() {
    let cluster = cluster_with_pods(&["a", "b"]).await;
    let hub = cluster.start_hub();
    let list_path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    assert_eq!(kubelet_get(hub.proxy, &list_path).await.status, 200);

    cluster.fake.refuse_connections();
    let cached = until_cached(&hub, &list_path).await;
    assert_eq!(names(&cached.json()), ["a", "b"]);
    cluster
        .fake
        .delete("v1/pods", Some("default"), "b")
        .unwrap();
    cluster
        .fake
        .create("v1/pods", pod("c", NODE, "web"))
        .unwrap();
    cluster.fake.restore().await;
    wait_online(&hub).await;

    let (pods, fields) = node_pods(&hub);
    assert_eq!(streamed_list(pods.clone(), &fields).await, ["a", "c"]);

    cluster.fake.refuse_connections();
    cluster.fake.cut_watches();
    let offline = until_cached(&hub, &list_path).await;
    assert_eq!(names(&offline.json()), ["a", "c"], "b was deleted upstream");
    assert_eq!(
        streamed_list(pods, &fields).await,
        ["a", "c"],
        "offline, from the cache"
    );
}

/// (name, resourceVersion) of this node's pods, as upstream has them.
fn upstream_pods(cluster: &Cluster) -> Vec<(String, String)> {
    let pods = cluster.fake.list("v1/pods", None);
    name_and_rv(pods.iter().filter(|p| p["spec"]["nodeName"] == NODE))
}

/// (name, resourceVersion) of a list body.
fn listed(list: &Value) -> Vec<(String, String)> {
    name_and_rv(list["items"].as_array().unwrap())
}

fn name_and_rv<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Vec<(String, String)> {
    let field = |p: &Value, f: &str| p["metadata"][f].as_str().unwrap().to_owned();
    let mut pairs: Vec<(String, String)> = objects
        .into_iter()
        .map(|p| (field(p, "name"), field(p, "resourceVersion")))
        .collect();
    pairs.sort();
    pairs
}

/// Changes upstream while the hub is cut off: one pod added, one modified, one deleted.
fn change_upstream(cluster: &Cluster, added: &str, modified: &str, deleted: &str) {
    cluster
        .fake
        .create("v1/pods", pod(added, NODE, "web"))
        .unwrap();
    let mut m = cluster
        .fake
        .get("v1/pods", Some("default"), modified)
        .unwrap();
    m["metadata"]["labels"]["app"] = json!("modified-offline");
    cluster.fake.update("v1/pods", m).unwrap();
    cluster
        .fake
        .delete("v1/pods", Some("default"), deleted)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_converges_with_a_kube_rs_watcher() {
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let cluster = cluster_with_pods(&["a", "b", "c"]).await;
    let hub = cluster.start_hub();
    let (pods, fields) = node_pods(&hub);
    let (reader, writer) = reflector::store::<Pod>();
    let stream = reflector(
        writer,
        watcher(pods, watcher::Config::default().fields(&fields)),
    )
    .default_backoff()
    .applied_objects();
    let watcher_task = tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let reflected = || {
        let mut names: Vec<String> = reader.state().iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    };
    assert!(eventually(Duration::from_secs(10), || reflected() == ["a", "b", "c"]).await);

    // Outage: the watcher's watch is cut and continues against the cache.
    cluster.fake.refuse_connections();
    cluster.fake.cut_watches();
    let scope = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    until_cached(&hub, &scope).await;
    change_upstream(&cluster, "d", "a", "b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        reflected(),
        ["a", "b", "c"],
        "offline, the node keeps its last view"
    );

    // Reconnect: the offline watch ends, the watcher resumes against the cloud.
    cluster.fake.restore().await;
    assert!(
        eventually(Duration::from_secs(5), || reflected() == ["a", "c", "d"]).await,
        "watcher state {:?}",
        reflected()
    );

    // Within 5 s the cache equals upstream for that scope: a second outage serves exactly it.
    let expected = upstream_pods(&cluster);
    cluster.fake.refuse_connections();
    cluster.fake.cut_watches();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = kubelet_get(hub.proxy, &scope).await;
        if resp.status == 200 && served_from_cache(&resp) && listed(&resp.json()) == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cache did not converge: {:?} vs upstream {expected:?}",
            (resp.status == 200).then(|| listed(&resp.json()))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        reflected(),
        ["a", "c", "d"],
        "the watcher keeps the converged view"
    );
    watcher_task.abort();
}

/// kubelet relists its pods, unchanged, while elsewhere in the cluster things moved on (so the
/// list's resourceVersion did): the cache renews the scope without reading its items. A changed
/// pod is a list the cache replaces its scope with, and offline the node gets what the cloud
/// listed last, at that list's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_relist_renews_the_cached_scope() {
    let cluster = Cluster::start().await;
    let pad = "x".repeat(2 << 10);
    for i in 0..12 {
        let mut pod = pod(&format!("p{i:02}"), NODE, "web");
        pod["metadata"]["annotations"] = json!({ "pad": pad });
        cluster.fake.create("v1/pods", pod).unwrap();
    }
    let hub = cluster.start_hub();
    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let lists =
        |outcome: &str| format!(r#"outpost_cache_writes_total{{op="list",outcome="{outcome}"}}"#);
    let applied = |text: &str| {
        ["replaced", "renewed"]
            .iter()
            .filter_map(|o| sample(text, &lists(o)))
            .sum::<f64>()
    };
    let mut versions = Vec::new();
    let mut last = Value::Null;
    for round in 0..4 {
        if round == 3 {
            let mut changed = cluster.fake.get("v1/pods", Some("default"), "p05").unwrap();
            changed["metadata"]["labels"]["app"] = json!("changed");
            cluster.fake.update("v1/pods", changed).unwrap();
        } else {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": format!("elsewhere-{round}"), "namespace": "default"}});
            cluster.fake.create("v1/configmaps", cm).unwrap();
        }
        let list = kubelet_get(hub.proxy, &path).await;
        assert_eq!(list.status, 200);
        assert!(list.body.len() > 16 << 10, "large enough to be kept");
        last = list.json();
        versions.push(last["metadata"]["resourceVersion"].clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let metrics = metrics_text(&hub).await;
            if applied(&metrics) == f64::from(round + 1) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "list {round} never applied:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    versions.dedup();
    assert_eq!(versions.len(), 4, "every list at a version of its own");
    let metrics = metrics_text(&hub).await;
    // The first list also records the pod kind, a write of its own: the second is kept.
    assert_eq!(sample(&metrics, &lists("replaced")), Some(3.0), "{metrics}");
    assert_eq!(sample(&metrics, &lists("renewed")), Some(1.0), "{metrics}");

    cluster.fake.refuse_connections();
    let offline = until_cached(&hub, &path).await.json();
    assert_eq!(
        offline["metadata"]["resourceVersion"],
        last["metadata"]["resourceVersion"]
    );
    assert_eq!(names(&offline), names(&last), "what the cloud listed last");
    let p05 = &offline["items"][5];
    assert_eq!(
        (&p05["metadata"]["name"], &p05["metadata"]["labels"]["app"]),
        (&json!("p05"), &json!("changed"))
    );
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_killed_and_restarted_offline_serves_from_disk() {
    let cluster = cluster_with_pods(&["a", "b"]).await;
    let scope = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let node_path = format!("/api/v1/nodes/{NODE}");
    {
        let hub = cluster.start_hub();
        assert_eq!(kubelet_get(hub.proxy, &scope).await.status, 200);
        assert_eq!(kubelet_get(hub.proxy, &node_path).await.status, 200);
        cluster.fake.refuse_connections();
        until_cached(&hub, &scope).await;
        until_cached(&hub, &node_path).await;
        // A write is readable once committed but durable once the writer's flush returns, which
        // the writes counter marks; only then does a SIGKILL owe us the data.
        until_durable(
            &hub,
            &[
                "op=\"list\",outcome=\"replaced\"",
                "op=\"object\",outcome=\"stored\"",
            ],
        )
        .await;
        // Dropping the guard sends SIGKILL: no shutdown path runs.
    }
    let hub = cluster.start_hub();
    let list = kubelet_get(hub.proxy, &scope).await;
    assert_eq!(list.status, 200, "{}", String::from_utf8_lossy(&list.body));
    assert!(served_from_cache(&list));
    assert_eq!(names(&list.json()), ["a", "b"]);
    let node = kubelet_get(hub.proxy, &node_path).await;
    assert_eq!(
        node.status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&node.body),
        hub.log_text()
    );
    assert_eq!(node.json()["metadata"]["name"], NODE);
    let ready = get(hub.admin, "/v1/readyz", "test").await;
    assert_eq!(ready.status, 200);
}

/// sled's log on a device that fails every write (ENOSPC): proxying goes on, and the first
/// failed write moves the cache to a fresh database (sled refuses every write after a failed
/// one, even once space is back), which then caches. A file system that is really full is
/// `e2e_storage`'s (the free-space floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_cache_disk_never_stops_the_proxy_and_the_cache_recovers() {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .create("v1/pods", pod("a", NODE, "web"))
        .unwrap();
    // The cache's sled log lives on /dev/full: every write fails with ENOSPC.
    let cache = cluster.dir.path().join("cache");
    std::fs::create_dir_all(cache.join("db-0")).unwrap();
    std::fs::write(cache.join("CURRENT"), "db-0").unwrap();
    std::os::unix::fs::symlink("/dev/full", cache.join("db-0").join("db")).unwrap();
    let hub = cluster.start_hub();

    let scope = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    for _ in 0..3 {
        let list = kubelet_get(hub.proxy, &scope).await;
        assert_eq!(list.status, 200, "online proxying continues");
        assert_eq!(names(&list.json()), ["a"]);
    }
    assert!(
        eventually(Duration::from_secs(10), || hub
            .log_text()
            .contains("cache moved to a fresh database after a failed write"))
        .await,
        "{}",
        hub.log_text()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = get(hub.admin, "/v1/readyz", "test").await;
        let text = String::from_utf8_lossy(&ready.body).into_owned();
        assert_eq!(
            ready.status, 200,
            "a failing cache is never unready: {text}"
        );
        let metrics = metrics_text(&hub).await;
        let cached = sample(
            &metrics,
            r#"outpost_cache_writes_total{op="list",outcome="replaced"}"#,
        );
        if text.contains("[+]cache ok") && cached.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cache never recovered:\n{text}\n{metrics}"
        );
        let _ = kubelet_get(hub.proxy, &scope).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!cache.join("db-0").exists(), "the failed database is gone");
    assert!(!hub.log_text().contains("panicked"), "{}", hub.log_text());
}

/// kubectl as a cache agent (added through `yurt-hub-cfg`, live): it works offline, discovery
/// included, and sees the cloud's changes after the outage, with nothing resurrected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_offline_once_made_a_cache_agent() {
    let cluster = cluster_with_pods(&["a", "b"]).await;
    let hub = cluster.start_hub();
    cluster
        .fake
        .create(
            "v1/configmaps",
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "yurt-hub-cfg", "namespace": "kube-system"},
                "data": {"cache_agents": "kubectl"}
            }),
        )
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || hub
            .log_text()
            .contains("cache agents changed"))
        .await,
        "the hub never applied yurt-hub-cfg:\n{}",
        hub.log_text()
    );
    let kc = hub_kubeconfig(cluster.dir.path(), &hub);
    let get_pods = |kc: &std::path::Path| {
        let out = kubectl(
            kc,
            &[
                "get",
                "pods",
                "-A",
                "--field-selector",
                &format!("spec.nodeName={NODE}"),
                "-o",
                "name",
            ],
        );
        let mut names: Vec<String> = assert_ok(&out, "kubectl get pods")
            .lines()
            .map(str::to_owned)
            .collect();
        names.sort();
        names
    };
    assert_eq!(get_pods(&kc), ["pod/a", "pod/b"]);

    cluster.fake.refuse_connections();
    // A kubeconfig with a fresh kubectl cache dir: discovery must come from the hub's cache.
    let offline_kc = cluster.dir.path().join("offline.kubeconfig");
    std::fs::copy(&kc, &offline_kc).unwrap();
    assert_eq!(get_pods(&offline_kc), ["pod/a", "pod/b"]);
    let version = kubectl(&offline_kc, &["version", "-o", "json"]);
    assert!(
        stdout(&version).contains("serverVersion"),
        "{}",
        stdout(&version)
    );

    change_upstream(&cluster, "c", "b", "a");
    cluster.fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while get_pods(&kc) != ["pod/b", "pod/c"] {
        assert!(
            Instant::now() < deadline,
            "kubectl never saw the cloud's changes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The relist replaced the cached scope: offline again, `a` stays deleted and `c` is there.
    cluster.fake.refuse_connections();
    let second_offline = cluster.dir.path().join("offline2.kubeconfig");
    std::fs::copy(&kc, &second_offline).unwrap();
    assert_eq!(get_pods(&second_offline), ["pod/b", "pod/c"]);
}

/// yurthub's `GET /pods` on the admin port, for OTA tooling: kubelet's cached pods in edge mode,
/// online and offline alike; the cloud's in cloud mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_pods_lists_the_nodes_pods_from_the_cache_or_in_cloud_mode_from_the_cloud() {
    let cluster = cluster_with_pods(&["p1", "p2"]).await;
    let hub = cluster.start_hub();
    let kubelet_list = kubelet_get(
        hub.proxy,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"),
    )
    .await;
    assert_eq!(kubelet_list.status, 200);
    let expected = names(&kubelet_list.json());
    assert!(expected.contains(&"p1".to_owned()), "{expected:?}");

    assert_eq!(admin_pods(hub.admin).await, expected);
    // Served from the cache: the fake saw no second pod list.
    let upstream_lists = |c: &Cluster| {
        c.fake
            .requests()
            .iter()
            .filter(|r| r.resource == "pods" && r.verb == "list")
            .count()
    };
    assert_eq!(upstream_lists(&cluster), 1);

    cluster.fake.refuse_connections();
    assert_eq!(admin_pods(hub.admin).await, expected);
    assert!(hub.terminate().success());

    cluster.fake.restore().await;
    let mut args = cluster.hub_args();
    args.push("--working-mode=cloud".into());
    let cloud = HubProcess::spawn(&args);
    assert_eq!(admin_pods(cloud.admin).await, expected);
    assert_eq!(upstream_lists(&cluster), 2);
    assert!(cloud.terminate().success());
}

/// `GET /pods` on an admin port: a 200 PodList; the names of its pods.
async fn admin_pods(admin: std::net::SocketAddr) -> Vec<String> {
    let resp = get(admin, "/pods", "curl/8").await;
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let list = resp.json();
    assert_eq!(list["kind"], "PodList");
    names(&list)
}

/// `(name, nice)` of each thread of process `pid`.
fn threads_and_nice(pid: u32) -> Vec<(String, i32)> {
    let threads = outpost_testkit::threads::threads(Some(pid));
    assert!(!threads.is_empty(), "the hub's /proc");
    threads.into_iter().map(|t| (t.name, t.nice)).collect()
}

/// Caching is work behind the responses: the cache writer and sled's threads run at a lower
/// CPU priority than the threads that answer clients, so that where they compete for a core
/// (a relist, a burst of watch events) the proxy wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_threads_run_at_a_lower_cpu_priority_than_the_proxy() {
    let cluster = cluster_with_pods(&["p1", "p2"]).await;
    let hub = cluster.start_hub();
    let list = kubelet_get(
        hub.proxy,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"),
    )
    .await;
    assert_eq!(list.status, 200);
    let cache_thread = |name: &str| {
        ["outpost-cache-w", "sled-io", "log flusher"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
    };
    // The main thread runs every task (the current-thread scheduler); it starts at the nice
    // the hub was given, and the cache threads go 10 above it.
    let main_nice = |seen: &[(String, i32)]| {
        seen.iter()
            .find(|(name, _)| name == "outpost")
            .map(|(_, nice)| *nice)
    };
    let mut seen = Vec::new();
    let settled = eventually(Duration::from_secs(10), || {
        seen = threads_and_nice(hub.pid());
        let Some(base) = main_nice(&seen) else {
            return false;
        };
        let cache: Vec<i32> = seen
            .iter()
            .filter(|(name, _)| cache_thread(name))
            .map(|(_, nice)| *nice)
            .collect();
        seen.iter().any(|(name, _)| name.starts_with("sled-io"))
            && seen.iter().any(|(name, _)| name == "outpost-cache-w")
            && cache.iter().all(|nice| *nice == (base + 10).min(19))
    })
    .await;
    assert!(
        settled,
        "cache threads not 10 above the hub's nice: {seen:?}"
    );
    let base = main_nice(&seen).expect("the main thread");
    let proxy: Vec<&(String, i32)> = seen
        .iter()
        .filter(|(name, _)| name == "outpost" || name.starts_with("tokio-rt"))
        .collect();
    assert!(
        proxy.len() > 1,
        "the main thread and the blocking pool: {seen:?}"
    );
    assert!(proxy.iter().all(|(_, nice)| *nice == base), "{seen:?}");
    assert!(base < 19, "a hub at nice 19 has no room below it: {seen:?}");
}

/// After a burst of work (here: kubelet listing 1,000 pods, parsed and written to the cache) the
/// hub gives the memory the burst freed back to the kernel (glibc keeps it otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_the_hub_gives_freed_memory_back() {
    let cluster = Cluster::start().await;
    let padding = "x".repeat(2048);
    for i in 0..1000 {
        let mut p = pod(&format!("burst-{i:04}"), NODE, "web");
        p["metadata"]["annotations"] = json!({ "example.com/padding": padding });
        cluster.fake.create("v1/pods", p).unwrap();
    }
    let hub = cluster.start_hub();
    let scope = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    for _ in 0..3 {
        let list = kubelet_get(hub.proxy, &scope).await;
        assert_eq!(list.status, 200);
        assert_eq!(names(&list.json()).len(), 1000);
    }
    let metric = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text =
            String::from_utf8_lossy(&get(hub.admin, "/metrics", "test").await.body).into_owned();
        let trims = metric(&text, "outpost_memory_trims_total");
        let given_back = metric(&text, "outpost_memory_trimmed_bytes_total");
        if trims >= 1 && given_back >= 1 << 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no trim gave back at least 1 MiB after the burst: {trims} trims, {given_back} bytes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An offline watch without `timeoutSeconds` lasts a random 1x-2x of `--min-request-timeout`,
/// as kube-apiserver's do (yurthub's flag), so that clients reconnect spread out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_watch_without_a_timeout_lasts_the_min_request_timeout() {
    let cluster = cluster_with_pods(&["a"]).await;
    let mut args = cluster.hub_args();
    args.push("--min-request-timeout=2s".into());
    let hub = cluster.start_hub_with(&args);
    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let list = kubelet_get(hub.proxy, &path).await;
    assert_eq!(list.status, 200);
    cluster.fake.refuse_connections();
    until_cached(&hub, &path).await;

    let started = Instant::now();
    let watch = kubelet_get(hub.proxy, &format!("{path}&watch=true&resourceVersion=0")).await;
    let lasted = started.elapsed();
    assert_eq!(
        watch.status,
        200,
        "{}",
        String::from_utf8_lossy(&watch.body)
    );
    assert!(served_from_cache(&watch));
    assert!(
        String::from_utf8_lossy(&watch.body).contains(r#""type":"ADDED""#),
        "{}",
        String::from_utf8_lossy(&watch.body)
    );
    assert!(
        lasted >= Duration::from_secs(2) && lasted < Duration::from_secs(5),
        "{lasted:?}"
    );
}

/// A pod of a DaemonSet with the `OTA` update strategy, as yurt-manager marks it when the
/// DaemonSet has a newer template (`PodNeedUpgrade=True`, the revision as message) or not.
fn ota_pod(name: &str, node: &str, owner: &str, marked: bool) -> Value {
    let mut pod = pod(name, node, "ota");
    pod["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": owner, "name": "ds", "uid": "u-1"}]);
    if marked {
        pod["status"] = json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PodNeedUpgrade", "status": "True", "message": "ds-7d9f8c"}
        ]});
    }
    pod
}

/// `POST` to the admin port; the status and the text answered.
async fn admin_post(hub: &HubProcess, path: &str, method: &str) -> (u16, String) {
    let resp = support::send_json(hub.admin, method, path, "").await;
    (
        resp.status,
        String::from_utf8_lossy(&resp.body).into_owned(),
    )
}

/// yurthub's OTA endpoints: the node's owner pre-pulls the image of a marked DaemonSet pod
/// (its status gets `PodImageReady=False`) and upgrades it (it is deleted, for the DaemonSet to
/// recreate from the new template). Unmarked pods, other nodes' pods, and any request while the
/// cloud is away are refused and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ota_pulls_the_image_of_and_upgrades_a_marked_daemonset_pod() {
    let cluster = Cluster::start().await;
    for pod in [
        ota_pod("marked", NODE, "DaemonSet", true),
        ota_pod("unmarked", NODE, "DaemonSet", false),
        ota_pod("elsewhere", "edge-2", "DaemonSet", true),
        ota_pod(&format!("static-{NODE}"), NODE, "Node", true),
    ] {
        cluster.fake.create("v1/pods", pod).unwrap();
    }
    let hub = cluster.start_hub();
    let ota =
        |pod: &str, action: &str| format!("/openyurt.io/v1/namespaces/default/pods/{pod}/{action}");

    let (code, text) = admin_post(&hub, &ota("marked", "imagepull"), "POST").await;
    assert_eq!(code, 200, "{text}");
    let pod = cluster
        .fake
        .get("v1/pods", Some("default"), "marked")
        .unwrap();
    let conditions = pod["status"]["conditions"].as_array().unwrap();
    let image_ready = conditions
        .iter()
        .find(|c| c["type"] == "PodImageReady")
        .unwrap_or_else(|| panic!("{conditions:?}"));
    assert_eq!(image_ready["status"], "False");
    assert_eq!(image_ready["reason"], "WaitPullImage");
    assert_eq!(image_ready["message"], "ds-7d9f8c");
    assert!(conditions.iter().any(|c| c["type"] == "PodNeedUpgrade"));

    for (pod, action, method, expected) in [
        ("unmarked", "upgrade", "POST", 403),
        ("elsewhere", "upgrade", "POST", 403),
        ("missing", "imagepull", "POST", 403),
        ("marked", "upgrade", "GET", 405),
        (&format!("static-{NODE}") as &str, "upgrade", "POST", 501),
    ] {
        let (code, text) = admin_post(&hub, &ota(pod, action), method).await;
        assert_eq!(code, expected, "{method} {pod} {action}: {text}");
    }
    for pod in ["unmarked", "elsewhere", "marked"] {
        assert!(
            cluster.fake.get("v1/pods", Some("default"), pod).is_some(),
            "{pod}"
        );
    }

    let (code, text) = admin_post(&hub, &ota("marked", "upgrade"), "POST").await;
    assert_eq!(
        (code, text.trim()),
        (200, "Start updating pod default/marked")
    );
    assert!(
        cluster
            .fake
            .get("v1/pods", Some("default"), "marked")
            .is_none()
    );

    cluster
        .fake
        .create("v1/pods", ota_pod("marked-2", NODE, "DaemonSet", true))
        .unwrap();
    cluster.fake.refuse_connections();
    // Until the hub has seen the cloud go, a request may still reach it (and would rightly
    // apply): wait for the refusal with a pod the asking cannot change.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, text) = admin_post(&hub, &ota("missing", "upgrade"), "POST").await;
        if code == 503 {
            assert!(text.contains("disconnected"), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "still {code} offline: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, text) = admin_post(&hub, &ota("marked-2", "upgrade"), "POST").await;
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("disconnected"), "{text}");
    cluster.fake.restore().await;
    assert!(
        cluster
            .fake
            .get("v1/pods", Some("default"), "marked-2")
            .is_some()
    );
}
