//! The public API end to end, on real-shaped apiserver bodies: configuration → `for_request` →
//! the byte-level entry points, as the proxy will call them.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use outpost_core::Verb;
use outpost_core::wire::LineFramer;
use outpost_filter::side::{NodePoolEntry, ServiceEntry, resolve_pool_name};
use outpost_filter::{Chain, FilterConfig, FilterContext, FilterSet, Outcome};
use serde_json::value::RawValue;
use serde_json::{Value, json};

const SERVICES: &str = include_str!("fixtures/services.json");
const SLICES: &str = include_str!("fixtures/endpointslices.json");
const ENDPOINTS: &str = include_str!("fixtures/endpoints.json");
const KUBE_PROXY_CM: &str = include_str!("fixtures/kube-proxy-configmap.json");
const PODS: &str = include_str!("fixtures/kube-system-pods.json");
const POD_WATCH: &str = include_str!("fixtures/watch-list-pods.jsonl");

/// The context the proxy would build: node `edge-1` whose Node carries the pool label, the
/// fixture's Services and two NodePools, all read through the `side` helpers.
fn ctx() -> FilterContext {
    let node = br#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"edge-1","labels":{"apps.openyurt.io/nodepool":"hangzhou","kubernetes.io/hostname":"edge-1"}}}"#;
    let mut ctx = FilterContext::new("edge-1");
    ctx.set_pool_name(resolve_pool_name(None, Some(node)).unwrap());
    for pool in [
        br#"{"apiVersion":"apps.openyurt.io/v1beta2","kind":"NodePool","metadata":{"name":"hangzhou"},"status":{"nodes":["edge-1","edge-2"]}}"#.as_slice(),
        br#"{"apiVersion":"apps.openyurt.io/v1beta2","kind":"NodePool","metadata":{"name":"beijing"},"status":{"nodes":["edge-3"]}}"#,
    ] {
        let pool = NodePoolEntry::from_json(pool).unwrap();
        ctx.insert_pool(pool.name, pool.nodes);
    }
    let list: Value = serde_json::from_str(SERVICES).unwrap();
    for svc in list["items"].as_array().unwrap() {
        let svc = ServiceEntry::from_json(&serde_json::to_vec(svc).unwrap()).unwrap();
        ctx.insert_service(svc.namespace, svc.name, svc.annotations);
    }
    ctx
}

fn chain(component: &str, group: &str, resource: &str, verb: Verb) -> Chain {
    FilterSet::new(&FilterConfig::default())
        .for_parts(component, group, "v1", resource, "", verb)
        .expect("a filter applies")
}

fn replaced(outcome: Outcome) -> Bytes {
    match outcome {
        Outcome::Replaced(bytes) => bytes,
        other => panic!("expected a replacement, got {other:?}"),
    }
}

fn item_names(list: &[u8]) -> Vec<String> {
    let list: Value = serde_json::from_slice(list).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap(),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Each item of `list` as the bytes it was received as.
fn raw_items(list: &str) -> Vec<String> {
    let list: HashMap<&str, &RawValue> = serde_json::from_str(list).unwrap();
    let items: Vec<&RawValue> = serde_json::from_str(list["items"].get()).unwrap();
    items.iter().map(|i| i.get().to_owned()).collect()
}

#[test]
fn kube_proxy_service_list_drops_cloud_and_isolated_services() {
    let out = replaced(
        chain("kube-proxy", "", "services", Verb::List).filter_list(SERVICES.as_bytes(), &ctx()),
    );
    assert_eq!(
        item_names(&out),
        [
            "default/kubernetes",
            "kube-system/kube-dns",
            "shop/web-public",
            "shop/web-nodeport",
            "shop/web-topology",
            "shop/web-node"
        ]
    );
    // Kept items and everything around `items` are the original bytes.
    let out = std::str::from_utf8(&out).unwrap();
    for (i, raw) in raw_items(SERVICES).iter().enumerate() {
        let dropped = [2, 3].contains(&i);
        assert_eq!(out.contains(raw.as_str()), !dropped, "item {i}");
    }
    assert!(out.starts_with(
        r#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"520"},"items":["#
    ));
    assert!(out.ends_with("]}\n"));

    // In beijing, the NodePort Service that listens only in hangzhou goes too.
    let mut beijing = ctx();
    beijing.set_pool_name(Some("beijing".into()));
    let out = replaced(
        chain("kube-proxy", "", "services", Verb::List).filter_list(SERVICES.as_bytes(), &beijing),
    );
    assert!(!item_names(&out).contains(&"shop/web-nodeport".to_owned()));
}

#[test]
fn kubelet_service_list_rewrites_only_the_kubernetes_service() {
    let out = replaced(
        chain("kubelet", "", "services", Verb::List).filter_list(SERVICES.as_bytes(), &ctx()),
    );
    let mut expected: Value = serde_json::from_str(SERVICES).unwrap();
    let spec = &mut expected["items"][0]["spec"];
    spec["clusterIP"] = json!("169.254.2.1");
    spec["clusterIPs"] = json!(["169.254.2.1"]);
    spec["ports"][0]["port"] = json!(10268);
    assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), expected);
    let out = std::str::from_utf8(&out).unwrap();
    for raw in &raw_items(SERVICES)[1..] {
        assert!(out.contains(raw.as_str()));
    }
}

