//! Server-side printing: `meta.k8s.io/v1` `Table` responses for clients that ask for them
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, which `kubectl get` sends).
//!
//! Columns follow kube-apiserver's printers (`pkg/printers/internalversion`) for the kinds edge
//! tests look at; other kinds get the generic `Name` / `Created At` table the apiserver uses for
//! resources without printers. Rows carry `PartialObjectMetadata` (the default `includeObject`).

use serde_json::{Value, json};

use crate::resources::ResourceDef;
use crate::util;

/// Whether the `Accept` header asks for a `meta.k8s.io/v1` Table.
pub fn wants_table(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    accept.split(',').any(|item| {
        let params: Vec<&str> = item.split(';').map(str::trim).collect();
        params.contains(&"as=Table")
            && params.contains(&"g=meta.k8s.io")
            && params.contains(&"v=v1")
    })
}

fn column(name: &str, kind: &str, format: &str, priority: u8) -> Value {
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
}

fn columns(kind: &str) -> Vec<Value> {
    let name = column("Name", "string", "name", 0);
    let age = column("Age", "string", "", 0);
    match kind {
        "Pod" => vec![
            name,
            column("Ready", "string", "", 0),
            column("Status", "string", "", 0),
            column("Restarts", "string", "", 0),
            age,
            column("IP", "string", "", 1),
            column("Node", "string", "", 1),
            column("Nominated Node", "string", "", 1),
            column("Readiness Gates", "string", "", 1),
        ],
        "Node" => vec![
            name,
            column("Status", "string", "", 0),
            column("Roles", "string", "", 0),
            age,
            column("Version", "string", "", 0),
        ],
        "Namespace" => vec![name, column("Status", "string", "", 0), age],
        "ConfigMap" => vec![name, column("Data", "integer", "", 0), age],
        "Secret" => vec![
            name,
            column("Type", "string", "", 0),
            column("Data", "integer", "", 0),
            age,
        ],
        "Lease" => vec![name, column("Holder", "string", "", 0), age],
        "Service" => vec![
            name,
            column("Type", "string", "", 0),
            column("Cluster-IP", "string", "", 0),
            column("External-IP", "string", "", 0),
            column("Port(s)", "string", "", 0),
            age,
        ],
        _ => vec![name, column("Created At", "date", "", 0)],
    }
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.into()
    }
}

fn age(obj: &Value) -> String {
    let created = util::parse_rfc3339(s(obj, "/metadata/creationTimestamp"));
    match created {
        Some(t) => util::human_duration(util::unix_now().saturating_sub(t)),
        None => "<unknown>".into(),
    }
}

fn len_of(v: &Value, pointer: &str) -> usize {
    v.pointer(pointer)
        .and_then(Value::as_object)
        .map_or(0, |m| m.len())
}

fn cells(kind: &str, obj: &Value) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    match kind {
        "Pod" => pod_cells(obj),
        "Node" => node_cells(obj),
        "Namespace" => vec![name, s(obj, "/status/phase").into(), age(obj).into()],
        "ConfigMap" => {
            let n = len_of(obj, "/data") + len_of(obj, "/binaryData");
            vec![name, n.into(), age(obj).into()]
        }
        "Secret" => vec![
            name,
            s(obj, "/type").into(),
            len_of(obj, "/data").into(),
            age(obj).into(),
        ],
        "Lease" => vec![
            name,
            or_none(s(obj, "/spec/holderIdentity")).into(),
            age(obj).into(),
        ],
        "Service" => service_cells(obj),
        _ => vec![name, s(obj, "/metadata/creationTimestamp").into()],
    }
}

