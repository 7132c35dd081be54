//! Prometheus metrics of the proxy, registered in an explicit registry (no global state).
//!
//! Names carry the `outpost_` prefix. The `component` label is yurthub's component (User-Agent up to
//! the first `/`), not the full User-Agent, and only for known components ([`component_label`]);
//! `resource` and `subresource` only for known names ([`resource_labels`]),
//! to keep cardinality bounded. yurthub's own names
//! (`node_yurthub_*`, `openyurt_version_info`) are derived from these at scrape time
//! ([`yurthub_families`]), so that dashboards and alerts written for yurthub keep working.

use std::sync::Arc;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Handles to every metric the proxy updates ([`Handles`]), shared: a clone is one reference
/// count, not one per metric (tees and filters take one per request).
#[derive(Clone)]
pub struct Metrics(Arc<Handles>);

impl std::ops::Deref for Metrics {
    type Target = Handles;

    fn deref(&self) -> &Handles {
        &self.0
    }
}

/// Every metric the proxy updates.
pub struct Handles {
    registry: Registry,
    pub requests: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub upstream_errors: IntCounterVec,
    pub upstream_connections: IntGaugeVec,
    /// Open HTTP/2 streams to each apiserver.
    pub upstream_streams: IntGaugeVec,
    /// Upstream response body bytes as received (compressed when gzip), by resource.
    pub upstream_received_bytes: IntCounterVec,
    pub response_bytes: IntCounterVec,
    pub latency: HistogramVec,
    pub client_cert_expiry: IntGaugeVec,
    /// Expiry of the secure port's serving certificate (0 until one is installed).
    pub serving_cert_expiry: IntGauge,
    /// Edge cache: writes applied by the writer thread, by operation and outcome.
    pub cache_writes: IntCounterVec,
    /// Edge cache: operations dropped because the writer queue was full.
    pub cache_dropped: IntCounterVec,
    /// Edge cache: 1 while the last write or flush failed (disk full, read-only).
    pub cache_degraded: IntGauge,
    /// Edge cache: watch events (or lists) passed on that the cache could not store, by reason;
    /// each marks its scope as having missed events.
    pub cache_missed: IntCounterVec,
    /// Edge cache: scopes known to have missed events, answered 503 offline until relisted.
    pub cache_missed_scopes: IntGauge,
    /// Edge cache: requests answered from the cache, by verb and result.
    pub cache_served: IntCounterVec,
    /// Pool-scope reads answered from the shared cache, by resource and verb.
    pub shared_served: IntCounterVec,
    /// kubelet's writes the hub answered or kept while the cloud was away, and their replays
    /// (`crate::autonomy`), by request and outcome.
    pub autonomy: IntCounterVec,
    /// 1 while the cloud answers, 0 while the hub serves from its cache.
    pub cloud_online: IntGauge,
    /// Per `--server-addr`: 1 healthy, 0 unhealthy.
    pub server_healthy: IntGaugeVec,
    /// Health transitions per server and direction.
    pub server_transitions: IntCounterVec,
    /// Probe (or lease renewal) latency per server.
    pub probe_latency: HistogramVec,
    /// Node-lease renewals by result (renewed, skipped, failed).
    pub lease_renewals: IntCounterVec,
    /// 1 when kubelet's health endpoint last answered OK, 0 when it failed; absent when disabled.
    pub kubelet_healthz_ok: IntGauge,
    /// Filtered responses (and changed watch events) by kind, shape and outcome.
    pub filtered: IntCounterVec,
    /// Trims that gave memory freed by a burst back to the kernel, and how much they gave.
    pub memory_trims: IntCounter,
    pub memory_trimmed_bytes: IntCounter,
    /// `--enable-dummy-if`: 1 while the dummy IP is an address of the node, by interface.
    pub dummy_if_ready: IntGaugeVec,
    /// Open client connections per port (proxy, secure, admin).
    pub client_connections: IntGaugeVec,
    /// Client connections the hub closed or refused, by port and reason.
    pub client_connections_closed: IntCounterVec,
    /// Failed accepts (out of file descriptors, mostly) per port.
    pub accept_errors: IntCounterVec,
    /// Pool sharing: 1 for this hub's role in its pool (leader, follower, none).
    pub pool_role: IntGaugeVec,
    /// Pool sharing: changes of the pool's leaders (or of this hub's pool).
    pub pool_leader_changes: IntCounter,
    /// Pool sharing: requests on the leader hub's port, by outcome (served, probed,
    /// unauthenticated, forbidden, unavailable, expired).
    pub pool_port_requests: IntCounterVec,
    /// Pool sharing: lists and watches of a follower's shared cache, by where they went
    /// (leader, cloud) and outcome (ok, failed).
    pub pool_feed_requests: IntCounterVec,
}

