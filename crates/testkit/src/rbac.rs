//! The RBAC authorizer, as `plugin/pkg/auth/authorizer/rbac` and the rule helpers of
//! `pkg/apis/rbac/v1`: which ClusterRoleBindings / RoleBindings name the user, and whether any
//! rule of the roles they reference matches the request.
//!
//! Roles and bindings are k8s-openapi types read through an [`RbacPolicy`] (the listers of the
//! real authorizer), so the matching rules are unit-testable without a store. [`StorePolicy`]
//! answers from the fake's store, so RBAC objects created over REST or with
//! `FakeApiServer::apply_rbac` take effect on the next request; [`StaticPolicy`] answers from
//! objects held in memory (public, for tests that check a manifest against recorded requests).
//! As in kube-apiserver only a ClusterRole's `rules` count: the aggregation controller that fills
//! them from `aggregationRule` is not simulated, nor is the escalation check on writes of roles.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use outpost_core::Status;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::authn::UserInfo;
use crate::authz::{Attributes, Decision};
use crate::registry::invalid;
use crate::resources::by_gvr;
use crate::store::{Store, object_key};

pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
pub const CLUSTER_ROLES: &str = "rbac.authorization.k8s.io/v1/clusterroles";
pub const CLUSTER_ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/v1/clusterrolebindings";
pub const ROLES: &str = "rbac.authorization.k8s.io/v1/roles";
pub const ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/v1/rolebindings";

/// The RBAC objects the authorizer reads (`RoleGetter`, `RoleBindingLister`, …).
pub trait RbacPolicy {
    fn cluster_role_bindings(&self) -> Vec<ClusterRoleBinding>;
    fn role_bindings(&self, namespace: &str) -> Vec<RoleBinding>;
    fn cluster_role(&self, name: &str) -> Option<ClusterRole>;
    fn role(&self, namespace: &str, name: &str) -> Option<Role>;
}

/// `RBACAuthorizer.Authorize`: allows if a rule granted to the user matches. A denial's reason is
/// empty unless bindings naming the user reference missing roles, as kube-apiserver words it.
pub fn authorize(a: &Attributes<'_>, policy: &dyn RbacPolicy) -> Decision {
    let mut errors = Vec::new();
    for binding in policy.cluster_role_bindings() {
        let subjects = slice(&binding.subjects);
        if !applies_to(a.user, subjects, "") {
            continue;
        }
        match role_rules(policy, &binding.role_ref, "") {
            Ok(rules) if rules.iter().any(|r| rule_allows(a, r)) => return Decision::Allow,
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    // Role bindings only grant within their own namespace, so cluster-scoped requests skip them.
    if !a.namespace.is_empty() {
        for binding in policy.role_bindings(a.namespace) {
            let subjects = slice(&binding.subjects);
            if !applies_to(a.user, subjects, a.namespace) {
                continue;
            }
            match role_rules(policy, &binding.role_ref, a.namespace) {
                Ok(rules) if rules.iter().any(|r| rule_allows(a, r)) => return Decision::Allow,
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
    }
    Decision::Deny(reason(errors))
}

/// `fmt.Sprintf("RBAC: %v", utilerrors.NewAggregate(errors))`: deduplicated, bracketed if many.
fn reason(errors: Vec<String>) -> String {
    let mut unique: Vec<String> = Vec::new();
    for e in errors {
        if !unique.contains(&e) {
            unique.push(e);
        }
    }
    match unique.as_slice() {
        [] => String::new(),
        [one] => format!("RBAC: {one}"),
        many => format!("RBAC: [{}]", many.join(", ")),
    }
}

/// `GetRoleReferenceRules`; errors are worded as the listers' NotFound errors.
fn role_rules(
    policy: &dyn RbacPolicy,
    role_ref: &RoleRef,
    namespace: &str,
) -> Result<Vec<PolicyRule>, String> {
    let not_found = |what: &str| format!("{what}.{RBAC_GROUP} {:?} not found", role_ref.name);
    match role_ref.kind.as_str() {
        "ClusterRole" => policy
            .cluster_role(&role_ref.name)
            .map(|r| r.rules.unwrap_or_default())
            .ok_or_else(|| not_found("clusterrole")),
        "Role" => policy
            .role(namespace, &role_ref.name)
            .map(|r| r.rules.unwrap_or_default())
            .ok_or_else(|| not_found("role")),
        other => Err(format!("unsupported role reference kind: {other:?}")),
    }
}

/// `appliesTo`: whether any subject names the user. Service accounts without a namespace
/// default to the binding's (none for cluster role bindings, so they never match).
pub fn applies_to(user: &UserInfo, subjects: &[Subject], namespace: &str) -> bool {
    subjects.iter().any(|s| match s.kind.as_str() {
        "User" => user.name == s.name,
        "Group" => user.in_group(&s.name),
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().filter(|n| !n.is_empty());
            let ns = ns.unwrap_or(namespace);
            !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{}", s.name)
        }
        _ => false,
    })
}

/// The API's optional lists, where absent means empty.
fn slice<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or_default()
}

/// `RuleAllows`: verb, then API group, resource (`resource/subresource`, `*`, `*/subresource`)
/// and resource name for resource requests, or the URL for non-resource ones.
pub fn rule_allows(a: &Attributes<'_>, rule: &PolicyRule) -> bool {
    let verb = rule.verbs.iter().any(|v| v == "*" || v == a.verb);
    if !verb {
        return false;
    }
    if !a.resource_request {
        return non_resource_url_matches(rule, a.path);
    }
    let combined = if a.subresource.is_empty() {
        a.resource.to_owned()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let group = slice(&rule.api_groups)
        .iter()
        .any(|g| g == "*" || g == a.api_group);
    group && resource_matches(rule, &combined, a.subresource) && resource_name_matches(rule, a.name)
}

fn resource_matches(rule: &PolicyRule, combined: &str, subresource: &str) -> bool {
    slice(&rule.resources).iter().any(|r| {
        r == "*"
            || r == combined
            || (!subresource.is_empty() && r.strip_prefix("*/") == Some(subresource))
    })
}

/// An empty list means any name; otherwise the request's name must be listed, so a rule with
/// names never matches a request without one (create, an unfiltered list or watch).
fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    let names = slice(&rule.resource_names);
    names.is_empty() || names.iter().any(|n| n == name)
}

fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    slice(&rule.non_resource_urls).iter().any(|u| {
        u == "*" || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
    })
}

/// The rules come from the store, so REST writes and `apply_rbac` count alike. Objects that do
/// not parse as their type are skipped: kube-apiserver would not have stored them.
pub struct StorePolicy<'a>(pub &'a Store);

