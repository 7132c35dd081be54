//! The fleet's cluster in the fake apiserver: one Node per hub with its pods, the 10 ConfigMaps
//! and 10 Secrets those pods mount (kubelet watches each by name), Services with their
//! EndpointSlices in real shapes (`outpost_testkit::full_node`), and the identities of the
//! node-local agents: kube-proxy and coredns get a bearer token per node, so that the fake's
//! accounting can tell whose hub forwarded them.

use anyhow::{Result, anyhow};
use outpost_testkit::FakeApiServer;
use outpost_testkit::full_node::{NAMESPACES, endpoint_slice, service};
use serde_json::{Value, json};

/// Namespace of every node's pods, ConfigMaps and Secrets.
pub const NAMESPACE: &str = "fleet";
/// ConfigMaps per node, and as many Secrets: kubelet's 20 per-name watches.
pub const REFS: usize = 10;
/// The group the node-local agents' tokens are in, granted reads by [`AGENT_RBAC`].
pub const AGENTS_GROUP: &str = "fleet:agents";

/// The name of node `i` (0-based), also its hub's.
pub fn node_name(i: usize) -> String {
    format!("fleet-{:03}", i + 1)
}

/// The hub a user acts for: `system:node:<node>`, or an agent's `fleet:<agent>:<node>`.
pub fn node_of_user(user: &str) -> Option<&str> {
    user.strip_prefix("system:node:")
        .or_else(|| {
            user.strip_prefix("fleet:")
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, node)| node)
        })
        .filter(|node| node.starts_with("fleet-"))
}

/// kube-proxy's and coredns's bearer token on `node`; its user is `fleet:<agent>:<node>`.
pub fn agent_token(agent: &str, node: &str) -> String {
    format!("fleet-{agent}-{node}")
}

pub fn config_map_name(node: &str, k: usize) -> String {
    format!("{node}-config-{k}")
}

pub fn secret_name(node: &str, k: usize) -> String {
    format!("{node}-secret-{k}")
}

pub fn pod_name(node: &str, j: usize) -> String {
    format!("{node}-pod-{j}")
}

/// What the cluster holds.
pub struct Shape {
    pub nodes: usize,
    pub pods_per_node: usize,
    pub services: usize,
}

/// Creates everything; returns the number of objects created.
pub fn populate(fake: &FakeApiServer, shape: &Shape) -> Result<usize> {
    let mut created = 0;
    let mut create = |gvr: &str, obj: Value| -> Result<()> {
        fake.create(gvr, obj)
            .map_err(|s| anyhow!("create {gvr}: {}", s.message))?;
        created += 1;
        Ok(())
    };
    fake.apply_rbac(&agent_rbac())
        .map_err(|s| anyhow!("agents' RBAC: {}", s.message))?;
    create("v1/namespaces", json!({"metadata": {"name": NAMESPACE}}))?;
    for ns in 0..NAMESPACES {
        create(
            "v1/namespaces",
            json!({"metadata": {"name": format!("app-{ns}")}}),
        )?;
    }
    for i in 0..shape.nodes {
        let node = node_name(i);
        create("v1/nodes", node_object(&node))?;
        for k in 0..REFS {
            create("v1/configmaps", config_map(&node, k, 0))?;
            create("v1/secrets", secret(&node, k))?;
        }
        for j in 0..shape.pods_per_node {
            create("v1/pods", pod(&node, j))?;
        }
        for agent in ["kube-proxy", "coredns"] {
            fake.add_token(
                &agent_token(agent, &node),
                &format!("fleet:{agent}:{node}"),
                &[AGENTS_GROUP, "system:authenticated"],
            );
        }
    }
    for i in 0..shape.services {
        create("v1/services", service(i))?;
        let node = node_name(i % shape.nodes.max(1));
        create(
            "discovery.k8s.io/v1/endpointslices",
            endpoint_slice(i, &node),
        )?;
    }
    Ok(created)
}

