//! `discardcloudservice`: kube-proxy on an edge node does not program Services that only make
//! sense in the cloud.

use serde_json::Value;

use super::SERVICES;
use crate::FilterContext;
use crate::filter::{Filter, Peek, Rule, Verdict};
use crate::head::Head;

/// The annotation that marks a LoadBalancer Service as cloud-only.
const DISCARD_ANNOTATION: &str = "svc.openyurt.io/discard";
/// The tunnel server's in-cloud Service, always discarded at the edge.
const CLOUD_SERVICES: [(&str, &str); 1] = [("kube-system", "x-tunnel-server-internal-svc")];

/// Drops `LoadBalancer` Services annotated `svc.openyurt.io/discard: "true"` (exactly `true`),
/// and `kube-system/x-tunnel-server-internal-svc` whatever its type.
pub struct DiscardCloudService;

impl Filter for DiscardCloudService {
    fn name(&self) -> &'static str {
        "discardcloudservice"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kube-proxy"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[SERVICES]
    }

    fn off_in_cloud_mode(&self) -> bool {
        true
    }

    fn peeks_at_spec_type(&self) -> bool {
        true
    }

    fn peek(&self, head: &Head<'_>, _: &FilterContext) -> Peek {
        let discarded_lb = head.spec_type == "LoadBalancer"
            && head.annotations.get(DISCARD_ANNOTATION) == Some("true");
        if discarded_lb || CLOUD_SERVICES.iter().any(|(ns, name)| head.is(ns, name)) {
            Peek::Drop
        } else {
            Peek::Pass
        }
    }

    /// Never reached: the decision is made from the head.
    fn filter(&self, _: &mut Value, _: &Head<'_>, _: &FilterContext) -> Verdict {
        Verdict::Keep
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{SERVICES as FIXTURE, apply, edge_ctx, item};

    fn verdict(svc: &Value) -> Verdict {
        apply(&DiscardCloudService, svc, &edge_ctx()).0
    }

    #[test]
    fn drops_annotated_load_balancers_and_the_tunnel_service() {
        assert_eq!(verdict(&item(FIXTURE, "shop", "web-lb")), Verdict::Drop);
        assert_eq!(
            verdict(&item(
                FIXTURE,
                "kube-system",
                "x-tunnel-server-internal-svc"
            )),
            Verdict::Drop
        );
    }

    #[test]
    fn keeps_everything_else() {
        for (ns, name) in [
            ("default", "kubernetes"),
            ("kube-system", "kube-dns"),
            ("shop", "web-public"),
            ("shop", "web-nodeport"),
        ] {
            assert_eq!(
                verdict(&item(FIXTURE, ns, name)),
                Verdict::Keep,
                "{ns}/{name}"
            );
        }
    }

    #[test]
    fn the_annotation_needs_a_load_balancer_and_exactly_true() {
        let mut svc = item(FIXTURE, "shop", "web-lb");
        for value in ["True", "yes", "", "false"] {
            svc["metadata"]["annotations"][DISCARD_ANNOTATION] = json!(value);
            assert_eq!(verdict(&svc), Verdict::Keep, "{value:?}");
        }
        let mut node_port = item(FIXTURE, "shop", "web-nodeport");
        node_port["metadata"]["annotations"][DISCARD_ANNOTATION] = json!("true");
        assert_eq!(verdict(&node_port), Verdict::Keep);
    }

    #[test]
    fn the_tunnel_service_only_in_kube_system() {
        let mut svc = item(FIXTURE, "kube-system", "x-tunnel-server-internal-svc");
        svc["metadata"]["namespace"] = json!("default");
        assert_eq!(verdict(&svc), Verdict::Keep);
    }
}