impl StorePolicy<'_> {
    fn all<T: DeserializeOwned>(&self, gvr: &str, prefix: &str) -> Vec<T> {
        let Some(def) = by_gvr(gvr) else {
            return Vec::new();
        };
        let (_, items) = self.0.list(def, prefix);
        items
            .iter()
            .filter_map(|(_, obj)| T::deserialize(obj.as_ref()).ok())
            .collect()
    }

    fn one<T: DeserializeOwned>(
        &self,
        gvr: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<T> {
        let def = by_gvr(gvr)?;
        let obj = self.0.get(def, &object_key(def, namespace, name))?;
        T::deserialize(obj.as_ref()).ok()
    }
}

impl RbacPolicy for StorePolicy<'_> {
    fn cluster_role_bindings(&self) -> Vec<ClusterRoleBinding> {
        self.all(CLUSTER_ROLE_BINDINGS, "")
    }

    fn role_bindings(&self, namespace: &str) -> Vec<RoleBinding> {
        self.all(ROLE_BINDINGS, &format!("{namespace}/"))
    }

    fn cluster_role(&self, name: &str) -> Option<ClusterRole> {
        self.one(CLUSTER_ROLES, None, name)
    }

    fn role(&self, namespace: &str, name: &str) -> Option<Role> {
        if namespace.is_empty() {
            return None;
        }
        self.one(ROLES, Some(namespace), name)
    }
}

/// Roles and bindings held in memory, like the real authorizer's `StaticRoles` resolver: with
/// [`crate::authorization::authorize`] it answers "would the cluster allow this request with
/// exactly these RBAC objects?", e.g. for a test that checks a manifest's ClusterRole against the
/// requests a program really made.
#[derive(Debug, Clone, Default)]
pub struct StaticPolicy {
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
}