#[test]
fn kube_proxy_slice_list_applies_topology_then_forwards_the_kubernetes_slice() {
    let out = replaced(
        chain(
            "kube-proxy",
            "discovery.k8s.io",
            "endpointslices",
            Verb::List,
        )
        .filter_list(SLICES.as_bytes(), &ctx()),
    );
    let list: Value = serde_json::from_slice(&out).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 4, "slices are trimmed, never dropped");
    assert_eq!(
        items[0]["endpoints"],
        json!([{"addresses":["169.254.2.1"],"conditions":{"ready":true}}])
    );
    assert_eq!(items[0]["ports"][0]["port"], 10268);
    let nodes = |i: usize| -> Vec<&str> {
        items[i]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["nodeName"].as_str().unwrap())
            .collect()
    };
    assert_eq!(
        nodes(1),
        ["v1.32-control-plane", "v1.32-control-plane"],
        "kube-dns has no topology"
    );
    assert_eq!(nodes(2), ["edge-1", "edge-2"], "pool topology");
    assert_eq!(nodes(3), ["edge-1"], "node topology");
    assert!(
        std::str::from_utf8(&out)
            .unwrap()
            .contains(&raw_items(SLICES)[1])
    );
}

#[test]
fn the_kubernetes_slice_keeps_the_hub_endpoint_even_under_topology() {
    // Were forwardkubesvctraffic applied first, node topology would drop the hub endpoint
    // (it has no node). The fixed order keeps it.
    let mut ctx = ctx();
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "openyurt.io/topologyKeys".to_owned(),
        "kubernetes.io/hostname".to_owned(),
    );
    ctx.insert_service("default", "kubernetes", annotations);
    let out = replaced(
        chain(
            "kube-proxy",
            "discovery.k8s.io",
            "endpointslices",
            Verb::List,
        )
        .filter_list(SLICES.as_bytes(), &ctx),
    );
    let list: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        list["items"][0]["endpoints"][0]["addresses"],
        json!(["169.254.2.1"])
    );
}

#[test]
fn endpoints_lists_are_filtered() {
    let chain = chain("nginx-ingress-controller", "", "endpoints", Verb::List);
    let out = replaced(chain.filter_list(ENDPOINTS.as_bytes(), &ctx()));
    let list: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(list["items"][0]["subsets"].as_array().unwrap().len(), 1);
    assert_eq!(
        list["items"][1],
        serde_json::from_str::<Value>(ENDPOINTS).unwrap()["items"][1]
    );
}

#[test]
fn lists_nothing_changes_in_are_unchanged() {
    let mut ctx = ctx();
    ctx.clear_services();
    let slices = chain("coredns", "discovery.k8s.io", "endpointslices", Verb::List);
    assert!(matches!(
        slices.filter_list(SLICES.as_bytes(), &ctx),
        Outcome::Unchanged
    ));
    let pods = chain("kubelet", "", "pods", Verb::List);
    assert!(matches!(
        pods.filter_list(PODS.as_bytes(), &ctx),
        Outcome::Unchanged
    ));
    let empty = br#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[]}"#;
    let services = chain("kube-proxy", "", "services", Verb::List);
    assert!(matches!(
        services.filter_list(empty, &ctx),
        Outcome::Unchanged
    ));
    let null = br#"{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":null}"#;
    assert!(matches!(
        services.filter_list(null, &ctx),
        Outcome::Unchanged
    ));
}