/// A metric's name, help text and labels (none for a single series).
struct Def {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

/// Makes metrics from their [`Def`]s and registers each as it is made.
struct Registrar(Registry);

impl Registrar {
    fn counters(&self, def: Def) -> IntCounterVec {
        self.add(IntCounterVec::new(
            Opts::new(def.name, def.help),
            def.labels,
        ))
    }

    fn gauges(&self, def: Def) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(def.name, def.help), def.labels))
    }

    fn counter(&self, def: Def) -> IntCounter {
        self.add(IntCounter::new(def.name, def.help))
    }

    fn gauge(&self, def: Def) -> IntGauge {
        self.add(IntGauge::new(def.name, def.help))
    }

    fn histograms(&self, def: Def, buckets: &[f64]) -> HistogramVec {
        let opts = HistogramOpts::new(def.name, def.help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, def.labels))
    }

    fn add<M: prometheus::core::Collector + Clone + 'static>(
        &self,
        made: prometheus::Result<M>,
    ) -> M {
        let metric = made.expect("valid metric definition");
        self.0
            .register(Box::new(metric.clone()))
            .expect("metric names are unique");
        metric
    }
}

const REQUESTS: Def = Def {
    name: "outpost_requests_total",
    help: "Proxied requests by component, verb, resource and response code.",
    labels: &["component", "verb", "resource", "code"],
};

const IN_FLIGHT: Def = Def {
    name: "outpost_in_flight_requests",
    help: "Requests being served right now (watches count until their stream ends).",
    labels: &REQUEST_LABELS,
};

const UPSTREAM_CONNECTIONS: Def = Def {
    name: "outpost_upstream_connections",
    help: "Open TCP connections to each apiserver, pooled or in use (see connections.rs).",
    labels: &["server"],
};

const UPSTREAM_STREAMS: Def = Def {
    name: "outpost_upstream_streams",
    help: "Open HTTP/2 streams to each apiserver (requests and watches under way on its connections).",
    labels: &["server"],
};

const UPSTREAM_RECEIVED_BYTES: Def = Def {
    name: "outpost_upstream_received_bytes_total",
    help: "Response body bytes received from the apiservers as they crossed the WAN (compressed when gzip; TLS and HTTP framing not included), by resource and content encoding.",
    labels: &["resource", "encoding"],
};

const UPSTREAM_ERRORS: Def = Def {
    name: "outpost_upstream_errors_total",
    help: "Failed upstream exchanges by server and kind (unreachable, timeout, bad_reply).",
    labels: &["server", "kind"],
};

const RESPONSE_BYTES: Def = Def {
    name: "outpost_proxied_response_bytes_total",
    help: "Response body bytes sent to clients, by component and request.",
    labels: &REQUEST_LABELS,
};

const LATENCY: Def = Def {
    name: "outpost_request_duration_seconds",
    help: "Time from request to response headers, by verb.",
    labels: &["verb"],
};

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

const CLIENT_CERT_EXPIRY: Def = Def {
    name: "outpost_client_certificate_expiry_timestamp_seconds",
    help: "Expiry (Unix time) of the client certificate the hub presents upstream.",
    labels: &["user"],
};

