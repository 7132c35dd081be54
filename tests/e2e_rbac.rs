//! The hub's RBAC, proven rather than guessed (lesson 000), and the Node authorizer's limits
//! respected (lesson 002).
//!
//! The scenarios run the real binary in edge and in cloud mode: kubelet-like traffic through it
//! (its node, node status, lease, pods scoped to the node, a pod's status, the ConfigMap and Secret
//! its pod references, services, an event), an outage and recovery (so the hub checks whether the
//! cloud is back), and a `yurt-hub-cfg` ConfigMap created, changed and deleted (so the hub's
//! config watch runs). Then:
//!
//! - every request the hub made on its own (User-Agent `outpost…`), taken from the fake
//!   apiserver's log, is judged with testkit's pure authorizers: each must be allowed by the
//!   ClusterRole in `manifests/cluster/rbac.yaml` together with what the Node authorizer (and the
//!   static rules of the `system:node` role it carries) grants, and each grant of the ClusterRole
//!   must be needed by one of them;
//! - no request made with the node's identity, own or forwarded, may be answered 403 (nor 401),
//!   and an unscoped pod list forwarded with kubelet's identity shows that such a 403 is seen.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::rbac::v1::PolicyRule;
use outpost_core::RequestInfo;
use outpost_core::selector::FieldSelector;
use outpost_testkit::RequestRecord;
use outpost_testkit::authorization::{
    Attributes, Decision, NodeGraph, RefKind, StaticPolicy, UserInfo, authorize, node_name,
    rule_allows,
};
use serde_json::{Value, json};
use support::{Cluster, HubProcess, NODE, RawResponse, eventually, hub_rbac, raw_http};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/e2e";
/// What kubelet really sends.
const KUBELET_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";
/// Every request the hub makes on its own carries a User-Agent starting with this.
const OWN_UA_PREFIX: &str = "outpost";
const ROLE: &str = "outpost";
const HUB_CFG: &str = "yurt-hub-cfg";
/// Pool sharing's ConfigMap for the suite's pool (`--nodepool-name=pool-a`).
const LEADER_HUB: &str = "leader-hub-pool-a";

// ---- the scenarios ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Edge,
    Cloud,
}

/// Runs the whole scenario against a fresh cluster and a hub in `mode`; returns the fake's
/// request log once the hub has stopped.
async fn scenario(mode: Mode) -> Vec<RequestRecord> {
    let cluster = Cluster::start().await;
    seed(&cluster);
    let hub = HubProcess::spawn(&hub_args(&cluster, mode));

    kubelet_round(&hub, 1).await;
    config_round(&cluster, &hub).await;
    outage_and_recovery(&cluster, &hub).await;
    kubelet_round(&hub, 2).await;

    // Stopped gracefully, so that whatever the hub sends while shutting down is logged too.
    tokio::task::spawn_blocking(move || hub.terminate())
        .await
        .expect("terminate");
    cluster.fake.requests()
}

/// The suite's flags, with probes every second so that recovery is seen within the test. The
/// cloud hub takes its pools from NodeBuckets, the edge hub from NodePools, so that both grants
/// are exercised; the edge hub elects its pool's leaders (pool sharing's ClusterRole).
fn hub_args(cluster: &Cluster, mode: Mode) -> Vec<String> {
    let mine: Vec<String> = match mode {
        Mode::Edge => vec![
            "--heartbeat-interval-seconds=1".into(),
            "--enable-pool-leader-election".into(),
        ],
        Mode::Cloud => vec![
            "--heartbeat-interval-seconds=1".into(),
            "--working-mode=cloud".into(),
            "--enable-pool-service-topology".into(),
        ],
    };
    let flag = |arg: &str| arg.split('=').next().unwrap_or("").to_owned();
    let overridden: BTreeSet<String> = mine.iter().map(|a| flag(a)).collect();
    let mut args: Vec<String> = cluster
        .hub_args()
        .into_iter()
        .filter(|a| !overridden.contains(&flag(a)))
        .collect();
    args.extend(mine);
    args
}

/// Pod `default/web` on the node, using ConfigMap `web-cfg` and Secret `web-secret`.
fn seed(cluster: &Cluster) {
    let fake = &cluster.fake;
    fake.create(
        "v1/configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "web-cfg", "namespace": "default"}, "data": {"k": "v"}}),
    )
    .expect("configmap");
    fake.create(
        "v1/secrets",
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "web-secret", "namespace": "default"}, "data": {"k": "dg=="}}),
    )
    .expect("secret");
    fake.create(
        "v1/pods",
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": "web-cfg"}}, {"secretRef": {"name": "web-secret"}}]}]}
        }),
    )
    .expect("pod");
}

