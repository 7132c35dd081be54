//! A full node's objects in real shapes, created through the fake's API: 110 pods bound to
//! [`NODE`] (the recorded kube-system pods, renamed and spread over ten `app-N` namespaces), the
//! first 100 of them each mounting one ConfigMap and one Secret of its own (200 objects), 1,000
//! Services and 1,000 EndpointSlices with two endpoints each, and the ServiceAccounts the pods run
//! as. The shapes are `outpost_testkit::full_node`'s, shared with the cold-boot harness.

use outpost_testkit::FakeApiServer;
pub use outpost_testkit::full_node::{
    MOUNTS, NAMESPACES, app_ns, config_map, config_map_ref, endpoint_slice, pod, secret,
    secret_ref, service,
};
use serde_json::{Value, json};

use crate::{NODE, PodTemplates};

pub const PODS: usize = 110;
pub const SERVICES: usize = 1000;

/// kube-proxy's label selector on Services and EndpointSlices, URL-encoded.
pub const PROXY_SELECTOR: &str = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";

/// What [`seed`] created that a replay needs to address.
pub struct FullNode {
    /// The node's pods as stored (with uid and resourceVersion).
    pub pods: Vec<Value>,
}

/// Creates the full node in `fake` (on top of its default seed); panics on any rejection.
pub fn seed(fake: &FakeApiServer) -> FullNode {
    let create = |gvr: &str, obj: Value| -> Value {
        fake.create(gvr, obj)
            .unwrap_or_else(|s| panic!("create {gvr}: {}", s.message))
    };
    let templates = PodTemplates::default();
    let mut accounts: Vec<String> = templates
        .templates
        .iter()
        .filter_map(|p| p["spec"]["serviceAccountName"].as_str().map(str::to_owned))
        .collect();
    accounts.push("default".into());
    accounts.sort();
    accounts.dedup();
    for ns in 0..NAMESPACES {
        let ns = format!("app-{ns}");
        create("v1/namespaces", json!({"metadata": {"name": ns}}));
        for sa in &accounts {
            create(
                "v1/serviceaccounts",
                json!({"metadata": {"name": sa, "namespace": ns}}),
            );
        }
    }
    let pods = (0..PODS)
        .map(|i| {
            let shape = &templates.templates[i % templates.templates.len()];
            create("v1/pods", pod(shape, i, NODE))
        })
        .collect();
    for i in 0..MOUNTS {
        create("v1/configmaps", config_map(i));
        create("v1/secrets", secret(i));
    }
    for i in 0..SERVICES {
        create("v1/services", service(i));
        create(
            "discovery.k8s.io/v1/endpointslices",
            endpoint_slice(i, NODE),
        );
    }
    FullNode { pods }
}