const SERVING_CERT_EXPIRY: Def = Def {
    name: "outpost_serving_certificate_expiry_timestamp_seconds",
    help: "Expiry (Unix time) of the certificate the secure port presents; 0 until one is issued.",
    labels: &[],
};

const CACHE_WRITES: Def = Def {
    name: "outpost_cache_writes_total",
    help: "Edge cache writes by operation (object, list, event, gone, document) and outcome.",
    labels: &["op", "outcome"],
};

const CACHE_DROPPED: Def = Def {
    name: "outpost_cache_dropped_total",
    help: "Edge cache operations dropped (writer queue full or response too large).",
    labels: &["op"],
};

const CACHE_DEGRADED: Def = Def {
    name: "outpost_cache_degraded",
    help: "1 while the edge cache cannot persist writes (disk full, read-only, I/O error).",
    labels: &[],
};

const CACHE_MISSED: Def = Def {
    name: "outpost_cache_missed_total",
    help: "Responses passed on that the edge cache could not store (queue_full, too_large, no_space, write_failed, not_durable); each marks its scope stale.",
    labels: &["reason"],
};

const CACHE_MISSED_SCOPES: Def = Def {
    name: "outpost_cache_missed_scopes",
    help: "Cached scopes known to have missed watch events: answered 503 offline until a LIST replaces them.",
    labels: &[],
};

const CACHE_SERVED: Def = Def {
    name: "outpost_cache_served_total",
    help: "Requests answered from the edge cache while the cloud is unreachable.",
    labels: &["verb", "result"],
};

const SHARED_SERVED: Def = Def {
    name: "outpost_shared_cache_served_total",
    help: "Pool-scope LISTs and WATCHes answered from the shared in-memory cache.",
    labels: &["resource", "verb"],
};

const AUTONOMY: Def = Def {
    name: "outpost_autonomy_total",
    help: "kubelet's requests the hub answered or kept while the cloud was unreachable \
                 (service-account tokens, registration, pod status, events), and their replays \
                 to the cloud, by request and outcome.",
    labels: &["request", "outcome"],
};

const CLOUD_ONLINE: Def = Def {
    name: "outpost_cloud_online",
    help: "1 while an apiserver answers, 0 while the hub serves from its cache.",
    labels: &[],
};

const SERVER_HEALTHY: Def = Def {
    name: "outpost_server_healthy",
    help: "1 while the apiserver is healthy.",
    labels: &["server"],
};

const SERVER_TRANSITIONS: Def = Def {
    name: "outpost_server_health_transitions_total",
    help: "Apiserver health changes, by server and new state.",
    labels: &["server", "to"],
};

const PROBE_LATENCY: Def = Def {
    name: "outpost_probe_duration_seconds",
    help: "Health probe (or node-lease renewal) latency, by server.",
    labels: &["server"],
};

const PROBE_LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const LEASE_RENEWALS: Def = Def {
    name: "outpost_node_lease_renewals_total",
    help: "Node-lease heartbeats by result: renewed, skipped (kubelet not alive), failed.",
    labels: &["result"],
};

const KUBELET_HEALTHZ_OK: Def = Def {
    name: "outpost_kubelet_healthz_ok",
    help: "1 when kubelet's health endpoint last answered OK.",
    labels: &[],
};

const FILTERED: Def = Def {
    name: "outpost_filtered_total",
    help: "Filtered bodies by object kind, shape (object, list, event, response) and outcome \
                 (unchanged, replaced, undecodable: passed on as received).",
    labels: &["kind", "shape", "outcome"],
};

const MEMORY_TRIMS: Def = Def {
    name: "outpost_memory_trims_total",
    help: "Times the hub gave memory freed by a burst of work back to the kernel (malloc_trim).",
    labels: &[],
};

const MEMORY_TRIMMED_BYTES: Def = Def {
    name: "outpost_memory_trimmed_bytes_total",
    help: "Anonymous resident memory those trims gave back to the kernel.",
    labels: &[],
};

