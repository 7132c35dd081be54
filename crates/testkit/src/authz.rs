//! Authorization: the Node authorizer (Kubernetes 1.32, `AuthorizeNodeWithSelectors`, KEP-4601)
//! in union with RBAC (the `rbac` module), as `--authorization-mode=Node,RBAC`, plus the
//! NodeRestriction admission checks, an "everything" policy for authenticated users that are not
//! nodes, and `system:public-info-viewer` for anonymous callers.
//!
//! The node rules follow `plugin/pkg/auth/authorizer/node/node_authorizer.go` and the static
//! `NodeRules()` of the bootstrap policy; relationships (which pods run on the node, which
//! secrets / configmaps / PVCs / service accounts they reference) come from a [`NodeGraph`],
//! and roles and bindings from an [`RbacPolicy`], so the rules are unit-testable without a store.

use outpost_core::Status;
use outpost_core::selector::FieldSelector;
use serde_json::Value;

use crate::authn::UserInfo;
use crate::rbac::{self, RbacPolicy};

/// What is being asked, as kube-apiserver's `authorizer.Attributes`.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    pub user: &'a UserInfo,
    pub verb: &'a str,
    pub resource_request: bool,
    pub path: &'a str,
    pub api_group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    /// For list/watch, taken from a `metadata.name=` field selector, like `RequestInfo`.
    pub name: &'a str,
    pub field_selector: Option<&'a FieldSelector>,
}

/// Allow, or deny with the authorizer's reason (may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(String),
}

/// Object kinds a node may reach through its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    Secret,
    ConfigMap,
    PersistentVolumeClaim,
    ServiceAccount,
}

/// The node authorizer's graph, answered from the store.
pub trait NodeGraph {
    /// `spec.nodeName` of a pod, if the pod exists.
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String>;
    /// Whether a pod bound to `node` references the object.
    fn referenced_by_node(&self, node: &str, kind: RefKind, namespace: &str, name: &str) -> bool;
}

/// `NodeIdentifier`: user `system:node:<name>` in group `system:nodes`.
pub fn node_name(user: &UserInfo) -> Option<&str> {
    let name = user.name.strip_prefix("system:node:")?;
    user.in_group("system:nodes").then_some(name)
}

const PUBLIC_INFO: &[&str] = &["/healthz", "/livez", "/readyz", "/version", "/version/"];

fn is_discovery_path(path: &str) -> bool {
    let prefixed = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    prefixed("/api") || prefixed("/apis") || prefixed("/openapi")
}

/// The union of the cluster's authorizers for this fake: allowed if any of them allows.
pub fn authorize(
    attrs: &Attributes<'_>,
    graph: &dyn NodeGraph,
    policy: &dyn RbacPolicy,
) -> Decision {
    let public = !attrs.resource_request && PUBLIC_INFO.contains(&attrs.path);
    if public && attrs.verb == "get" {
        return Decision::Allow;
    }
    let node = node_name(attrs.user);
    if node.is_none() && !attrs.user.is_anonymous() {
        return Decision::Allow;
    }
    // Node first, then RBAC. Neither ever denies outright (both answer "no opinion"), so the
    // union authorizer tries both and joins their non-empty reasons with newlines.
    let node_reason = match node.map(|n| authorize_as_node(n, attrs, graph)) {
        Some(Decision::Allow) => return Decision::Allow,
        Some(Decision::Deny(reason)) => reason,
        None => String::new(),
    };
    let Decision::Deny(rbac_reason) = rbac::authorize(attrs, policy) else {
        return Decision::Allow;
    };
    let reasons: Vec<String> = [node_reason, rbac_reason]
        .into_iter()
        .filter(|r| !r.is_empty())
        .collect();
    Decision::Deny(reasons.join("\n"))
}

/// The Node authorizer's decision for one of its node identities.
fn authorize_as_node(node: &str, attrs: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    if !attrs.resource_request {
        return allow_if(
            attrs.verb == "get" && is_discovery_path(attrs.path),
            String::new(),
        );
    }
    authorize_node(node, attrs, graph)
}