/// One request through the hub with kubelet's headers; `body` is (content type, JSON).
async fn kubelet(
    hub: &HubProcess,
    method: &str,
    path: &str,
    body: Option<(&str, Value)>,
) -> RawResponse {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET_UA}\r\nAccept: {KUBELET_ACCEPT}\r\nConnection: close\r\n"
    );
    let payload = body.map(|(content_type, value)| {
        req.push_str(&format!("Content-Type: {content_type}\r\n"));
        value.to_string()
    });
    let payload = payload.unwrap_or_default();
    if !payload.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", payload.len()));
    }
    req.push_str("\r\n");
    req.push_str(&payload);
    raw_http(hub.proxy, req.as_bytes()).await
}

fn expect(resp: RawResponse, status: u16, what: &str) -> RawResponse {
    assert_eq!(
        resp.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&resp.body)
    );
    resp
}

/// What kubelet does in a sync loop, every call answered as it should be.
async fn kubelet_round(hub: &HubProcess, round: u32) {
    let node = format!("/api/v1/nodes/{NODE}");
    expect(kubelet(hub, "GET", &node, None).await, 200, "GET node");
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "kubelet is posting ready status"}]}});
    let patch = Some(("application/strategic-merge-patch+json", status));
    let resp = kubelet(hub, "PATCH", &format!("{node}/status"), patch).await;
    expect(resp, 200, "PATCH node status");

    // The node lease: kubelet GETs it and PUTs it back renewed (or creates it if missing).
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let lease = kubelet(hub, "GET", &format!("{leases}/{NODE}"), None).await;
    if lease.status == 404 {
        let new = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": NODE, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40}});
        let resp = kubelet(hub, "POST", leases, Some(("application/json", new))).await;
        expect(resp, 201, "POST lease");
    } else {
        let lease = expect(lease, 200, "GET lease").object();
        let put = Some(("application/json", lease));
        let resp = kubelet(hub, "PUT", &format!("{leases}/{NODE}"), put).await;
        expect(resp, 200, "PUT lease");
    }

    // Its pods: a list and a (short) watch scoped to the node, one pod, its status.
    let scoped = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    let list = kubelet(
        hub,
        "GET",
        &format!("{scoped}&limit=500&resourceVersion=0"),
        None,
    )
    .await;
    let list = expect(list, 200, "list pods").json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .to_owned();
    let watch = format!(
        "{scoped}&watch=true&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion={rv}"
    );
    expect(kubelet(hub, "GET", &watch, None).await, 200, "watch pods");
    let pod = "/api/v1/namespaces/default/pods/web";
    expect(kubelet(hub, "GET", pod, None).await, 200, "GET pod");
    let running = json!({"status": {"phase": "Running"}});
    let patch = Some(("application/strategic-merge-patch+json", running));
    let resp = kubelet(hub, "PATCH", &format!("{pod}/status"), patch).await;
    expect(resp, 200, "PATCH pod status");

    // What the pod references, services for its environment, an event.
    for path in [
        "/api/v1/namespaces/default/configmaps/web-cfg",
        "/api/v1/namespaces/default/secrets/web-secret",
        "/api/v1/services?limit=500&resourceVersion=0",
    ] {
        expect(kubelet(hub, "GET", path, None).await, 200, path);
    }
    // kube-proxy on the same node reads EndpointSlices: the shared cache lists and watches them.
    let slices = "/apis/discovery.k8s.io/v1/endpointslices?limit=500&resourceVersion=0";
    let read = support::get(hub.proxy, slices, "kube-proxy/v1.32.4").await;
    expect(read, 200, slices);
    let event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("web.e2e-{round}"), "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Started", "message": "Started container c", "type": "Normal",
        "source": {"component": "kubelet", "host": NODE}});
    let events = "/api/v1/namespaces/default/events";
    let resp = kubelet(hub, "POST", events, Some(("application/json", event))).await;
    expect(resp, 201, "POST event");
}

fn own(record: &RequestRecord) -> bool {
    record
        .user_agent
        .as_deref()
        .is_some_and(|ua| ua.starts_with(OWN_UA_PREFIX))
}