const DUMMY_IF_READY: Def = Def {
    name: "outpost_dummy_interface_ready",
    help: "1 while --dummy-if-ip is an address of the node (on --dummy-if-name, or on lo when \
                 the kernel has no dummy interfaces), 0 while it cannot be configured.",
    labels: &["interface"],
};

const CLIENT_CONNECTIONS: Def = Def {
    name: "outpost_client_connections",
    help: "Open client connections per port (proxy, secure, admin).",
    labels: &["port"],
};

const CLIENT_CONNECTIONS_CLOSED: Def = Def {
    name: "outpost_client_connections_closed_total",
    help: "Client connections the hub closed (header_timeout, idle_timeout, evicted: its slot \
                 went to a newer connection) or refused (refused: the port was full of busy ones).",
    labels: &["port", "reason"],
};

const ACCEPT_ERRORS: Def = Def {
    name: "outpost_accept_errors_total",
    help: "Failed accepts per port (out of file descriptors, mostly).",
    labels: &["port"],
};

const POOL_ROLE: Def = Def {
    name: "outpost_pool_role",
    help: "Pool sharing: 1 for this hub's role in its pool (leader, follower, none).",
    labels: &["role"],
};

const POOL_LEADER_CHANGES: Def = Def {
    name: "outpost_pool_leader_changes_total",
    help: "Pool sharing: changes of the pool's leader hubs (or of this hub's pool).",
    labels: &[],
};

const POOL_PORT_REQUESTS: Def = Def {
    name: "outpost_pool_port_requests_total",
    help: "Pool sharing: requests on the leader hub's port (--multiplexer-port) by outcome \
           (served, probed, unauthenticated, forbidden, unavailable, expired).",
    labels: &["outcome"],
};

const POOL_FEED_REQUESTS: Def = Def {
    name: "outpost_pool_feed_requests_total",
    help: "Pool sharing: lists and watches of a follower's shared cache by source (leader, \
           cloud) and outcome (ok, failed).",
    labels: &["source", "outcome"],
};

impl Metrics {
    pub fn new() -> Self {
        let r = Registrar(Registry::new());
        let metrics = Handles {
            requests: r.counters(REQUESTS),
            in_flight: r.gauges(IN_FLIGHT),
            upstream_connections: r.gauges(UPSTREAM_CONNECTIONS),
            upstream_streams: r.gauges(UPSTREAM_STREAMS),
            upstream_received_bytes: r.counters(UPSTREAM_RECEIVED_BYTES),
            upstream_errors: r.counters(UPSTREAM_ERRORS),
            response_bytes: r.counters(RESPONSE_BYTES),
            latency: r.histograms(LATENCY, LATENCY_BUCKETS),
            client_cert_expiry: r.gauges(CLIENT_CERT_EXPIRY),
            serving_cert_expiry: r.gauge(SERVING_CERT_EXPIRY),
            cache_writes: r.counters(CACHE_WRITES),
            cache_dropped: r.counters(CACHE_DROPPED),
            cache_degraded: r.gauge(CACHE_DEGRADED),
            cache_missed: r.counters(CACHE_MISSED),
            cache_missed_scopes: r.gauge(CACHE_MISSED_SCOPES),
            cache_served: r.counters(CACHE_SERVED),
            shared_served: r.counters(SHARED_SERVED),
            autonomy: r.counters(AUTONOMY),
            cloud_online: r.gauge(CLOUD_ONLINE),
            server_healthy: r.gauges(SERVER_HEALTHY),
            server_transitions: r.counters(SERVER_TRANSITIONS),
            probe_latency: r.histograms(PROBE_LATENCY, PROBE_LATENCY_BUCKETS),
            lease_renewals: r.counters(LEASE_RENEWALS),
            kubelet_healthz_ok: r.gauge(KUBELET_HEALTHZ_OK),
            filtered: r.counters(FILTERED),
            memory_trims: r.counter(MEMORY_TRIMS),
            memory_trimmed_bytes: r.counter(MEMORY_TRIMMED_BYTES),
            dummy_if_ready: r.gauges(DUMMY_IF_READY),
            client_connections: r.gauges(CLIENT_CONNECTIONS),
            client_connections_closed: r.counters(CLIENT_CONNECTIONS_CLOSED),
            accept_errors: r.counters(ACCEPT_ERRORS),
            pool_role: r.gauges(POOL_ROLE),
            pool_leader_changes: r.counter(POOL_LEADER_CHANGES),
            pool_port_requests: r.counters(POOL_PORT_REQUESTS),
            pool_feed_requests: r.counters(POOL_FEED_REQUESTS),
            registry: r.0,
        };
        metrics.cloud_online.set(1);
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds…: what
        // yurthub's default process collector exports, and what node dashboards graph.
        #[cfg(target_os = "linux")]
        metrics
            .registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metric names are unique");
        Metrics(Arc::new(metrics))
    }