fn allow_if(cond: bool, reason: impl Into<String>) -> Decision {
    if cond {
        Decision::Allow
    } else {
        Decision::Deny(reason.into())
    }
}

fn authorize_node(node: &str, a: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    match (a.api_group, a.resource) {
        ("", "secrets") => read_namespaced_object(node, RefKind::Secret, a, graph),
        ("", "configmaps") => read_namespaced_object(node, RefKind::ConfigMap, a, graph),
        ("", "persistentvolumeclaims") => persistent_volume_claim(node, a, graph),
        ("", "serviceaccounts") => create_token(node, a, graph),
        ("coordination.k8s.io", "leases") => lease(node, a),
        ("storage.k8s.io", "csinodes") => csi_node(node, a),
        ("", "nodes") => node_object(node, a),
        ("", "pods") => pod(node, a, graph),
        _ => allow_if(static_node_rules(a), String::new()),
    }
}

fn read_namespaced_object(
    node: &str,
    kind: RefKind,
    a: &Attributes<'_>,
    graph: &dyn NodeGraph,
) -> Decision {
    if !matches!(a.verb, "get" | "list" | "watch") {
        return Decision::Deny("can only read resources of this type".into());
    }
    if !a.subresource.is_empty() {
        return Decision::Deny("cannot read subresource".into());
    }
    if a.namespace.is_empty() {
        return Decision::Deny("can only read namespaced object of this type".into());
    }
    related(node, kind, a, graph)
}

fn related(node: &str, kind: RefKind, a: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    if a.name.is_empty() {
        return Decision::Deny("No Object name found".into());
    }
    allow_if(
        graph.referenced_by_node(node, kind, a.namespace, a.name),
        format!("no relationship found between node '{node}' and this object"),
    )
}

fn persistent_volume_claim(node: &str, a: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    if a.subresource == "status" {
        if !matches!(a.verb, "update" | "patch") {
            return Decision::Deny("can only get, update, or patch a PVC status".into());
        }
        return related(node, RefKind::PersistentVolumeClaim, a, graph);
    }
    get_only(node, RefKind::PersistentVolumeClaim, a, graph)
}

fn get_only(node: &str, kind: RefKind, a: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    if a.verb != "get" {
        return Decision::Deny("can only get individual resources of this type".into());
    }
    if !a.subresource.is_empty() {
        return Decision::Deny("cannot get subresource".into());
    }
    related(node, kind, a, graph)
}

fn create_token(node: &str, a: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    if a.verb != "create" || a.name.is_empty() {
        return Decision::Deny("can only create tokens for individual service accounts".into());
    }
    if a.subresource != "token" {
        return Decision::Deny("can only create token subresource of serviceaccount".into());
    }
    related(node, RefKind::ServiceAccount, a, graph)
}

fn lease(node: &str, a: &Attributes<'_>) -> Decision {
    if !matches!(a.verb, "get" | "create" | "update" | "patch" | "delete") {
        return Decision::Deny(
            "can only get, create, update, patch, or delete a node lease".into(),
        );
    }
    if a.namespace != "kube-node-lease" {
        return Decision::Deny(
            "can only access leases in the \"kube-node-lease\" system namespace".into(),
        );
    }
    // The name of a create is only known to admission (NodeRestriction checks it).
    allow_if(
        a.verb == "create" || a.name == node,
        "can only access node lease with the same name as the requesting node",
    )
}

fn csi_node(node: &str, a: &Attributes<'_>) -> Decision {
    if !matches!(a.verb, "get" | "create" | "update" | "patch" | "delete") {
        return Decision::Deny("can only get, create, update, patch, or delete a CSINode".into());
    }
    if !a.subresource.is_empty() {
        return Decision::Deny("cannot authorize CSINode subresources".into());
    }
    allow_if(
        a.verb == "create" || a.name == node,
        "can only access CSINode with the same name as the requesting node",
    )
}

