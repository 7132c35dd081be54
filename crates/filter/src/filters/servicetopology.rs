//! `servicetopology`: endpoints of a Service annotated `openyurt.io/topologyKeys` are limited to
//! this node or this node's pool, so edge traffic stays local.
//!
//! The annotation is on the Service, not on the EndpointSlice, so the rule needs the hub's
//! Service watch ([`FilterContext::service_annotations`]) and NodePool membership
//! ([`FilterContext::pool_nodes`]).

use std::borrow::Cow;
use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{ENDPOINT_SLICES, LIST_WATCH};
use crate::filter::{Filter, Needs, Peek, Rule, Verdict};
use crate::head::Head;
use crate::splice::splice_items;
use crate::{FilterContext, Rewrite};

pub const TOPOLOGY_KEYS: &str = "openyurt.io/topologyKeys";
const TOPOLOGY_NODE: &str = "kubernetes.io/hostname";
const TOPOLOGY_POOL: &str = "openyurt.io/nodepool";
/// yurthub treats the zone key as the pool key: it never reads zone labels.
const TOPOLOGY_ZONE: &str = "kubernetes.io/zone";
/// The EndpointSlice label naming its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

const ENDPOINTS: Rule = Rule {
    group: "",
    versions: &["v1"],
    resource: "endpoints",
    kind: "Endpoints",
    verbs: LIST_WATCH,
};

/// Keeps only the endpoints on this node (`kubernetes.io/hostname`) or on nodes of this node's
/// pool (`openyurt.io/nodepool`, `kubernetes.io/zone`), for EndpointSlices (v1, v1beta1) and
/// v1 Endpoints of annotated Services. Endpoints without a node are dropped. A node in no pool
/// falls back to node topology; a pool the hub has not seen leaves the object unchanged
/// (yurthub's behaviour). A slice whose endpoints are all dropped stays, empty.
///
/// yurthub registers v1 `Endpoints` for this filter but never filters them (#2613): clients
/// that still read Endpoints (older ingress controllers) escaped the topology. They are
/// filtered here, by each address's `nodeName`.
pub struct ServiceTopology;

impl Filter for ServiceTopology {
    fn name(&self) -> &'static str {
        "servicetopology"
    }

    fn default_components(&self) -> &'static [&'static str] {
        &["kube-proxy", "coredns", "nginx-ingress-controller"]
    }

    fn rules(&self) -> &'static [Rule] {
        &[ENDPOINT_SLICES, ENDPOINTS]
    }

    fn needs(&self) -> Needs {
        Needs {
            services: true,
            node_pools: true,
            pool_name: true,
        }
    }

    fn peek(&self, head: &Head<'_>, ctx: &FilterContext) -> Peek {
        if scope(head, ctx).is_some() {
            Peek::Inspect
        } else {
            Peek::Pass
        }
    }

    fn filter(&self, obj: &mut Value, head: &Head<'_>, ctx: &FilterContext) -> Verdict {
        let Some(scope) = scope(head, ctx) else {
            return Verdict::Keep;
        };
        let changed = match &*head.kind {
            "EndpointSlice" => retain_slice_endpoints(obj, &scope),
            "Endpoints" => retain_endpoints_addresses(obj, &scope),
            _ => false,
        };
        Verdict::changed_if(changed)
    }

    /// EndpointSlices (kube-proxy's and coredns' steady diet) are trimmed on their JSON text:
    /// only each endpoint's node is decoded, and kept endpoints are copied as received.
    fn filter_text(&self, raw: &str, head: &Head<'_>, ctx: &FilterContext) -> Option<Rewrite> {
        if head.kind != "EndpointSlice" {
            return None;
        }
        let Some(scope) = scope(head, ctx) else {
            return Some(Rewrite::Keep);
        };
        let slice: SliceText<'_> = serde_json::from_str(raw).ok()?;
        let endpoints = slice.endpoints.unwrap_or_default();
        let mut drops = Vec::new();
        for (i, endpoint) in endpoints.iter().enumerate() {
            let node: EndpointNode<'_> = serde_json::from_str(endpoint.get()).ok()?;
            if !scope.admits(node.name()) {
                drops.push((i, Rewrite::Drop));
            }
        }
        if drops.is_empty() {
            return Some(Rewrite::Keep);
        }
        Some(Rewrite::Replace(splice_items(raw, &endpoints, drops)))
    }
}

/// An EndpointSlice's endpoints, as text.
#[derive(Deserialize)]
struct SliceText<'a> {
    #[serde(borrow)]
    endpoints: Option<Vec<&'a RawValue>>,
}

