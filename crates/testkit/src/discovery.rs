//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/<group>`, `/api/v1` and
//! `/apis/<group>/<version>`, built from the resource registry in kube-apiserver's legacy
//! (non-aggregated) JSON format.
//!
//! kubectl asks for aggregated discovery (`as=APIGroupDiscoveryList`) first and falls back to
//! these when the server answers with plain `APIVersions` / `APIGroupList`, as older servers do.
//! There is no OpenAPI: `/openapi/v2` and `/openapi/v3` are 404, so `kubectl apply` needs
//! `--validate=false`.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::resources::{RESOURCES, ResourceDef, group_versions};

/// `/version`: kubectl's dispatcher picks its binary from `major` / `minor`.
pub fn version(git_version: &str) -> Value {
    let numbers: Vec<&str> = git_version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .collect();
    let major = numbers.first().copied().unwrap_or("1");
    let minor = numbers.get(1).copied().unwrap_or("0");
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-22T16:02:27Z",
        "goVersion": "go1.23.8",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`: the core group's versions.
pub fn api_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}],
    })
}

fn group_doc(group: &str) -> Value {
    let versions: Vec<Value> = group_versions()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": versions, "preferredVersion": preferred})
}

/// `/apis`: every named group.
pub fn api_group_list() -> Value {
    let mut names: Vec<&str> = Vec::new();
    for (g, _) in group_versions() {
        if !g.is_empty() && !names.contains(&g) {
            names.push(g);
        }
    }
    let groups: Vec<Value> = names.into_iter().map(group_doc).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, or `None` if the group is not served.
pub fn api_group(group: &str) -> Option<Value> {
    if !RESOURCES
        .iter()
        .any(|r| r.group == group && !group.is_empty())
    {
        return None;
    }
    let mut doc = group_doc(group);
    doc["kind"] = "APIGroup".into();
    doc["apiVersion"] = "v1".into();
    Some(doc)
}

fn resource_entry(r: &ResourceDef) -> Value {
    let mut e = json!({
        "name": r.name,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": r.verbs,
    });
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        e["categories"] = json!(r.categories);
    }
    e
}

fn subresource_entries(r: &ResourceDef) -> Vec<Value> {
    let mut out = Vec::new();
    if crate::csr::is_csr(r) {
        out.push(json!({
            "name": format!("{}/approval", r.name),
            "singularName": "",
            "namespaced": false,
            "kind": r.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    if r.status {
        out.push(json!({
            "name": format!("{}/status", r.name),
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    if r.kind == "ServiceAccount" {
        out.push(json!({
            "name": "serviceaccounts/token",
            "singularName": "",
            "namespaced": true,
            "group": "authentication.k8s.io",
            "version": "v1",
            "kind": "TokenRequest",
            "verbs": ["create"],
        }));
    }
    out
}

/// `/api/v1` or `/apis/<group>/<version>`, or `None` if not served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in defs {
        resources.push(resource_entry(r));
        resources.extend(subresource_entries(r));
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let mut doc =
        json!({"kind": "APIResourceList", "groupVersion": group_version, "resources": resources});
    if !group.is_empty() {
        // Group lists carry apiVersion, the core one does not (a real apiserver quirk).
        doc["apiVersion"] = "v1".into();
    }
    Some(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_splits_git_version() {
        let v = version("v1.32.4");
        assert_eq!(v["major"], "1");
        assert_eq!(v["minor"], "32");
        assert_eq!(v["gitVersion"], "v1.32.4");
    }

    #[test]
    fn group_list_has_fixture_shape() {
        let fixture: Value = serde_json::from_str(include_str!("../fixtures/apis.json")).unwrap();
        let ours = api_group_list();
        assert_eq!(ours["kind"], fixture["kind"]);
        assert_eq!(ours["apiVersion"], fixture["apiVersion"]);
        let keys = |g: &Value| {
            let mut k: Vec<String> = g.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&ours["groups"][0]), keys(&fixture["groups"][0]));
        let names: Vec<&str> = ours["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        for g in [
            "apps",
            "coordination.k8s.io",
            "discovery.k8s.io",
            "rbac.authorization.k8s.io",
            "storage.k8s.io",
            "apps.openyurt.io",
        ] {
            assert!(names.contains(&g), "{g}");
        }
    }

    #[test]
    fn resource_lists_include_subresources() {
        let core = api_resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for n in [
            "pods",
            "pods/status",
            "nodes/status",
            "serviceaccounts/token",
            "services/status",
        ] {
            assert!(names.contains(&n), "{n}");
        }
        assert!(core.get("apiVersion").is_none());
        let leases = api_resource_list("coordination.k8s.io", "v1").unwrap();
        assert_eq!(leases["apiVersion"], "v1");
        assert_eq!(leases["resources"][0]["kind"], "Lease");
        assert!(api_resource_list("coordination.k8s.io", "v2").is_none());
        let csrs = api_resource_list("certificates.k8s.io", "v1").unwrap();
        let names: Vec<&str> = csrs["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "certificatesigningrequests",
                "certificatesigningrequests/approval",
                "certificatesigningrequests/status"
            ]
        );
        assert!(api_group("nope.io").is_none());
    }
}
