//! The default cluster state: the real kube-system pods from the fixture (kept byte-for-byte,
//! resourceVersions included) plus a small edge cluster around node `edge-1`: namespaces, the
//! control-plane and edge nodes, edge-1's Lease, the `kubernetes` Service and Endpoints,
//! default service accounts and the usual ConfigMaps.

use serde_json::{Value, json};

use crate::pki::TestPki;
use crate::registry::{self, Origin};
use crate::resources::by_gvr;
use crate::store::{Store, object_key};
use crate::util;

const PODS: &str = include_str!("../fixtures/kube-system-pods.json");

/// The node the fixture pods run on.
pub const CONTROL_PLANE_NODE: &str = "v1.32-control-plane";
/// The edge node Outpost's tests act as.
pub const EDGE_NODE: &str = "edge-1";

pub fn seed(store: &Store, pki: &TestPki) {
    let list_rv = seed_fixture_pods(store);
    store.advance_to(list_rv);
    for (gvr, obj) in objects(pki) {
        let def = by_gvr(gvr).expect("seed resources are registered");
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Err(e) = registry::create(store, def, ns.as_deref(), obj, Origin::Server) {
            tracing::warn!(gvr, error = %e.message, "seed object rejected");
        }
    }
}

/// Inserts the fixture pods as recorded; returns the list's resourceVersion.
fn seed_fixture_pods(store: &Store) -> u64 {
    let pods = by_gvr("v1/pods").expect("pods are registered");
    let list: Value = serde_json::from_str(PODS).expect("the pod fixture is valid JSON");
    for pod in list["items"].as_array().into_iter().flatten() {
        let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str);
        let name = pod
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        store.insert_raw(pods, &object_key(pods, ns, name), pod.clone());
    }
    list.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn namespace(name: &str) -> (&'static str, Value) {
    (
        "v1/namespaces",
        json!({"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
    )
}

fn node(name: &str, labels: Value) -> (&'static str, Value) {
    let now = util::now_rfc3339();
    (
        "v1/nodes",
        json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status",
                                "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "addresses": [{"type": "InternalIP", "address": "172.18.0.2"}, {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": "v1.32.4", "kubeProxyVersion": "v1.32.4",
                             "operatingSystem": "linux", "architecture": "amd64",
                             "containerRuntimeVersion": "containerd://1.7.24", "osImage": "Debian GNU/Linux 12 (bookworm)",
                             "kernelVersion": "6.1.0", "machineID": "", "systemUUID": "", "bootID": ""},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }),
    )
}

fn lease(node: &str) -> (&'static str, Value) {
    // MicroTime: RFC 3339 with microseconds.
    let renew = util::now_rfc3339().replace('Z', ".000000Z");
    (
        "coordination.k8s.io/v1/leases",
        json!({
            "metadata": {"name": node, "namespace": "kube-node-lease",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": util::new_uid()}]},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renew},
        }),
    )
}

fn service_account(ns: &str, name: &str) -> (&'static str, Value) {
    (
        "v1/serviceaccounts",
        json!({"metadata": {"name": name, "namespace": ns}}),
    )
}

fn config_map(ns: &str, name: &str, data: Value) -> (&'static str, Value) {
    (
        "v1/configmaps",
        json!({"metadata": {"name": name, "namespace": ns}, "data": data}),
    )
}

fn objects(pki: &TestPki) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        out.push(namespace(ns));
    }
    out.push(node(CONTROL_PLANE_NODE, json!({"kubernetes.io/hostname": CONTROL_PLANE_NODE, "node-role.kubernetes.io/control-plane": ""})));
    out.push(node(
        EDGE_NODE,
        json!({"kubernetes.io/hostname": EDGE_NODE, "openyurt.io/is-edge-worker": "true"}),
    ));
    out.push(lease(EDGE_NODE));
    out.push(("v1/services", json!({
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"], "type": "ClusterIP",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
        "status": {"loadBalancer": {}},
    })));
    out.push(("v1/endpoints", json!({
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "172.18.0.2"}], "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}],
    })));
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        out.push(service_account(ns, "default"));
        out.push(config_map(
            ns,
            "kube-root-ca.crt",
            json!({"ca.crt": pki.ca_pem}),
        ));
    }
    for sa in ["coredns", "kube-proxy", "kindnet"] {
        out.push(service_account("kube-system", sa));
    }
    out.push(config_map("kube-system", "coredns", json!({"Corefile": ".:53 {\n    errors\n    health\n    kubernetes cluster.local in-addr.arpa ip6.arpa\n    forward . /etc/resolv.conf\n    cache 30\n}\n"})));
    out.push(config_map("kube-system", "kube-proxy", json!({"config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n"})));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeding_keeps_fixture_versions_and_builds_the_edge_cluster() {
        let store = Store::new(100, 0);
        seed(&store, &TestPki::new().unwrap());
        let pods = by_gvr("v1/pods").unwrap();
        let coredns = store
            .get(pods, "kube-system/coredns-668d6bf9bc-898sq")
            .unwrap();
        assert_eq!(coredns["metadata"]["resourceVersion"], "435");
        assert!(store.current_rv() > 503);
        let nodes = by_gvr("v1/nodes").unwrap();
        assert!(store.get(nodes, EDGE_NODE).is_some());
        let leases = by_gvr("coordination.k8s.io/v1/leases").unwrap();
        assert!(store.get(leases, "kube-node-lease/edge-1").is_some());
        let cms = by_gvr("v1/configmaps").unwrap();
        assert_eq!(store.list(cms, "kube-system/").1.len(), 3);
    }
}