/// The node fields of one endpoint (see [`slice_endpoint_node`]).
#[derive(Deserialize)]
struct EndpointNode<'a> {
    #[serde(rename = "nodeName", borrow)]
    node_name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    topology: Option<Topology<'a>>,
}

#[derive(Deserialize)]
struct Topology<'a> {
    #[serde(rename = "kubernetes.io/hostname", borrow)]
    hostname: Option<Cow<'a, str>>,
}

impl EndpointNode<'_> {
    fn name(&self) -> Option<&str> {
        self.node_name
            .as_deref()
            .or_else(|| self.topology.as_ref()?.hostname.as_deref())
    }
}

/// The nodes whose endpoints an annotated Service keeps.
enum Scope<'c> {
    Node(&'c str),
    Pool(&'c HashSet<String>),
}

impl Scope<'_> {
    fn admits(&self, node: Option<&str>) -> bool {
        match (self, node) {
            (_, None) => false,
            (Scope::Node(this), Some(node)) => *this == node,
            (Scope::Pool(nodes), Some(node)) => nodes.contains(node),
        }
    }
}

/// The scope the object's Service asks for, or `None` to leave the object alone.
fn scope<'c>(head: &Head<'_>, ctx: &'c FilterContext) -> Option<Scope<'c>> {
    let (namespace, service) = match &*head.kind {
        "EndpointSlice" => (&*head.namespace, head.labels.get(SERVICE_NAME_LABEL)?),
        "Endpoints" => (&*head.namespace, &*head.name),
        _ => return None,
    };
    let key = ctx
        .service_annotations(namespace, service)?
        .get(TOPOLOGY_KEYS)?;
    match key.as_str() {
        TOPOLOGY_NODE => Some(Scope::Node(ctx.node_name())),
        TOPOLOGY_POOL | TOPOLOGY_ZONE => match ctx.pool_name() {
            None => Some(Scope::Node(ctx.node_name())),
            Some(pool) => ctx.pool_nodes(pool).map(Scope::Pool),
        },
        _ => None,
    }
}

fn retain_slice_endpoints(slice: &mut Value, scope: &Scope<'_>) -> bool {
    let Some(endpoints) = slice.get_mut("endpoints").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = endpoints.len();
    endpoints.retain(|ep| scope.admits(slice_endpoint_node(ep)));
    endpoints.len() != before
}

/// `nodeName` (v1, and v1beta1 since 1.20), else v1beta1's `topology["kubernetes.io/hostname"]`.
fn slice_endpoint_node(endpoint: &Value) -> Option<&str> {
    endpoint
        .get("nodeName")
        .and_then(Value::as_str)
        .or_else(|| endpoint.get("topology")?.get(TOPOLOGY_NODE)?.as_str())
}

fn retain_endpoints_addresses(endpoints: &mut Value, scope: &Scope<'_>) -> bool {
    let Some(subsets) = endpoints.get_mut("subsets").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut changed = false;
    for subset in subsets.iter_mut() {
        for key in ["addresses", "notReadyAddresses"] {
            if let Some(addresses) = subset.get_mut(key).and_then(Value::as_array_mut) {
                let before = addresses.len();
                addresses.retain(|a| scope.admits(a.get("nodeName").and_then(Value::as_str)));
                changed |= addresses.len() != before;
            }
        }
    }
    let before = subsets.len();
    subsets.retain(|s| has_addresses(s, "addresses") || has_addresses(s, "notReadyAddresses"));
    changed || subsets.len() != before
}