    /// The expiry of the client certificate presented now (the only one with a value).
    pub fn record_client_certificate(&self, identity: &outpost_certs::IdentityInfo) {
        self.client_cert_expiry.reset();
        self.client_cert_expiry
            .with_label_values(&[identity.user.as_str()])
            .set(i64::try_from(identity.not_after_unix()).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition of every metric, yurthub's names included.
    pub fn render(&self) -> Vec<u8> {
        let mut families = self.registry.gather();
        let yurthub = yurthub_families(&families);
        families.extend(yurthub);
        let mut out = Vec::new();
        // Encoding into a Vec only fails on invalid metric families, which registration prevents.
        let _ = TextEncoder::new().encode(&families, &mut out);
        out
    }
}

/// The labels of per-request metrics: yurthub's (`client` is the component here).
pub const REQUEST_LABELS: [&str; 4] = ["component", "verb", "resource", "subresource"];

/// The components per-request metrics name; any other User-Agent counts as `other`. The
/// User-Agent is the client's to choose, so a label taken from it as sent lets any client add
/// series (and memory, and `/metrics` bytes) without bound. Listed: yurthub's cache agents and
/// the components its filters serve (kept in step by a test), kubectl, and common CNI agents.
/// Only labels are bounded: the cache still keys on the component as sent.
const KNOWN_COMPONENTS: &[&str] = &[
    "kubelet",
    "kube-proxy",
    "coredns",
    "flanneld",
    "outpost",
    "yurthub",
    "raven-agent-ds",
    "yurttunnel-agent",
    "nginx-ingress-controller",
    "kubectl",
    "calico-node",
    "cilium-agent",
];

/// The `component` label of a request: its component if known ([`KNOWN_COMPONENTS`]), `none`
/// without a User-Agent, `other` otherwise. A scan of a dozen static names; no allocation.
pub fn component_label(component: Option<&str>) -> &'static str {
    match component {
        None => "none",
        Some(component) => KNOWN_COMPONENTS
            .iter()
            .find(|known| **known == component)
            .copied()
            .unwrap_or("other"),
    }
}

/// The resources per-request metrics name, in [`by_length_then_bytes`] order;
/// any other counts as `other`. The path is the client's to choose, so a label taken from it
/// as sent lets any client that reaches the hub add series without bound (six per new name).
/// Listed: what Kubernetes serves (API groups up to 1.33) and OpenYurt's own resources;
/// custom resources of other projects count as `other`.
const KNOWN_RESOURCES: &[&str] = &[
    "jobs",
    "pods",
    "nodes",
    "roles",
    "events",
    "leases",
    "secrets",
    "bindings",
    "cronjobs",
    "csinodes",
    "gateways",
    "services",
    "endpoints",
    "ingresses",
    "nodepools",
    "configmaps",
    "csidrivers",
    "daemonsets",
    "namespaces",
    "apiservices",
    "deployments",
    "flowschemas",
    "ipaddresses",
    "limitranges",
    "nodebuckets",
    "replicasets",
    "yurtappsets",
    "clusterroles",
    "podtemplates",
    "rolebindings",
    "servicecidrs",
    "statefulsets",
    "tokenreviews",
    "deviceclasses",
    "endpointslices",
    "ingressclasses",
    "platformadmins",
    "resourceclaims",
    "resourcequotas",
    "resourceslices",
    "runtimeclasses",
    "storageclasses",
    "yurtappdaemons",
    "yurtstaticsets",
    "leasecandidates",
    "networkpolicies",
    "priorityclasses",
    "serviceaccounts",
    "storageversions",
    "componentstatuses",
    "persistentvolumes",
    "volumeattachments",
    "selfsubjectreviews",
    "clusterrolebindings",
    "clustertrustbundles",
    "controllerrevisions",
    "csistoragecapacities",
    "poddisruptionbudgets",
    "subjectaccessreviews",
    "persistentvolumeclaims",
    "replicationcontrollers",
    "resourceclaimtemplates",
    "selfsubjectrulesreviews",
    "volumeattributesclasses",
    "horizontalpodautoscalers",
    "selfsubjectaccessreviews",
    "storageversionmigrations",
    "customresourcedefinitions",
    "localsubjectaccessreviews",
    "mutatingadmissionpolicies",
    "certificatesigningrequests",
    "prioritylevelconfigurations",
    "validatingadmissionpolicies",
    "mutatingwebhookconfigurations",
    "mutatingadmissionpolicybindings",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicybindings",
];

/// The subresources per-request metrics name, in [`by_length_then_bytes`] order; any other
/// counts as `other`.
const KNOWN_SUBRESOURCES: &[&str] = &[
    "log",
    "exec",
    "proxy",
    "scale",
    "token",
    "attach",
    "resize",
    "status",
    "binding",
    "approval",
    "eviction",
    "finalize",
    "portforward",
    "ephemeralcontainers",
];

/// The `resource` and `subresource` labels of one request, bounded as [`component_label`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceLabels {
    /// The resource if known ([`KNOWN_RESOURCES`]), empty for a path with none, else `other`.
    pub resource: &'static str,
    /// The subresource if known ([`KNOWN_SUBRESOURCES`]), empty when none, else `other`.
    pub subresource: &'static str,
}

