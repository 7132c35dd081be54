//! End to end: the pool-scope shared cache (`--pool-scope-resources`). Node-local readers of
//! Services and EndpointSlices (kubelet, kube-proxy, coredns, kubectl) are answered from one
//! list and watch the hub keeps, with the apiserver's selectors and watch semantics; callers with
//! a token only after the apiserver allowed that token the same read; offline it answers
//! everyone, also after a restart, and it converges when the cloud is back.

mod support;

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use support::{
    ADMIN_TOKEN, Cluster, HubProcess, RawResponse, assert_ok, ends_without_changes, get,
    hub_kubeconfig, kube_client, kubectl, metrics_text, raw_http, sample,
};

const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const SHARED: Option<&str> = Some("shared-cache");

fn service(namespace: &str, name: &str, app: &str, kind: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {"type": kind, "ports": [{"port": 80, "protocol": "TCP"}]},
    })
}

fn endpoint_slice(name: &str, service: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}}],
        "ports": [{"port": 80, "protocol": "TCP"}],
    })
}

async fn cluster_with_services() -> Cluster {
    let cluster = Cluster::start().await;
    for (ns, name, app, kind) in [
        ("default", "web", "web", "ClusterIP"),
        ("default", "db", "db", "ClusterIP"),
        ("kube-system", "kube-dns", "dns", "ClusterIP"),
        ("default", "shop", "web", "NodePort"),
    ] {
        cluster
            .fake
            .create("v1/services", service(ns, name, app, kind))
            .unwrap();
    }
    cluster
        .fake
        .create(
            "discovery.k8s.io/v1/endpointslices",
            endpoint_slice("web-x1", "web"),
        )
        .unwrap();
    cluster
}

/// `GET path` with a User-Agent and, when given, a bearer token.
async fn read(hub: &HubProcess, path: &str, user_agent: &str, token: Option<&str>) -> RawResponse {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {user_agent}\r\n{auth}\
         Accept: application/vnd.kubernetes.protobuf,application/json\r\nConnection: close\r\n\r\n",
        hub.proxy
    );
    raw_http(hub.proxy, req.as_bytes()).await
}

/// Polls (bounded) until a LIST of `path` is answered by the shared cache; returns it.
async fn until_shared(hub: &HubProcess, path: &str, user_agent: &str) -> RawResponse {
    for _ in 0..100 {
        let resp = read(hub, path, user_agent, None).await;
        if resp.status == 200 && resp.header("x-outpost-served-from") == SHARED {
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{path} never answered by the shared cache\n{}",
        hub.log_text()
    );
}

/// The items' names (without namespaces), sorted.
fn sorted_names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap_or("").to_owned())
        .collect();
    names.sort();
    names
}

/// The Services' names upstream, sorted.
fn upstream_service_names(cluster: &Cluster) -> Vec<String> {
    let list = json!({"items": cluster.fake.list("v1/services", None)});
    sorted_names(&list)
}