/// `yurt-hub-cfg` created, changed and deleted; each step waits until the hub applied it.
async fn config_round(cluster: &Cluster, hub: &HubProcess) {
    // Creating it before the hub's watch is open could go unnoticed (the watch starts "now").
    let watching = eventually(Duration::from_secs(10), || {
        cluster
            .fake
            .requests()
            .iter()
            .any(|r| own(r) && r.verb == "watch" && r.name == HUB_CFG)
    })
    .await;
    assert!(watching, "the hub never watched {HUB_CFG}");
    let before = applied(hub);
    let fake = &cluster.fake;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": HUB_CFG, "namespace": "kube-system"},
        "data": {"cache_agents": "e2e-a"}});
    fake.create("v1/configmaps", cm)
        .expect("create yurt-hub-cfg");
    wait_applied(hub, before + 1, "the created ConfigMap").await;
    let mut cm = fake
        .get("v1/configmaps", Some("kube-system"), HUB_CFG)
        .expect("yurt-hub-cfg");
    cm["data"]["cache_agents"] = json!("e2e-a,e2e-b");
    fake.update("v1/configmaps", cm)
        .expect("update yurt-hub-cfg");
    wait_applied(hub, before + 2, "the changed ConfigMap").await;
    fake.delete("v1/configmaps", Some("kube-system"), HUB_CFG)
        .expect("delete yurt-hub-cfg");
    wait_applied(hub, before + 3, "the deletion").await;
}

/// How many times the hub logged that it applied a new `yurt-hub-cfg`.
fn applied(hub: &HubProcess) -> usize {
    let log = hub.log.lock().unwrap();
    log.iter()
        .filter(|l| l.contains("yurt-hub-cfg applied"))
        .count()
}

async fn wait_applied(hub: &HubProcess, n: usize, what: &str) {
    let ok = eventually(Duration::from_secs(10), || applied(hub) >= n).await;
    assert!(ok, "{what} never applied:\n{}", hub.log_text());
}

