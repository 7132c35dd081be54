//! Node autonomy end to end: what a rebooted node's kubelet needs from the hub while the cloud is
//! away, sent as a Kubernetes 1.32 kubelet sends it (protobuf bodies, protobuf preferred back):
//! its lease across a hub restart, its registration, the service-account tokens of its pods, and
//! the node status it reports only while it is alive.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Cluster, HubProcess, NODE, kubelet_get, kubelet_send};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

fn start_hub(cluster: &Cluster, extra: &[&str]) -> HubProcess {
    cluster.start_hub_with_flags(extra)
}

/// The hub stopped and started again while the apiserver refuses connections: a node reboot
/// while the link is down.
async fn reboot_offline(cluster: &Cluster, hub: HubProcess) -> HubProcess {
    cluster.fake.refuse_connections();
    assert!(hub.terminate_within(Duration::from_secs(10)).success());
    let hub = cluster.start_hub();
    until_offline(&hub).await;
    hub
}

async fn until_offline(hub: &HubProcess) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = support::get(hub.admin, "/v1/readyz", "test").await;
        if String::from_utf8_lossy(&ready.body).contains("offline") {
            return;
        }
        assert!(Instant::now() < deadline, "the hub never went offline");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn lease(rv: Option<&str>, renew: &str) -> Value {
    let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": NODE, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": renew}});
    if let Some(rv) = rv {
        lease["metadata"]["resourceVersion"] = json!(rv);
    }
    lease
}

fn is_protobuf(resp: &support::RawResponse) -> bool {
    resp.header("content-type") == Some(outpost_core::wire::PROTOBUF)
}

/// kubelet's lease loop in protobuf, online and then after a reboot offline: the lease GET
/// finds what the hub had (no 404 that would make kubelet re-create it), and versions go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_protobuf_lease_is_answered_and_outlives_a_reboot() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let path = format!("{LEASE}/{NODE}");
    let got = kubelet_get(hub.proxy, &path).await;
    let renewed = match got.status {
        // The cloud has no lease yet: kubelet creates it.
        404 => {
            kubelet_send(
                hub.proxy,
                "POST",
                LEASE,
                &lease(None, "2026-11-26T10:00:00.000000Z"),
            )
            .await
        }
        200 => {
            let rv = got.object()["metadata"]["resourceVersion"].clone();
            let rv = rv.as_str().unwrap().to_owned();
            kubelet_send(
                hub.proxy,
                "PUT",
                &path,
                &lease(Some(&rv), "2026-11-26T10:00:00.000000Z"),
            )
            .await
        }
        other => panic!(
            "lease GET answered {other}: {}",
            String::from_utf8_lossy(&got.body)
        ),
    };
    assert!(
        matches!(renewed.status, 200 | 201),
        "{}",
        String::from_utf8_lossy(&renewed.body)
    );
    assert!(
        is_protobuf(&renewed),
        "kubelet prefers protobuf: {:?}",
        renewed.headers
    );
    let rv = renewed.object()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let put = kubelet_send(
        hub.proxy,
        "PUT",
        &path,
        &lease(Some(&rv), "2026-11-26T10:00:10.000000Z"),
    )
    .await;
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    let rv = put.object()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let hub = reboot_offline(&cluster, hub).await;
    let got = kubelet_get(hub.proxy, &path).await;
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    let kept = got.object();
    assert_eq!(kept["metadata"]["resourceVersion"], rv.as_str());
    assert_eq!(kept["spec"]["renewTime"], "2026-11-26T10:00:10.000000Z");
    let stale = kubelet_send(
        hub.proxy,
        "PUT",
        &path,
        &lease(Some("1"), "2026-11-26T10:01:00.000000Z"),
    )
    .await;
    assert_eq!(
        stale.status, 409,
        "a stale version is a conflict, as the apiserver says"
    );
    let next = kubelet_send(
        hub.proxy,
        "PUT",
        &path,
        &lease(Some(&rv), "2026-11-26T10:01:00.000000Z"),
    )
    .await;
    assert_eq!(next.status, 200, "{}", String::from_utf8_lossy(&next.body));
    let next_rv: u64 = next.object()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(next_rv, rv.parse::<u64>().unwrap() + 1);
}

fn node_object(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"}}})
}

