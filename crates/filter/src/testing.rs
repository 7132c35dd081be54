//! Test helpers: the fixtures (real-shaped apiserver bodies) and one-filter application.

use serde_json::Value;

use crate::filter::{Filter, Peek, Verdict};
use crate::head::Head;
use crate::{FilterContext, side};

pub const SERVICES: &str = include_str!("../tests/fixtures/services.json");
pub const ENDPOINT_SLICES: &str = include_str!("../tests/fixtures/endpointslices.json");
pub const ENDPOINTS: &str = include_str!("../tests/fixtures/endpoints.json");
pub const KUBE_PROXY_CONFIGMAP: &str = include_str!("../tests/fixtures/kube-proxy-configmap.json");
pub const PODS: &str = include_str!("../tests/fixtures/kube-system-pods.json");

/// Item `namespace/name` of the list fixture `list`, with the `kind` a watch event would carry.
pub fn item(list: &str, namespace: &str, name: &str) -> Value {
    let list: Value = serde_json::from_str(list).expect("fixture");
    let kind = list["kind"]
        .as_str()
        .expect("kind")
        .trim_end_matches("List")
        .to_owned();
    let mut obj = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|o| o["metadata"]["namespace"] == namespace && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {namespace}/{name} in fixture"))
        .clone();
    obj["kind"] = Value::from(kind);
    obj
}

/// What a chain of this one filter does to `obj`: the verdict and the object afterwards.
pub fn apply(filter: &dyn Filter, obj: &Value, ctx: &FilterContext) -> (Verdict, Value) {
    let raw = obj.to_string();
    let head = Head::parse(&raw, "").expect("head");
    let mut out = obj.clone();
    let verdict = match filter.peek(&head, ctx) {
        Peek::Pass => Verdict::Keep,
        Peek::Drop => Verdict::Drop,
        Peek::Inspect => filter.filter(&mut out, &head, ctx),
    };
    if verdict == Verdict::Keep {
        assert_eq!(&out, obj, "a Keep verdict must leave the object as it was");
    }
    (verdict, out)
}

/// A context for node `edge-1` in pool `hangzhou` (`edge-1`, `edge-2`; `edge-3` is in
/// `beijing`), with the fixture's Services loaded.
pub fn edge_ctx() -> FilterContext {
    let mut ctx = FilterContext::new("edge-1")
        .with_pool_name("hangzhou")
        .with_pool("hangzhou", &["edge-1", "edge-2"])
        .with_pool("beijing", &["edge-3"]);
    let list: Value = serde_json::from_str(SERVICES).expect("fixture");
    for svc in list["items"].as_array().expect("items") {
        let entry = side::ServiceEntry::from_json(svc.to_string().as_bytes()).expect("service");
        ctx.insert_service(entry.namespace, entry.name, entry.annotations);
    }
    ctx
}
