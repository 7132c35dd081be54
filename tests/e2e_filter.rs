//! Response filters end to end: the real `outpost` binary in front of the fake apiserver,
//! requests with the User-Agents of the components each filter serves (kubelet, kube-proxy,
//! coredns), one test per filter, plus the stage's wiring: watches filtered event by event with
//! live side data, offline answers filtered like online ones, `yurt-hub-cfg` applied live,
//! the flags that turn filters off, and cloud mode (filters only, nothing on disk).

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{
    ADMIN_TOKEN, Cluster, HubProcess, NODE, RawResponse, get, names, raw_http, until_ready,
};

const KUBELET: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
const KUBE_PROXY: &str = "kube-proxy/v1.32.4 (linux/amd64) kubernetes/e2e";
const COREDNS: &str = "coredns/1.11.3";
/// What kubelet and kube-proxy really send.
const PROTOBUF_FIRST: &str = "application/vnd.kubernetes.protobuf,application/json";
/// kube-proxy's label selector on Services and EndpointSlices.
const PROXY_SELECTOR: &str = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";
/// The hub's address as the filters write it: the test hubs run with `--enable-dummy-if=false`,
/// so rewritten Services point at `--bind-proxy-address`.
const HUB_HOST: &str = "127.0.0.1";

/// The port the filters write: where the hub's secure port really listens (the tests pass
/// `--proxy-secure-port=0`).
fn hub_port(hub: &HubProcess) -> i64 {
    i64::from(hub.secure.port())
}
const TOPOLOGY: &str = "openyurt.io/topologyKeys";

/// A request through the hub; `bearer` sends the admin token (kube-proxy and coredns use their
/// own service-account tokens, which the hub passes through).
async fn call(hub: &HubProcess, path: &str, user_agent: &str, bearer: bool) -> RawResponse {
    let auth = if bearer {
        format!("Authorization: Bearer {ADMIN_TOKEN}\r\n")
    } else {
        String::new()
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: outpost\r\nUser-Agent: {user_agent}\r\nAccept: {PROTOBUF_FIRST}\r\n{auth}Connection: close\r\n\r\n"
    );
    raw_http(hub.proxy, req.as_bytes()).await
}

/// A 200 JSON answer (never protobuf: the hub asked upstream for JSON to filter it).
fn ok_json(resp: &RawResponse, what: &str) -> Value {
    assert_eq!(
        resp.status,
        200,
        "{what}: {}",
        String::from_utf8_lossy(&resp.body)
    );
    let content_type = resp.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/json"),
        "{what}: {content_type}"
    );
    resp.json()
}

fn item<'a>(list: &'a Value, namespace: &str, name: &str) -> &'a Value {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["metadata"]["namespace"] == namespace && i["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{namespace}/{name} not in {list}"))
}

/// The watch events of a finished stream.
fn events(resp: &RawResponse) -> Vec<Value> {
    String::from_utf8_lossy(&resp.body)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("event {l:?}: {e}")))
        .collect()
}

fn service(namespace: &str, name: &str, annotations: Value, spec: Value) -> Value {
    let mut spec = spec;
    spec["ports"] = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    })
}