#[test]
fn a_list_whose_every_item_is_dropped_is_an_empty_list() {
    let services = chain("kube-proxy", "", "services", Verb::List);
    let body = br#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[
        {"metadata":{"name":"x-tunnel-server-internal-svc","namespace":"kube-system"},"spec":{"type":"ClusterIP"}},
        {"metadata":{"name":"lb","namespace":"a","annotations":{"svc.openyurt.io/discard":"true"}},"spec":{"type":"LoadBalancer"}}
    ]}"#;
    let out = replaced(services.filter_list(body, &ctx()));
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "{\"kind\":\"ServiceList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"9\"},\"items\":[\n        \n    ]}"
    );
}

#[test]
fn pretty_printed_lists_keep_their_layout() {
    let services = chain("kube-proxy", "", "services", Verb::List);
    let body = "{\n  \"kind\": \"ServiceList\",\n  \"items\": [\n    {\"metadata\": {\"name\": \"a\", \"namespace\": \"n\"}},\n    {\"metadata\": {\"name\": \"x-tunnel-server-internal-svc\", \"namespace\": \"kube-system\"}},\n    {\"metadata\": {\"name\": \"b\", \"namespace\": \"n\"}}\n  ]\n}\n";
    let out = replaced(services.filter_list(body.as_bytes(), &ctx()));
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "{\n  \"kind\": \"ServiceList\",\n  \"items\": [\n    {\"metadata\": {\"name\": \"a\", \"namespace\": \"n\"}},{\"metadata\": {\"name\": \"b\", \"namespace\": \"n\"}}\n  ]\n}\n"
    );
}

#[test]
fn other_kinds_pass_unchanged() {
    let services = chain("kube-proxy", "", "services", Verb::List);
    let table = br#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"columnDefinitions":[],"rows":[]}"#;
    assert!(matches!(
        services.filter_list(table, &ctx()),
        Outcome::Unchanged
    ));
    let partial = br#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{},
        "items":[{"kind":"PartialObjectMetadata","metadata":{"name":"x-tunnel-server-internal-svc","namespace":"kube-system"}}]}"#;
    assert!(matches!(
        services.filter_list(partial, &ctx()),
        Outcome::Unchanged
    ));
    let status = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404}"#;
    let cm = chain("kubelet", "", "configmaps", Verb::Get);
    assert!(matches!(
        cm.filter_object(status, &ctx()),
        Outcome::Unchanged
    ));
}

#[test]
fn undecodable_bodies_pass_unchanged() {
    let services = chain("kube-proxy", "", "services", Verb::List);
    let protobuf = b"k8s\x00\n\x0f\n\x02v1\x12\x0bServiceList\x12\x00";
    let truncated = &SERVICES.as_bytes()[..SERVICES.len() / 2];
    for body in [
        protobuf.as_slice(),
        truncated,
        b"",
        b"[1,2]",
        br#"{"items":[1]}"#,
    ] {
        let outcome = services.filter_list(body, &ctx());
        assert!(
            matches!(outcome, Outcome::Undecodable(_)),
            "{:?}",
            String::from_utf8_lossy(body)
        );
        let original = Bytes::copy_from_slice(body);
        assert_eq!(outcome.into_bytes(original.clone()), original);
    }
    let cm = chain("kubelet", "", "configmaps", Verb::Get);
    assert!(matches!(
        cm.filter_object(b"\xff\xfe", &ctx()),
        Outcome::Undecodable(_)
    ));
    assert!(matches!(
        cm.filter_object(b"[]", &ctx()),
        Outcome::Undecodable(_)
    ));
}

#[test]
fn get_of_the_kube_proxy_configmap() {
    let cm = chain("kubelet", "", "configmaps", Verb::Get);
    let out = replaced(cm.filter_object(KUBE_PROXY_CM.as_bytes(), &ctx()));
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert!(
        out["data"]["config.conf"]
            .as_str()
            .unwrap()
            .contains("\n  #kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n")
    );
    let other = KUBE_PROXY_CM.replace(r#""name":"kube-proxy""#, r#""name":"coredns""#);
    assert!(matches!(
        cm.filter_object(other.as_bytes(), &ctx()),
        Outcome::Unchanged
    ));
}

#[test]
fn a_dropped_object_in_a_get_is_sent_as_is() {
    // yurthub's rule: a GET answers with the original object. No default chain drops on GET,
    // so feed a single Service to the services chain's object entry point.
    let services = chain("kube-proxy", "", "services", Verb::Watch);
    let svc = br#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"x-tunnel-server-internal-svc","namespace":"kube-system"},"spec":{"type":"ClusterIP"}}"#;
    assert!(matches!(
        services.filter_object(svc, &ctx()),
        Outcome::Unchanged
    ));
}

/// A watch event line as kube-apiserver writes it: `type` first.
fn event(kind: &str, obj: &Value) -> String {
    format!("{{\"type\":\"{kind}\",\"object\":{obj}}}\n")
}

fn service(ns: &str, name: &str) -> Value {
    let list: Value = serde_json::from_str(SERVICES).unwrap();
    let mut svc = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["metadata"]["namespace"] == ns && s["metadata"]["name"] == name)
        .unwrap()
        .clone();
    svc["kind"] = json!("Service");
    svc["apiVersion"] = json!("v1");
    svc
}

