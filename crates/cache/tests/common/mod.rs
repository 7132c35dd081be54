//! Object builders shared by the integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use outpost_cache::{Gvr, Scope};
use outpost_core::selector::{FieldSelector, LabelSelector};
use serde_json::{Value, json};

pub fn pods() -> Gvr {
    Gvr::new("", "v1", "pods")
}

/// A small pod; `labels` like `[("app", "web")]`.
pub fn pod(ns: &str, name: &str, rv: &str, node: &str, labels: &[(&str, &str)]) -> Vec<u8> {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    serde_json::to_vec(&json!({
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv,
                     "uid": format!("uid-{ns}-{name}"), "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }))
    .expect("serializes")
}

pub fn bookmark(rv: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"kind": "Pod", "apiVersion": "v1",
        "metadata": {"resourceVersion": rv}}))
    .expect("serializes")
}

pub fn scope(component: &str, gvr: &Gvr, ns: Option<&str>, labels: &str, fields: &str) -> Scope {
    Scope::new(
        component,
        gvr,
        ns,
        LabelSelector::parse(labels).expect("label selector"),
        FieldSelector::parse(fields).expect("field selector"),
    )
}

pub fn refs(items: &[Vec<u8>]) -> Vec<&[u8]> {
    items.iter().map(Vec::as_slice).collect()
}

/// A JSON field of stored bytes, e.g. `field(bytes, "/metadata/name")`.
pub fn field(bytes: &[u8], pointer: &str) -> String {
    let v: Value = serde_json::from_slice(bytes).expect("stored bytes are JSON");
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