fn pod_cells(obj: &Value) -> Vec<Value> {
    let statuses = obj
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array);
    let total = obj
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses.map_or(0, |c| c.iter().filter(|c| c["ready"] == true).count());
    let restarts: i64 = statuses.map_or(0, |c| {
        c.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
    });
    let status = if obj.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating".to_owned()
    } else if !s(obj, "/status/reason").is_empty() {
        s(obj, "/status/reason").to_owned()
    } else {
        s(obj, "/status/phase").to_owned()
    };
    vec![
        json!(s(obj, "/metadata/name")),
        format!("{ready}/{total}").into(),
        status.into(),
        restarts.to_string().into(),
        age(obj).into(),
        or_none(s(obj, "/status/podIP")).into(),
        or_none(s(obj, "/spec/nodeName")).into(),
        "<none>".into(),
        "<none>".into(),
    ]
}

fn node_cells(obj: &Value) -> Vec<Value> {
    let ready = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .is_some_and(|c| c["status"] == "True");
    let mut status = if ready { "Ready" } else { "NotReady" }.to_owned();
    if obj.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    vec![
        json!(s(obj, "/metadata/name")),
        status.into(),
        or_none(&roles.join(",")).into(),
        age(obj).into(),
        s(obj, "/status/nodeInfo/kubeletVersion").into(),
    ]
}

fn service_cells(obj: &Value) -> Vec<Value> {
    let ports: Vec<String> = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ports| {
            ports
                .iter()
                .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP")))
                .collect()
        })
        .unwrap_or_default();
    vec![
        json!(s(obj, "/metadata/name")),
        or_none(s(obj, "/spec/type")).into(),
        or_none(s(obj, "/spec/clusterIP")).into(),
        "<none>".into(),
        or_none(&ports.join(",")).into(),
        age(obj).into(),
    ]
}

fn row(def: &ResourceDef, obj: &Value) -> Value {
    json!({
        "cells": cells(def.kind, obj),
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_default(),
        },
    })
}

/// A Table for a list response (or for one object, wrapped as a one-row table).
pub fn from_list(def: &ResourceDef, list: &Value) -> Value {
    let rows: Vec<Value> = list["items"]
        .as_array()
        .map(|items| items.iter().map(|o| row(def, o)).collect())
        .unwrap_or_default();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "columnDefinitions": columns(def.kind),
        "rows": rows,
    })
}

pub fn from_object(def: &ResourceDef, obj: &Value) -> Value {
    let rv = s(obj, "/metadata/resourceVersion");
    let list = json!({"metadata": {"resourceVersion": rv}, "items": [obj]});
    from_list(def, &list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_gvr;

    #[test]
    fn detects_kubectl_table_accept_header() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert!(wants_table(Some(kubectl)));
        assert!(!wants_table(Some("application/json")));
        assert!(!wants_table(None));
    }

    #[test]
    fn pod_rows_follow_the_pod_printer() {
        let fixture: Value =
            serde_json::from_str(include_str!("../fixtures/kube-system-pods.json")).unwrap();
        let pods = by_gvr("v1/pods").unwrap();
        let table = from_list(pods, &fixture);
        assert_eq!(table["columnDefinitions"].as_array().unwrap().len(), 9);
        let first = &table["rows"][0];
        assert_eq!(first["cells"][0], "coredns-668d6bf9bc-898sq");
        assert_eq!(first["cells"][1], "1/1");
        assert_eq!(first["cells"][2], "Running");
        assert_eq!(first["cells"][6], "v1.32-control-plane");
        assert_eq!(first["object"]["metadata"]["namespace"], "kube-system");
    }

    #[test]
    fn node_and_default_tables() {
        let nodes = by_gvr("v1/nodes").unwrap();
        let node = json!({"metadata": {"name": "n", "labels": {"node-role.kubernetes.io/control-plane": ""}},
                          "spec": {"unschedulable": true},
                          "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.32.4"}}});
        let t = from_object(nodes, &node);
        assert_eq!(t["rows"][0]["cells"][1], "Ready,SchedulingDisabled");
        assert_eq!(t["rows"][0]["cells"][2], "control-plane");
        let leases = by_gvr("apps.openyurt.io/v1beta1/nodepools").unwrap();
        let t = from_object(
            leases,
            &json!({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        assert_eq!(t["columnDefinitions"][1]["name"], "Created At");
    }
}