/// The cloud goes away while kubelet keeps calling, and comes back: done when the cloud itself
/// answers kubelet again (not the edge cache), which takes the hub's own checks.
async fn outage_and_recovery(cluster: &Cluster, hub: &HubProcess) {
    let node = format!("/api/v1/nodes/{NODE}");
    cluster.fake.refuse_connections();
    let _ = kubelet(hub, "GET", &node, None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = kubelet(hub, "GET", &node, None).await;
    cluster.fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = kubelet(hub, "GET", &node, None).await;
        if resp.status == 200 && resp.header("x-outpost-served-from").is_none() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the hub never went back to the cloud: {} {}\n{}",
            resp.status,
            String::from_utf8_lossy(&resp.body),
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- judging recorded requests -------------------------------------------------------------

/// One recorded request, as the authorizers see it.
#[derive(Debug, Clone)]
struct Call {
    user: UserInfo,
    user_agent: String,
    status: u16,
    verb: String,
    resource_request: bool,
    path: String,
    group: String,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
    field_selector: Option<FieldSelector>,
}

impl Call {
    /// The fake's record (its `RequestInfo`), plus the API group from the path and the field
    /// selector from the query, which the record does not carry.
    fn from_record(r: &RequestRecord) -> Call {
        let resource_request = !r.resource.is_empty();
        let group = match r.path.strip_prefix("/apis/") {
            Some(rest) if resource_request => rest.split('/').next().unwrap_or("").to_owned(),
            _ => String::new(),
        };
        let method = Method::from_bytes(r.method.as_bytes()).unwrap_or(Method::GET);
        let field_selector =
            RequestInfo::classify(&method, &format!("{}?{}", r.path, r.query), None)
                .ok()
                .map(|info| info.query.field_selector)
                .filter(|f| !f.is_empty());
        Call {
            user: UserInfo {
                name: r.user.clone(),
                groups: r.groups.clone(),
            },
            user_agent: r.user_agent.clone().unwrap_or_default(),
            status: r.status,
            verb: r.verb.clone(),
            resource_request,
            path: r.path.clone(),
            group,
            resource: r.resource.clone(),
            subresource: r.subresource.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            field_selector,
        }
    }

    fn attributes(&self) -> Attributes<'_> {
        Attributes {
            user: &self.user,
            verb: &self.verb,
            resource_request: self.resource_request,
            path: &self.path,
            api_group: &self.group,
            resource: &self.resource,
            subresource: &self.subresource,
            namespace: &self.namespace,
            name: &self.name,
            field_selector: self.field_selector.as_ref(),
        }
    }

    /// The cluster's decision with exactly `policy` as its RBAC objects.
    fn decide(&self, policy: &StaticPolicy) -> Decision {
        authorize(&self.attributes(), &NoPods, policy)
    }

    /// `(verb, group, resource, subresource[, name])`, or the verb and path of a non-resource
    /// request, with the namespace and field selector for context.
    fn label(&self) -> String {
        if !self.resource_request {
            return format!("{} {}", self.verb, self.path);
        }
        let mut s = format!("{} ", self.verb);
        if !self.group.is_empty() {
            s.push_str(&format!("{}/", self.group));
        }
        s.push_str(&self.resource);
        if !self.subresource.is_empty() {
            s.push_str(&format!("/{}", self.subresource));
        }
        if !self.name.is_empty() {
            s.push_str(&format!(" name={}", self.name));
        }
        if !self.namespace.is_empty() {
            s.push_str(&format!(" in {}", self.namespace));
        }
        if let Some(f) = &self.field_selector {
            s.push_str(&format!(" fieldSelector={f}"));
        }
        s
    }

    fn described(&self) -> String {
        format!("{} ({}, {})", self.label(), self.user_agent, self.user.name)
    }
}

/// The hub's own calls must not depend on which pods happen to run on the node, so they are
/// judged by a Node authorizer whose graph has no pods: nothing is reachable through one.
struct NoPods;

impl NodeGraph for NoPods {
    fn pod_node(&self, _namespace: &str, _name: &str) -> Option<String> {
        None
    }

    fn referenced_by_node(&self, _node: &str, _kind: RefKind, _ns: &str, _name: &str) -> bool {
        false
    }
}

/// One grant of a role: a single verb × group × resource × resource name (or URL).
struct Grant {
    label: String,
    rule: PolicyRule,
}

fn grants(rules: &[PolicyRule]) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules {
        for verb in &rule.verbs {
            for url in rule.non_resource_urls.iter().flatten() {
                out.push(Grant {
                    label: format!("{verb} {url}"),
                    rule: PolicyRule {
                        verbs: vec![verb.clone()],
                        non_resource_urls: Some(vec![url.clone()]),
                        ..PolicyRule::default()
                    },
                });
            }
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    let names: Vec<Option<&String>> = match rule.resource_names.as_deref() {
                        Some(names) if !names.is_empty() => names.iter().map(Some).collect(),
                        _ => vec![None],
                    };
                    for name in names {
                        let qualified = if group.is_empty() {
                            resource.clone()
                        } else {
                            format!("{group}/{resource}")
                        };
                        let named = name.map(|n| format!(" [{n}]")).unwrap_or_default();
                        out.push(Grant {
                            label: format!("{verb} {qualified}{named}"),
                            rule: PolicyRule {
                                verbs: vec![verb.clone()],
                                api_groups: Some(vec![group.clone()]),
                                resources: Some(vec![resource.clone()]),
                                resource_names: name.map(|n| vec![n.clone()]),
                                ..PolicyRule::default()
                            },
                        });
                    }
                }
            }
        }
    }
    out
}

/// The verdict on a set of calls and a set of RBAC objects.
#[derive(Debug)]
struct Audit {
    /// Calls the cluster would refuse, with the authorizers' reasons.
    denied: Vec<String>,
    /// Grants of the ClusterRole that no call needs.
    unused: Vec<String>,
}

/// Judges `calls` against the Node authorizer plus exactly the RBAC `objects`. A grant of the
/// ClusterRole counts as used only by a call the Node authorizer (and public info) alone refuses.
fn audit(calls: &[Call], objects: &[Value]) -> Audit {
    let policy = StaticPolicy::from_objects(objects).expect("the RBAC manifest is valid");
    let rules = policy
        .cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(ROLE))
        .and_then(|r| r.rules.clone())
        .unwrap_or_default();
    let grants = grants(&rules);
    let mut used = vec![false; grants.len()];
    let nothing = StaticPolicy::default();
    let mut denied = BTreeSet::new();
    for call in calls {
        if let Decision::Deny(reason) = call.decide(&policy) {
            let reason = reason.replace('\n', "; ");
            denied.insert(format!("{}: {reason}", call.described()));
        }
        if call.decide(&nothing) == Decision::Allow {
            continue;
        }
        let attrs = call.attributes();
        for (grant, used) in grants.iter().zip(used.iter_mut()) {
            *used |= rule_allows(&attrs, &grant.rule);
        }
    }
    let unused = grants
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|(g, _)| g.label.clone())
        .collect();
    Audit {
        denied: denied.into_iter().collect(),
        unused,
    }
}