impl ResourceLabels {
    /// `pods`, `pods/status`: the joined label of the families that have one `resource` label.
    pub fn joined(self) -> std::borrow::Cow<'static, str> {
        if self.subresource.is_empty() {
            self.resource.into()
        } else {
            format!("{}/{}", self.resource, self.subresource).into()
        }
    }
}

/// The bounded labels of `info`'s resource and subresource. Logs keep the names as sent.
pub fn resource_labels(info: &outpost_core::RequestInfo) -> ResourceLabels {
    ResourceLabels {
        resource: known_or_other(KNOWN_RESOURCES, &info.resource),
        subresource: known_or_other(KNOWN_SUBRESOURCES, &info.subresource),
    }
}

fn known_or_other(known: &'static [&'static str], name: &str) -> &'static str {
    if name.is_empty() {
        return "";
    }
    known
        .binary_search_by(|k| by_length_then_bytes(k, name))
        .map_or("other", |at| known[at])
}

/// The order of the known names: most probes of a search end at the lengths, without comparing
/// bytes.
fn by_length_then_bytes(a: &str, b: &str) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// yurthub's metrics (`pkg/yurthub/metrics`), from the outpost families they correspond to:
/// server health, requests in flight and their total, response bytes, whether the cache can
/// persist, and the build. The multiplexer's and the connection tracker's have no counterpart.
pub fn yurthub_families(gathered: &[MetricFamily]) -> Vec<MetricFamily> {
    let find = |name: &str| gathered.iter().find(|f| f.name() == name);
    let mut out: Vec<MetricFamily> = RENAMED
        .iter()
        .filter_map(|r| Some(renamed(find(r.from)?, r.name, r.help, r.labels)))
        .collect();
    let total: f64 = find("outpost_in_flight_requests")
        .map(|f| f.get_metric().iter().map(value).sum())
        .unwrap_or_default();
    out.push(single(
        "node_yurthub_in_flight_requests_total",
        "total of in flight requests handling by hub agent",
        MetricType::GAUGE,
        Vec::new(),
        total,
    ));
    let degraded = find("outpost_cache_degraded")
        .and_then(|f| f.get_metric().first())
        .map_or(0.0, value);
    out.push(single(
        "node_yurthub_error_keys_persistency_status",
        "status of error keys persistency: 1 when the cache can persist writes",
        MetricType::GAUGE,
        Vec::new(),
        if degraded > 0.0 { 0.0 } else { 1.0 },
    ));
    out.push(version_info());
    out
}