#[test]
fn watch_events_rewritten_in_place() {
    let kubelet = chain("kubelet", "", "services", Verb::Watch);
    let line = event("MODIFIED", &service("default", "kubernetes"));
    let out = replaced(kubelet.filter_event(line.as_bytes(), &ctx()));
    // The object is spliced in place: the line's other bytes, newline included, are kept.
    assert!(out.starts_with(br#"{"type":"MODIFIED","object":{"#));
    assert!(out.ends_with(b"}}\n"));
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out["type"], "MODIFIED");
    assert_eq!(out["object"]["spec"]["clusterIP"], "169.254.2.1");
    let other = event("ADDED", &service("kube-system", "kube-dns"));
    assert!(matches!(
        kubelet.filter_event(other.as_bytes(), &ctx()),
        Outcome::Unchanged
    ));
}

#[test]
fn a_dropped_watch_object_becomes_deleted() {
    let proxy = chain("kube-proxy", "", "services", Verb::Watch);
    let lb = service("shop", "web-lb");
    for kind in ["ADDED", "MODIFIED"] {
        let line = event(kind, &lb);
        let out = replaced(proxy.filter_event(line.as_bytes(), &ctx()));
        assert!(out.ends_with(b"}\n"));
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out, json!({"type": "DELETED", "object": lb}), "{kind}");
    }
    // Without the trailing newline, none is added.
    let line = event("ADDED", &lb);
    let out = replaced(proxy.filter_event(line.trim_end().as_bytes(), &ctx()));
    assert!(out.ends_with(b"}}"));
    let deleted = event("DELETED", &lb);
    assert!(matches!(
        proxy.filter_event(deleted.as_bytes(), &ctx()),
        Outcome::Unchanged
    ));
}

