//! `masterservice`: kubelet sees the `default/kubernetes` Service at the hub's address.
//!
//! kubelet injects `KUBERNETES_SERVICE_HOST`/`PORT` into every pod from this Service, so pods
//! using in-cluster configuration talk to the hub (which keeps working offline) instead of the
//! apiserver's ClusterIP.

use serde_json::Value;

use super::{
    KUBERNETES_NAME, KUBERNETES_NAMESPACE, KUBERNETES_PORT_NAME, SERVICES, replace, set_named_port,
};
use crate::FilterContext;
use crate::filter::{Filter, Peek, Rule, Verdict};
use crate::head::Head;

/// Rewrites `default/kubernetes`: `spec.clusterIP` and `spec.clusterIPs` become the hub's
/// address, and the port named `https` its HTTPS port.
pub struct MasterService;

impl Filter for MasterService {
    fn name(&self) -> &'static str {
        "masterservice"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kubelet"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[SERVICES]
    }

    fn only_object(&self) -> Option<(&'static str, &'static str)> {
        Some((KUBERNETES_NAMESPACE, KUBERNETES_NAME))
    }

    fn peek(&self, head: &Head<'_>, _: &FilterContext) -> Peek {
        if head.is(KUBERNETES_NAMESPACE, KUBERNETES_NAME) {
            Peek::Inspect
        } else {
            Peek::Pass
        }
    }

    fn filter(&self, obj: &mut Value, _: &Head<'_>, ctx: &FilterContext) -> Verdict {
        let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
            return Verdict::Keep;
        };
        let host = ctx.hub_host().to_string();
        // `clusterIPs` too (yurthub at the time of writing sets only `clusterIP`): since 1.20
        // clients read the list, and a Service whose two fields disagree is invalid.
        let mut changed = replace(&mut spec["clusterIP"], Value::from(host.clone()));
        changed |= replace(&mut spec["clusterIPs"], Value::from(vec![host]));
        changed |= set_named_port(spec.get_mut("ports"), KUBERNETES_PORT_NAME, ctx.hub_port());
        if changed {
            tracing::debug!(host = %ctx.hub_host(), port = ctx.hub_port(), "masterservice: rewrote default/kubernetes");
        }
        Verdict::changed_if(changed)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use serde_json::json;

    use super::*;
    use crate::testing::{SERVICES as FIXTURE, apply, edge_ctx, item};

    #[test]
    fn points_the_kubernetes_service_at_the_hub() {
        let svc = item(FIXTURE, "default", "kubernetes");
        let (verdict, out) = apply(&MasterService, &svc, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(out["spec"]["clusterIP"], "169.254.2.1");
        assert_eq!(out["spec"]["clusterIPs"], json!(["169.254.2.1"]));
        assert_eq!(
            out["spec"]["ports"],
            json!([{"name":"https","protocol":"TCP","port":10268,"targetPort":6443}])
        );
        // Everything else is untouched.
        let mut expected = svc.clone();
        expected["spec"]["clusterIP"] = out["spec"]["clusterIP"].clone();
        expected["spec"]["clusterIPs"] = out["spec"]["clusterIPs"].clone();
        expected["spec"]["ports"][0]["port"] = json!(10268);
        assert_eq!(out, expected);
    }

    #[test]
    fn uses_the_configured_hub_address() {
        let ctx = edge_ctx().with_hub("127.0.0.1".parse::<IpAddr>().unwrap(), 10443);
        let (_, out) = apply(
            &MasterService,
            &item(FIXTURE, "default", "kubernetes"),
            &ctx,
        );
        assert_eq!(out["spec"]["clusterIP"], "127.0.0.1");
        assert_eq!(out["spec"]["ports"][0]["port"], 10443);
    }

    #[test]
    fn other_services_pass() {
        for (ns, name) in [("kube-system", "kube-dns"), ("shop", "web-lb")] {
            let (verdict, _) = apply(&MasterService, &item(FIXTURE, ns, name), &edge_ctx());
            assert_eq!(verdict, Verdict::Keep, "{ns}/{name}");
        }
        // The same name in another namespace is not the apiserver's Service.
        let mut svc = item(FIXTURE, "default", "kubernetes");
        svc["metadata"]["namespace"] = json!("shop");
        assert_eq!(apply(&MasterService, &svc, &edge_ctx()).0, Verdict::Keep);
    }

    #[test]
    fn without_an_https_port_only_the_address_changes() {
        let mut svc = item(FIXTURE, "default", "kubernetes");
        svc["spec"]["ports"][0]["name"] = json!("api");
        let (verdict, out) = apply(&MasterService, &svc, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(out["spec"]["ports"][0]["port"], 443);
    }

    #[test]
    fn an_already_rewritten_service_is_kept_as_is() {
        let (_, once) = apply(
            &MasterService,
            &item(FIXTURE, "default", "kubernetes"),
            &edge_ctx(),
        );
        assert_eq!(apply(&MasterService, &once, &edge_ctx()).0, Verdict::Keep);
    }

    #[test]
    fn a_service_without_spec_is_kept() {
        let svc = json!({"kind":"Service","metadata":{"name":"kubernetes","namespace":"default"}});
        assert_eq!(apply(&MasterService, &svc, &edge_ctx()).0, Verdict::Keep);
    }
}
