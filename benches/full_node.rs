//! A full node's objects in real shapes, created through the fake's API: 110 pods bound to
//! [`NODE`] (the recorded kube-system pods, renamed and spread over ten `app-N` namespaces), the
//! first 100 of them each mounting one ConfigMap and one Secret of its own (200 objects), 1,000
//! Services and 1,000 EndpointSlices with two endpoints each, and the ServiceAccounts the pods run
//! as. The shapes are those of `crates/outpost/examples/coldboot.rs` (the cold-boot harness).

use outpost_testkit::FakeApiServer;
use serde_json::{Value, json};

use crate::{NODE, PodTemplates};

pub const PODS: usize = 110;
/// Pods `0..MOUNTS` each mount one ConfigMap and one Secret.
pub const MOUNTS: usize = 100;
pub const SERVICES: usize = 1000;
pub const NAMESPACES: usize = 10;

/// kube-proxy's label selector on Services and EndpointSlices, URL-encoded.
pub const PROXY_SELECTOR: &str = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";

/// What [`seed`] created that a replay needs to address.
pub struct FullNode {
    /// The node's pods as stored (with uid and resourceVersion).
    pub pods: Vec<Value>,
}

/// `app-<i mod 10>`: where pod, ConfigMap, Secret and Service `i` live.
pub fn app_ns(i: usize) -> String {
    format!("app-{}", i % NAMESPACES)
}

/// `(namespace, name)` of pod `i`'s ConfigMap (`i < MOUNTS`).
pub fn config_map_ref(i: usize) -> (String, String) {
    (app_ns(i), format!("app-config-{i}"))
}

/// `(namespace, name)` of pod `i`'s Secret (`i < MOUNTS`).
pub fn secret_ref(i: usize) -> (String, String) {
    (app_ns(i), format!("app-secret-{i}"))
}

/// Creates the full node in `fake` (on top of its default seed); panics on any rejection.
pub fn seed(fake: &FakeApiServer) -> FullNode {
    let create = |gvr: &str, obj: Value| -> Value {
        fake.create(gvr, obj)
            .unwrap_or_else(|s| panic!("create {gvr}: {}", s.message))
    };
    let templates = PodTemplates::default();
    let mut accounts: Vec<String> = templates
        .templates
        .iter()
        .filter_map(|p| p["spec"]["serviceAccountName"].as_str().map(str::to_owned))
        .collect();
    accounts.push("default".into());
    accounts.sort();
    accounts.dedup();
    for ns in 0..NAMESPACES {
        let ns = format!("app-{ns}");
        create("v1/namespaces", json!({"metadata": {"name": ns}}));
        for sa in &accounts {
            create(
                "v1/serviceaccounts",
                json!({"metadata": {"name": sa, "namespace": ns}}),
            );
        }
    }
    let pods = (0..PODS)
        .map(|i| create("v1/pods", pod(&templates, i)))
        .collect();
    for i in 0..MOUNTS {
        create("v1/configmaps", config_map(i));
        create("v1/secrets", secret(i));
    }
    for i in 0..SERVICES {
        create("v1/services", service(i));
        create("discovery.k8s.io/v1/endpointslices", endpoint_slice(i));
    }
    FullNode { pods }
}

/// A recorded pod, renamed, moved to `app-N` and bound to the node; the first `MOUNTS` also
/// mount their own ConfigMap and Secret (so the node authorizer lets kubelet read them).
fn pod(templates: &PodTemplates, i: usize) -> Value {
    let mut pod = templates.templates[i % templates.templates.len()].clone();
    let base = pod["metadata"]["name"].as_str().unwrap_or("pod").to_owned();
    let meta = pod["metadata"].as_object_mut().expect("pod metadata");
    meta.remove("generateName");
    meta.insert("name".into(), format!("{base}-{i}").into());
    meta.insert("namespace".into(), app_ns(i).into());
    pod["spec"]["nodeName"] = NODE.into();
    if i < MOUNTS {
        let volumes = pod["spec"]
            .as_object_mut()
            .expect("pod spec")
            .entry("volumes")
            .or_insert_with(|| json!([]));
        if let Some(v) = volumes.as_array_mut() {
            let (_, cm) = config_map_ref(i);
            let (_, secret) = secret_ref(i);
            v.push(json!({"name": "app-config", "configMap": {"name": cm, "defaultMode": 420}}));
            v.push(
                json!({"name": "app-secret", "secret": {"secretName": secret, "defaultMode": 420}}),
            );
        }
    }
    pod
}

fn config_map(i: usize) -> Value {
    let (ns, name) = config_map_ref(i);
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app.kubernetes.io/name": format!("app-{i}"), "app.kubernetes.io/part-of": "shop"}},
        "data": {
            "application.yaml": format!(
                "server:\n  port: 8080\n  shutdownGracePeriod: 20s\nlogging:\n  level: info\n  format: json\n\
                 upstream:\n  url: http://svc-{i}.{ns}.svc.cluster.local:8080\n  timeout: 5s\n  retries: 3\n\
                 features:\n  cache: true\n  tracing: false\n"),
            "LOG_LEVEL": "info",
        },
    })
}

fn secret(i: usize) -> Value {
    let (ns, name) = secret_ref(i);
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app.kubernetes.io/name": format!("app-{i}")}},
        "type": "Opaque",
        "data": {
            "username": "YXBw",
            "password": "c2VjcmV0LXBhc3N3b3JkLWZvci10aGUtYXBwbGljYXRpb24=",
            "tls.key": "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUV2UUlCQURBTkJna3Foa2lHOXcwQkFRRUZBQVNDQktjd2dnU2pBZ0VBQW9JQkFRQzMKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo=",
        },
    })
}

fn cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", 1 + i / 250, 1 + i % 250)
}

fn service(i: usize) -> Value {
    let app = format!("svc-{i}");
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, "namespace": app_ns(i),
                     "labels": {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "shop"},
                     "annotations": {"meta.helm.sh/release-name": "shop", "meta.helm.sh/release-namespace": app_ns(i)}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip(i),
            "clusterIPs": [cluster_ip(i)],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "sessionAffinity": "None",
            "selector": {"app.kubernetes.io/name": app},
            "ports": [
                {"name": "http", "port": 8080, "protocol": "TCP", "targetPort": "http"},
                {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090},
            ],
        },
        "status": {"loadBalancer": {}},
    })
}

fn endpoint_slice(i: usize) -> Value {
    let app = format!("svc-{i}");
    let endpoints: Vec<Value> = (0..2)
        .map(|r| {
            json!({
                "addresses": [format!("10.244.{}.{}", (2 * i + r) / 250, 1 + (2 * i + r) % 250)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": if r == 0 { NODE.to_owned() } else { format!("edge-{}", 2 + i % 7) },
                "targetRef": {"kind": "Pod", "namespace": app_ns(i), "name": format!("{app}-7d9f8b6c5-{r}x2kq"),
                              "uid": format!("3f0c6a2e-1b7d-4c1e-9a5f-{:012x}", 2 * i + r)},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": format!("{app}-x7k2p"), "namespace": app_ns(i),
                     "generateName": format!("{app}-"),
                     "labels": {"app.kubernetes.io/name": app, "kubernetes.io/service-name": app,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-20T08:14:03Z"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": app,
                                          "uid": format!("7e3b1c9d-5a2f-4e8b-b1d6-{i:012x}"),
                                          "controller": true, "blockOwnerDeletion": true}]},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [
            {"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "metrics", "port": 9090, "protocol": "TCP"},
        ],
    })
}