/// One of ours exported again under yurthub's name, help and label names.
struct Renamed {
    from: &'static str,
    name: &'static str,
    help: &'static str,
    labels: &'static [(&'static str, &'static str)],
}

/// yurthub's labels of a request (ours → theirs).
const YURTHUB_REQUEST_LABELS: &[(&str, &str)] = &[
    ("component", "client"),
    ("verb", "verb"),
    ("resource", "resource"),
    ("subresource", "subresources"),
];

const RENAMED: &[Renamed] = &[
    Renamed {
        from: "outpost_server_healthy",
        name: "node_yurthub_server_healthy_status",
        help: "healthy status of remote servers. 1: healthy, 0: unhealthy",
        labels: &[("server", "server")],
    },
    Renamed {
        from: "outpost_upstream_connections",
        name: "node_yurthub_closable_conns_collector",
        help: "collector of underlay tcp connection from hub agent to remote server",
        labels: &[("server", "server")],
    },
    Renamed {
        from: "outpost_in_flight_requests",
        name: "node_yurthub_in_flight_requests_collector",
        help: "collector of in flight requests handling by hub agent",
        labels: YURTHUB_REQUEST_LABELS,
    },
    Renamed {
        from: "outpost_proxied_response_bytes_total",
        name: "node_yurthub_proxy_traffic_collector",
        help: "collector of proxy response traffic by hub agent(unit: byte)",
        labels: YURTHUB_REQUEST_LABELS,
    },
];

/// `openyurt_version_info`, as yurthub exports it.
fn version_info() -> MetricFamily {
    single(
        "openyurt_version_info",
        "A metric with a constant '1' value labeled by git version, git commit, build date, \
         compiler, platform and component name from which OpenYurt was built.",
        MetricType::GAUGE,
        vec![
            label("component_name", "yurthub"),
            label(
                "git_version",
                concat!("outpost-v", env!("CARGO_PKG_VERSION")),
            ),
            label("git_commit", ""),
            label("build_date", ""),
            label("go_version", ""),
            label("compiler", "rustc"),
            label(
                "platform",
                &format!(
                    "{}/{}",
                    std::env::consts::OS,
                    go_arch(std::env::consts::ARCH)
                ),
            ),
            label("nodepoollabelkey", "apps.openyurt.io/nodepool"),
        ],
        1.0,
    )
}

/// `family` under yurthub's `name`, each metric's labels renamed by `labels` (from, to).
fn renamed(family: &MetricFamily, name: &str, help: &str, labels: &[(&str, &str)]) -> MetricFamily {
    let mut out = MetricFamily::default();
    out.set_name(name.to_owned());
    out.set_help(help.to_owned());
    out.set_field_type(family.get_field_type());
    for metric in family.get_metric() {
        let mut pairs: Vec<LabelPair> = labels
            .iter()
            .filter_map(|(from, to)| {
                let pair = metric.get_label().iter().find(|p| p.name() == *from)?;
                Some(label(to, pair.value()))
            })
            .collect();
        // As the registry writes them: sorted by name.
        pairs.sort_by(|a, b| a.name().cmp(b.name()));
        out.mut_metric()
            .push(with_value(pairs, family.get_field_type(), value(metric)));
    }
    out
}