/// kubelet registers at every start; offline the hub answers 409 AlreadyExists for the cached
/// node, as kube-apiserver would, so kubelet goes on to report status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_registration_finds_the_cached_node() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();
    let online = kubelet_send(hub.proxy, "POST", "/api/v1/nodes", &node_object(NODE)).await;
    assert_eq!(
        online.status,
        409,
        "the node exists: {}",
        String::from_utf8_lossy(&online.body)
    );
    let node = kubelet_get(hub.proxy, &format!("/api/v1/nodes/{NODE}")).await;
    assert_eq!(node.status, 200);
    // Let the writer store the node.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let hub = reboot_offline(&cluster, hub).await;
    let registered = kubelet_send(hub.proxy, "POST", "/api/v1/nodes", &node_object(NODE)).await;
    assert_eq!(
        registered.status,
        409,
        "{}",
        String::from_utf8_lossy(&registered.body)
    );
    let status = registered.object();
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("AlreadyExists"))
    );
    assert!(is_protobuf(&registered), "in the encoding kubelet prefers");
    let node = kubelet_get(hub.proxy, &format!("/api/v1/nodes/{NODE}")).await;
    assert_eq!(
        node.status, 200,
        "and kubelet's next step, the GET, is answered too"
    );

    let other = kubelet_send(hub.proxy, "POST", "/api/v1/nodes", &node_object("edge-2")).await;
    assert_eq!(other.status, 503, "only this node's own registration");
}

fn token_request(pod: &str, uid: &str, seconds: i64) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"],
                 "expirationSeconds": seconds,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid}}})
}