impl StaticPolicy {
    /// From manifest objects (as `manifest::load_yaml` returns them), each checked as
    /// `FakeApiServer::apply_rbac` checks it; anything else is an error.
    pub fn from_objects(objects: &[Value]) -> Result<Self, Status> {
        let mut p = StaticPolicy::default();
        for o in objects {
            match checked_gvr(o)? {
                CLUSTER_ROLES => p.cluster_roles.push(parse(o)?),
                CLUSTER_ROLE_BINDINGS => p.cluster_role_bindings.push(parse(o)?),
                ROLES => p.roles.push(parse(o)?),
                // ROLE_BINDINGS, the only other kind `checked_gvr` accepts.
                _ => p.role_bindings.push(parse(o)?),
            }
        }
        Ok(p)
    }
}

fn ns_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("")
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or("")
}

impl RbacPolicy for StaticPolicy {
    fn cluster_role_bindings(&self) -> Vec<ClusterRoleBinding> {
        self.cluster_role_bindings.clone()
    }

    fn role_bindings(&self, namespace: &str) -> Vec<RoleBinding> {
        let in_ns = |b: &&RoleBinding| ns_of(&b.metadata) == namespace;
        self.role_bindings.iter().filter(in_ns).cloned().collect()
    }

    fn cluster_role(&self, name: &str) -> Option<ClusterRole> {
        let named = |r: &&ClusterRole| name_of(&r.metadata) == name;
        self.cluster_roles.iter().find(named).cloned()
    }

    fn role(&self, namespace: &str, name: &str) -> Option<Role> {
        let named = |r: &&Role| ns_of(&r.metadata) == namespace && name_of(&r.metadata) == name;
        self.roles.iter().find(named).cloned()
    }
}

/// For `FakeApiServer::apply_rbac`: the object's `gvr` key, once it parses as its RBAC type and
/// passes the checks of `ValidateClusterRoleBinding` / `ValidateRoleBinding` that matter for
/// authorization (role reference and subject kinds), so a broken manifest fails the test loudly
/// instead of silently granting nothing.
pub fn checked_gvr(obj: &Value) -> Result<&'static str, Status> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    match kind {
        "ClusterRole" => parse::<ClusterRole>(obj).map(|_| CLUSTER_ROLES),
        "Role" => parse::<Role>(obj).map(|_| ROLES),
        "ClusterRoleBinding" => {
            let b = parse::<ClusterRoleBinding>(obj)?;
            let name = b.metadata.name.as_deref().unwrap_or("");
            check_binding(CLUSTER_ROLE_BINDINGS, name, &b.role_ref, &b.subjects, false)?;
            Ok(CLUSTER_ROLE_BINDINGS)
        }
        "RoleBinding" => {
            let b = parse::<RoleBinding>(obj)?;
            let name = b.metadata.name.as_deref().unwrap_or("");
            check_binding(ROLE_BINDINGS, name, &b.role_ref, &b.subjects, true)?;
            Ok(ROLE_BINDINGS)
        }
        other => Err(Status::bad_request(format!(
            "not an RBAC object: kind {other:?} (expected ClusterRole, ClusterRoleBinding, Role or RoleBinding)"
        ))),
    }
}

fn parse<T: DeserializeOwned>(obj: &Value) -> Result<T, Status> {
    T::deserialize(obj).map_err(|e| {
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = obj.pointer("/metadata/name").and_then(Value::as_str);
        Status::bad_request(format!(
            "{kind} {:?} does not parse: {e}",
            name.unwrap_or("")
        ))
    })
}

