//! The recorded node traffic, replayed through the hub and straight to the fake apiserver.
//!
//! Script: each agent's start-up (reflector LISTs with `limit=500&resourceVersion=0`, each
//! followed by a WATCH from the list's resourceVersion: kubelet's node, pods, services,
//! CSIDrivers, RuntimeClasses and one reflector per mounted ConfigMap and Secret; kube-proxy's
//! node, Services and EndpointSlices with its headless selector; coredns' EndpointSlices,
//! Namespaces and Services; flannel's nodes), then the steady state of the perfspec audit log
//! (four minutes of a real 3-node cluster): the busiest worker's kubelet row by row plus one
//! node's share of the kube-proxy, coredns and flannel rows, at their recorded offsets, node names
//! rewritten to `edge-1`, non-2xx and watch-end rows left out. The script derived from
//! `../../shared/traffic/perfspec-audit/audit-logs.csv` is kept in `data/kubelet-mix.json`, so a
//! clone without `shared/` runs too; when the CSV is there the bench re-derives it and says
//! whether it still matches (`OUTPOST_REPLAY_WRITE_MIX=1` rewrites the file and runs nothing else).
//!
//! The fake holds a full node (`full_node.rs`). kubelet goes as the node; kube-proxy, coredns and
//! flannel bring service-account bearer tokens. The hub: edge mode over a fresh sled cache per
//! run, node-lease heartbeat on (so it answers kubelet's lease itself, as the binary does), two
//! runtime workers (the binary's default here); the fake and the clients share another runtime.
//!
//! Criterion times whole replays as fast as possible (`replay/{hub,direct}_asap`: each agent runs
//! its steps in order, the agents concurrently, every WATCH held open to the end). Then the bench
//! prints per-verb and per-request-kind p50/p99 (WATCH: to the response headers) and total times,
//! as fast as possible and time-compressed (`OUTPOST_REPLAY_SPEED`: default 100, 1 = recorded
//! speed, about 4 minutes, `max` = only as fast as possible).
//! Run: `cargo bench -p outpost-benches --bench replay`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outpost_agent::health::HeartbeatConfig;
use outpost_benches::full_node::{self, FullNode, MOUNTS, PROXY_SELECTOR};
use outpost_benches::{HubThread, NODE, SledCache, Upstream, bench_runtime, millis, percentile};
use outpost_core::time::{micro_time, parse_rfc3339, rfc3339};
use outpost_testkit::FakeConfig;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

/// The embedded script, and where it is derived from (relative to this crate).
const MIX_FILE: &str = "data/kubelet-mix.json";
const MIX: &str = include_str!("data/kubelet-mix.json");
const CSV: &str = "../../shared/traffic/perfspec-audit/audit-logs.csv";
/// The kubelet whose rows are replayed: the busiest worker node of the recording.
const RECORDED_KUBELET: &str = "system:node:k8s-node-2-perfspec";
/// Bound on every request and on the response headers of every WATCH.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const HUB_WORKERS: usize = 2;

// ---- the script -------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Agent {
    Kubelet,
    KubeProxy,
    Coredns,
    Flannel,
}

const AGENTS: [Agent; 4] = [
    Agent::Kubelet,
    Agent::KubeProxy,
    Agent::Coredns,
    Agent::Flannel,
];

impl Agent {
    fn name(self) -> &'static str {
        match self {
            Agent::Kubelet => "kubelet",
            Agent::KubeProxy => "kube-proxy",
            Agent::Coredns => "coredns",
            Agent::Flannel => "flanneld",
        }
    }

    fn from_name(s: &str) -> Option<Agent> {
        AGENTS.into_iter().find(|a| a.name() == s)
    }

    /// The recording's user for this agent, and how many instances share its rows (one per
    /// node for the DaemonSets, two coredns replicas): one node's share is every n-th row.
    fn recorded(user: &str) -> Option<(Agent, usize)> {
        match user {
            RECORDED_KUBELET => Some((Agent::Kubelet, 1)),
            "system:serviceaccount:kube-system:kube-proxy" => Some((Agent::KubeProxy, 3)),
            "system:serviceaccount:kube-system:coredns" => Some((Agent::Coredns, 2)),
            "system:serviceaccount:kube-flannel:flannel" => Some((Agent::Flannel, 3)),
            _ => None,
        }
    }

    fn user_agent(self) -> &'static str {
        match self {
            Agent::Kubelet => outpost_benches::KUBELET_UA,
            Agent::KubeProxy => "kube-proxy/v1.32.4 (linux/amd64) kubernetes/bench",
            Agent::Coredns => "coredns/v1.11.3 (linux/amd64) kubernetes/bench",
            Agent::Flannel => "flanneld/v0.26.1 (linux/amd64) kubernetes/bench",
        }
    }

    /// kubelet and kube-proxy ask for protobuf first; coredns and flannel use JSON.
    fn accept(self) -> &'static str {
        match self {
            Agent::Kubelet | Agent::KubeProxy => outpost_benches::KUBELET_ACCEPT,
            Agent::Coredns | Agent::Flannel => "application/json",
        }
    }

    /// The service account token (none for kubelet: it goes as the node).
    fn token(self) -> Option<(&'static str, &'static str)> {
        match self {
            Agent::Kubelet => None,
            Agent::KubeProxy => Some((
                "replay-kube-proxy",
                "system:serviceaccount:kube-system:kube-proxy",
            )),
            Agent::Coredns => Some((
                "replay-coredns",
                "system:serviceaccount:kube-system:coredns",
            )),
            Agent::Flannel => Some((
                "replay-flannel",
                "system:serviceaccount:kube-flannel:flannel",
            )),
        }
    }
}

