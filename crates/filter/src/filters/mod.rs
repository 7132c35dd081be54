//! yurthub's seven response filters, one file each, and the registry the configuration reads.
//!
//! [`ALL`] lists them in yurthub's registration order, which is also the order a chain applies
//! them in (yurthub's per-request order comes from a set; ours is fixed so results are
//! reproducible, and servicetopology runs before forwardkubesvctraffic, which replaces the
//! `default/kubernetes` endpoints with one that has no node).

use outpost_core::Verb;
use serde_json::Value;

use crate::filter::{Filter, Rule};

mod discardcloudservice;
mod forwardkubesvctraffic;
mod inclusterconfig;
mod masterservice;
mod nodeportisolation;
mod serviceenvupdater;
mod servicetopology;

pub use discardcloudservice::DiscardCloudService;
pub use forwardkubesvctraffic::ForwardKubeSvcTraffic;
pub use inclusterconfig::InClusterConfig;
pub use masterservice::MasterService;
pub use nodeportisolation::NodePortIsolation;
pub use serviceenvupdater::ServiceEnvUpdater;
pub use servicetopology::ServiceTopology;
pub use servicetopology::TOPOLOGY_KEYS;

/// Every filter, in registration (= application) order.
pub static ALL: [&dyn Filter; 7] = [
    &ServiceTopology,
    &MasterService,
    &DiscardCloudService,
    &InClusterConfig,
    &NodePortIsolation,
    &ForwardKubeSvcTraffic,
    &ServiceEnvUpdater,
];

/// The filter called `name`.
pub fn by_name(name: &str) -> Option<&'static dyn Filter> {
    ALL.iter().copied().find(|f| f.name() == name)
}

const LIST_WATCH: &[Verb] = &[Verb::List, Verb::Watch];

/// The `default/kubernetes` Service and its EndpointSlice: how in-cluster clients reach the
/// apiserver, and so what masterservice and forwardkubesvctraffic point at the hub.
const KUBERNETES_NAMESPACE: &str = "default";
const KUBERNETES_NAME: &str = "kubernetes";
const KUBERNETES_PORT_NAME: &str = "https";

const SERVICES: Rule = Rule {
    group: "",
    versions: &["v1"],
    resource: "services",
    kind: "Service",
    verbs: LIST_WATCH,
};

const ENDPOINT_SLICES: Rule = Rule {
    group: "discovery.k8s.io",
    versions: &["v1", "v1beta1"],
    resource: "endpointslices",
    kind: "EndpointSlice",
    verbs: LIST_WATCH,
};

/// Sets `*slot` to `new`, reporting whether that changed anything.
fn replace(slot: &mut Value, new: Value) -> bool {
    if *slot == new {
        return false;
    }
    *slot = new;
    true
}

/// Points the first port named `name` of `ports` (a Service's or an EndpointSlice's) at `port`.
fn set_named_port(ports: Option<&mut Value>, name: &str, port: u16) -> bool {
    let Some(ports) = ports.and_then(Value::as_array_mut) else {
        return false;
    };
    ports
        .iter_mut()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .is_some_and(|p| replace(&mut p["port"], Value::from(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_defaults_are_yurthubs() {
        let table: Vec<(&str, &[&str], bool)> = ALL
            .iter()
            .map(|f| (f.name(), f.default_components(), f.off_in_cloud_mode()))
            .collect();
        assert_eq!(
            table,
            [
                (
                    "servicetopology",
                    &["kube-proxy", "coredns", "nginx-ingress-controller"][..],
                    false
                ),
                ("masterservice", &["kubelet"][..], false),
                ("discardcloudservice", &["kube-proxy"][..], true),
                ("inclusterconfig", &["kubelet"][..], false),
                ("nodeportisolation", &["kube-proxy"][..], false),
                ("forwardkubesvctraffic", &["kube-proxy"][..], true),
                ("serviceenvupdater", &["kubelet"][..], true),
            ]
        );
        assert_eq!(
            by_name("masterservice").map(|f| f.name()),
            Some("masterservice")
        );
        assert!(by_name("nope").is_none());
    }

    #[test]
    fn rules_match_group_version_resource_and_verb() {
        let topo = by_name("servicetopology").unwrap();
        assert!(
            topo.applies_to("discovery.k8s.io", "v1", "endpointslices", Verb::Watch)
                .is_some()
        );
        assert!(
            topo.applies_to("discovery.k8s.io", "v1beta1", "endpointslices", Verb::List)
                .is_some()
        );
        assert!(topo.applies_to("", "v1", "endpoints", Verb::List).is_some());
        assert!(
            topo.applies_to("discovery.k8s.io", "v1", "endpointslices", Verb::Get)
                .is_none()
        );
        // yurthub keys on the resource name alone; a CRD that happens to be called
        // `endpointslices` in another group is not an EndpointSlice.
        assert!(
            topo.applies_to("example.com", "v1", "endpointslices", Verb::List)
                .is_none()
        );
        let env = by_name("serviceenvupdater").unwrap();
        for verb in [Verb::Get, Verb::List, Verb::Watch, Verb::Patch] {
            assert_eq!(
                env.applies_to("", "v1", "pods", verb).map(|r| r.kind),
                Some("Pod")
            );
        }
        assert!(env.applies_to("", "v1", "pods", Verb::Update).is_none());
        let cfg = by_name("inclusterconfig").unwrap();
        assert!(cfg.applies_to("", "v1", "configmaps", Verb::Get).is_some());
    }

    #[test]
    fn set_named_port_touches_the_first_match_only() {
        let mut ports = serde_json::json!([{"name":"http","port":80},{"name":"https","port":443},{"name":"https","port":8443}]);
        assert!(set_named_port(Some(&mut ports), "https", 10268));
        assert_eq!(
            ports,
            serde_json::json!([{"name":"http","port":80},{"name":"https","port":10268},{"name":"https","port":8443}])
        );
        assert!(
            !set_named_port(Some(&mut ports), "https", 10268),
            "already set"
        );
        assert!(!set_named_port(None, "https", 1));
    }
}