fn check_binding(
    gvr: &str,
    name: &str,
    role_ref: &RoleRef,
    subjects: &Option<Vec<Subject>>,
    namespaced: bool,
) -> Result<(), Status> {
    let def = by_gvr(gvr).expect("RBAC resources are registered");
    let fail = |field_error: String| Err(invalid(def, name, &field_error));
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&role_ref.kind.as_str()) {
        let supported: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
        return fail(format!(
            "roleRef.kind: Unsupported value: {:?}: supported values: {}",
            role_ref.kind,
            supported.join(", ")
        ));
    }
    // Optional in the newest API (defaulted), but never another group.
    let group = role_ref.api_group.as_deref().unwrap_or(RBAC_GROUP);
    if group != RBAC_GROUP {
        return fail(format!(
            "roleRef.apiGroup: Unsupported value: {group:?}: supported values: \"{RBAC_GROUP}\""
        ));
    }
    if role_ref.name.is_empty() {
        return fail("roleRef.name: Required value".into());
    }
    for (i, s) in slice(subjects).iter().enumerate() {
        if !matches!(s.kind.as_str(), "User" | "Group" | "ServiceAccount") {
            return fail(format!(
                "subjects[{i}].kind: Unsupported value: {:?}: supported values: \"ServiceAccount\", \"User\", \"Group\"",
                s.kind
            ));
        }
        if s.kind == "ServiceAccount"
            && !namespaced
            && s.namespace.as_deref().unwrap_or("").is_empty()
        {
            return fail(format!("subjects[{i}].namespace: Required value"));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    impl StaticPolicy {
        /// Objects by `kind`, unvalidated (so tests can hold what validation would refuse).
        pub(crate) fn from_json(objects: &[Value]) -> Self {
            let mut p = StaticPolicy::default();
            for o in objects {
                match o["kind"].as_str().unwrap() {
                    "ClusterRole" => p.cluster_roles.push(parse(o).unwrap()),
                    "ClusterRoleBinding" => p.cluster_role_bindings.push(parse(o).unwrap()),
                    "Role" => p.roles.push(parse(o).unwrap()),
                    "RoleBinding" => p.role_bindings.push(parse(o).unwrap()),
                    other => panic!("not an RBAC kind: {other}"),
                }
            }
            p
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn node() -> UserInfo {
        user(
            "system:node:edge-1",
            &["system:nodes", "system:authenticated"],
        )
    }

    /// A request: `verb group/resource[/sub] ns/name`, or a non-resource path.
    struct Req {
        verb: &'static str,
        group: &'static str,
        resource: &'static str,
        sub: &'static str,
        ns: &'static str,
        name: &'static str,
        path: &'static str,
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
            path: "",
        }
    }

    fn url(verb: &'static str, path: &'static str) -> Req {
        Req {
            path,
            ..req(verb, "", "", "")
        }
    }

    impl Req {
        fn group(self, group: &'static str) -> Self {
            Req { group, ..self }
        }

        fn sub(self, sub: &'static str) -> Self {
            Req { sub, ..self }
        }

        fn attrs<'a>(&'a self, user: &'a UserInfo) -> Attributes<'a> {
            Attributes {
                user,
                verb: self.verb,
                resource_request: self.path.is_empty(),
                path: self.path,
                api_group: self.group,
                resource: self.resource,
                subresource: self.sub,
                namespace: self.ns,
                name: self.name,
                field_selector: None,
            }
        }

        /// Whether `rule` (a JSON PolicyRule) allows this request.
        fn matched_by(&self, rule: Value) -> bool {
            let rule: PolicyRule = serde_json::from_value(rule).unwrap();
            rule_allows(&self.attrs(&node()), &rule)
        }

        fn decide(&self, user: &UserInfo, policy: &StaticPolicy) -> Decision {
            authorize(&self.attrs(user), policy)
        }
    }

    #[test]
    fn verbs_match_exactly_or_by_wildcard() {
        let rule =
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]});
        assert!(req("get", "configmaps", "kube-system", "c").matched_by(rule.clone()));
        assert!(req("list", "configmaps", "kube-system", "").matched_by(rule.clone()));
        assert!(!req("watch", "configmaps", "kube-system", "").matched_by(rule.clone()));
        assert!(!req("update", "configmaps", "kube-system", "c").matched_by(rule));
        let any = json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]});
        assert!(req("deletecollection", "configmaps", "default", "").matched_by(any));
        let none = json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": []});
        assert!(!req("get", "configmaps", "default", "c").matched_by(none));
    }

    #[test]
    fn api_groups_match_exactly_or_by_wildcard() {
        let core = json!({"apiGroups": [""], "resources": ["leases"], "verbs": ["get"]});
        let lease = req("get", "leases", "kube-node-lease", "edge-1").group("coordination.k8s.io");
        assert!(!lease.matched_by(core));
        let coordination = json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]});
        assert!(lease.matched_by(coordination.clone()));
        assert!(!req("get", "leases", "default", "x").matched_by(coordination));
        let any = json!({"apiGroups": ["*"], "resources": ["leases"], "verbs": ["get"]});
        assert!(lease.matched_by(any.clone()));
        assert!(req("get", "leases", "default", "x").matched_by(any));
        let missing = json!({"resources": ["leases"], "verbs": ["get"]});
        assert!(!lease.matched_by(missing));
    }

    #[test]
    fn resources_and_subresources() {
        let nodes = json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]});
        let status = json!({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]});
        let main = req("patch", "nodes", "", "edge-1");
        let sub = req("patch", "nodes", "", "edge-1").sub("status");
        assert!(main.matched_by(nodes.clone()));
        assert!(
            !sub.matched_by(nodes),
            "the resource does not grant its subresources"
        );
        assert!(sub.matched_by(status.clone()));
        assert!(!main.matched_by(status), "nor a subresource its resource");
        let any_status = json!({"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]});
        assert!(sub.matched_by(any_status.clone()));
        assert!(
            req("patch", "pods", "default", "p")
                .sub("status")
                .matched_by(any_status.clone())
        );
        assert!(!main.matched_by(any_status.clone()));
        assert!(
            !req("patch", "pods", "default", "p")
                .sub("log")
                .matched_by(any_status)
        );
        let everything = json!({"apiGroups": [""], "resources": ["*"], "verbs": ["patch"]});
        assert!(main.matched_by(everything.clone()));
        assert!(sub.matched_by(everything));
        let other = json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]});
        assert!(!main.matched_by(other));
    }

    #[test]
    fn resource_names_need_a_named_request() {
        let rule = json!({"apiGroups": [""], "resources": ["configmaps"],
                          "resourceNames": ["yurt-hub-cfg"], "verbs": ["get", "list", "watch", "create", "update"]});
        assert!(req("get", "configmaps", "kube-system", "yurt-hub-cfg").matched_by(rule.clone()));
        assert!(!req("get", "configmaps", "kube-system", "other").matched_by(rule.clone()));
        assert!(
            req("update", "configmaps", "kube-system", "yurt-hub-cfg").matched_by(rule.clone())
        );
        // list/watch carry the name of a `metadata.name=` field selector, as RequestInfo does.
        assert!(req("list", "configmaps", "kube-system", "yurt-hub-cfg").matched_by(rule.clone()));
        assert!(req("watch", "configmaps", "kube-system", "yurt-hub-cfg").matched_by(rule.clone()));
        assert!(!req("list", "configmaps", "kube-system", "").matched_by(rule.clone()));
        assert!(!req("watch", "configmaps", "kube-system", "").matched_by(rule.clone()));
        // A create's name is in the body, which authorization never sees.
        assert!(!req("create", "configmaps", "kube-system", "").matched_by(rule));
        let unnamed = json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]});
        assert!(req("list", "configmaps", "kube-system", "").matched_by(unnamed.clone()));
        assert!(req("list", "configmaps", "kube-system", "any").matched_by(unnamed));
    }

    #[test]
    fn non_resource_urls() {
        let rule = json!({"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]});
        assert!(url("get", "/metrics").matched_by(rule.clone()));
        assert!(!url("get", "/metrics/x").matched_by(rule.clone()));
        assert!(url("get", "/debug/pprof/heap").matched_by(rule.clone()));
        assert!(url("get", "/debug/").matched_by(rule.clone()));
        assert!(!url("get", "/debug").matched_by(rule.clone()));
        assert!(!url("post", "/metrics").matched_by(rule.clone()));
        let any = json!({"nonResourceURLs": ["*"], "verbs": ["*"]});
        assert!(url("post", "/anything").matched_by(any.clone()));
        // Resource rules and URL rules never stand in for each other.
        assert!(!req("get", "metrics", "", "").matched_by(rule));
        let resources = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(!url("get", "/metrics").matched_by(resources));
        assert!(!req("get", "pods", "", "").matched_by(any));
    }

    fn role(kind: &str, ns: Option<&str>, name: &str, rules: Value) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
               "metadata": {"name": name, "namespace": ns}, "rules": rules})
    }

    fn binding(
        kind: &str,
        ns: Option<&str>,
        name: &str,
        role: (&str, &str),
        subjects: Value,
    ) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
               "metadata": {"name": name, "namespace": ns},
               "roleRef": {"apiGroup": RBAC_GROUP, "kind": role.0, "name": role.1},
               "subjects": subjects})
    }

    fn cm_reader() -> Value {
        role(
            "ClusterRole",
            None,
            "cm-reader",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
        )
    }

    #[test]
    fn cluster_role_bindings_by_user_group_and_service_account() {
        let get_cm = req("get", "configmaps", "kube-system", "yurt-hub-cfg");
        let bound_to = |subject: Value| {
            StaticPolicy::from_json(&[
                cm_reader(),
                binding(
                    "ClusterRoleBinding",
                    None,
                    "b",
                    ("ClusterRole", "cm-reader"),
                    json!([subject]),
                ),
            ])
        };
        let node = node();
        let other = user("system:node:edge-2", &["system:nodes"]);
        let sa = user(
            "system:serviceaccount:kube-system:outpost",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
            ],
        );

        let by_group =
            bound_to(json!({"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:nodes"}));
        assert_eq!(get_cm.decide(&node, &by_group), Decision::Allow);
        assert_eq!(get_cm.decide(&other, &by_group), Decision::Allow);
        assert_eq!(get_cm.decide(&sa, &by_group), Decision::Deny(String::new()));
        assert_eq!(
            req("list", "configmaps", "kube-system", "").decide(&node, &by_group),
            Decision::Deny(String::new()),
            "the role grants get only"
        );

        let by_user =
            bound_to(json!({"apiGroup": RBAC_GROUP, "kind": "User", "name": "system:node:edge-1"}));
        assert_eq!(get_cm.decide(&node, &by_user), Decision::Allow);
        assert_ne!(get_cm.decide(&other, &by_user), Decision::Allow);

        let by_sa = bound_to(
            json!({"kind": "ServiceAccount", "name": "outpost", "namespace": "kube-system"}),
        );
        assert_eq!(get_cm.decide(&sa, &by_sa), Decision::Allow);
        assert_ne!(get_cm.decide(&node, &by_sa), Decision::Allow);
        // Without a namespace a cluster role binding's service account names nobody.
        let no_ns = bound_to(json!({"kind": "ServiceAccount", "name": "outpost"}));
        assert_ne!(get_cm.decide(&sa, &no_ns), Decision::Allow);

        let unknown_kind = bound_to(json!({"kind": "Robot", "name": "system:node:edge-1"}));
        assert_ne!(get_cm.decide(&node, &unknown_kind), Decision::Allow);
    }

    #[test]
    fn role_bindings_grant_only_in_their_namespace() {
        let policy = StaticPolicy::from_json(&[
            cm_reader(),
            role(
                "Role",
                Some("kube-system"),
                "lease-writer",
                json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["update"]}]),
            ),
            binding(
                "RoleBinding",
                Some("kube-system"),
                "leases",
                ("Role", "lease-writer"),
                json!([{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:nodes"}]),
            ),
            // A RoleBinding of a ClusterRole grants the role's rules in the binding's namespace.
            binding(
                "RoleBinding",
                Some("default"),
                "cm",
                ("ClusterRole", "cm-reader"),
                // Service accounts without a namespace default to the binding's.
                json!([{"kind": "ServiceAccount", "name": "app"}]),
            ),
        ]);
        let node = node();
        let lease = |ns| req("update", "leases", ns, "edge-1").group("coordination.k8s.io");
        assert_eq!(lease("kube-system").decide(&node, &policy), Decision::Allow);
        assert_ne!(lease("default").decide(&node, &policy), Decision::Allow);
        assert_ne!(lease("").decide(&node, &policy), Decision::Allow);
        let app = user("system:serviceaccount:default:app", &[]);
        let elsewhere = user("system:serviceaccount:other:app", &[]);
        let cm = |ns| req("get", "configmaps", ns, "c");
        assert_eq!(cm("default").decide(&app, &policy), Decision::Allow);
        assert_ne!(cm("kube-system").decide(&app, &policy), Decision::Allow);
        assert_ne!(cm("default").decide(&elsewhere, &policy), Decision::Allow);
    }

    #[test]
    fn missing_roles_are_the_denial_reason() {
        let nodes = json!([{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:nodes"}]);
        let policy = StaticPolicy::from_json(&[
            binding(
                "ClusterRoleBinding",
                None,
                "a",
                ("ClusterRole", "gone"),
                nodes.clone(),
            ),
            binding(
                "ClusterRoleBinding",
                None,
                "b",
                ("ClusterRole", "gone"),
                nodes.clone(),
            ),
            binding(
                "RoleBinding",
                Some("default"),
                "c",
                ("Role", "absent"),
                nodes.clone(),
            ),
            // Bindings that do not name the user are not resolved at all.
            binding(
                "ClusterRoleBinding",
                None,
                "d",
                ("ClusterRole", "elsewhere"),
                json!([{"apiGroup": RBAC_GROUP, "kind": "User", "name": "someone"}]),
            ),
        ]);
        let node = node();
        assert_eq!(
            req("get", "nodes", "", "edge-1").decide(&node, &policy),
            Decision::Deny("RBAC: clusterrole.rbac.authorization.k8s.io \"gone\" not found".into())
        );
        assert_eq!(
            req("get", "pods", "default", "p").decide(&node, &policy),
            Decision::Deny("RBAC: [clusterrole.rbac.authorization.k8s.io \"gone\" not found, role.rbac.authorization.k8s.io \"absent\" not found]".into())
        );
    }

    #[test]
    fn static_policy_from_manifest_objects() {
        let nodes = json!([{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:nodes"}]);
        let objects = [
            cm_reader(),
            binding(
                "ClusterRoleBinding",
                None,
                "b",
                ("ClusterRole", "cm-reader"),
                nodes.clone(),
            ),
        ];
        let policy = StaticPolicy::from_objects(&objects).unwrap();
        let get_cm = req("get", "configmaps", "kube-system", "c");
        assert_eq!(get_cm.decide(&node(), &policy), Decision::Allow);
        assert_ne!(
            req("list", "configmaps", "kube-system", "").decide(&node(), &policy),
            Decision::Allow
        );
        // Checked as `apply_rbac` checks: what the apiserver would refuse is an error.
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        assert_eq!(StaticPolicy::from_objects(&[cm]).unwrap_err().code, 400);
        let to_role = binding("ClusterRoleBinding", None, "x", ("Role", "r"), nodes);
        assert_eq!(
            StaticPolicy::from_objects(&[to_role]).unwrap_err().code,
            422
        );
    }

    #[test]
    fn apply_checks_kinds_and_role_refs() {
        assert_eq!(checked_gvr(&cm_reader()).unwrap(), CLUSTER_ROLES);
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        assert_eq!(checked_gvr(&cm).unwrap_err().code, 400);
        let nodes = json!([{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:nodes"}]);
        let crb_to_role = binding(
            "ClusterRoleBinding",
            None,
            "x",
            ("Role", "r"),
            nodes.clone(),
        );
        let err = checked_gvr(&crb_to_role).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message
                .contains("roleRef.kind: Unsupported value: \"Role\""),
            "{}",
            err.message
        );
        let rb_to_role = binding("RoleBinding", Some("default"), "x", ("Role", "r"), nodes);
        assert_eq!(checked_gvr(&rb_to_role).unwrap(), ROLE_BINDINGS);
        let bad_subject = binding(
            "ClusterRoleBinding",
            None,
            "x",
            ("ClusterRole", "r"),
            json!([{"kind": "ServiceAccount", "name": "sa"}]),
        );
        assert_eq!(checked_gvr(&bad_subject).unwrap_err().code, 422);
        let wrong_version =
            json!({"apiVersion": "rbac.authorization.k8s.io/v1beta1", "kind": "ClusterRole"});
        assert_eq!(checked_gvr(&wrong_version).unwrap_err().code, 400);
    }

    #[test]
    fn store_policy_reads_stored_objects() {
        let store = Store::new(10, 1);
        let put =
            |gvr: &str, key: &str, obj: Value| store.insert_raw(by_gvr(gvr).unwrap(), key, obj);
        put(CLUSTER_ROLES, "cm-reader", cm_reader());
        put(
            CLUSTER_ROLE_BINDINGS,
            "b",
            binding(
                "ClusterRoleBinding",
                None,
                "b",
                ("ClusterRole", "cm-reader"),
                json!([{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "system:nodes"}]),
            ),
        );
        put(
            CLUSTER_ROLE_BINDINGS,
            "garbage",
            json!({"roleRef": "not an object"}),
        );
        let policy = StorePolicy(&store);
        assert_eq!(policy.cluster_role_bindings().len(), 1);
        assert!(policy.cluster_role("cm-reader").is_some());
        assert!(policy.role("", "cm-reader").is_none());
        let get_cm = req("get", "configmaps", "kube-system", "c");
        assert_eq!(authorize(&get_cm.attrs(&node()), &policy), Decision::Allow);
    }
}