fn single(
    name: &str,
    help: &str,
    kind: MetricType,
    labels: Vec<LabelPair>,
    v: f64,
) -> MetricFamily {
    let mut out = MetricFamily::default();
    out.set_name(name.to_owned());
    out.set_help(help.to_owned());
    out.set_field_type(kind);
    out.set_metric(vec![with_value(labels, kind, v)]);
    out
}

fn with_value(labels: Vec<LabelPair>, kind: MetricType, v: f64) -> Metric {
    let mut metric = Metric::from_label(labels);
    if kind == MetricType::COUNTER {
        let mut counter = Counter::default();
        counter.set_value(v);
        metric.set_counter(counter);
    } else {
        let mut gauge = Gauge::default();
        gauge.set_value(v);
        metric.set_gauge(gauge);
    }
    metric
}

fn value(metric: &Metric) -> f64 {
    metric.get_gauge().get_value() + metric.get_counter().get_value()
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_owned());
    pair.set_value(value.to_owned());
    pair
}

/// Go's `GOARCH` spelling, as yurthub's `platform` label has it.
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_labels_are_the_known_components_then_other() {
        assert_eq!(component_label(Some("kubelet")), "kubelet");
        assert_eq!(component_label(Some("kubectl")), "kubectl");
        assert_eq!(component_label(None), "none");
        assert_eq!(component_label(Some("ua-12345")), "other");
        assert_eq!(component_label(Some("")), "other");
    }

    /// Every cache agent and every component a filter serves by default has its own label.
    #[test]
    fn every_component_the_hub_knows_of_is_labelled() {
        let filters = outpost_filter::filters::ALL
            .iter()
            .flat_map(|f| f.default_components().iter());
        for component in crate::edge::policy::DEFAULT_AGENTS.iter().chain(filters) {
            assert_eq!(component_label(Some(component)), *component);
        }
    }

    #[test]
    fn known_names_are_ordered_for_the_binary_search() {
        for known in [KNOWN_RESOURCES, KNOWN_SUBRESOURCES] {
            let ordered = |w: &[&str]| by_length_then_bytes(w[0], w[1]).is_lt();
            assert!(known.windows(2).all(ordered), "{known:?}");
        }
    }

    fn labels_of(path: &str) -> ResourceLabels {
        let info = outpost_core::RequestInfo::classify(&http::Method::GET, path, None).unwrap();
        resource_labels(&info)
    }

    #[test]
    fn resource_labels_are_known_names_then_other() {
        let known = labels_of("/api/v1/namespaces/default/pods/web/status");
        assert_eq!((known.resource, known.subresource), ("pods", "status"));
        assert_eq!(known.joined(), "pods/status");
        assert_eq!(
            labels_of("/apis/apps.openyurt.io/v1beta1/nodepools").joined(),
            "nodepools"
        );
        let unknown = labels_of("/api/v1/namespaces/default/pods/web/zz1");
        assert_eq!((unknown.resource, unknown.subresource), ("pods", "other"));
        assert_eq!(labels_of("/apis/example.com/v1/widgets").joined(), "other");
        assert_eq!(labels_of("/version").joined(), "");
    }

    /// Every resource the hub treats in a way of its own has its own label.
    #[test]
    fn every_resource_the_hub_knows_of_is_labelled() {
        let filtered = outpost_filter::filters::ALL
            .iter()
            .flat_map(|f| f.rules().iter().map(|rule| rule.resource));
        let own = [
            "leases",
            "nodes",
            "pods",
            "events",
            "serviceaccounts",
            "services",
        ];
        for resource in filtered.chain(own) {
            assert!(KNOWN_RESOURCES.contains(&resource), "{resource}");
        }
    }
}