/// What a reflector lists and watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Stream {
    /// The node's pods (`spec.nodeName=edge-1`).
    Pods,
    /// The node itself (`metadata.name=edge-1`).
    Node,
    /// Every node.
    Nodes,
    Services,
    EndpointSlices,
    Namespaces,
    CsiDrivers,
    RuntimeClasses,
    /// One ConfigMap by name.
    ConfigMap,
    /// One Secret by name.
    Secret,
}

const STREAMS: [Stream; 10] = [
    Stream::Pods,
    Stream::Node,
    Stream::Nodes,
    Stream::Services,
    Stream::EndpointSlices,
    Stream::Namespaces,
    Stream::CsiDrivers,
    Stream::RuntimeClasses,
    Stream::ConfigMap,
    Stream::Secret,
];

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Pods => "pods",
            Stream::Node => "node",
            Stream::Nodes => "nodes",
            Stream::Services => "services",
            Stream::EndpointSlices => "endpointslices",
            Stream::Namespaces => "namespaces",
            Stream::CsiDrivers => "csidrivers",
            Stream::RuntimeClasses => "runtimeclasses",
            Stream::ConfigMap => "configmap",
            Stream::Secret => "secret",
        }
    }

    /// From the audit row's resource and whether its query selects by name.
    fn recorded(resource: &str, by_name: bool) -> Option<Stream> {
        Some(match (resource, by_name) {
            ("pods", _) => Stream::Pods,
            ("nodes", true) => Stream::Node,
            ("nodes", false) => Stream::Nodes,
            ("services", _) => Stream::Services,
            ("endpointslices", _) => Stream::EndpointSlices,
            ("namespaces", _) => Stream::Namespaces,
            ("csidrivers", _) => Stream::CsiDrivers,
            ("runtimeclasses", _) => Stream::RuntimeClasses,
            ("configmaps", true) => Stream::ConfigMap,
            ("secrets", true) => Stream::Secret,
            _ => return None,
        })
    }

    /// Path and selector of `agent`'s reflector on this stream (`obj` picks the ConfigMap or
    /// Secret).
    fn target(self, agent: Agent, obj: usize) -> (String, Option<String>) {
        let proxy = (agent == Agent::KubeProxy).then(|| PROXY_SELECTOR.to_owned());
        let by_name = |kind: &str, (ns, name): (String, String)| {
            (
                format!("/api/v1/namespaces/{ns}/{kind}"),
                Some(format!("fieldSelector=metadata.name%3D{name}")),
            )
        };
        match self {
            Stream::Pods => (
                "/api/v1/pods".into(),
                Some(format!("fieldSelector=spec.nodeName%3D{NODE}")),
            ),
            Stream::Node => (
                "/api/v1/nodes".into(),
                Some(format!("fieldSelector=metadata.name%3D{NODE}")),
            ),
            Stream::Nodes => ("/api/v1/nodes".into(), None),
            Stream::Services => ("/api/v1/services".into(), proxy),
            Stream::EndpointSlices => ("/apis/discovery.k8s.io/v1/endpointslices".into(), proxy),
            Stream::Namespaces => ("/api/v1/namespaces".into(), None),
            Stream::CsiDrivers => ("/apis/storage.k8s.io/v1/csidrivers".into(), None),
            Stream::RuntimeClasses => ("/apis/node.k8s.io/v1/runtimeclasses".into(), None),
            Stream::ConfigMap => by_name("configmaps", full_node::config_map_ref(obj % MOUNTS)),
            Stream::Secret => by_name("secrets", full_node::secret_ref(obj % MOUNTS)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Op {
    LeaseGet,
    LeasePut,
    NodeGet,
    NodeStatusPatch,
    PodGet,
    PodStatusPatch,
    EventCreate,
    EventPatch,
    TokenCreate,
    TokenReview,
    SubjectAccessReview,
    /// A reflector's first LIST: `limit=500&resourceVersion=0`.
    List(Stream),
    /// A re-list after a watch ended: `resourceVersion=<last>`, no limit.
    Relist(Stream),
    Watch(Stream),
}

const SIMPLE_OPS: [Op; 11] = [
    Op::LeaseGet,
    Op::LeasePut,
    Op::NodeGet,
    Op::NodeStatusPatch,
    Op::PodGet,
    Op::PodStatusPatch,
    Op::EventCreate,
    Op::EventPatch,
    Op::TokenCreate,
    Op::TokenReview,
    Op::SubjectAccessReview,
];

impl Op {
    fn name(self) -> String {
        match self {
            Op::LeaseGet => "lease_get".into(),
            Op::LeasePut => "lease_put".into(),
            Op::NodeGet => "node_get".into(),
            Op::NodeStatusPatch => "node_status_patch".into(),
            Op::PodGet => "pod_get".into(),
            Op::PodStatusPatch => "pod_status_patch".into(),
            Op::EventCreate => "event_create".into(),
            Op::EventPatch => "event_patch".into(),
            Op::TokenCreate => "token_create".into(),
            Op::TokenReview => "tokenreview_create".into(),
            Op::SubjectAccessReview => "subjectaccessreview_create".into(),
            Op::List(s) => format!("list:{}", s.name()),
            Op::Relist(s) => format!("relist:{}", s.name()),
            Op::Watch(s) => format!("watch:{}", s.name()),
        }
    }

    fn from_name(s: &str) -> Option<Op> {
        if let Some(op) = SIMPLE_OPS.into_iter().find(|op| op.name() == s) {
            return Some(op);
        }
        let (kind, stream) = s.split_once(':')?;
        let stream = STREAMS.into_iter().find(|st| st.name() == stream)?;
        match kind {
            "list" => Some(Op::List(stream)),
            "relist" => Some(Op::Relist(stream)),
            "watch" => Some(Op::Watch(stream)),
            _ => None,
        }
    }

    /// The Kubernetes verb.
    fn verb(self) -> &'static str {
        match self {
            Op::LeaseGet | Op::NodeGet | Op::PodGet => "get",
            Op::LeasePut => "update",
            Op::NodeStatusPatch | Op::PodStatusPatch | Op::EventPatch => "patch",
            Op::EventCreate | Op::TokenCreate | Op::TokenReview | Op::SubjectAccessReview => {
                "create"
            }
            Op::List(_) | Op::Relist(_) => "list",
            Op::Watch(_) => "watch",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Step {
    /// Offset from the start of the recording's window.
    t_ms: u64,
    agent: Agent,
    op: Op,
    /// Which object, for ops on one of several (pod, ConfigMap, Secret, service account): the
    /// order in which the recording first named it.
    obj: usize,
}

#[derive(Debug, PartialEq, Eq)]
struct Script {
    window_ms: u64,
    /// Row counts: kept and why others were left out.
    rows: BTreeMap<String, usize>,
    steps: Vec<Step>,
}

impl Script {
    fn to_json(&self) -> String {
        let rows: Vec<String> = self
            .rows
            .iter()
            .map(|(k, v)| format!("{}: {v}", json!(k)))
            .collect();
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                format!(
                    "    [{}, {}, {}, {}]",
                    s.t_ms,
                    json!(s.agent.name()),
                    json!(s.op.name()),
                    s.obj
                )
            })
            .collect();
        format!(
            "{{\n  \"source\": \"shared/traffic/perfspec-audit/audit-logs.csv (hkerma/kubernetes-event-dataset e39cc98e, CC-BY-4.0): {RECORDED_KUBELET}'s rows and one node's share of kube-proxy, coredns and flannel\",\n  \
             \"regenerate\": \"OUTPOST_REPLAY_WRITE_MIX=1 cargo bench -p outpost-benches --bench replay\",\n  \
             \"columns\": [\"t_ms\", \"agent\", \"op\", \"obj\"],\n  \"window_ms\": {},\n  \"rows\": {{{}}},\n  \"steps\": [\n{}\n  ]\n}}\n",
            self.window_ms,
            rows.join(", "),
            steps.join(",\n")
        )
    }

    fn from_json(text: &str) -> Result<Script, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let window_ms = v["window_ms"].as_u64().ok_or("window_ms")?;
        let rows = v["rows"]
            .as_object()
            .ok_or("rows")?
            .iter()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0) as usize))
            .collect();
        let steps = v["steps"]
            .as_array()
            .ok_or("steps")?
            .iter()
            .map(|s| {
                let bad = || format!("bad step {s}");
                Ok(Step {
                    t_ms: s[0].as_u64().ok_or_else(bad)?,
                    agent: s[1].as_str().and_then(Agent::from_name).ok_or_else(bad)?,
                    op: s[2].as_str().and_then(Op::from_name).ok_or_else(bad)?,
                    obj: s[3].as_u64().ok_or_else(bad)? as usize,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Script {
            window_ms,
            rows,
            steps,
        })
    }
}

/// Splits one CSV line (fields optionally double-quoted, `""` inside quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// `2023-01-27T18:28:08.129781Z` → milliseconds since the epoch.
fn timestamp_ms(s: &str) -> Option<u64> {
    let (whole, fraction) = s.trim_end_matches('Z').split_once('.')?;
    let secs = parse_rfc3339(&format!("{whole}Z"))?.as_secs();
    let millis: u64 = fraction.get(..3)?.parse().ok()?;
    Some(secs * 1000 + millis)
}

/// The op a recorded request maps to (`None`: nothing in the replay corresponds).
fn recorded_op(verb: &str, resource: &str, uri: &str) -> Option<Op> {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let has = |key: &str| query.split('&').any(|kv| kv.split('=').next() == Some(key));
    let by_name = query.contains("fieldSelector=metadata.name");
    Some(match (verb, resource) {
        ("update", "leases") => Op::LeasePut,
        ("get", "leases") => Op::LeaseGet,
        ("get", "nodes") => Op::NodeGet,
        ("patch", "nodes") if path.ends_with("/status") => Op::NodeStatusPatch,
        ("get", "pods") => Op::PodGet,
        ("patch", "pods") if path.ends_with("/status") => Op::PodStatusPatch,
        ("create", "events") => Op::EventCreate,
        ("patch", "events") => Op::EventPatch,
        ("create", "serviceaccounts") if path.ends_with("/token") => Op::TokenCreate,
        ("create", "tokenreviews") => Op::TokenReview,
        ("create", "subjectaccessreviews") => Op::SubjectAccessReview,
        ("list", _) if has("limit") => Op::List(Stream::recorded(resource, by_name)?),
        ("list", _) => Op::Relist(Stream::recorded(resource, by_name)?),
        ("watch", _) => Op::Watch(Stream::recorded(resource, by_name)?),
        _ => return None,
    })
}

/// The object a per-object op names: the pod or service account in the path, or the ConfigMap /
/// Secret in the field selector.
fn recorded_object(op: Op, uri: &str) -> Option<String> {
    match op {
        Op::PodGet | Op::PodStatusPatch | Op::TokenCreate => {
            let path = uri.split('?').next().unwrap_or(uri);
            Some(
                path.trim_end_matches("/status")
                    .trim_end_matches("/token")
                    .to_owned(),
            )
        }
        Op::List(s) | Op::Relist(s) | Op::Watch(s)
            if matches!(s, Stream::ConfigMap | Stream::Secret) =>
        {
            let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
            let name = query
                .split('&')
                .find(|kv| kv.starts_with("fieldSelector="))
                .unwrap_or("");
            Some(format!("{path}?{name}"))
        }
        _ => None,
    }
}

/// Derives the steady-state script from the audit log.
fn derive_script(csv: &str) -> Script {
    let mut rows: BTreeMap<String, usize> = BTreeMap::new();
    let mut count = |why: &str| *rows.entry(why.to_owned()).or_insert(0) += 1;
    let mut first = u64::MAX;
    let mut last = 0;
    let mut steps = Vec::new();
    // Per (agent, op): rows seen so far, for one instance's share.
    let mut ordinal: HashMap<(Agent, Op), usize> = HashMap::new();
    // Per op family: the objects in order of first mention.
    let mut objects: HashMap<(Agent, &'static str), Vec<String>> = HashMap::new();
    for line in csv.lines() {
        let f = csv_fields(line);
        if f.len() < 15 {
            count("dropped: truncated line");
            continue;
        }
        let Some(ts) = timestamp_ms(&f[1]) else {
            count("dropped: bad timestamp");
            continue;
        };
        first = first.min(ts);
        last = last.max(ts);
        let (user, verb, resource, uri, stage, code) = (&f[2], &f[3], &f[4], &f[8], &f[10], &f[11]);
        let Some((agent, instances)) = Agent::recorded(user) else {
            continue;
        };
        if !code.starts_with('2') {
            count("dropped: non-2xx answer");
            continue;
        }
        let watch = verb == "watch";
        if watch && stage != "ResponseStarted" {
            count("dropped: watch end (ResponseComplete)");
            continue;
        }
        let Some(op) = recorded_op(verb, resource, uri) else {
            count("dropped: no replay equivalent");
            continue;
        };
        let n = ordinal.entry((agent, op)).or_insert(0);
        *n += 1;
        if !(*n - 1).is_multiple_of(instances) {
            count("dropped: another node's instance");
            continue;
        }
        let node_free = uri.replace(RECORDED_KUBELET.trim_start_matches("system:node:"), NODE);
        let obj = match recorded_object(op, &node_free) {
            None => 0,
            Some(name) => {
                let family = match op {
                    Op::PodGet | Op::PodStatusPatch => "pod",
                    Op::TokenCreate => "serviceaccount",
                    Op::List(s) | Op::Relist(s) | Op::Watch(s) => s.name(),
                    _ => "other",
                };
                let seen = objects.entry((agent, family)).or_default();
                match seen.iter().position(|n| *n == name) {
                    Some(i) => i,
                    None => {
                        seen.push(name);
                        seen.len() - 1
                    }
                }
            }
        };
        count("kept");
        steps.push(Step {
            t_ms: ts,
            agent,
            op,
            obj,
        });
    }
    for s in &mut steps {
        s.t_ms -= first;
    }
    steps.sort_by_key(|s| s.t_ms);
    Script {
        window_ms: last.saturating_sub(first),
        rows,
        steps,
    }
}

/// The CSV-derived script when the recording is reachable, else the embedded one.
fn load_script() -> Script {
    let embedded = Script::from_json(MIX).expect("benches/data/kubelet-mix.json");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv_path: PathBuf = dir.join(CSV);
    let Ok(csv) = std::fs::read_to_string(&csv_path) else {
        println!(
            "replay: {} not found (a clone without shared/): using the embedded script {MIX_FILE}",
            csv_path.display()
        );
        return embedded;
    };
    let derived = derive_script(&csv);
    if derived == embedded {
        println!("replay: script derived from {CSV}; it matches {MIX_FILE}");
    } else {
        println!(
            "replay: script derived from {CSV} differs from {MIX_FILE}: using the derived one \
             (OUTPOST_REPLAY_WRITE_MIX=1 rewrites the file)"
        );
    }
    derived
}

/// Each agent's start-up, before the recorded window: node registration reads, then one LIST and
/// WATCH per reflector.
fn startup(agent: Agent) -> Vec<(Op, usize)> {
    let reflectors: &[Stream] = match agent {
        Agent::Kubelet => &[
            Stream::Node,
            Stream::Pods,
            Stream::Services,
            Stream::CsiDrivers,
            Stream::RuntimeClasses,
        ],
        Agent::KubeProxy => &[Stream::Node, Stream::Services, Stream::EndpointSlices],
        Agent::Coredns => &[Stream::EndpointSlices, Stream::Namespaces, Stream::Services],
        Agent::Flannel => &[Stream::Nodes],
    };
    let mut ops = Vec::new();
    if agent == Agent::Kubelet {
        ops.push((Op::NodeGet, 0));
        ops.push((Op::LeaseGet, 0));
    }
    for &s in reflectors {
        ops.push((Op::List(s), 0));
        ops.push((Op::Watch(s), 0));
    }
    if agent == Agent::Kubelet {
        for i in 0..MOUNTS {
            for s in [Stream::ConfigMap, Stream::Secret] {
                ops.push((Op::List(s), i));
                ops.push((Op::Watch(s), i));
            }
        }
    }
    ops
}

// ---- the replay -------------------------------------------------------------------------------

type PlainClient = Client<HttpConnector, Full<Bytes>>;
type TlsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

enum Http {
    Plain(PlainClient),
    Tls(TlsClient),
}

impl Http {
    async fn send(&self, req: http::Request<Full<Bytes>>) -> Option<http::Response<Incoming>> {
        let sent = match self {
            Http::Plain(c) => tokio::time::timeout(REQUEST_TIMEOUT, c.request(req)).await,
            Http::Tls(c) => tokio::time::timeout(REQUEST_TIMEOUT, c.request(req)).await,
        };
        sent.ok()?.ok()
    }
}

/// Where the replay goes: one keep-alive client per agent.
struct Target {
    base: String,
    clients: Vec<Http>,
}

impl Target {
    fn direct(upstream: &Upstream) -> Target {
        let https = |config| {
            Http::Tls(
                Client::builder(TokioExecutor::new()).build(
                    hyper_rustls::HttpsConnectorBuilder::new()
                        .with_tls_config(config)
                        .https_only()
                        .enable_http1()
                        .build(),
                ),
            )
        };
        Target {
            base: upstream.fake.url(),
            clients: AGENTS
                .iter()
                .map(|a| match a {
                    Agent::Kubelet => https(upstream.tls.with_identity.as_ref().clone()),
                    _ => https(upstream.tls.without_identity.as_ref().clone()),
                })
                .collect(),
        }
    }

    fn hub(hub: &HubThread) -> Target {
        Target {
            base: format!("http://{}", hub.proxy_addr()),
            clients: AGENTS
                .iter()
                .map(|_| Http::Plain(Client::builder(TokioExecutor::new()).build_http()))
                .collect(),
        }
    }

    fn client(&self, agent: Agent) -> &Http {
        &self.clients[agent as usize]
    }
}

/// One request's outcome.
struct Sample {
    op: Op,
    status: u16,
    latency: Duration,
}

/// Unique event names across runs against the same fake.
static EVENT_SEQ: AtomicU64 = AtomicU64::new(0);

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// What one agent keeps between its requests.
struct AgentRun<'a> {
    agent: Agent,
    target: &'a Target,
    world: &'a FullNode,
    /// Last listed resourceVersion per reflector.
    rvs: HashMap<(Stream, usize), String>,
    watches: HashMap<(Stream, usize), JoinHandle<()>>,
    /// Watch lines (events and bookmarks) received per stream.
    watch_lines: HashMap<Stream, std::sync::Arc<AtomicU64>>,
    lease: Option<Value>,
    events: Vec<(String, String)>,
    samples: Vec<Sample>,
}

/// The list's own `metadata.resourceVersion` (the items are skipped, not parsed: the fake
/// writes keys in sorted order, so the list metadata comes after them).
fn list_rv(body: &[u8]) -> Option<String> {
    let top: HashMap<&str, &RawValue> = serde_json::from_slice(body).ok()?;
    let meta: Value = serde_json::from_str(top.get("metadata")?.get()).ok()?;
    Some(meta["resourceVersion"].as_str()?.to_owned())
}

impl AgentRun<'_> {
    fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<(&str, Value)>,
    ) -> http::Request<Full<Bytes>> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.target.base))
            .header("user-agent", self.agent.user_agent())
            .header("accept", self.agent.accept());
        if let Some((token, _)) = self.agent.token() {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        let bytes = match body {
            Some((content_type, value)) => {
                req = req.header("content-type", content_type);
                Bytes::from(value.to_string())
            }
            None => Bytes::new(),
        };
        req.body(Full::new(bytes)).expect("valid request")
    }

    /// Sends, reads the whole body, records the sample; returns status and body.
    async fn call(
        &mut self,
        op: Op,
        method: http::Method,
        path: &str,
        body: Option<(&str, Value)>,
    ) -> (u16, Bytes) {
        let req = self.request(method, path, body);
        let started = Instant::now();
        let mut out = (0, Bytes::new());
        if let Some(resp) = self.target.client(self.agent).send(req).await {
            let status = resp.status().as_u16();
            if let Ok(Ok(body)) =
                tokio::time::timeout(REQUEST_TIMEOUT, resp.into_body().collect()).await
            {
                out = (status, body.to_bytes());
            }
        }
        self.samples.push(Sample {
            op,
            status: out.0,
            latency: started.elapsed(),
        });
        out
    }

    fn pod(&self, obj: usize) -> &Value {
        &self.world.pods[obj % self.world.pods.len()]
    }

    fn pod_path(&self, obj: usize) -> String {
        let meta = &self.pod(obj)["metadata"];
        format!(
            "/api/v1/namespaces/{}/pods/{}",
            meta["namespace"].as_str().expect("namespace"),
            meta["name"].as_str().expect("name")
        )
    }

    async fn run(&mut self, op: Op, obj: usize) {
        use http::Method;
        const SMP: &str = "application/strategic-merge-patch+json";
        let lease_path =
            format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}");
        match op {
            Op::LeaseGet => {
                let (status, body) = self
                    .call(op, Method::GET, &format!("{lease_path}?timeout=10s"), None)
                    .await;
                if status == 200 {
                    self.lease = serde_json::from_slice(&body).ok();
                }
            }
            Op::LeasePut => {
                // kubelet's lease controller: PUT the last lease seen with a new renewTime; on a
                // conflict, GET it again and retry once.
                for attempt in 0..2 {
                    if self.lease.is_none() {
                        Box::pin(self.run(Op::LeaseGet, 0)).await;
                    }
                    let Some(mut lease) = self.lease.clone() else {
                        return;
                    };
                    lease["spec"]["renewTime"] = json!(micro_time(now()));
                    let (status, body) = self
                        .call(
                            op,
                            Method::PUT,
                            &format!("{lease_path}?timeout=10s"),
                            Some(("application/json", lease)),
                        )
                        .await;
                    if status == 200 {
                        self.lease = serde_json::from_slice(&body).ok();
                        return;
                    }
                    self.lease = None;
                    if status != 409 || attempt == 1 {
                        return;
                    }
                }
            }
            Op::NodeGet => {
                let path = format!("/api/v1/nodes/{NODE}?resourceVersion=0&timeout=10s");
                self.call(op, Method::GET, &path, None).await;
            }
            Op::NodeStatusPatch => {
                let t = rfc3339(now());
                let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                    "reason": "KubeletReady", "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": t, "lastTransitionTime": t}]}});
                let path = format!("/api/v1/nodes/{NODE}/status?timeout=10s");
                self.call(op, Method::PATCH, &path, Some((SMP, patch)))
                    .await;
            }
            Op::PodGet => {
                let path = self.pod_path(obj);
                self.call(op, Method::GET, &path, None).await;
            }
            Op::PodStatusPatch => {
                let uid = self.pod(obj)["metadata"]["uid"].clone();
                let seq = EVENT_SEQ.fetch_add(1, Ordering::Relaxed);
                let patch = json!({"metadata": {"uid": uid}, "status": {"conditions": [{
                    "type": "Ready", "status": "True", "lastProbeTime": null,
                    "lastTransitionTime": rfc3339(now()), "message": format!("replay {seq}")}]}});
                let path = format!("{}/status", self.pod_path(obj));
                self.call(op, Method::PATCH, &path, Some((SMP, patch)))
                    .await;
            }
            Op::EventCreate => {
                let seq = EVENT_SEQ.fetch_add(1, Ordering::Relaxed);
                let pod = self.pod(seq as usize);
                let (ns, pod_name) = (
                    pod["metadata"]["namespace"]
                        .as_str()
                        .expect("ns")
                        .to_owned(),
                    pod["metadata"]["name"].as_str().expect("name").to_owned(),
                );
                let name = format!("{pod_name}.{seq:016x}");
                let t = rfc3339(now());
                let event = json!({
                    "metadata": {"name": name, "namespace": ns},
                    "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod_name,
                        "uid": pod["metadata"]["uid"], "apiVersion": "v1",
                        "resourceVersion": pod["metadata"]["resourceVersion"],
                        "fieldPath": "spec.containers{main}"},
                    "reason": "Pulled",
                    "message": "Container image \"registry.k8s.io/pause:3.10\" already present on machine",
                    "source": {"component": "kubelet", "host": NODE},
                    "firstTimestamp": t, "lastTimestamp": t, "count": 1, "type": "Normal",
                    "eventTime": null, "reportingComponent": "kubelet", "reportingInstance": NODE,
                });
                let path = format!("/api/v1/namespaces/{ns}/events");
                let (status, _) = self
                    .call(op, Method::POST, &path, Some(("application/json", event)))
                    .await;
                if status == 201 {
                    self.events.push((ns, name));
                }
            }
            Op::EventPatch => {
                let Some((ns, name)) = self.events.last().cloned() else {
                    return;
                };
                let patch = json!({"count": 2, "lastTimestamp": rfc3339(now())});
                let path = format!("/api/v1/namespaces/{ns}/events/{name}");
                self.call(op, Method::PATCH, &path, Some((SMP, patch)))
                    .await;
            }
            Op::TokenCreate => {
                // The first pod from `obj` on that runs as a service account.
                let n = self.world.pods.len();
                let Some(pod) = (0..n)
                    .map(|k| self.pod(obj + k))
                    .find(|p| p["spec"]["serviceAccountName"].is_string())
                    .cloned()
                else {
                    return;
                };
                let sa = pod["spec"]["serviceAccountName"].as_str().expect("sa");
                let ns = pod["metadata"]["namespace"].as_str().expect("ns");
                let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"],
                             "expirationSeconds": 3607,
                             "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                                "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}});
                let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token");
                self.call(op, Method::POST, &path, Some(("application/json", request)))
                    .await;
            }
            Op::TokenReview => {
                let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": "replay-coredns"}});
                self.call(
                    op,
                    Method::POST,
                    "/apis/authentication.k8s.io/v1/tokenreviews",
                    Some(("application/json", review)),
                )
                .await;
            }
            Op::SubjectAccessReview => {
                let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                    "spec": {"user": "system:serviceaccount:kube-system:coredns",
                             "groups": ["system:serviceaccounts"],
                             "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}});
                self.call(
                    op,
                    Method::POST,
                    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                    Some(("application/json", review)),
                )
                .await;
            }
            Op::List(s) | Op::Relist(s) => {
                let (path, selector) = s.target(self.agent, obj);
                let key = (s, obj % MOUNTS);
                let rv = match op {
                    Op::List(_) => "limit=500&resourceVersion=0".to_owned(),
                    _ => format!(
                        "resourceVersion={}",
                        self.rvs.get(&key).map_or("0", String::as_str)
                    ),
                };
                let query = match selector {
                    Some(sel) => format!("{sel}&{rv}"),
                    None => rv,
                };
                let (status, body) = self
                    .call(op, Method::GET, &format!("{path}?{query}"), None)
                    .await;
                if status == 200
                    && let Some(rv) = list_rv(&body)
                {
                    self.rvs.insert(key, rv);
                }
            }
            Op::Watch(s) => self.watch(s, obj).await,
        }
    }

    /// Opens a WATCH from the reflector's last resourceVersion (replacing an open one), timed to
    /// the response headers, and drains it in the background until the replay ends.
    async fn watch(&mut self, s: Stream, obj: usize) {
        let key = (s, obj % MOUNTS);
        if let Some(old) = self.watches.remove(&key) {
            old.abort();
        }
        let (path, selector) = s.target(self.agent, obj);
        let rv = self.rvs.get(&key).map_or("0", String::as_str);
        let selector = selector.map(|s| format!("{s}&")).unwrap_or_default();
        let path = format!(
            "{path}?allowWatchBookmarks=true&{selector}resourceVersion={rv}&timeout=7m43s&timeoutSeconds=463&watch=true"
        );
        let req = self.request(http::Method::GET, &path, None);
        let started = Instant::now();
        let resp = self.target.client(self.agent).send(req).await;
        let latency = started.elapsed();
        let status = resp.as_ref().map_or(0, |r| r.status().as_u16());
        self.samples.push(Sample {
            op: Op::Watch(s),
            status,
            latency,
        });
        if let Some(resp) = resp {
            let lines = self.watch_lines.entry(s).or_default().clone();
            let drain = tokio::spawn(async move {
                let mut body = resp.into_body();
                while let Some(Ok(frame)) = body.frame().await {
                    if let Some(data) = frame.data_ref() {
                        let n = data.iter().filter(|&&b| b == b'\n').count();
                        lines.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            });
            self.watches.insert(key, drain);
        }
    }
}

/// What one replay measured.
struct Run {
    startup: Duration,
    total: Duration,
    samples: Vec<Sample>,
    /// Watch lines received per stream, all agents.
    watch_lines: BTreeMap<&'static str, u64>,
}

/// Replays `script` against `target`: every agent runs its start-up, then (all together) its
/// steady-state steps at `t / speed` (or back to back when `speed` is `None`).
async fn replay(target: &Target, world: &FullNode, script: &Script, speed: Option<f64>) -> Run {
    let barrier = Barrier::new(AGENTS.len());
    let started = Instant::now();
    let agent_run = |agent: Agent| {
        let barrier = &barrier;
        async move {
            let mut run = AgentRun {
                agent,
                target,
                world,
                rvs: HashMap::new(),
                watches: HashMap::new(),
                watch_lines: HashMap::new(),
                lease: None,
                events: Vec::new(),
                samples: Vec::new(),
            };
            for (op, obj) in startup(agent) {
                run.run(op, obj).await;
            }
            barrier.wait().await;
            let startup = started.elapsed();
            let t0 = Instant::now();
            for step in script.steps.iter().filter(|s| s.agent == agent) {
                if let Some(speed) = speed {
                    let at = Duration::from_secs_f64(step.t_ms as f64 / 1e3 / speed);
                    tokio::time::sleep_until((t0 + at).into()).await;
                }
                run.run(step.op, step.obj).await;
            }
            (startup, run.samples, run.watches, run.watch_lines)
        }
    };
    let (a, b, c, d) = tokio::join!(
        agent_run(Agent::Kubelet),
        agent_run(Agent::KubeProxy),
        agent_run(Agent::Coredns),
        agent_run(Agent::Flannel),
    );
    let total = started.elapsed();
    let mut samples = Vec::new();
    let mut startup = Duration::ZERO;
    let mut watch_lines = BTreeMap::new();
    for (s, agent_samples, watches, lines) in [a, b, c, d] {
        startup = startup.max(s);
        samples.extend(agent_samples);
        for (_, w) in watches {
            w.abort();
        }
        for (stream, n) in lines {
            *watch_lines.entry(stream.name()).or_insert(0) += n.load(Ordering::Relaxed);
        }
    }
    Run {
        startup,
        total,
        samples,
        watch_lines,
    }
}

/// Everything a replay needs that outlives one run.
struct Bench {
    rt: tokio::runtime::Runtime,
    upstream: Upstream,
    world: FullNode,
    script: Script,
}

impl Bench {
    fn new() -> Bench {
        let script = load_script();
        let rt = bench_runtime();
        let upstream = rt.block_on(Upstream::start(FakeConfig::default()));
        let world = full_node::seed(&upstream.fake);
        for agent in AGENTS {
            if let Some((token, user)) = agent.token() {
                upstream.fake.add_token(
                    token,
                    user,
                    &["system:serviceaccounts", "system:authenticated"],
                );
            }
        }
        let per_agent: BTreeMap<&str, usize> =
            script.steps.iter().fold(BTreeMap::new(), |mut m, s| {
                *m.entry(s.agent.name()).or_insert(0) += 1;
                m
            });
        println!(
            "replay: {} pods on {NODE}, {} ConfigMaps + {} Secrets, {} Services, {} EndpointSlices; \
             start-up {} requests; recorded window {:.1} s with {} steps {per_agent:?}",
            world.pods.len(),
            MOUNTS,
            MOUNTS,
            full_node::SERVICES,
            full_node::SERVICES,
            AGENTS.iter().map(|&a| startup(a).len()).sum::<usize>(),
            script.window_ms as f64 / 1e3,
            script.steps.len(),
        );
        Bench {
            rt,
            upstream,
            world,
            script,
        }
    }

    /// A fresh edge-mode hub (new sled cache, heartbeat on) for one run.
    fn hub(&self, cache_dir: &Path) -> (HubThread, SledCache) {
        let cache = SledCache::open(cache_dir);
        let mut config = self.upstream.hub_config(Some(cache.edge_config()));
        config.health.heartbeat = Some(HeartbeatConfig {
            grace: Duration::from_secs(40),
            kubelet_healthz_url: None,
        });
        (HubThread::start(config, "hub-replay", HUB_WORKERS), cache)
    }

    fn run_direct(&self, speed: Option<f64>) -> Run {
        let target = Target::direct(&self.upstream);
        self.rt
            .block_on(replay(&target, &self.world, &self.script, speed))
    }

    /// One run through a fresh hub; also returns its cache writes and drops by op.
    fn run_hub(&self, speed: Option<f64>) -> (Run, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (hub, cache) = self.hub(dir.path());
        let target = Target::hub(&hub);
        let run = self
            .rt
            .block_on(replay(&target, &self.world, &self.script, speed));
        let metrics = self.rt.block_on(cache_metrics(&hub));
        drop(target);
        hub.stop();
        cache.wait_released();
        (run, metrics)
    }
}

/// The hub's `outpost_cache_writes_total` and `outpost_cache_dropped_total` lines.
async fn cache_metrics(hub: &HubThread) -> String {
    let client: PlainClient = Client::builder(TokioExecutor::new()).build_http();
    let Ok(resp) = client.get(hub.metrics_uri()).await else {
        return "metrics unavailable".into();
    };
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| {
            l.starts_with("outpost_cache_writes_total{")
                || l.starts_with("outpost_cache_dropped_total{")
        })
        .map(|l| l.trim_start_matches("outpost_cache_"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `OUTPOST_REPLAY_WRITE_MIX=1`: derives the script from the CSV into `data/kubelet-mix.json`.
fn write_mix() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv = std::fs::read_to_string(dir.join(CSV)).expect("the perfspec CSV (shared/traffic)");
    let out = dir.join(MIX_FILE);
    std::fs::write(&out, derive_script(&csv).to_json()).expect("write the mix file");
    println!("replay: wrote {}; nothing else was run", out.display());
}

fn replay_bench(c: &mut Criterion) {
    if std::env::var_os("OUTPOST_REPLAY_WRITE_MIX").is_some() {
        write_mix();
        return;
    }
    let bench = Bench::new();
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    group.bench_function("hub_asap", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| bench.run_hub(None).0.total)
                .sum::<Duration>()
        })
    });
    group.bench_function("direct_asap", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| bench.run_direct(None).total).sum())
    });
    group.finish();

    let speed = match std::env::var("OUTPOST_REPLAY_SPEED") {
        Ok(v) if v == "max" => None,
        Ok(v) => Some(
            v.parse::<f64>()
                .expect("OUTPOST_REPLAY_SPEED: a number or max"),
        ),
        Err(_) => Some(100.0),
    };
    let mut passes = vec![None];
    if speed.is_some() {
        passes.push(speed);
    }
    for speed in passes {
        let label = speed.map_or("as fast as possible".to_owned(), |s| format!("×{s}"));
        let direct = bench.run_direct(speed);
        let (hub, metrics) = bench.run_hub(speed);
        report(&label, &direct, &hub);
        println!(
            "  watch lines received (events + bookmarks): direct {:?}, hub {:?}",
            direct.watch_lines, hub.watch_lines
        );
        println!("  hub cache: {metrics}");
    }
    bench.rt.block_on(bench.upstream.shutdown());
}