/// The hub's own reads of `path` (User-Agent `outpost/…`) and everyone else's.
fn upstream_reads(cluster: &Cluster, path: &str) -> (usize, usize) {
    let records = cluster.fake.requests();
    let of_path = records.iter().filter(|r| r.path == path);
    let own = of_path
        .clone()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|ua| ua.starts_with("outpost"))
        })
        .count();
    (own, of_path.count() - own)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_local_readers_share_one_list_and_watch() {
    let cluster = cluster_with_services().await;
    let hub = cluster.start_hub();
    until_shared(&hub, SERVICES, "kubelet/v1.32.4").await;
    until_shared(&hub, SLICES, "kube-proxy/v1.32.4").await;
    cluster.fake.clear_requests();

    // kubelet's and kube-proxy's start-up lists, coredns' namespaced one, selectors.
    let all = read(
        &hub,
        &format!("{SERVICES}?limit=500&resourceVersion=0"),
        "kubelet/v1.32.4",
        None,
    )
    .await;
    assert_eq!(all.header("x-outpost-served-from"), SHARED);
    assert_eq!(all.header("content-type"), Some("application/json"));
    let list = all.json();
    assert_eq!(
        (list["kind"].as_str(), list["apiVersion"].as_str()),
        (Some("ServiceList"), Some("v1"))
    );
    let upstream = upstream_service_names(&cluster);
    assert_eq!(sorted_names(&list), upstream);
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let newest = cluster
        .fake
        .list("v1/services", None)
        .iter()
        .filter_map(|s| {
            s["metadata"]["resourceVersion"]
                .as_str()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    assert!(
        rv >= newest,
        "the list is at {rv}, older than a Service ({newest})"
    );
    let cases = [
        ("?labelSelector=app%3Dweb", vec!["shop", "web"]),
        ("?fieldSelector=spec.type%3DNodePort", vec!["shop"]),
        (
            "?labelSelector=app%20in%20(web,db)&fieldSelector=metadata.name!%3Dshop",
            vec!["db", "web"],
        ),
    ];
    for (query, expected) in cases {
        let resp = read(
            &hub,
            &format!("{SERVICES}{query}"),
            "kube-proxy/v1.32.4",
            None,
        )
        .await;
        assert_eq!(resp.header("x-outpost-served-from"), SHARED, "{query}");
        assert_eq!(sorted_names(&resp.json()), expected, "{query}");
    }
    let dns = read(
        &hub,
        "/api/v1/namespaces/kube-system/services",
        "coredns/v1.11.3",
        None,
    )
    .await;
    assert_eq!(
        (
            dns.header("x-outpost-served-from"),
            sorted_names(&dns.json())
        ),
        (SHARED, vec!["kube-dns".to_owned()])
    );
    let slices = read(&hub, SLICES, "kube-proxy/v1.32.4", None).await;
    assert_eq!(sorted_names(&slices.json()), ["web-x1"]);
    assert_eq!(slices.json()["kind"], "EndpointSliceList");
    // A field the apiserver cannot select Services by is its to refuse: sent upstream.
    let odd = read(
        &hub,
        &format!("{SERVICES}?fieldSelector=spec.ports%3D1"),
        "kubelet/v1.32.4",
        None,
    )
    .await;
    assert_eq!(
        (odd.status, odd.header("x-outpost-served-from")),
        (400, None)
    );

    // kubectl (server-side printing asked for, plain JSON accepted) and a kube-rs watch.
    let kubeconfig = hub_kubeconfig(cluster.dir.path(), &hub);
    let out = assert_ok(
        &kubectl(&kubeconfig, &["get", "services", "-A", "-o", "name"]),
        "kubectl get services",
    );
    assert_eq!(out.lines().count(), upstream.len(), "{out}");
    let client = kube_client(&hub, "kube-proxy/v1.32.4");
    let api: Api<Service> = Api::all(client);
    let web = ListParams::default().labels("app=web");
    let listed = api.list(&web).await.unwrap();
    let from = listed.metadata.resource_version.clone().unwrap();
    let wp = WatchParams::default().labels("app=web").timeout(60);
    let mut stream = api.watch(&wp, &from).await.unwrap().boxed();
    cluster
        .fake
        .create(
            "v1/services",
            service("default", "cart", "web", "ClusterIP"),
        )
        .unwrap();
    let mut cart = cluster
        .fake
        .get("v1/services", Some("default"), "cart")
        .unwrap();
    cart["metadata"]["labels"]["app"] = json!("legacy");
    cluster.fake.update("v1/services", cart).unwrap();
    cluster
        .fake
        .create(
            "v1/services",
            service("default", "other", "db", "ClusterIP"),
        )
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .expect("the watch stays open");
        match event {
            WatchEvent::Added(s) => seen.push(("ADDED", s.metadata.name.unwrap())),
            WatchEvent::Deleted(s) => seen.push(("DELETED", s.metadata.name.unwrap())),
            WatchEvent::Modified(s) => seen.push(("MODIFIED", s.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        seen,
        [("ADDED", "cart".to_owned()), ("DELETED", "cart".to_owned())],
        "entering and leaving app=web"
    );

    // None of that reached the apiserver but the refused selector: only the hub's own watches
    // are open there.
    let others: Vec<String> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == SERVICES || r.path == SLICES)
        .filter(|r| {
            !r.user_agent
                .as_deref()
                .is_some_and(|ua| ua.starts_with("outpost"))
        })
        .map(|r| format!("{} {}?{} -> {}", r.verb, r.path, r.query, r.status))
        .collect();
    assert_eq!(
        others,
        ["list /api/v1/services?fieldSelector=spec.ports%3D1 -> 400"]
    );
    let metrics = metrics_text(&hub).await;
    let served = |verb: &str| {
        sample(
            &metrics,
            &format!(
                "outpost_shared_cache_served_total{{resource=\"pool-services.v1.core\",verb=\"{verb}\"}}"
            ),
        )
    };
    assert!(served("list").is_some_and(|n| n >= 8.0), "{metrics}");
    assert_eq!(served("watch"), Some(1.0));
}

/// A caller with a bearer token is answered from the shared cache only once the apiserver has
/// answered the same read (or a wider one) for that token; a token it refuses is never answered
/// here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_answered_here_only_after_the_apiserver_allowed_its_read() {
    let cluster = cluster_with_services().await;
    let hub = cluster.start_hub();
    until_shared(&hub, SERVICES, "kubelet/v1.32.4").await;

    let admin = |hub, path| read(hub, path, "coredns/v1.11.3", Some(ADMIN_TOKEN));
    let first = admin(&hub, "/api/v1/namespaces/default/services").await;
    assert_eq!(
        (first.status, first.header("x-outpost-served-from")),
        (200, None),
        "asked upstream"
    );
    let again = admin(
        &hub,
        "/api/v1/namespaces/default/services?labelSelector=app%3Dweb",
    )
    .await;
    assert_eq!(
        (again.status, again.header("x-outpost-served-from")),
        (200, SHARED)
    );
    assert_eq!(sorted_names(&again.json()), ["shop", "web"]);
    let wider = admin(&hub, SERVICES).await;
    assert_eq!(
        wider.header("x-outpost-served-from"),
        None,
        "all namespaces were not granted yet"
    );

    let granted = admin(&hub, SERVICES).await;
    assert_eq!(granted.header("x-outpost-served-from"), SHARED);
    assert_eq!(sorted_names(&granted.json()), sorted_names(&wider.json()));

    // The fake lets every authenticated non-node user read (no 403 to show); a token it does
    // not know is refused each time, and never answered here.
    for _ in 0..2 {
        let unknown = read(&hub, SERVICES, "coredns/v1.11.3", Some("no-such-token")).await;
        assert_eq!(
            (unknown.status, unknown.header("x-outpost-served-from")),
            (401, None)
        );
    }
}

/// Offline, the shared cache answers every node-local reader (not only the cache agents); an
/// open watch ends when its feed breaks and, watched again, when the cloud is back; then the
/// cache converges to what changed meanwhile. A hub restarted without the cloud answers from the
/// copy it saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_it_answers_everyone_and_converges_when_the_cloud_returns() {
    let cluster = cluster_with_services().await;
    let hub = cluster.start_hub();
    let listed = until_shared(&hub, SERVICES, "kubelet/v1.32.4").await.json();
    let client = kube_client(&hub, "coredns/v1.11.3");
    let api: Api<Service> = Api::all(client);
    let from = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let wp = WatchParams::default().timeout(120);
    let mut online = api.watch(&wp, &from).await.unwrap().boxed();

    cluster.fake.refuse_connections();
    assert!(
        ends_without_changes(&mut online, Duration::from_secs(15)).await,
        "the watch ends when its feed breaks\n{}",
        hub.log_text()
    );
    let app = "some-app/1.0";
    let offline = until_offline_answer(&hub, app).await;
    assert_eq!(sorted_names(&offline.json()), sorted_names(&listed));
    let mut offline_watch = api.watch(&wp, &from).await.unwrap().boxed();

    // Changes while the node is cut off.
    cluster
        .fake
        .delete("v1/services", Some("default"), "db")
        .unwrap();
    cluster
        .fake
        .create("v1/services", service("default", "new", "web", "ClusterIP"))
        .unwrap();
    cluster.fake.restore().await;
    assert!(
        ends_without_changes(&mut offline_watch, Duration::from_secs(15)).await,
        "a watch served offline ends when the cloud is back"
    );
    let upstream = upstream_service_names(&cluster);
    let mut converged = None;
    for _ in 0..100 {
        let resp = read(&hub, SERVICES, app, None).await;
        if resp.header("x-outpost-served-from") == SHARED && sorted_names(&resp.json()) == upstream
        {
            converged = Some(resp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        converged.is_some(),
        "the shared cache never matched the cloud:\n{}",
        hub.log_text()
    );

    // Restarted without the cloud: the saved copy answers.
    let args = cluster.hub_args();
    drop(online);
    drop(offline_watch);
    hub.terminate();
    cluster.fake.refuse_connections();
    let restarted = cluster.start_hub_with(&args);
    let answer = until_offline_answer(&restarted, app).await;
    assert_eq!(sorted_names(&answer.json()), upstream);
    let list = kube_client(&restarted, "kube-proxy/v1.32.4");
    let services: Api<Service> = Api::all(list);
    let names: Vec<String> = services
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(names, ["new", "shop", "web"]);
}

/// Polls (bounded) until a Services LIST by `user_agent` is answered 200 by the shared cache
/// while the hub is offline.
async fn until_offline_answer(hub: &HubProcess, user_agent: &str) -> RawResponse {
    for _ in 0..150 {
        let metrics = metrics_text(hub).await;
        if sample(&metrics, "outpost_cloud_online") == Some(0.0) {
            // A restarted hub's first read starts the feed, which loads the saved copy.
            let resp = get(hub.proxy, SERVICES, user_agent).await;
            if resp.header("x-outpost-served-from") == SHARED {
                assert_eq!(resp.status, 200);
                return resp;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "never answered offline by the shared cache\n{}",
        hub.log_text()
    );
}

/// `--pool-scope-resources=` turns the shared cache off: every read goes the normal way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_scope_turns_it_off() {
    let cluster = cluster_with_services().await;
    let mut args = cluster.hub_args();
    args.push("--pool-scope-resources=".into());
    let hub = cluster.start_hub_with(&args);
    for _ in 0..3 {
        for path in [SERVICES, SLICES] {
            let resp = read(&hub, path, "kube-proxy/v1.32.4", None).await;
            assert_eq!(
                (resp.status, resp.header("x-outpost-served-from")),
                (200, None)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        upstream_reads(&cluster, SLICES).0,
        0,
        "no EndpointSlice feed"
    );
}