fn own_calls(records: &[RequestRecord]) -> Vec<Call> {
    records
        .iter()
        .filter(|r| own(r))
        .map(Call::from_record)
        .collect()
}

fn is_node_identity(record: &RequestRecord) -> bool {
    let user = UserInfo {
        name: record.user.clone(),
        groups: record.groups.clone(),
    };
    node_name(&user).is_some()
}

/// Requests made with a node's identity that the cluster refused.
fn node_denials(records: &[RequestRecord]) -> Vec<String> {
    records
        .iter()
        .filter(|r| is_node_identity(r) && matches!(r.status, 401 | 403))
        .map(|r| {
            let call = Call::from_record(r);
            format!("{} {}", call.status, call.described())
        })
        .collect()
}

fn lines(items: impl IntoIterator<Item = String>) -> String {
    items
        .into_iter()
        .map(|s| format!("\n  {s}"))
        .collect::<String>()
}

// ---- the tests -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_role_grants_exactly_the_hubs_own_calls() {
    let (edge, cloud) = tokio::join!(scenario(Mode::Edge), scenario(Mode::Cloud));
    for (mode, records) in [("edge", &edge), ("cloud", &cloud)] {
        let calls = own_calls(records);
        let seen = |verb: &str| {
            calls
                .iter()
                .any(|c| c.verb == verb && c.resource == "configmaps" && c.name == HUB_CFG)
        };
        assert!(
            seen("get") && seen("watch"),
            "{mode}: the hub's config GET and watch are missing from its own calls:{}",
            lines(calls.iter().map(Call::described))
        );
        // Pool sharing's ConfigMap, granted by the Role in kube-system.
        let leader_hub = |verb: &str| {
            calls
                .iter()
                .any(|c| c.verb == verb && c.resource == "configmaps" && c.name == LEADER_HUB)
        };
        assert!(
            leader_hub("get") && leader_hub("watch"),
            "{mode}: the leader-hub ConfigMap's GET and watch are missing:{}",
            lines(calls.iter().map(Call::described))
        );
    }
    let records: Vec<RequestRecord> = edge.into_iter().chain(cloud).collect();
    let own = own_calls(&records);
    let kinds: BTreeSet<String> = own
        .iter()
        .map(|c| format!("{}: {}", c.user_agent, c.label()))
        .collect();
    eprintln!("the hub's own calls:{}", lines(kinds.iter().cloned()));
    let refused: Vec<String> = own
        .iter()
        .filter(|c| matches!(c.status, 401 | 403))
        .map(Call::described)
        .collect();
    assert!(
        refused.is_empty(),
        "the fake refused the hub's own calls:{}",
        lines(refused)
    );

    let objects = hub_rbac();
    let verdict = audit(&own, &objects);
    assert!(
        verdict.denied.is_empty(),
        "calls the hub makes on its own that ClusterRole {ROLE} plus the Node authorizer do not \
         allow (add them to manifests/cluster/rbac.yaml):{}\nall own calls:{}",
        lines(verdict.denied),
        lines(kinds.iter().cloned())
    );
    assert!(
        verdict.unused.is_empty(),
        "grants of ClusterRole {ROLE} the hub never needs (remove them from \
         manifests/cluster/rbac.yaml):{}\nall own calls:{}",
        lines(verdict.unused),
        lines(kinds.iter().cloned())
    );

    // The check has teeth: without the roles the config calls are refused, and a grant no call
    // needs is reported by name.
    let without_role: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] != "ClusterRole" && o["kind"] != "Role")
        .cloned()
        .collect();
    let verdict = audit(&own, &without_role);
    for config_map in [HUB_CFG, LEADER_HUB] {
        assert!(
            verdict
                .denied
                .iter()
                .any(|d| d.contains(&format!("configmaps name={config_map}"))),
            "{verdict:?}"
        );
    }
    // Pool sharing's election reads the pool's Nodes by label, which only ClusterRole
    // outpost-pool-election grants (since 1.32 the Node authorizer allows a node its own Node).
    let election =
        |c: &&Call| c.resource == "nodes" && c.name.is_empty() && c.field_selector.is_none();
    let reads: BTreeSet<&str> = own
        .iter()
        .filter(election)
        .map(|c| c.verb.as_str())
        .collect();
    assert_eq!(
        reads,
        BTreeSet::from(["list", "watch"]),
        "the election's reads of the pool's Nodes:{}",
        lines(kinds.iter().cloned())
    );
    let without_election: Vec<Value> = objects
        .iter()
        .filter(|o| o["metadata"]["name"] != "outpost-pool-election")
        .cloned()
        .collect();
    let verdict = audit(&own, &without_election);
    assert!(
        !verdict.denied.is_empty()
            && verdict
                .denied
                .iter()
                .all(|d| d.starts_with("list nodes (") || d.starts_with("watch nodes (")),
        "without the election's ClusterRole exactly its Node reads are refused: {verdict:?}"
    );
    let mut broader = objects.clone();
    let role = broader
        .iter_mut()
        .find(|o| o["kind"] == "ClusterRole")
        .expect("the ClusterRole");
    role["rules"]
        .as_array_mut()
        .expect("rules")
        .push(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "delete"]}));
    let verdict = audit(&own, &broader);
    assert!(verdict.denied.is_empty(), "{verdict:?}");
    assert_eq!(verdict.unused, ["get secrets", "delete secrets"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_with_the_node_identity_is_forbidden() {
    let (edge, cloud) = tokio::join!(scenario(Mode::Edge), scenario(Mode::Cloud));
    for (mode, records) in [("edge", &edge), ("cloud", &cloud)] {
        let with_node_identity = |prefix: &str| {
            records.iter().any(|r| {
                is_node_identity(r)
                    && r.user == format!("system:node:{NODE}")
                    && r.user_agent
                        .as_deref()
                        .is_some_and(|ua| ua.starts_with(prefix))
            })
        };
        assert!(
            with_node_identity("kubelet/") && with_node_identity(OWN_UA_PREFIX),
            "{mode}: expected requests forwarded for kubelet and the hub's own, both with the \
             node's identity"
        );
        let denied = node_denials(records);
        assert!(
            denied.is_empty(),
            "{mode}: requests made with the node's identity were refused:{}",
            lines(denied)
        );
        // This file makes no deliberately bad request: nothing at all may be refused.
        let refused: Vec<String> = records
            .iter()
            .filter(|r| matches!(r.status, 401 | 403))
            .map(|r| {
                format!(
                    "{} {} {}?{} ({})",
                    r.status, r.method, r.path, r.query, r.user
                )
            })
            .collect();
        assert!(refused.is_empty(), "{mode}: refused:{}", lines(refused));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unscoped_pod_list_with_node_credentials_is_refused() {
    let cluster = Cluster::start().await;
    let hub = cluster.start_hub();

    let resp = kubelet(&hub, "GET", "/api/v1/pods", None).await;
    let status = expect(resp, 403, "unscoped pod list").json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Forbidden");
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        message.contains("can only list/watch pods with spec.nodeName field selector"),
        "{message}"
    );
    let other_node = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-2";
    expect(
        kubelet(&hub, "GET", other_node, None).await,
        403,
        other_node,
    );
    let own_node = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}");
    expect(kubelet(&hub, "GET", &own_node, None).await, 200, &own_node);

    // The fake logged it as a 403 to the node, and the check the other tests make reports it.
    let records = cluster.fake.requests();
    let unscoped = records
        .iter()
        .find(|r| r.path == "/api/v1/pods" && r.query.is_empty())
        .expect("the unscoped list reached the fake");
    assert_eq!(unscoped.status, 403);
    assert_eq!(unscoped.verb, "list");
    assert_eq!(unscoped.user, format!("system:node:{NODE}"));
    assert_eq!(unscoped.user_agent.as_deref(), Some(KUBELET_UA));
    let denied = node_denials(&records);
    assert_eq!(denied.len(), 2, "{denied:#?}");
    assert!(
        denied[0].starts_with("403 list pods (kubelet/"),
        "{denied:#?}"
    );

    // The pure authorizer the RBAC audit uses agrees with the fake's live decision.
    let policy = StaticPolicy::from_objects(&hub_rbac()).expect("valid RBAC");
    let verdict = Call::from_record(unscoped).decide(&policy);
    assert!(
        matches!(&verdict, Decision::Deny(r) if r.contains("spec.nodeName field selector")),
        "{verdict:?}"
    );
    let scoped = records
        .iter()
        .find(|r| r.path == "/api/v1/pods" && r.query.contains(NODE))
        .expect("the scoped list reached the fake");
    assert_eq!(Call::from_record(scoped).decide(&policy), Decision::Allow);
}