#[test]
fn events_that_give_the_object_before_the_type_are_read_in_full() {
    let kubelet = chain("kubelet", "", "services", Verb::Watch);
    let proxy = chain("kube-proxy", "", "services", Verb::Watch);
    let reversed = |kind: &str, obj: &Value| format!("{}\n", json!({"object": obj, "type": kind}));
    let line = reversed("MODIFIED", &service("default", "kubernetes"));
    assert!(line.starts_with(r#"{"object":"#));
    let out: Value =
        serde_json::from_slice(&replaced(kubelet.filter_event(line.as_bytes(), &ctx()))).unwrap();
    assert_eq!(out["type"], "MODIFIED");
    assert_eq!(out["object"]["spec"]["clusterIP"], "169.254.2.1");
    let lb = reversed("ADDED", &service("shop", "web-lb"));
    let out: Value =
        serde_json::from_slice(&replaced(proxy.filter_event(lb.as_bytes(), &ctx()))).unwrap();
    assert_eq!(out["type"], "DELETED");
    let other = reversed("ADDED", &service("kube-system", "kube-dns"));
    assert!(matches!(
        proxy.filter_event(other.as_bytes(), &ctx()),
        Outcome::Unchanged
    ));
    let bookmark = r#"{"object":{"kind":"Service","apiVersion":"v1","metadata":{"resourceVersion":"7"}},"type":"BOOKMARK"}"#;
    assert!(matches!(
        proxy.filter_event(bookmark.as_bytes(), &ctx()),
        Outcome::Unchanged
    ));
}

#[test]
fn bookmarks_errors_and_blank_lines_pass() {
    let proxy = chain("kube-proxy", "", "services", Verb::Watch);
    let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Service","apiVersion":"v1","metadata":{"resourceVersion":"12345","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
    let error = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (200)","reason":"Expired","code":410}}"#;
    for line in [bookmark, error, "", "\n", "  \r\n"] {
        assert!(
            matches!(
                proxy.filter_event(line.as_bytes(), &ctx()),
                Outcome::Unchanged
            ),
            "{line:?}"
        );
    }
    assert!(matches!(
        proxy.filter_event(b"{\"type\":", &ctx()),
        Outcome::Undecodable(_)
    ));
}

#[test]
fn the_recorded_pod_watch_through_kubelets_chain() {
    let pods = chain("kubelet", "", "pods", Verb::Watch);
    let mut framer = LineFramer::new();
    let mut lines = Vec::new();
    for chunk in POD_WATCH.as_bytes().chunks(1000) {
        framer.push(Bytes::copy_from_slice(chunk));
        lines.extend(std::iter::from_fn(|| framer.next_line()));
    }
    lines.extend(framer.finish());
    assert_eq!(
        lines.len(),
        9,
        "8 ADDED and the initial-events-end BOOKMARK"
    );
    for line in &lines {
        assert!(matches!(
            pods.filter_event(line, &ctx()),
            Outcome::Unchanged
        ));
    }
    // A pod that sets the apiserver address itself gets the hub's.
    let with_env = std::str::from_utf8(&lines[3]).unwrap().replace(
        r#"{"name":"POD_SUBNET","value":"10.244.0.0/16"}"#,
        r#"{"name":"KUBERNETES_SERVICE_HOST","value":"10.96.0.1"}"#,
    );
    assert_ne!(
        with_env.as_bytes(),
        &lines[3][..],
        "the fixture line is kindnet's"
    );
    let out = replaced(pods.filter_event(with_env.as_bytes(), &ctx()));
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out["type"], "ADDED");
    assert!(
        out["object"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name":"KUBERNETES_SERVICE_HOST","value":"169.254.2.1"}))
    );
}

#[test]
fn side_data_changes_apply_to_the_next_event() {
    let proxy = chain(
        "kube-proxy",
        "discovery.k8s.io",
        "endpointslices",
        Verb::Watch,
    );
    let list: Value = serde_json::from_str(SLICES).unwrap();
    let mut slice = list["items"][3].clone();
    slice["kind"] = json!("EndpointSlice");
    let line = event("MODIFIED", &slice);
    let mut ctx = ctx();
    assert!(matches!(
        proxy.filter_event(line.as_bytes(), &ctx),
        Outcome::Replaced(_)
    ));
    ctx.insert_service("shop", "web-node", BTreeMap::new());
    assert!(matches!(
        proxy.filter_event(line.as_bytes(), &ctx),
        Outcome::Unchanged
    ));
}

#[test]
fn cloud_mode_and_disabled_filters_change_the_chains() {
    let cloud = FilterSet::new(&FilterConfig {
        cloud_mode: true,
        ..FilterConfig::default()
    });
    let chain = cloud
        .for_parts("kube-proxy", "", "v1", "services", "", Verb::List)
        .unwrap();
    assert_eq!(chain.names().collect::<Vec<_>>(), ["nodeportisolation"]);
    let mut beijing = ctx();
    beijing.set_pool_name(Some("beijing".into()));
    let out = replaced(chain.filter_list(SERVICES.as_bytes(), &beijing));
    let names = item_names(&out);
    assert!(!names.contains(&"shop/web-nodeport".to_owned()));
    assert!(
        names.contains(&"shop/web-lb".to_owned()),
        "discardcloudservice is off"
    );
    assert!(
        cloud
            .for_parts("kubelet", "", "v1", "pods", "", Verb::List)
            .is_none()
    );

    let none = FilterSet::new(&FilterConfig {
        disabled: vec!["*".into()],
        ..FilterConfig::default()
    });
    assert!(
        none.for_parts("kube-proxy", "", "v1", "services", "", Verb::List)
            .is_none()
    );
}

/// kubelet's pod LIST is read only when some pod sets the apiserver's address in its env: a
/// node's usual list goes out after one substring search, however large it is.
#[test]
fn a_pod_list_without_the_service_variables_is_not_read() {
    let pods = chain("kubelet", "", "pods", Verb::List);
    // Not JSON at all: reading it would say so.
    let unread = br#"{"kind":"PodList","items":[{"metadata":{"name":"p"}, oops"#;
    assert!(matches!(
        pods.filter_list(unread, &ctx()),
        Outcome::Unchanged
    ));
    let with_env = PODS.replacen(
        r#""containers":["#,
        r#""containers":[{"name":"agent","image":"a","env":[{"name":"KUBERNETES_SERVICE_HOST","value":"10.96.0.1"}]},"#,
        1,
    );
    assert_ne!(with_env, PODS, "the fixture has containers");
    let out: Value =
        serde_json::from_slice(&replaced(pods.filter_list(with_env.as_bytes(), &ctx()))).unwrap();
    assert_eq!(
        out["items"][0]["spec"]["containers"][0]["env"][0],
        json!({"name":"KUBERNETES_SERVICE_HOST","value":"169.254.2.1"})
    );
}
