//! `nodeportisolation`: a NodePort (or LoadBalancer) Service listens only on the nodes of the
//! pools its `nodeport.openyurt.io/listen` annotation allows.

use serde_json::Value;

use super::SERVICES;
use crate::FilterContext;
use crate::filter::{Filter, Needs, Peek, Rule, Verdict};
use crate::head::Head;

const LISTEN_ANNOTATION: &str = "nodeport.openyurt.io/listen";

/// For `NodePort`/`LoadBalancer` Services carrying `nodeport.openyurt.io/listen` (a
/// comma-separated list of pools; `-pool` excludes one, `*` means every pool): kept when this
/// node is in no pool, when its pool is listed, or when `*` is listed and `-pool` is not;
/// dropped otherwise (an empty annotation included). The first mention of a pool wins
/// (`a,-a` keeps `a`). Services without the annotation, and other types, are kept.
pub struct NodePortIsolation;

impl Filter for NodePortIsolation {
    fn name(&self) -> &'static str {
        "nodeportisolation"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kube-proxy"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[SERVICES]
    }

    fn needs(&self) -> Needs {
        Needs {
            pool_name: true,
            ..Needs::default()
        }
    }

    fn peeks_at_spec_type(&self) -> bool {
        true
    }

    fn peek(&self, head: &Head<'_>, ctx: &FilterContext) -> Peek {
        // A node outside any pool keeps NodePort Services as in plain Kubernetes.
        let Some(pool) = ctx.pool_name() else {
            return Peek::Pass;
        };
        if !matches!(&*head.spec_type, "NodePort" | "LoadBalancer") {
            return Peek::Pass;
        }
        match head.annotations.get(LISTEN_ANNOTATION) {
            Some(listen) if !listens_in(listen, pool) => Peek::Drop,
            _ => Peek::Pass,
        }
    }

    /// Never reached: the decision is made from the head.
    fn filter(&self, _: &mut Value, _: &Head<'_>, _: &FilterContext) -> Verdict {
        Verdict::Keep
    }
}

/// yurthub's `isNodePoolEnabled` over its deduplicated annotation entries.
fn listens_in(listen: &str, pool: &str) -> bool {
    let mut seen: Vec<&str> = Vec::new();
    let mut entries: Vec<&str> = Vec::new();
    for entry in listen.split(',').map(str::trim) {
        let name = entry.strip_prefix('-').unwrap_or(entry);
        if !name.is_empty() && !seen.contains(&name) {
            seen.push(name);
            entries.push(entry);
        }
    }
    let has = |e: &str| entries.contains(&e);
    if has(pool) {
        true
    } else if entries.iter().any(|e| e.strip_prefix('-') == Some(pool)) {
        false
    } else {
        has("*")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{SERVICES as FIXTURE, apply, edge_ctx, item};

    fn verdict_in(pool: Option<&str>, listen: Option<&str>, kind: &str) -> Verdict {
        let mut svc = item(FIXTURE, "shop", "web-nodeport");
        svc["spec"]["type"] = json!(kind);
        match listen {
            Some(l) => svc["metadata"]["annotations"][LISTEN_ANNOTATION] = json!(l),
            None => {
                svc["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("annotations");
            }
        }
        let mut ctx = edge_ctx();
        ctx.set_pool_name(pool.map(str::to_owned));
        apply(&NodePortIsolation, &svc, &ctx).0
    }

    #[test]
    fn the_fixture_service_listens_in_hangzhou_only() {
        let svc = item(FIXTURE, "shop", "web-nodeport");
        assert_eq!(
            apply(&NodePortIsolation, &svc, &edge_ctx()).0,
            Verdict::Keep
        );
        let beijing = edge_ctx().with_pool_name("beijing");
        assert_eq!(apply(&NodePortIsolation, &svc, &beijing).0, Verdict::Drop);
        let shanghai = edge_ctx().with_pool_name("shanghai");
        assert_eq!(
            apply(&NodePortIsolation, &svc, &shanghai).0,
            Verdict::Drop,
            "not listed"
        );
    }

    #[test]
    fn annotation_rules() {
        let cases = [
            ("hangzhou", true),
            ("beijing", false),
            ("-hangzhou", false),
            ("*", true),
            ("*,-hangzhou", false),
            ("-hangzhou,*", false),
            (" hangzhou , beijing ", true),
            ("hangzhou,-hangzhou", true),
            ("-hangzhou,hangzhou", false),
            ("", false),
            (",", false),
            ("-", false),
            ("*,beijing", true),
        ];
        for (listen, kept) in cases {
            let expected = if kept { Verdict::Keep } else { Verdict::Drop };
            assert_eq!(
                verdict_in(Some("hangzhou"), Some(listen), "NodePort"),
                expected,
                "{listen:?}"
            );
        }
    }

    #[test]
    fn only_node_port_and_load_balancer_services_with_the_annotation() {
        assert_eq!(
            verdict_in(Some("hangzhou"), Some("beijing"), "LoadBalancer"),
            Verdict::Drop
        );
        assert_eq!(
            verdict_in(Some("hangzhou"), Some("beijing"), "ClusterIP"),
            Verdict::Keep
        );
        assert_eq!(
            verdict_in(Some("hangzhou"), None, "NodePort"),
            Verdict::Keep
        );
    }

    #[test]
    fn a_node_in_no_pool_keeps_every_service() {
        assert_eq!(verdict_in(None, Some("beijing"), "NodePort"), Verdict::Keep);
        assert_eq!(verdict_in(None, Some(""), "NodePort"), Verdict::Keep);
    }
}