fn has_addresses(subset: &Value, key: &str) -> bool {
    subset
        .get(key)
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{ENDPOINT_SLICES as SLICES, ENDPOINTS as EPS, apply, edge_ctx, item};

    fn addresses(slice: &Value) -> Vec<&str> {
        slice["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["addresses"][0].as_str().unwrap())
            .collect()
    }

    fn annotate(ctx: FilterContext, service: &str, key: &str) -> FilterContext {
        ctx.with_service("shop", service, &[(TOPOLOGY_KEYS, key)])
    }

    #[test]
    fn pool_topology_keeps_endpoints_in_this_nodes_pool() {
        let slice = item(SLICES, "shop", "web-topology-k2m9x");
        let (verdict, out) = apply(&ServiceTopology, &slice, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        // edge-1 (ready) and edge-2 (not ready) are in hangzhou; edge-3 is in beijing; the last
        // endpoint has no node.
        assert_eq!(addresses(&out), ["10.244.1.5", "10.244.2.6"]);
        assert_eq!(
            out["endpoints"][1], slice["endpoints"][1],
            "kept endpoints are untouched"
        );
        assert_eq!(out["ports"], slice["ports"]);
    }

    #[test]
    fn zone_topology_means_the_pool() {
        let ctx = annotate(edge_ctx(), "web-topology", TOPOLOGY_ZONE);
        let (_, out) = apply(
            &ServiceTopology,
            &item(SLICES, "shop", "web-topology-k2m9x"),
            &ctx,
        );
        assert_eq!(addresses(&out), ["10.244.1.5", "10.244.2.6"]);
    }

    #[test]
    fn node_topology_keeps_this_nodes_endpoints() {
        let (verdict, out) = apply(
            &ServiceTopology,
            &item(SLICES, "shop", "web-node-p4q7z"),
            &edge_ctx(),
        );
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(addresses(&out), ["10.244.1.8"]);
    }

    #[test]
    fn a_node_in_no_pool_falls_back_to_node_topology() {
        let mut ctx = edge_ctx();
        ctx.set_pool_name(None);
        let (_, out) = apply(
            &ServiceTopology,
            &item(SLICES, "shop", "web-topology-k2m9x"),
            &ctx,
        );
        assert_eq!(addresses(&out), ["10.244.1.5"]);
    }

    #[test]
    fn a_pool_the_hub_has_not_seen_leaves_the_slice_unchanged() {
        let mut ctx = edge_ctx();
        ctx.remove_pool("hangzhou");
        assert_eq!(
            apply(
                &ServiceTopology,
                &item(SLICES, "shop", "web-topology-k2m9x"),
                &ctx
            )
            .0,
            Verdict::Keep
        );
    }

    #[test]
    fn unannotated_unknown_or_misannotated_services_pass() {
        let ctx = edge_ctx();
        assert_eq!(
            apply(
                &ServiceTopology,
                &item(SLICES, "kube-system", "kube-dns-7xkq2"),
                &ctx
            )
            .0,
            Verdict::Keep
        );
        let mut ctx = edge_ctx();
        ctx.remove_service("shop", "web-node");
        assert_eq!(
            apply(
                &ServiceTopology,
                &item(SLICES, "shop", "web-node-p4q7z"),
                &ctx
            )
            .0,
            Verdict::Keep
        );
        for bad in [
            "",
            "kubernetes.io/hostname,openyurt.io/nodepool",
            "topology.kubernetes.io/zone",
        ] {
            let ctx = annotate(edge_ctx(), "web-node", bad);
            assert_eq!(
                apply(
                    &ServiceTopology,
                    &item(SLICES, "shop", "web-node-p4q7z"),
                    &ctx
                )
                .0,
                Verdict::Keep,
                "{bad:?}"
            );
        }
        let mut orphan = item(SLICES, "shop", "web-node-p4q7z");
        orphan["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(SERVICE_NAME_LABEL);
        assert_eq!(
            apply(&ServiceTopology, &orphan, &edge_ctx()).0,
            Verdict::Keep
        );
    }

    #[test]
    fn the_service_is_looked_up_in_the_slices_namespace() {
        let mut slice = item(SLICES, "shop", "web-node-p4q7z");
        slice["metadata"]["namespace"] = json!("other");
        assert_eq!(
            apply(&ServiceTopology, &slice, &edge_ctx()).0,
            Verdict::Keep
        );
    }

    #[test]
    fn a_slice_with_no_local_endpoint_stays_empty() {
        let ctx = FilterContext::new("edge-9").with_service(
            "shop",
            "web-node",
            &[(TOPOLOGY_KEYS, TOPOLOGY_NODE)],
        );
        let (verdict, out) = apply(
            &ServiceTopology,
            &item(SLICES, "shop", "web-node-p4q7z"),
            &ctx,
        );
        assert_eq!(verdict, Verdict::Changed);
        assert_eq!(out["endpoints"], json!([]));
    }

    #[test]
    fn all_local_endpoints_keep_the_slice_as_is() {
        let ctx = edge_ctx().with_pool("hangzhou", &["edge-1", "edge-2", "edge-3"]);
        let mut slice = item(SLICES, "shop", "web-topology-k2m9x");
        slice["endpoints"].as_array_mut().unwrap().pop();
        assert_eq!(apply(&ServiceTopology, &slice, &ctx).0, Verdict::Keep);
        let empty = json!({"kind":"EndpointSlice","metadata":{"name":"e","namespace":"shop",
            "labels":{"kubernetes.io/service-name":"web-node"}},"addressType":"IPv4","endpoints":null});
        assert_eq!(apply(&ServiceTopology, &empty, &ctx).0, Verdict::Keep);
    }

    #[test]
    fn v1beta1_slices_use_the_hostname_topology() {
        let slice = json!({"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1beta1",
            "metadata":{"name":"web-node-abc","namespace":"shop","labels":{"kubernetes.io/service-name":"web-node"}},
            "addressType":"IPv4",
            "endpoints":[
                {"addresses":["10.244.1.8"],"conditions":{"ready":true},"topology":{"kubernetes.io/hostname":"edge-1"}},
                {"addresses":["10.244.3.9"],"conditions":{"ready":true},"topology":{"kubernetes.io/hostname":"edge-3"}},
                {"addresses":["10.244.4.1"],"conditions":{"ready":true}}
            ],
            "ports":[{"name":"http","protocol":"TCP","port":8080}]});
        let (_, out) = apply(&ServiceTopology, &slice, &edge_ctx());
        assert_eq!(addresses(&out), ["10.244.1.8"]);
    }

    #[test]
    fn v1_endpoints_are_filtered_too() {
        let eps = item(EPS, "shop", "web-topology");
        let (verdict, out) = apply(&ServiceTopology, &eps, &edge_ctx());
        assert_eq!(verdict, Verdict::Changed);
        let subsets = out["subsets"].as_array().unwrap();
        assert_eq!(subsets.len(), 1, "the subset only on edge-3 is gone");
        let ips = |key: &str| -> Vec<&str> {
            subsets[0][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["ip"].as_str().unwrap())
                .collect()
        };
        assert_eq!(ips("addresses"), ["10.244.1.5"]);
        assert_eq!(ips("notReadyAddresses"), ["10.244.2.6"]);
        assert_eq!(subsets[0]["ports"], eps["subsets"][0]["ports"]);
    }

    #[test]
    fn v1_endpoints_under_node_topology() {
        let ctx = annotate(edge_ctx(), "web-topology", TOPOLOGY_NODE);
        let (_, out) = apply(&ServiceTopology, &item(EPS, "shop", "web-topology"), &ctx);
        let subset = &out["subsets"][0];
        assert_eq!(subset["addresses"].as_array().unwrap().len(), 1);
        assert_eq!(subset["notReadyAddresses"], json!([]));
        let ctx = FilterContext::new("edge-9").with_service(
            "shop",
            "web-topology",
            &[(TOPOLOGY_KEYS, TOPOLOGY_NODE)],
        );
        let (_, out) = apply(&ServiceTopology, &item(EPS, "shop", "web-topology"), &ctx);
        assert_eq!(out["subsets"], json!([]));
    }

    /// The text path (used when servicetopology alone inspects a slice) and the `Value` path
    /// (used when another filter inspects it too) agree on every fixture slice and context.
    #[test]
    fn text_and_value_paths_agree() {
        let list: Value = serde_json::from_str(SLICES).unwrap();
        let contexts = [
            edge_ctx(),
            annotate(edge_ctx(), "web-topology", TOPOLOGY_NODE),
            FilterContext::new("edge-3").with_service(
                "shop",
                "web-node",
                &[(TOPOLOGY_KEYS, TOPOLOGY_NODE)],
            ),
            FilterContext::new("edge-9")
                .with_service("shop", "web-topology", &[(TOPOLOGY_KEYS, TOPOLOGY_POOL)])
                .with_pool_name("p")
                .with_pool("p", &["edge-3", "edge-9"]),
        ];
        for ctx in &contexts {
            for item in list["items"].as_array().unwrap() {
                let mut item = item.clone();
                item["kind"] = Value::from("EndpointSlice");
                let item = &item;
                let raw = serde_json::to_string(item).unwrap();
                let head = Head::parse(&raw, "EndpointSlice").unwrap();
                let (verdict, by_value) = apply(&ServiceTopology, item, ctx);
                let by_text = match ServiceTopology.filter_text(&raw, &head, ctx).unwrap() {
                    Rewrite::Keep => item.clone(),
                    Rewrite::Replace(text) => serde_json::from_str(&text).unwrap(),
                    Rewrite::Drop => panic!("slices are never dropped"),
                };
                assert_eq!(by_text, by_value, "{}", head.name);
                assert_eq!(verdict == Verdict::Keep, &by_text == item);
            }
        }
    }

    #[test]
    fn the_text_path_leaves_other_kinds_to_the_value_path() {
        let eps = serde_json::to_string(&item(EPS, "shop", "web-topology")).unwrap();
        let head = Head::parse(&eps, "Endpoints").unwrap();
        assert_eq!(ServiceTopology.filter_text(&eps, &head, &edge_ctx()), None);
    }

    #[test]
    fn endpoints_of_unannotated_services_pass() {
        assert_eq!(
            apply(
                &ServiceTopology,
                &item(EPS, "default", "kubernetes"),
                &edge_ctx()
            )
            .0,
            Verdict::Keep
        );
    }
}