fn node_object(node: &str, a: &Attributes<'_>) -> Decision {
    match (a.subresource, a.verb) {
        // NodeRestriction limits these to the node's own object.
        ("", "create" | "update" | "patch") | ("status", "update" | "patch") => Decision::Allow,
        ("", "get" | "list" | "watch") => match a.name {
            n if n == node => Decision::Allow,
            "" => Decision::Deny(format!(
                "node '{node}' cannot read all nodes, only its own Node object"
            )),
            other => Decision::Deny(format!(
                "node '{node}' cannot read '{other}', only its own Node object"
            )),
        },
        _ => Decision::Deny(String::new()),
    }
}

fn pod(node: &str, a: &Attributes<'_>, graph: &dyn NodeGraph) -> Decision {
    match a.verb {
        "get" => {
            if !a.subresource.is_empty() {
                return Decision::Deny("cannot get subresource".into());
            }
            let bound = graph.pod_node(a.namespace, a.name).as_deref() == Some(node);
            allow_if(
                bound,
                format!("no relationship found between node '{node}' and this object"),
            )
        }
        "list" | "watch" => {
            let scoped = a
                .field_selector
                .and_then(|f| f.requires_exact_match("spec.nodeName"))
                == Some(node);
            allow_if(
                scoped,
                "can only list/watch pods with spec.nodeName field selector",
            )
        }
        _ => allow_if(static_node_rules(a), String::new()),
    }
}

/// `NodeRules()` of the bootstrap policy, for resources the graph does not subdivide.
fn static_node_rules(a: &Attributes<'_>) -> bool {
    let read = matches!(a.verb, "get" | "list" | "watch");
    match (a.api_group, a.resource, a.subresource) {
        ("authentication.k8s.io", "tokenreviews", "") => a.verb == "create",
        ("authorization.k8s.io", "subjectaccessreviews" | "localsubjectaccessreviews", "") => {
            a.verb == "create"
        }
        ("", "services", "") => read,
        ("", "events", "") => matches!(a.verb, "create" | "update" | "patch"),
        ("", "pods", "") => matches!(a.verb, "create" | "delete"),
        ("", "pods", "status") => matches!(a.verb, "update" | "patch"),
        ("", "pods", "eviction") => a.verb == "create",
        ("", "endpoints", "") => a.verb == "get",
        ("certificates.k8s.io", "certificatesigningrequests", "") => {
            matches!(a.verb, "create" | "get" | "list" | "watch")
        }
        ("storage.k8s.io", "volumeattachments", "") => a.verb == "get",
        ("storage.k8s.io", "csidrivers", "") => read,
        ("node.k8s.io", "runtimeclasses", "") => read,
        _ => false,
    }
}

/// NodeRestriction admission for writes a node may make; `Some(message)` rejects with 403.
pub fn node_restriction(
    attrs: &Attributes<'_>,
    body: Option<&Value>,
    graph: &dyn NodeGraph,
) -> Option<String> {
    let node = node_name(attrs.user)?;
    let body_name = body
        .and_then(|b| b.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let target = if attrs.name.is_empty() {
        body_name
    } else {
        attrs.name
    };
    match (attrs.api_group, attrs.resource, attrs.subresource, attrs.verb) {
        ("", "nodes", _, "create" | "update" | "patch") if target != node => {
            Some(format!("node \"{node}\" is not allowed to modify node \"{target}\""))
        }
        ("coordination.k8s.io", "leases", _, "create") if target != node => {
            Some("can only access node lease with the same name as the requesting node".into())
        }
        ("storage.k8s.io", "csinodes", _, "create") if target != node => {
            Some(format!("node \"{node}\" is not allowed to modify object \"{target}\""))
        }
        ("", "pods", "", "create") => mirror_pod_violation(node, body),
        ("", "pods", "", "delete") => (graph.pod_node(attrs.namespace, attrs.name).as_deref()
            != Some(node))
        .then(|| format!("node \"{node}\" can only delete pods with spec.nodeName set to itself")),
        ("", "pods", "status", _) => (graph.pod_node(attrs.namespace, attrs.name).as_deref()
            != Some(node))
        .then(|| {
            format!("node \"{node}\" can only update pod status for pods with spec.nodeName set to itself")
        }),
        _ => None,
    }
}

fn mirror_pod_violation(node: &str, body: Option<&Value>) -> Option<String> {
    let body = body?;
    let mirror = body
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    if !mirror {
        return Some(format!(
            "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
        ));
    }
    let bound = body.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node);
    (!bound)
        .then(|| format!("node \"{node}\" can only create pods with spec.nodeName set to itself"))
}