fn token_of(resp: &support::RawResponse) -> String {
    resp.object()["status"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A pod with a projected service-account token, bound to this node (the node authorizer lets
/// kubelet ask for its service account's tokens).
fn pod_with_token(cluster: &Cluster, name: &str) -> String {
    cluster
        .fake
        .create(
            "v1/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "web", "namespace": "default"}}),
        )
        .ok();
    let pod = cluster
        .fake
        .create(
            "v1/pods",
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "serviceAccountName": "web",
                     "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap();
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// Offline after a reboot, kubelet's TokenRequest for a pod gets the token the cloud last gave
/// for that very pod (even expired: kubelet mounts it, the pod starts); another pod's uid gets
/// none; and back online kubelet's refresh reaches the cloud and gets a fresh token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_token_requests_are_answered_for_the_same_pod_only() {
    let cluster = Cluster::start().await;
    let uid = pod_with_token(&cluster, "web-0");
    let hub = cluster.start_hub();
    let path = "/api/v1/namespaces/default/serviceaccounts/web/token";
    let current = kubelet_send(hub.proxy, "POST", path, &token_request("web-0", &uid, 3607)).await;
    assert_eq!(
        current.status,
        201,
        "{}",
        String::from_utf8_lossy(&current.body)
    );
    let issued = token_of(&current);
    assert!(!issued.is_empty());
    // One that expires at once: kubelet mounts it offline all the same.
    let short = kubelet_send(hub.proxy, "POST", path, &token_request("web-0", &uid, 1)).await;
    assert_eq!(short.status, 201);
    let short_token = token_of(&short);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let hub = reboot_offline(&cluster, hub).await;
    let served = kubelet_send(hub.proxy, "POST", path, &token_request("web-0", &uid, 3607)).await;
    assert_eq!(
        served.status,
        201,
        "{}",
        String::from_utf8_lossy(&served.body)
    );
    assert_eq!(
        token_of(&served),
        issued,
        "the cloud's last answer for this pod"
    );
    assert!(is_protobuf(&served) || served.header("content-type") == Some("application/json"));
    let expired = kubelet_send(hub.proxy, "POST", path, &token_request("web-0", &uid, 1)).await;
    assert_eq!(
        (expired.status, token_of(&expired)),
        (201, short_token),
        "served expired"
    );
    let stranger = kubelet_send(
        hub.proxy,
        "POST",
        path,
        &token_request("web-0", "another-uid", 3607),
    )
    .await;
    assert_eq!(
        stranger.status, 503,
        "a pod re-created under the same name gets no token"
    );
    let log = hub.log_text();
    assert!(
        log.contains("service-account token served from the edge cache"),
        "{log}"
    );
    assert!(!log.contains(&issued), "the token itself is never logged");
    let metrics = support::metrics_text(&hub).await;
    assert_eq!(
        support::sample(
            &metrics,
            r#"outpost_autonomy_total{outcome="served",request="token"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        support::sample(
            &metrics,
            r#"outpost_autonomy_total{outcome="served_expired",request="token"}"#
        ),
        Some(1.0)
    );

    cluster.fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let refreshed =
            kubelet_send(hub.proxy, "POST", path, &token_request("web-0", &uid, 3607)).await;
        if refreshed.status == 201 && token_of(&refreshed) != issued {
            assert!(
                refreshed.header("x-outpost-served-from").is_none(),
                "from the cloud"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kubelet's refresh never reached the cloud"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready_heartbeat(node: &Value) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map_or(Value::Null, |c| c["lastHeartbeatTime"].clone())
}

/// kubelet reports Ready while offline and then dies before the cloud is back: the hub, which
/// re-reads its evidence right before replaying, does not tell the cloud the node is Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_that_died_offline_is_not_reported_ready_on_reconnect() {
    let cluster = Cluster::start().await;
    let hub = start_hub(&cluster, &["--kubelet-health-grace-period=2s"]);
    let node_path = format!("/api/v1/nodes/{NODE}");
    assert_eq!(kubelet_get(hub.proxy, &node_path).await.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.fake.refuse_connections();
    until_offline(&hub).await;
    let beat = "2030-01-01T00:00:00Z";
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "lastHeartbeatTime": beat}]}});
    let accepted = kubelet_send(hub.proxy, "PATCH", &format!("{node_path}/status"), &patch).await;
    assert_eq!(
        accepted.status,
        200,
        "{}",
        String::from_utf8_lossy(&accepted.body)
    );

    // kubelet dies: no lease, no status for longer than the grace period.
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        let cloud = cluster.fake.get("v1/nodes", None, NODE).unwrap();
        assert_ne!(
            ready_heartbeat(&cloud),
            beat,
            "a dead kubelet was reported Ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = hub.log_text();
    assert!(log.contains("its offline node status is not sent"), "{log}");
}

const KUBE_PROXY: &str = "kube-proxy/v1.32.4 (linux/amd64) kubernetes/e2e";
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";

fn old_ip(i: usize) -> String {
    format!("10.244.1.{}", 10 + i)
}

fn new_ip(i: usize) -> String {
    format!("10.244.1.{}", 100 + i)
}

/// The addresses of the `web` EndpointSlice, endpoint by endpoint.
fn slice_addresses(list: &Value) -> Vec<String> {
    list["items"][0]["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["addresses"][0].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// kube-proxy's list of the slices, once the hub answers it from its shared cache.
async fn kube_proxy_slices(hub: &HubProcess) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = support::get(hub.proxy, SLICES, KUBE_PROXY).await;
        if resp.status == 200 && resp.header("x-outpost-served-from").is_some() {
            return resp.json();
        }
        assert!(
            Instant::now() < deadline,
            "kube-proxy's slices never answered by the hub: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The story an edge proxy exists for: the node reboots while the link is down and its pods
/// come back. kubelet's whole boot (issue 24's request list, protobuf bodies) is answered; its
/// pods' new IPs reach kube-proxy's EndpointSlices (an open watch gets a MODIFIED); and once
/// the cloud is back it has the node's and the pods' offline status and events, and nothing
/// else, while kube-proxy's slices are the cloud's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rebooted_offline_boots_its_pods_and_reports_back() {
    use outpost_testkit::kubelet_boot::{self, Boot, Scenario};
    let cluster = Cluster::start().await;
    let pods = Scenario::create(&cluster.fake, NODE, 3, old_ip);
    let hub = cluster.start_hub();
    let online = kubelet_boot::replay(&Boot {
        hub: hub.proxy,
        node: NODE,
        boot_id: "boot-1",
        pod_ip: &old_ip,
        now: "2026-11-26T10:00:00Z",
    })
    .await;
    assert!(
        online.unusable().is_empty(),
        "online:\n{}",
        online.summary()
    );
    assert_eq!(
        online.find("csinode create").map(|e| e.status),
        Some(201),
        "kubelet created its CSINode online:\n{}",
        online.summary()
    );
    assert_eq!(
        slice_addresses(&kube_proxy_slices(&hub).await),
        [old_ip(0), old_ip(1), old_ip(2)]
    );
    // Let the writer catch up with the last answers.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let hub = reboot_offline(&cluster, hub).await;
    let proxy = support::kube_client(&hub, KUBE_PROXY);
    let slices: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        kube::Api::namespaced(proxy, "shop");
    let watch = slices
        .watch(&kube::api::WatchParams::default().timeout(60), "0")
        .await
        .expect("an offline watch of the slices");
    let mut watch = Box::pin(watch);
    let offline = kubelet_boot::replay(&Boot {
        hub: hub.proxy,
        node: NODE,
        boot_id: "boot-2",
        pod_ip: &new_ip,
        now: "2026-11-26T11:00:00Z",
    })
    .await;
    assert!(
        offline.unusable().is_empty(),
        "offline:\n{}",
        offline.summary()
    );
    // A status patch for another pod of the same name (its uid precondition) is a conflict.
    let stale = support::kubelet_send(
        hub.proxy,
        "PATCH",
        "/api/v1/namespaces/shop/pods/web-0/status",
        &json!({"metadata": {"uid": "another-uid"}, "status": {"podIP": "10.9.9.9"}}),
    )
    .await;
    assert_eq!(
        stale.status,
        409,
        "{}",
        String::from_utf8_lossy(&stale.body)
    );
    let csinode = offline.find("csinode").expect("kubelet's CSINode wait");
    assert_eq!(
        (csinode.status, offline.find("csinode create").is_none()),
        (200, true),
        "the CSINode kubelet created is known offline: no create that would fail"
    );
    let token = offline.find("token web-0").expect("a token request");
    assert_eq!(token.served_from.as_deref(), Some("edge-cache"));
    assert_eq!(
        slice_addresses(&kube_proxy_slices(&hub).await),
        [new_ip(0), new_ip(1), new_ip(2)],
        "kube-proxy routes to where the pods now are"
    );
    let moved = tokio::time::timeout(Duration::from_secs(10), async {
        use futures_util::StreamExt;
        while let Some(event) = watch.next().await {
            if let Ok(kube::api::WatchEvent::Modified(slice)) = event {
                let first = slice
                    .endpoints
                    .unwrap_or_default()
                    .first()
                    .map(|e| e.addresses[0].clone());
                if first == Some(new_ip(0)) {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(moved, Ok(true), "the open watch sees the addresses move");

    cluster.fake.clear_requests();
    cluster.fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let node = cluster.fake.get("v1/nodes", None, NODE).unwrap();
        let pod_ips: Vec<Value> = pods
            .iter()
            .map(|p| {
                let name = p["metadata"]["name"].as_str().unwrap();
                cluster.fake.get("v1/pods", Some("shop"), name).unwrap()["status"]["podIP"].clone()
            })
            .collect();
        let events = cluster.fake.list("v1/events", Some("shop"));
        let reported = ready_heartbeat(&node) == "2026-11-26T11:00:00Z"
            && pod_ips == [json!(new_ip(0)), json!(new_ip(1)), json!(new_ip(2))]
            && events
                .iter()
                .filter(|e| {
                    e["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with(".boot-boot-2"))
                })
                .count()
                == 3;
        if reported {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cloud never got the offline status: node {node}\npods {pod_ips:?}\nevents {}",
            events.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing else was written in the node's name (besides the hub's own heartbeat, and the
    // secure port's serving-certificate request, which waits for the cloud at every start).
    let writes: Vec<String> = cluster
        .fake
        .requests()
        .iter()
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .map(|r| {
            format!(
                "{} {} {}",
                r.verb,
                r.resource,
                r.user_agent.as_deref().unwrap_or("")
            )
        })
        .collect();
    for write in &writes {
        assert!(
            write.starts_with("patch nodes outpost/node-status")
                || write.starts_with("patch pods outpost/pod-status")
                || write.starts_with("create events outpost/events")
                || write.starts_with("update leases outpost/heartbeat")
                || write.starts_with("create certificatesigningrequests outpost/certificates"),
            "unexpected write after reconnect: {write}\nall: {writes:?}"
        );
    }
    let back = kube_proxy_slices(&hub).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut back = back;
    while slice_addresses(&back) != [old_ip(0), old_ip(1), old_ip(2)] {
        assert!(
            Instant::now() < deadline,
            "the cloud's slice never came back: {back}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        back = kube_proxy_slices(&hub).await;
    }
}