fn slice(namespace: &str, name: &str, service: &str, endpoints: &[(&str, &str)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

fn endpoint_nodes(slice: &Value) -> Vec<String> {
    let mut nodes: Vec<String> = slice["endpoints"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|e| e["nodeName"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    nodes
}

/// A fake cluster with the namespace `shop` for the tests' objects.
/// Polls (bounded) kube-proxy's EndpointSlice list until `slice`'s endpoints are on exactly
/// `expected`; returns what the last read had, for the caller's assertion.
async fn slice_nodes_until(hub: &HubProcess, slice: &str, expected: &[&str]) -> Vec<String> {
    let path = format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}");
    let mut nodes = Vec::new();
    for _ in 0..100 {
        let list = ok_json(&call(hub, &path, KUBE_PROXY, true).await, slice);
        nodes = endpoint_nodes(item(&list, "shop", slice));
        if nodes == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodes
}

async fn shop_cluster() -> Cluster {
    let cluster = Cluster::start().await;
    cluster
        .fake
        .create("v1/namespaces", json!({"metadata": {"name": "shop"}}))
        .unwrap();
    cluster
}

/// A cluster with a NodePool (this node and edge-3) and the side objects the filters read.
async fn topology_cluster() -> Cluster {
    let cluster = shop_cluster().await;
    let fake = &cluster.fake;
    let pool = fake
        .create(
            "apps.openyurt.io/v1beta1/nodepools",
            json!({"apiVersion": "apps.openyurt.io/v1beta1", "kind": "NodePool",
                   "metadata": {"name": "pool-a"}, "spec": {"type": "Edge"}}),
        )
        .unwrap();
    let mut pool = pool;
    // What the NodePool controller reports.
    pool["status"] = json!({"nodes": [NODE, "edge-3"]});
    fake.update("apps.openyurt.io/v1beta1/nodepools", pool)
        .unwrap();
    for (name, key) in [
        ("by-host", "kubernetes.io/hostname"),
        ("by-pool", "openyurt.io/nodepool"),
        ("plain", ""),
    ] {
        let annotations = if key.is_empty() {
            json!({})
        } else {
            json!({ TOPOLOGY: key })
        };
        fake.create(
            "v1/services",
            service("shop", name, annotations, json!({"type": "ClusterIP"})),
        )
        .unwrap();
        fake.create(
            "v1/endpoints",
            json!({"metadata": {"name": name, "namespace": "shop"},
                   "subsets": [{"addresses": [
                       {"ip": "10.0.0.1", "nodeName": NODE},
                       {"ip": "10.0.0.2", "nodeName": "edge-2"}],
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}),
        )
        .unwrap();
        fake.create(
            "discovery.k8s.io/v1/endpointslices",
            slice(
                "shop",
                &format!("{name}-abc"),
                name,
                &[
                    ("10.0.0.1", NODE),
                    ("10.0.0.2", "edge-2"),
                    ("10.0.0.3", "edge-3"),
                ],
            ),
        )
        .unwrap();
    }
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicetopology_keeps_the_nodes_and_pools_endpoints_for_kube_proxy_and_coredns() {
    let cluster = topology_cluster().await;
    let hub = cluster.start_hub();
    let body = until_ready(&hub, "[+]filters ok").await;
    assert!(body.contains("[+]filters ok"), "{body}");

    for ua in [KUBE_PROXY, COREDNS] {
        let path = format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}");
        let list = ok_json(&call(&hub, &path, ua, true).await, ua);
        assert_eq!(
            endpoint_nodes(item(&list, "shop", "by-host-abc")),
            [NODE],
            "{ua}: hostname topology keeps this node's endpoints"
        );
        assert_eq!(
            endpoint_nodes(item(&list, "shop", "by-pool-abc")),
            [NODE, "edge-3"],
            "{ua}: nodepool topology keeps the pool's endpoints"
        );
        assert_eq!(
            endpoint_nodes(item(&list, "shop", "plain-abc")),
            [NODE, "edge-2", "edge-3"],
            "{ua}: no annotation, untouched"
        );
    }
    // v1 Endpoints too (yurthub registers them but never filters them).
    let list = ok_json(
        &call(
            &hub,
            "/api/v1/namespaces/shop/endpoints",
            "nginx-ingress-controller/v1.11",
            true,
        )
        .await,
        "endpoints",
    );
    let addresses: Vec<&str> = item(&list, "shop", "by-host")["subsets"][0]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["nodeName"].as_str().unwrap())
        .collect();
    assert_eq!(addresses, [NODE]);

    // kubectl is no filtered component: it sees the cluster as it is.
    let path = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";
    let list = ok_json(&call(&hub, path, "kubectl/v1.32.4", true).await, "kubectl");
    assert_eq!(
        endpoint_nodes(item(&list, "shop", "by-host-abc")),
        [NODE, "edge-2", "edge-3"]
    );

    // A Service annotated later: the hub's own Service watch sees it, and kube-proxy's next
    // read is filtered by it, without a restart.
    let mut plain = cluster
        .fake
        .get("v1/services", Some("shop"), "plain")
        .unwrap();
    plain["metadata"]["annotations"] = json!({ TOPOLOGY: "kubernetes.io/hostname" });
    cluster.fake.update("v1/services", plain).unwrap();
    let nodes = slice_nodes_until(&hub, "plain-abc", &[NODE]).await;
    assert_eq!(nodes, [NODE], "the new annotation applies live");

    // And an annotation removed: the hub forgets the Service, and its endpoints go unfiltered.
    let mut by_host = cluster
        .fake
        .get("v1/services", Some("shop"), "by-host")
        .unwrap();
    by_host["metadata"]["annotations"] = json!({ "example.com/owner": "shop" });
    cluster.fake.update("v1/services", by_host).unwrap();
    let nodes = slice_nodes_until(&hub, "by-host-abc", &[NODE, "edge-2", "edge-3"]).await;
    assert_eq!(
        nodes,
        [NODE, "edge-2", "edge-3"],
        "the removal applies live"
    );
    hub.terminate();
}

/// A NodeBucket of `pool` holding `nodes`, as yurt-manager slices a large pool.
fn bucket(name: &str, pool: &str, nodes: &[&str]) -> Value {
    let nodes: Vec<Value> = nodes.iter().map(|n| json!({ "name": n })).collect();
    json!({"apiVersion": "apps.openyurt.io/v1alpha1", "kind": "NodeBucket",
           "metadata": {"name": name, "labels": {"openyurt.io/pool-name": pool}},
           "numNodes": nodes.len(), "nodes": nodes})
}

/// `--enable-pool-service-topology`: the pool's nodes are the union of the NodeBuckets labelled
/// with its name, not the NodePool's `status.nodes`, and follow the buckets live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pool_service_topology_the_pool_is_the_union_of_its_node_buckets() {
    let cluster = topology_cluster().await;
    const BUCKETS: &str = "apps.openyurt.io/v1alpha1/nodebuckets";
    for b in [
        bucket("pool-a-1", "pool-a", &[NODE]),
        bucket("pool-a-2", "pool-a", &["edge-2"]),
        bucket("pool-b-1", "pool-b", &["edge-3"]),
    ] {
        cluster.fake.create(BUCKETS, b).unwrap();
    }
    let mut args = cluster.hub_args();
    args.push("--enable-pool-service-topology".into());
    let hub = cluster.start_hub_with(&args);
    let body = until_ready(&hub, "[+]filters ok").await;
    assert!(body.contains("nodebuckets"), "{body}");

    let nodes = slice_nodes_until(&hub, "by-pool-abc", &[NODE, "edge-2"]).await;
    assert_eq!(nodes, [NODE, "edge-2"], "the NodePool says edge-3");

    let mut grown = cluster.fake.get(BUCKETS, None, "pool-a-2").unwrap();
    grown["nodes"] = json!([{"name": "edge-2"}, {"name": "edge-3"}]);
    cluster.fake.update(BUCKETS, grown).unwrap();
    let nodes = slice_nodes_until(&hub, "by-pool-abc", &[NODE, "edge-2", "edge-3"]).await;
    assert_eq!(
        nodes,
        [NODE, "edge-2", "edge-3"],
        "a grown bucket applies live"
    );

    cluster.fake.delete(BUCKETS, None, "pool-a-2").unwrap();
    let nodes = slice_nodes_until(&hub, "by-pool-abc", &[NODE]).await;
    assert_eq!(nodes, [NODE], "a deleted bucket applies live");
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_filtered_event_by_event_and_a_dropped_object_becomes_deleted() {
    let cluster = topology_cluster().await;
    let fake = &cluster.fake;
    fake.create(
        "v1/services",
        service("shop", "public", json!({}), json!({"type": "LoadBalancer"})),
    )
    .unwrap();
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;

    let rv = fake.current_resource_version();
    let path = format!(
        "/api/v1/services?{PROXY_SELECTOR}&watch=true&resourceVersion={rv}&timeoutSeconds=3"
    );
    let proxy = hub.proxy;
    let watch = tokio::spawn(async move {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: outpost\r\nUser-Agent: {KUBE_PROXY}\r\nAccept: {PROTOBUF_FIRST}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nConnection: close\r\n\r\n"
        );
        raw_http(proxy, req.as_bytes()).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Marked for discard: kube-proxy must forget it (DELETED), not keep serving it.
    let mut public = fake.get("v1/services", Some("shop"), "public").unwrap();
    public["metadata"]["annotations"] = json!({"svc.openyurt.io/discard": "true"});
    fake.update("v1/services", public).unwrap();
    // An ordinary change passes as it came.
    let mut plain = fake.get("v1/services", Some("shop"), "plain").unwrap();
    plain["metadata"]["labels"] = json!({"tier": "web"});
    fake.update("v1/services", plain).unwrap();

    let resp = watch.await.unwrap();
    assert_eq!(resp.status, 200);
    let events = events(&resp);
    let seen: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or("").to_owned(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect();
    assert!(
        seen.contains(&("DELETED".into(), "public".into())),
        "discarded service arrives as DELETED: {seen:?}"
    );
    assert!(
        seen.contains(&("MODIFIED".into(), "plain".into())),
        "{seen:?}"
    );
    assert!(
        !seen.contains(&("MODIFIED".into(), "public".into())),
        "{seen:?}"
    );
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masterservice_points_kubelet_at_the_hub_online_and_offline() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;

    // kubelet reads Services with its node identity; the list is cached (edge mode).
    let list = ok_json(
        &call(&hub, "/api/v1/services", KUBELET, false).await,
        "list",
    );
    let check = |list: &Value, what: &str| {
        let kubernetes = item(list, "default", "kubernetes");
        assert_eq!(kubernetes["spec"]["clusterIP"], HUB_HOST, "{what}");
        assert_eq!(
            kubernetes["spec"]["clusterIPs"],
            json!([HUB_HOST]),
            "{what}"
        );
        assert_eq!(
            kubernetes["spec"]["ports"][0]["port"],
            hub_port(&hub),
            "{what}"
        );
    };
    check(&list, "online");
    // Others see the real Service.
    let real = ok_json(
        &call(&hub, "/api/v1/services", "kubectl/v1.32.4", false).await,
        "kubectl",
    );
    assert_eq!(
        item(&real, "default", "kubernetes")["spec"]["clusterIP"],
        "10.96.0.1"
    );

    // Offline, the cache (which keeps the upstream truth) answers, filtered the same way.
    cluster.fake.refuse_connections();
    let mut offline = None;
    for _ in 0..100 {
        let resp = call(&hub, "/api/v1/services", KUBELET, false).await;
        if resp.status == 200 && resp.header("x-outpost-served-from").is_some() {
            offline = Some(resp.json());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let offline = offline.expect("served from the cache while the cloud is down");
    check(&offline, "offline");
    cluster.fake.restore().await;
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_proxy_services_discard_and_nodeport_isolation() {
    let cluster = shop_cluster().await;
    let fake = &cluster.fake;
    let lb = json!({"type": "LoadBalancer"});
    let node_port = json!({"type": "NodePort"});
    for (name, annotations, spec) in [
        ("discarded", json!({"svc.openyurt.io/discard": "true"}), &lb),
        ("kept-lb", json!({}), &lb),
        (
            "np-other-pools",
            json!({"nodeport.openyurt.io/listen": "pool-b,pool-c"}),
            &node_port,
        ),
        (
            "np-not-ours",
            json!({"nodeport.openyurt.io/listen": "*,-pool-a"}),
            &node_port,
        ),
        (
            "np-ours",
            json!({"nodeport.openyurt.io/listen": "pool-a"}),
            &node_port,
        ),
        (
            "np-all",
            json!({"nodeport.openyurt.io/listen": "*"}),
            &node_port,
        ),
    ] {
        fake.create(
            "v1/services",
            service("shop", name, annotations, spec.clone()),
        )
        .unwrap();
    }
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;
    let path = format!("/api/v1/services?{PROXY_SELECTOR}");
    let list = ok_json(&call(&hub, &path, KUBE_PROXY, true).await, "kube-proxy");
    assert_eq!(
        names(&list),
        [
            "default/kubernetes",
            "shop/kept-lb",
            "shop/np-all",
            "shop/np-ours"
        ]
    );
    let all = ok_json(&call(&hub, &path, "kubectl/v1.32.4", true).await, "kubectl");
    assert_eq!(names(&all).len(), 7);
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwardkubesvctraffic_sends_kube_proxy_to_the_hub() {
    let cluster = Cluster::start().await;
    let mut kubernetes = slice("default", "kubernetes", "kubernetes", &[]);
    kubernetes["endpoints"] = json!([{"addresses": ["172.18.0.2"], "conditions": {"ready": true}}]);
    kubernetes["ports"] = json!([{"name": "https", "port": 6443, "protocol": "TCP"}]);
    cluster
        .fake
        .create("discovery.k8s.io/v1/endpointslices", kubernetes)
        .unwrap();
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;
    let path = format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}");
    let list = ok_json(&call(&hub, &path, KUBE_PROXY, true).await, "kube-proxy");
    let kubernetes = item(&list, "default", "kubernetes");
    assert_eq!(kubernetes["endpoints"].as_array().unwrap().len(), 1);
    assert_eq!(
        kubernetes["endpoints"][0]["addresses"],
        json!([HUB_HOST]),
        "{kubernetes}"
    );
    assert_eq!(kubernetes["ports"][0]["port"], hub_port(&hub));
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_gets_an_in_cluster_kube_proxy_config_and_pod_env_pointing_at_the_hub() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    let mut cm = fake
        .get("v1/configmaps", Some("kube-system"), "kube-proxy")
        .unwrap();
    cm["data"]["config.conf"] = json!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\nkind: KubeProxyConfiguration\n"
    );
    fake.update("v1/configmaps", cm).unwrap();
    fake.create(
        "v1/pods",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "app", "namespace": "default"},
               "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox", "env": [
                   {"name": "KUBERNETES_SERVICE_HOST", "value": "10.96.0.1"},
                   {"name": "KUBERNETES_SERVICE_PORT", "value": "443"},
                   {"name": "OTHER", "value": "x"}]}]}}),
    )
    .unwrap();
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;

    let cm = ok_json(
        &call(
            &hub,
            "/api/v1/namespaces/kube-system/configmaps/kube-proxy",
            KUBELET,
            true,
        )
        .await,
        "configmap",
    );
    let conf = cm["data"]["config.conf"].as_str().unwrap();
    assert!(
        conf.contains("#kubeconfig: /var/lib/kube-proxy/kubeconfig.conf"),
        "{conf}"
    );

    let pod = ok_json(
        &call(&hub, "/api/v1/namespaces/default/pods/app", KUBELET, false).await,
        "pod",
    );
    let env = &pod["spec"]["containers"][0]["env"];
    assert_eq!(
        env,
        &json!([
            {"name": "KUBERNETES_SERVICE_HOST", "value": HUB_HOST},
            {"name": "KUBERNETES_SERVICE_PORT", "value": hub_port(&hub).to_string()},
            {"name": "OTHER", "value": "x"}
        ])
    );
    hub.terminate();
}

/// kubelet's pod LIST, too large for the apiserver to declare its length, streams through
/// `serviceenvupdater` instead of being held whole, and a pod late in it that sets the
/// apiserver's address still reaches kubelet rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_pod_list_streams_through_the_filter_and_is_still_rewritten() {
    let cluster = Cluster::start().await;
    let fake = &cluster.fake;
    let pod = |name: &str, env: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default",
                            "annotations": {"pad": "x".repeat(8 << 10)}},
               "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox", "env": env}]}})
    };
    let web: Vec<String> = (0..40).map(|i| format!("web-{i:02}")).collect();
    for name in &web {
        fake.create("v1/pods", pod(name, json!([]))).unwrap();
    }
    let env = json!([{"name": "KUBERNETES_SERVICE_HOST", "value": "10.96.0.1"}]);
    fake.create("v1/pods", pod("zz-app", env)).unwrap();
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;

    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let resp = call(&hub, &path, KUBELET, false).await;
    let list = ok_json(&resp, "kubelet's pods");
    assert_eq!(resp.header("content-length"), None, "not held whole");
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    let app = item(&list, "default", "zz-app");
    assert_eq!(
        app["spec"]["containers"][0]["env"],
        json!([{"name": "KUBERNETES_SERVICE_HOST", "value": HUB_HOST}])
    );
    let listed = names(&list);
    let every_web = web.iter().all(|w| listed.contains(&format!("default/{w}")));
    assert!(every_web, "{listed:?}");
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_and_yurt_hub_cfg_choose_the_filters_live() {
    let cluster = Cluster::start().await;
    let mut args = cluster.hub_args();
    args.push("--disabled-resource-filters=servicetopology,nodeportisolation".into());
    let hub = HubProcess::spawn(&args);
    until_ready(&hub, "[+]config ok").await;
    let ip = |list: &Value| item(list, "default", "kubernetes")["spec"]["clusterIP"].clone();
    let cilium = "cilium-agent/1.16";
    let list = ok_json(
        &call(&hub, "/api/v1/services", cilium, true).await,
        "cilium",
    );
    assert_eq!(ip(&list), "10.96.0.1", "not a masterservice component yet");

    cluster
        .fake
        .create(
            "v1/configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "yurt-hub-cfg", "namespace": "kube-system"},
                   "data": {"masterservice": "cilium-agent"}}),
        )
        .unwrap();
    let mut got = Value::Null;
    for _ in 0..100 {
        got = ip(&ok_json(
            &call(&hub, "/api/v1/services", cilium, true).await,
            "cilium",
        ));
        if got == HUB_HOST {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        got, HUB_HOST,
        "yurt-hub-cfg added cilium-agent to masterservice"
    );
    assert!(hub.log_text().contains("filter components changed"));
    // No NodePool watch: servicetopology, the only filter that needs it, is off.
    let readyz =
        String::from_utf8_lossy(&get(hub.admin, "/v1/readyz?verbose", "t").await.body).into_owned();
    assert!(!readyz.contains("nodepools"), "{readyz}");
    hub.terminate();

    let mut args = cluster.hub_args();
    args.push("--enable-resource-filter=false".into());
    let hub = HubProcess::spawn(&args);
    until_ready(&hub, "[+]config ok").await;
    let list = ok_json(&call(&hub, "/api/v1/services", KUBELET, false).await, "off");
    assert_eq!(ip(&list), "10.96.0.1", "--enable-resource-filter=false");
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_mode_filters_writes_nothing_to_disk_and_answers_503_without_a_healthy_server() {
    let cluster = topology_cluster().await;
    cluster
        .fake
        .create(
            "v1/services",
            service(
                "shop",
                "discarded",
                json!({"svc.openyurt.io/discard": "true"}),
                json!({"type": "LoadBalancer"}),
            ),
        )
        .unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .filter(|a| !a.starts_with("--disk-cache-path"))
        .collect();
    args.push("--working-mode=cloud".into());
    args.push(format!(
        "--disk-cache-path={}",
        cache_dir.path().join("cache").display()
    ));
    let hub = HubProcess::spawn(&args);
    until_ready(&hub, "[+]filters ok").await;

    let services = format!("/api/v1/services?{PROXY_SELECTOR}");
    let list = ok_json(&call(&hub, &services, KUBE_PROXY, true).await, "services");
    assert!(
        names(&list).contains(&"shop/discarded".to_owned()),
        "discardcloudservice is off in cloud mode"
    );
    let slices = format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}");
    let list = ok_json(&call(&hub, &slices, KUBE_PROXY, true).await, "slices");
    assert_eq!(endpoint_nodes(item(&list, "shop", "by-host-abc")), [NODE]);
    let list = ok_json(
        &call(&hub, "/api/v1/services", KUBELET, false).await,
        "kubelet",
    );
    assert_eq!(
        item(&list, "default", "kubernetes")["spec"]["clusterIP"],
        HUB_HOST
    );
    for path in ["/api/v1/namespaces/default/pods", "/api/v1/nodes/edge-1"] {
        call(&hub, path, KUBELET, false).await;
    }
    assert!(
        !cache_dir.path().join("cache").exists(),
        "cloud mode never touches --disk-cache-path"
    );

    cluster.fake.refuse_connections();
    let mut last = None;
    for _ in 0..100 {
        let resp = call(&hub, "/api/v1/services", KUBELET, false).await;
        if resp.status == 503 {
            last = Some(resp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resp = last.expect("503 once no server is healthy");
    let status = resp.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 503);
    cluster.fake.restore().await;
    assert!(
        !cache_dir.path().join("cache").exists(),
        "nothing cached during the outage either"
    );
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nodepool_name_the_pool_comes_from_the_nodes_label() {
    let cluster = topology_cluster().await;
    let mut node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
    node["metadata"]["labels"]["apps.openyurt.io/nodepool"] = json!("pool-a");
    cluster.fake.update("v1/nodes", node).unwrap();
    let args: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .filter(|a| !a.starts_with("--nodepool-name"))
        .collect();
    let hub = HubProcess::spawn(&args);
    let readyz = until_ready(&hub, "[+]filters ok").await;
    let verbose =
        String::from_utf8_lossy(&get(hub.admin, "/v1/readyz?verbose", "t").await.body).into_owned();
    assert!(verbose.contains("node from cloud"), "{readyz}\n{verbose}");
    let path = format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}");
    let list = ok_json(&call(&hub, &path, KUBE_PROXY, true).await, "kube-proxy");
    assert_eq!(
        endpoint_nodes(item(&list, "shop", "by-pool-abc")),
        [NODE, "edge-3"]
    );
    hub.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restarted_offline_filters_with_the_side_data_it_cached() {
    let cluster = topology_cluster().await;
    let hub = cluster.start_hub();
    until_ready(&hub, "[+]filters ok").await;
    let path = format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}");
    let list = ok_json(&call(&hub, &path, KUBE_PROXY, true).await, "online");
    assert_eq!(endpoint_nodes(item(&list, "shop", "by-host-abc")), [NODE]);
    hub.terminate();

    cluster.fake.refuse_connections();
    let hub = cluster.start_hub();
    let verbose = loop_readyz_verbose(&hub, "services from edge cache").await;
    assert!(verbose.contains("nodepools from edge cache"), "{verbose}");
    let resp = call(&hub, &path, KUBE_PROXY, true).await;
    assert!(resp.header("x-outpost-served-from").is_some());
    let list = ok_json(&resp, "offline after restart");
    assert_eq!(endpoint_nodes(item(&list, "shop", "by-host-abc")), [NODE]);
    assert_eq!(
        endpoint_nodes(item(&list, "shop", "by-pool-abc")),
        [NODE, "edge-3"]
    );
    cluster.fake.restore().await;
    hub.terminate();
}

/// Polls `/v1/readyz?verbose` (bounded) until its body contains `needle`, whatever the code.
async fn loop_readyz_verbose(hub: &HubProcess, needle: &str) -> String {
    let mut body = String::new();
    for _ in 0..150 {
        let resp = get(hub.admin, "/v1/readyz?verbose", "test").await;
        body = String::from_utf8_lossy(&resp.body).into_owned();
        if body.contains(needle) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("readyz never said {needle:?}:\n{body}");
}