/// Per-verb and per-kind p50/p99, hub against direct, and totals.
fn report(label: &str, direct: &Run, hub: &Run) {
    println!(
        "replay {label} (not criterion): total direct {} (start-up {}), hub {} (start-up {}), hub ÷ direct {:.3}",
        millis(direct.total),
        millis(direct.startup),
        millis(hub.total),
        millis(hub.startup),
        hub.total.as_secs_f64() / direct.total.as_secs_f64(),
    );
    let group = |run: &Run, key: &dyn Fn(Op) -> String| {
        let mut m: BTreeMap<String, (Vec<Duration>, usize)> = BTreeMap::new();
        for s in &run.samples {
            let e = m.entry(key(s.op)).or_default();
            e.0.push(s.latency);
            if !(200..300).contains(&s.status) {
                e.1 += 1;
            }
        }
        for (v, _) in m.values_mut() {
            v.sort();
        }
        m
    };
    let by_verb = |op: Op| op.verb().to_owned();
    let by_kind = |op: Op| op.name();
    for (title, key) in [
        ("verb", &by_verb as &dyn Fn(Op) -> String),
        ("request kind", &by_kind),
    ] {
        let d = group(direct, key);
        let h = group(hub, key);
        println!(
            "  {:<28} {:>5} {:>4} | {:>10} {:>10} | {:>10} {:>10} | {:>6} {:>6}",
            title, "n", "err", "direct p50", "p99", "hub p50", "p99", "p50 ×", "p99 ×"
        );
        for (k, (hs, herr)) in &h {
            let Some((ds, derr)) = d.get(k) else { continue };
            let (d50, d99, h50, h99) = (
                percentile(ds, 0.5),
                percentile(ds, 0.99),
                percentile(hs, 0.5),
                percentile(hs, 0.99),
            );
            println!(
                "  {:<28} {:>5} {:>4} | {:>10} {:>10} | {:>10} {:>10} | {:>6.2} {:>6.2}",
                k,
                hs.len(),
                format!("{derr}/{herr}"),
                millis(d50),
                millis(d99),
                millis(h50),
                millis(h99),
                h50.as_secs_f64() / d50.as_secs_f64(),
                h99.as_secs_f64() / d99.as_secs_f64(),
            );
        }
    }
}

criterion_group!(benches, replay_bench);
criterion_main!(benches);
