//! `forwardkubesvctraffic`: kube-proxy sends traffic for the `kubernetes` ClusterIP to the hub.
//!
//! Pods that resolved the apiserver through the ClusterIP (not the env vars masterservice
//! rewrites) then also land on the hub.

use serde_json::{Value, json};

use super::{
    ENDPOINT_SLICES, KUBERNETES_NAME, KUBERNETES_NAMESPACE, KUBERNETES_PORT_NAME, replace,
    set_named_port,
};
use crate::FilterContext;
use crate::filter::{Filter, Peek, Rule, Verdict};
use crate::head::Head;

/// Rewrites the `default/kubernetes` EndpointSlice to a single ready endpoint, the hub's
/// address, with the port named `https` set to the hub's HTTPS port. A slice of the other
/// address family than the hub's address is left alone (kube-proxy would reject the mix).
pub struct ForwardKubeSvcTraffic;

impl Filter for ForwardKubeSvcTraffic {
    fn name(&self) -> &'static str {
        "forwardkubesvctraffic"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kube-proxy"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[ENDPOINT_SLICES]
    }

    fn off_in_cloud_mode(&self) -> bool {
        true
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
        let hub_family = if ctx.hub_host().is_ipv6() {
            "IPv6"
        } else {
            "IPv4"
        };
        let slice_family = obj.get("addressType").and_then(Value::as_str);
        if slice_family != Some(hub_family) {
            tracing::debug!(
                ?slice_family,
                hub_family,
                "forwardkubesvctraffic: default/kubernetes EndpointSlice is of another address family than the hub address; left alone"
            );
            return Verdict::Keep;
        }
        let endpoints = json!([{
            "addresses": [ctx.hub_host().to_string()],
            "conditions": {"ready": true},
        }]);
        let mut changed = replace(&mut obj["endpoints"], endpoints);
        changed |= set_named_port(obj.get_mut("ports"), KUBERNETES_PORT_NAME, ctx.hub_port());
        Verdict::changed_if(changed)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use serde_json::json;

    use super::*;
    use crate::testing::{ENDPOINT_SLICES as FIXTURE, apply, edge_ctx, item};

    #[test]
    fn the_kubernetes_slice_points_at_the_hub() {
        let slice = item(FIXTURE, "default", "kubernetes");
        let (verdict, out) = apply(&ForwardKubeSvcTraffic, &slice, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(
            out["endpoints"],
            json!([{"addresses":["169.254.2.1"],"conditions":{"ready":true}}])
        );
        assert_eq!(
            out["ports"],
            json!([{"name":"https","protocol":"TCP","port":10268}])
        );
        assert_eq!(out["metadata"], slice["metadata"]);
        assert_eq!(out["addressType"], "IPv4");
    }

    #[test]
    fn several_apiservers_collapse_to_the_hub() {
        let mut slice = item(FIXTURE, "default", "kubernetes");
        slice["endpoints"] = json!([
            {"addresses":["172.18.0.2"],"conditions":{"ready":true}},
            {"addresses":["172.18.0.3"],"conditions":{"ready":false}},
        ]);
        let (_, out) = apply(&ForwardKubeSvcTraffic, &slice, &edge_ctx());
        assert_eq!(out["endpoints"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn an_address_family_mismatch_is_left_alone() {
        let v6 = edge_ctx().with_hub("fd00::2:1".parse::<IpAddr>().unwrap(), 10268);
        let slice = item(FIXTURE, "default", "kubernetes");
        assert_eq!(apply(&ForwardKubeSvcTraffic, &slice, &v6).0, Verdict::Keep);

        let mut v6_slice = slice.clone();
        v6_slice["addressType"] = json!("IPv6");
        let (verdict, out) = apply(&ForwardKubeSvcTraffic, &v6_slice, &v6);
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(out["endpoints"][0]["addresses"], json!(["fd00::2:1"]));
        assert_eq!(
            apply(&ForwardKubeSvcTraffic, &v6_slice, &edge_ctx()).0,
            Verdict::Keep
        );
    }

    #[test]
    fn other_slices_pass_and_a_rewritten_one_is_stable() {
        let dns = item(FIXTURE, "kube-system", "kube-dns-7xkq2");
        assert_eq!(
            apply(&ForwardKubeSvcTraffic, &dns, &edge_ctx()).0,
            Verdict::Keep
        );
        let (_, once) = apply(
            &ForwardKubeSvcTraffic,
            &item(FIXTURE, "default", "kubernetes"),
            &edge_ctx(),
        );
        assert_eq!(
            apply(&ForwardKubeSvcTraffic, &once, &edge_ctx()).0,
            Verdict::Keep
        );
    }
}