/// What kube-proxy and coredns may read, as their ClusterRoles grant it.
fn agent_rbac() -> Vec<Value> {
    let read = json!(["get", "list", "watch"]);
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "fleet:agent"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "endpoints", "namespaces", "nodes"], "verbs": read},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "fleet:agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleet:agent"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": AGENTS_GROUP}]}),
    ]
}

fn node_object(node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {
            "kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "openyurt.io/is-edge-worker": "true", "apps.openyurt.io/nodepool": "pool-a"}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": "172.18.0.2"}, {"type": "Hostname", "address": node}],
            "nodeInfo": {"kubeletVersion": "v1.32.4", "kubeProxyVersion": "v1.32.4",
                         "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "containerd://1.7.24", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "kernelVersion": "6.1.0", "machineID": "", "systemUUID": "", "bootID": ""}}})
}

/// ConfigMap `k` of `node`, at data generation `generation` (the churn bumps it).
pub fn config_map(node: &str, k: usize, generation: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": config_map_name(node, k), "namespace": NAMESPACE,
                 "labels": {"app.kubernetes.io/part-of": "fleet"}},
    "data": {
        "application.yaml": format!(
            "server:\n  port: 8080\nlogging:\n  level: info\nupstream:\n  url: http://svc-{k}.app-{k}.svc.cluster.local:8080\n  timeout: 5s\n"),
        "GENERATION": generation.to_string(),
    }})
}

fn secret(node: &str, k: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": secret_name(node, k), "namespace": NAMESPACE},
        "data": {"username": "YXBw", "password": "c2VjcmV0LXBhc3N3b3JkLWZvci10aGUtYXBwbGljYXRpb24="}})
}

/// Pod `j` of `node`: mounts ConfigMap and Secret `j mod 10`; pod 0 mounts all of them, so
/// that the Node authorizer lets kubelet read every one whatever the pod count.
fn pod(node: &str, j: usize) -> Value {
    let refs: Vec<usize> = if j == 0 {
        (0..REFS).collect()
    } else {
        vec![j % REFS]
    };
    let mut volumes: Vec<Value> = Vec::new();
    for k in refs {
        volumes.push(json!({"name": format!("config-{k}"), "configMap": {"name": config_map_name(node, k), "defaultMode": 420}}));
        volumes.push(json!({"name": format!("secret-{k}"), "secret": {"secretName": secret_name(node, k), "defaultMode": 420}}));
    }
    let ip = format!("10.244.{}.{}", j / 250, 2 + j % 250);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(node, j), "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/name": format!("app-{}", j % REFS), "churn": "0"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.example/app:1.4.2",
                "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
                "volumeMounts": [{"name": format!("config-{}", j % REFS), "mountPath": "/etc/app"}]}],
            "volumes": volumes,
            "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 30},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "172.18.0.2",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}})
}

/// The node's pods in the fake: name -> resourceVersion, for every node at once.
pub fn pods_by_node(fake: &FakeApiServer) -> std::collections::HashMap<String, View> {
    let mut by_node: std::collections::HashMap<String, View> = Default::default();
    for pod in fake.list("v1/pods", Some(NAMESPACE)) {
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        by_node
            .entry(node.to_owned())
            .or_default()
            .insert(meta(&pod, "name"), meta(&pod, "resourceVersion"));
    }
    by_node
}

/// `namespace/name` -> resourceVersion of every object of `gvr` (kube-proxy's selector matches
/// all the fleet's Services and EndpointSlices: none is headless or names a service proxy).
pub fn view_of(fake: &FakeApiServer, gvr: &str) -> View {
    fake.list(gvr, None)
        .iter()
        .map(|o| {
            (
                format!("{}/{}", meta(o, "namespace"), meta(o, "name")),
                meta(o, "resourceVersion"),
            )
        })
        .collect()
}

/// name (or `namespace/name`) -> resourceVersion.
pub type View = std::collections::BTreeMap<String, String>;

pub fn meta(obj: &Value, field: &str) -> String {
    obj["metadata"][field]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}
