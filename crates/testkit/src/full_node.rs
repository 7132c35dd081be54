//! A full edge node's objects in real shapes, shared by the benches (`benches/full_node.rs`)
//! and the cold-boot harness (`crates/outpost/examples/coldboot.rs`): pods spread over ten
//! `app-N` namespaces, each of the first [`MOUNTS`] mounting a ConfigMap and a Secret of its own,
//! and Services with their EndpointSlices. Callers choose the counts and create the objects.

use serde_json::{Value, json};

/// Pods `0..MOUNTS` each mount one ConfigMap and one Secret.
pub const MOUNTS: usize = 100;
/// Namespaces `app-0` … `app-9`.
pub const NAMESPACES: usize = 10;

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

/// A real pod `shape`, renamed, moved to `app-N` and bound to `node`; the first `MOUNTS` also
/// mount their own ConfigMap and Secret (so the node authorizer lets kubelet read them).
pub fn pod(shape: &Value, i: usize, node: &str) -> Value {
    let mut pod = shape.clone();
    let base = pod["metadata"]["name"].as_str().unwrap_or("pod").to_owned();
    let meta = pod["metadata"].as_object_mut().expect("pod metadata");
    for field in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generateName",
    ] {
        meta.shift_remove(field);
    }
    meta.insert("name".into(), format!("{base}-{i}").into());
    meta.insert("namespace".into(), app_ns(i).into());
    pod["spec"]["nodeName"] = node.into();
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

/// Pod `i`'s ConfigMap: an application config file.
pub fn config_map(i: usize) -> Value {
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

/// Pod `i`'s Secret: credentials and a key.
pub fn secret(i: usize) -> Value {
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

/// Service `i`'s ClusterIP.
pub fn cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", 1 + i / 250, 1 + i % 250)
}

/// Service `svc-i`, ClusterIP with two ports, as helm installs it.
pub fn service(i: usize) -> Value {
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

/// Service `i`'s EndpointSlice: one endpoint on `node`, one on another edge node.
pub fn endpoint_slice(i: usize, node: &str) -> Value {
    let app = format!("svc-{i}");
    let endpoints: Vec<Value> = (0..2)
        .map(|r| {
            json!({
                "addresses": [format!("10.244.{}.{}", (2 * i + r) / 250, 1 + (2 * i + r) % 250)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": if r == 0 { node.to_owned() } else { format!("edge-{}", 2 + i % 7) },
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
