//! The node authorizer's graph, answered by scanning the store's pods (fine at test scale).
//!
//! A node reaches a secret, configmap, PVC or service account only through a pod bound to it
//! (`spec.nodeName`), via volumes (including projected sources), env / envFrom references,
//! image pull secrets or the pod's service account, as `plugin/pkg/auth/authorizer/node/graph`.

use serde_json::Value;

use crate::authz::{NodeGraph, RefKind};
use crate::resources::by_gvr;
use crate::store::{Store, object_key};

pub struct StoreGraph<'a>(pub &'a Store);

impl NodeGraph for StoreGraph<'_> {
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
        let pods = by_gvr("v1/pods")?;
        let pod = self.0.get(pods, &object_key(pods, Some(namespace), name))?;
        Some(str_at(&pod, "/spec/nodeName").to_owned())
    }

    fn referenced_by_node(&self, node: &str, kind: RefKind, namespace: &str, name: &str) -> bool {
        let Some(pods) = by_gvr("v1/pods") else {
            return false;
        };
        let (_, items) = self.0.list(pods, &format!("{namespace}/"));
        items
            .iter()
            .filter(|(_, pod)| str_at(pod, "/spec/nodeName") == node)
            .any(|(_, pod)| references(pod, kind).iter().any(|r| r == name))
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Names of objects of `kind` a pod spec refers to.
pub fn references(pod: &Value, kind: RefKind) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |s: &str| {
        if !s.is_empty() {
            out.push(s.to_owned());
        }
    };
    match kind {
        RefKind::ServiceAccount => {
            let sa = str_at(pod, "/spec/serviceAccountName");
            push(if sa.is_empty() { "default" } else { sa });
        }
        RefKind::PersistentVolumeClaim => {
            for v in array_at(pod, "/spec/volumes") {
                push(str_at(v, "/persistentVolumeClaim/claimName"));
                if v.pointer("/ephemeral").is_some() {
                    push(&format!(
                        "{}-{}",
                        str_at(pod, "/metadata/name"),
                        str_at(v, "/name")
                    ));
                }
            }
        }
        RefKind::Secret | RefKind::ConfigMap => {
            for name in volume_refs(pod, kind)
                .into_iter()
                .chain(container_refs(pod, kind))
            {
                push(&name);
            }
            if kind == RefKind::Secret {
                for s in array_at(pod, "/spec/imagePullSecrets") {
                    push(str_at(s, "/name"));
                }
            }
        }
    }
    out
}

fn volume_refs(pod: &Value, kind: RefKind) -> Vec<String> {
    let (direct, projected) = match kind {
        RefKind::Secret => ("/secret/secretName", "/secret/name"),
        _ => ("/configMap/name", "/configMap/name"),
    };
    let mut out = Vec::new();
    for v in array_at(pod, "/spec/volumes") {
        out.push(str_at(v, direct).to_owned());
        for src in array_at(v, "/projected/sources") {
            out.push(str_at(src, projected).to_owned());
        }
        if kind == RefKind::Secret {
            for p in [
                "/csi/nodePublishSecretRef/name",
                "/cephfs/secretRef/name",
                "/rbd/secretRef/name",
                "/iscsi/secretRef/name",
                "/flexVolume/secretRef/name",
                "/azureFile/secretName",
            ] {
                out.push(str_at(v, p).to_owned());
            }
        }
    }
    out
}

fn container_refs(pod: &Value, kind: RefKind) -> Vec<String> {
    let (key_ref, from_ref) = match kind {
        RefKind::Secret => ("/valueFrom/secretKeyRef/name", "/secretRef/name"),
        _ => ("/valueFrom/configMapKeyRef/name", "/configMapRef/name"),
    };
    let mut out = Vec::new();
    for list in [
        "/spec/containers",
        "/spec/initContainers",
        "/spec/ephemeralContainers",
    ] {
        for c in array_at(pod, list) {
            for e in array_at(c, "/env") {
                out.push(str_at(e, key_ref).to_owned());
            }
            for e in array_at(c, "/envFrom") {
                out.push(str_at(e, from_ref).to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "nodeName": "edge-1",
                "serviceAccountName": "app",
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cfg-vol"}},
                    {"name": "b", "secret": {"secretName": "sec-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"secret": {"name": "sec-proj"}},
                        {"serviceAccountToken": {"path": "token"}}
                    ]}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}
                ],
                "containers": [{
                    "name": "c",
                    "env": [
                        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg-env", "key": "x"}}},
                        {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "y"}}}
                    ],
                    "envFrom": [{"configMapRef": {"name": "cfg-from"}}, {"secretRef": {"name": "sec-from"}}]
                }]
            }
        })
    }

    #[test]
    fn finds_every_reference_kind() {
        let p = pod();
        let mut cms = references(&p, RefKind::ConfigMap);
        cms.sort();
        assert_eq!(cms, ["cfg-env", "cfg-from", "cfg-vol", "kube-root-ca.crt"]);
        let mut secrets = references(&p, RefKind::Secret);
        secrets.sort();
        assert_eq!(
            secrets,
            ["pull", "sec-env", "sec-from", "sec-proj", "sec-vol"]
        );
        assert_eq!(references(&p, RefKind::PersistentVolumeClaim), ["data"]);
        assert_eq!(references(&p, RefKind::ServiceAccount), ["app"]);
    }

    #[test]
    fn store_graph_follows_bound_pods() {
        let store = Store::new(10, 1);
        let pods = by_gvr("v1/pods").unwrap();
        store.insert_raw(pods, "default/web", pod());
        let g = StoreGraph(&store);
        assert_eq!(g.pod_node("default", "web").as_deref(), Some("edge-1"));
        assert!(g.referenced_by_node("edge-1", RefKind::ConfigMap, "default", "cfg-vol"));
        assert!(!g.referenced_by_node("edge-2", RefKind::ConfigMap, "default", "cfg-vol"));
        assert!(!g.referenced_by_node("edge-1", RefKind::ConfigMap, "other", "cfg-vol"));
        assert!(!g.referenced_by_node("edge-1", RefKind::Secret, "default", "cfg-vol"));
    }
}