/// The 403 `responsewriters.Forbidden` writes, e.g. `pods is forbidden: User "x" cannot list
/// resource "pods" in API group "" in the namespace "default"`.
pub fn forbidden(attrs: &Attributes<'_>, reason: &str) -> Status {
    let user = &attrs.user.name;
    let mut msg = if attrs.resource_request {
        let mut resource = attrs.resource.to_owned();
        if !attrs.subresource.is_empty() {
            resource = format!("{resource}/{}", attrs.subresource);
        }
        let scope = if attrs.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace \"{}\"", attrs.namespace)
        };
        format!(
            "User \"{user}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            attrs.verb, attrs.api_group
        )
    } else {
        format!(
            "User \"{user}\" cannot {} path \"{}\"",
            attrs.verb, attrs.path
        )
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    forbidden_for(attrs, &msg)
}

/// `errors.NewForbidden(groupResource, name, err)`.
pub fn forbidden_for(attrs: &Attributes<'_>, message: &str) -> Status {
    let qualified = match (attrs.resource, attrs.api_group) {
        ("", _) => String::new(),
        (r, "") => r.to_owned(),
        (r, g) => format!("{r}.{g}"),
    };
    let full = match (qualified.is_empty(), attrs.name.is_empty()) {
        (true, _) => format!("forbidden: {message}"),
        (false, true) => format!("{qualified} is forbidden: {message}"),
        (false, false) => format!("{qualified} \"{}\" is forbidden: {message}", attrs.name),
    };
    Status::forbidden(full).with_details(attrs.api_group, attrs.resource, attrs.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::rbac::StaticPolicy;

    /// Pod `default/web` runs on edge-1 and uses configmap `cfg`, secret `sec`, SA `app`.
    struct Graph;

    impl NodeGraph for Graph {
        fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
            match (namespace, name) {
                ("default", "web") => Some("edge-1".into()),
                ("default", "other") => Some("edge-2".into()),
                _ => None,
            }
        }

        fn referenced_by_node(&self, node: &str, kind: RefKind, ns: &str, name: &str) -> bool {
            let refs = [
                (RefKind::ConfigMap, "cfg"),
                (RefKind::Secret, "sec"),
                (RefKind::ServiceAccount, "app"),
                (RefKind::PersistentVolumeClaim, "data"),
            ];
            node == "edge-1" && ns == "default" && refs.contains(&(kind, name))
        }
    }

    fn node_user(name: &str) -> UserInfo {
        UserInfo {
            name: format!("system:node:{name}"),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
        }
    }

    struct Req {
        verb: &'static str,
        group: &'static str,
        resource: &'static str,
        sub: &'static str,
        ns: &'static str,
        name: &'static str,
        fields: Option<FieldSelector>,
    }

    fn req(
        verb: &'static str,
        resource: &'static str,
        ns: &'static str,
        name: &'static str,
    ) -> Req {
        Req {
            verb,
            group: "",
            resource,
            sub: "",
            ns,
            name,
            fields: None,
        }
    }

    impl Req {
        fn group(mut self, g: &'static str) -> Self {
            self.group = g;
            self
        }
        fn sub(mut self, s: &'static str) -> Self {
            self.sub = s;
            self
        }
        fn fields(mut self, f: &str) -> Self {
            self.fields = Some(FieldSelector::parse(f).unwrap());
            self
        }
        fn decide_for(&self, user: &UserInfo) -> Decision {
            let attrs = Attributes {
                user,
                verb: self.verb,
                resource_request: true,
                path: "/",
                api_group: self.group,
                resource: self.resource,
                subresource: self.sub,
                namespace: self.ns,
                name: self.name,
                field_selector: self.fields.as_ref(),
            };
            authorize(&attrs, &Graph, &StaticPolicy::default())
        }
        fn allowed_for_edge1(&self) -> bool {
            self.decide_for(&node_user("edge-1")) == Decision::Allow
        }
    }

    #[test]
    fn node_pod_list_needs_own_node_selector() {
        assert!(
            req("list", "pods", "", "")
                .fields("spec.nodeName=edge-1")
                .allowed_for_edge1()
        );
        assert!(
            req("watch", "pods", "", "")
                .fields("spec.nodeName==edge-1")
                .allowed_for_edge1()
        );
        assert!(!req("list", "pods", "", "").allowed_for_edge1());
        assert!(
            !req("list", "pods", "", "")
                .fields("spec.nodeName=edge-2")
                .allowed_for_edge1()
        );
        assert!(
            !req("list", "pods", "", "")
                .fields("spec.nodeName!=edge-1")
                .allowed_for_edge1()
        );
        let d = req("list", "pods", "", "").decide_for(&node_user("edge-1"));
        assert_eq!(
            d,
            Decision::Deny("can only list/watch pods with spec.nodeName field selector".into())
        );
    }

    #[test]
    fn node_pod_get_and_status_only_for_bound_pods() {
        assert!(req("get", "pods", "default", "web").allowed_for_edge1());
        assert!(!req("get", "pods", "default", "other").allowed_for_edge1());
        assert!(
            req("patch", "pods", "default", "web")
                .sub("status")
                .allowed_for_edge1()
        );
        assert!(!req("update", "pods", "default", "web").allowed_for_edge1());
        assert!(
            !req("get", "pods", "default", "web")
                .sub("log")
                .allowed_for_edge1()
        );
    }

    #[test]
    fn node_objects_only_its_own() {
        assert!(req("get", "nodes", "", "edge-1").allowed_for_edge1());
        assert!(req("watch", "nodes", "", "edge-1").allowed_for_edge1());
        assert!(!req("get", "nodes", "", "edge-2").allowed_for_edge1());
        assert!(!req("list", "nodes", "", "").allowed_for_edge1());
        assert!(
            req("patch", "nodes", "", "edge-1")
                .sub("status")
                .allowed_for_edge1()
        );
        assert!(!req("delete", "nodes", "", "edge-1").allowed_for_edge1());
    }

    #[test]
    fn node_leases_only_its_own_in_kube_node_lease() {
        let lease = |verb, ns, name| req(verb, "leases", ns, name).group("coordination.k8s.io");
        assert!(lease("get", "kube-node-lease", "edge-1").allowed_for_edge1());
        assert!(lease("update", "kube-node-lease", "edge-1").allowed_for_edge1());
        assert!(lease("create", "kube-node-lease", "").allowed_for_edge1());
        assert!(!lease("get", "kube-node-lease", "edge-2").allowed_for_edge1());
        assert!(!lease("list", "kube-node-lease", "").allowed_for_edge1());
        assert!(!lease("get", "default", "edge-1").allowed_for_edge1());
    }

    #[test]
    fn node_secrets_and_configmaps_through_pods() {
        assert!(req("get", "configmaps", "default", "cfg").allowed_for_edge1());
        assert!(req("watch", "configmaps", "default", "cfg").allowed_for_edge1());
        assert!(!req("get", "configmaps", "default", "unrelated").allowed_for_edge1());
        assert!(!req("list", "configmaps", "default", "").allowed_for_edge1());
        assert!(!req("update", "configmaps", "default", "cfg").allowed_for_edge1());
        assert!(req("get", "secrets", "default", "sec").allowed_for_edge1());
        assert!(!req("get", "secrets", "kube-system", "sec").allowed_for_edge1());
        assert!(req("get", "persistentvolumeclaims", "default", "data").allowed_for_edge1());
        assert!(!req("list", "persistentvolumeclaims", "default", "data").allowed_for_edge1());
        assert!(
            !req("get", "configmaps", "default", "cfg")
                .decide_for(&node_user("edge-2"))
                .eq(&Decision::Allow)
        );
    }

    #[test]
    fn node_static_rules() {
        assert!(req("watch", "services", "", "").allowed_for_edge1());
        assert!(req("get", "endpoints", "default", "kubernetes").allowed_for_edge1());
        assert!(!req("list", "endpoints", "default", "").allowed_for_edge1());
        assert!(req("create", "events", "default", "").allowed_for_edge1());
        assert!(!req("delete", "events", "default", "e").allowed_for_edge1());
        assert!(
            req("create", "serviceaccounts", "default", "app")
                .sub("token")
                .allowed_for_edge1()
        );
        assert!(
            !req("create", "serviceaccounts", "default", "other")
                .sub("token")
                .allowed_for_edge1()
        );
        assert!(
            req("list", "csidrivers", "", "")
                .group("storage.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            req("get", "csinodes", "", "edge-1")
                .group("storage.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            !req("get", "csinodes", "", "edge-2")
                .group("storage.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            req("watch", "runtimeclasses", "", "")
                .group("node.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            req("create", "certificatesigningrequests", "", "")
                .group("certificates.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            req("create", "tokenreviews", "", "")
                .group("authentication.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            req("create", "subjectaccessreviews", "", "")
                .group("authorization.k8s.io")
                .allowed_for_edge1()
        );
        assert!(
            !req("list", "deployments", "", "")
                .group("apps")
                .allowed_for_edge1()
        );
        assert!(!req("list", "namespaces", "", "").allowed_for_edge1());
    }

    #[test]
    fn non_node_users() {
        let admin = UserInfo {
            name: "kubernetes-admin".into(),
            groups: vec!["system:masters".into()],
        };
        assert_eq!(
            req("delete", "nodes", "", "x").decide_for(&admin),
            Decision::Allow
        );
        // The node name prefix without the group is not a node identity.
        let impostor = UserInfo {
            name: "system:node:edge-1".into(),
            groups: vec!["system:authenticated".into()],
        };
        assert_eq!(
            req("list", "pods", "", "").decide_for(&impostor),
            Decision::Allow
        );
        let anon = UserInfo::anonymous();
        assert_eq!(
            req("list", "pods", "default", "").decide_for(&anon),
            Decision::Deny(String::new())
        );
    }

    #[test]
    fn rbac_grants_in_union_with_the_node_authorizer() {
        let nodes = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]);
        let policy = StaticPolicy::from_json(&[
            json!({"kind": "ClusterRole", "metadata": {"name": "outpost"},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "outpost"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "outpost"},
                   "subjects": nodes}),
        ]);
        let node = node_user("edge-1");
        let decide = |r: Req, user: &UserInfo, policy: &StaticPolicy| {
            let attrs = Attributes {
                user,
                verb: r.verb,
                resource_request: true,
                path: "/",
                api_group: r.group,
                resource: r.resource,
                subresource: r.sub,
                namespace: r.ns,
                name: r.name,
                field_selector: r.fields.as_ref(),
            };
            authorize(&attrs, &Graph, policy)
        };
        let cfg = || req("get", "configmaps", "kube-system", "yurt-hub-cfg");
        assert_eq!(
            decide(cfg(), &node, &StaticPolicy::default()),
            Decision::Deny("no relationship found between node 'edge-1' and this object".into())
        );
        assert_eq!(decide(cfg(), &node, &policy), Decision::Allow);
        assert_eq!(
            decide(req("list", "configmaps", "", ""), &node, &policy),
            Decision::Allow
        );
        // What neither grants keeps the Node authorizer's reason.
        assert_eq!(
            decide(req("list", "pods", "", ""), &node, &policy),
            Decision::Deny("can only list/watch pods with spec.nodeName field selector".into())
        );
        // Anonymous callers get RBAC too (through their user name or system:unauthenticated).
        let anon = UserInfo::anonymous();
        assert_eq!(decide(cfg(), &anon, &policy), Decision::Deny(String::new()));
        let open = StaticPolicy::from_json(&[
            json!({"kind": "ClusterRole", "metadata": {"name": "outpost"},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "anon"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "outpost"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]}),
        ]);
        assert_eq!(decide(cfg(), &anon, &open), Decision::Allow);
        // Both authorizers' reasons, joined like the union authorizer does.
        let dangling = StaticPolicy::from_json(&[json!({
            "kind": "ClusterRoleBinding", "metadata": {"name": "outpost"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "outpost"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]
        })]);
        assert_eq!(
            decide(req("list", "pods", "", ""), &node, &dangling),
            Decision::Deny("can only list/watch pods with spec.nodeName field selector\nRBAC: clusterrole.rbac.authorization.k8s.io \"outpost\" not found".into())
        );
    }

    #[test]
    fn non_resource_paths() {
        let anon = UserInfo::anonymous();
        let node = node_user("edge-1");
        let path_decision = |user: &UserInfo, path: &'static str| {
            let attrs = Attributes {
                user,
                verb: "get",
                resource_request: false,
                path,
                api_group: "",
                resource: "",
                subresource: "",
                namespace: "",
                name: "",
                field_selector: None,
            };
            authorize(&attrs, &Graph, &StaticPolicy::default()) == Decision::Allow
        };
        assert!(path_decision(&anon, "/version"));
        assert!(path_decision(&anon, "/healthz"));
        assert!(!path_decision(&anon, "/api"));
        assert!(path_decision(&node, "/apis/apps/v1"));
        assert!(!path_decision(&node, "/metrics"));
    }

    #[test]
    fn forbidden_messages_match_apiserver() {
        let anon = UserInfo::anonymous();
        let attrs = Attributes {
            user: &anon,
            verb: "list",
            resource_request: true,
            path: "/api/v1/namespaces/default/pods",
            api_group: "",
            resource: "pods",
            subresource: "",
            namespace: "default",
            name: "",
            field_selector: None,
        };
        let s = forbidden(&attrs, "");
        assert_eq!(
            s.message,
            "pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(s.code, 403);
        let node = node_user("edge-1");
        let lease = Attributes {
            user: &node,
            verb: "get",
            api_group: "coordination.k8s.io",
            resource: "leases",
            namespace: "kube-node-lease",
            name: "edge-2",
            ..attrs
        };
        let s = forbidden(
            &lease,
            "can only access node lease with the same name as the requesting node",
        );
        assert!(s.message.starts_with("leases.coordination.k8s.io \"edge-2\" is forbidden: User \"system:node:edge-1\" cannot get resource \"leases\""), "{}", s.message);
    }

    #[test]
    fn node_restriction_admission() {
        let node = node_user("edge-1");
        let attrs = |resource, sub, verb, name| Attributes {
            user: &node,
            verb,
            resource_request: true,
            path: "/",
            api_group: if resource == "leases" {
                "coordination.k8s.io"
            } else {
                ""
            },
            resource,
            subresource: sub,
            namespace: "kube-node-lease",
            name,
            field_selector: None,
        };
        let lease = serde_json::json!({"metadata": {"name": "edge-2"}});
        assert!(
            node_restriction(&attrs("leases", "", "create", ""), Some(&lease), &Graph).is_some()
        );
        let own = serde_json::json!({"metadata": {"name": "edge-1"}});
        assert!(node_restriction(&attrs("leases", "", "create", ""), Some(&own), &Graph).is_none());
        assert!(
            node_restriction(&attrs("nodes", "status", "patch", "edge-2"), None, &Graph).is_some()
        );
        assert!(node_restriction(&attrs("nodes", "", "patch", "edge-1"), None, &Graph).is_none());
        let plain_pod =
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"nodeName": "edge-1"}});
        assert!(
            node_restriction(&attrs("pods", "", "create", ""), Some(&plain_pod), &Graph).is_some()
        );
    }
}
