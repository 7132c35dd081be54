//! One node's workload through its hub, as light tokio tasks over plain HTTP/1.1: kubelet (its
//! pods, its Node, Services, one list+watch per ConfigMap and Secret its pods mount, the lease
//! every 10 s), kube-proxy (Services and EndpointSlices with its label selector) and coredns
//! (Services, EndpointSlices, Namespaces).
//!
//! Each list+watch is a reflector as client-go runs it: LIST with `resourceVersion=0` (paging
//! with `continue` when the answer pages), WATCH from the list's version with bookmarks and a
//! `timeoutSeconds` of 5-10 minutes, again from the last version when a watch ends after a
//! second or with events; a relist from the last version after a short or failed watch, from
//! scratch after 410 Gone; failed requests wait the reflector's backoff (0.8 s doubling to 30
//! s, full jitter). Every request's outcome is counted in the node's [`ClientStats`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::task::JoinSet;

use super::client::{self, Caller, EventLines};
use super::cluster::{self, NAMESPACE, REFS, View};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/a78aa47";
const KUBE_PROXY_UA: &str = "kube-proxy/v1.32.4 (linux/amd64) kubernetes/a78aa47";
const COREDNS_UA: &str = "coredns/1.11.3 (linux/amd64) kubernetes/fleet";
/// What kubelet, kube-proxy and coredns (client-go with protobuf) send.
const ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";
/// kube-proxy's label selector on Services and EndpointSlices.
const PROXY_SELECTOR: &str = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";
const LEASE_EVERY: Duration = Duration::from_secs(10);
/// kubelet's lease controller: tries per renewal, re-reading the lease after a conflict.
const LEASE_TRIES: usize = 5;

/// A request that got no usable answer.
#[derive(Debug, Clone)]
pub struct Failure {
    pub at: Instant,
    pub what: String,
    pub detail: String,
}

/// What one node's clients saw.
#[derive(Default)]
pub struct ClientStats {
    pub requests: AtomicU64,
    pub failures: Mutex<Vec<Failure>>,
    /// Answers the hub served itself (`x-outpost-served-from`), by source.
    pub served_from: Mutex<BTreeMap<String, u64>>,
    pub lists: AtomicU64,
    pub watches: AtomicU64,
    pub events: AtomicU64,
    /// How watch streams ended: `timeout-or-closed`, `short` (under a second without events),
    /// `expired` (410), `error-event`, `undecodable`.
    pub watch_ends: Mutex<BTreeMap<&'static str, u64>>,
    /// Reflectors whose first list succeeded.
    pub synced: AtomicUsize,
    pub lease_renewals: AtomicU64,
    pub lease_conflicts: AtomicU64,
}

impl ClientStats {
    fn fail(&self, what: &str, detail: impl std::fmt::Display) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Failure {
                at: Instant::now(),
                what: what.to_owned(),
                detail: detail.to_string(),
            });
    }

    fn served(&self, headers: &http::HeaderMap) {
        if let Some(source) = client::served_from(headers) {
            *self
                .served_from
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(source.to_owned())
                .or_default() += 1;
        }
    }

    fn watch_end(&self, how: &'static str) {
        *self
            .watch_ends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(how)
            .or_default() += 1;
    }

    pub fn failures(&self) -> Vec<Failure> {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The views a node's clients keep, compared with the apiserver's after the outage.
#[derive(Default)]
pub struct Views {
    pub kubelet_pods: Mutex<View>,
    pub proxy_services: Mutex<View>,
    pub proxy_slices: Mutex<View>,
}

/// One node's clients, running.
pub struct NodeClients {
    pub stats: Arc<ClientStats>,
    pub views: Arc<Views>,
    /// List+watches in the workload (the lease loop not counted).
    pub informers: usize,
    tasks: JoinSet<()>,
}

impl NodeClients {
    /// Starts every component of `node` against the hub's proxy port.
    pub fn start(node: &str, proxy: SocketAddr, seed: u64) -> NodeClients {
        let stats = Arc::new(ClientStats::default());
        let views = Arc::new(Views::default());
        let informers = informers(node, &views);
        let mut tasks = JoinSet::new();
        let count = informers.len();
        for (i, informer) in informers.into_iter().enumerate() {
            let ctx = Ctx {
                proxy,
                stats: stats.clone(),
                rng: Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(i as u64)),
            };
            tasks.spawn(reflector(ctx, informer));
        }
        let ctx = Ctx {
            proxy,
            stats: stats.clone(),
            rng: Rng::new(seed ^ 0x5eed),
        };
        tasks.spawn(lease_loop(ctx, node.to_owned()));
        NodeClients {
            stats,
            views,
            informers: count,
            tasks,
        }
    }

    pub fn synced(&self) -> bool {
        self.stats.synced.load(Ordering::Relaxed) >= self.informers
    }

    pub fn stop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Who runs a reflector.
#[derive(Clone)]
struct Component {
    user_agent: &'static str,
    token: Option<String>,
}

impl Component {
    fn caller(&self) -> Caller<'_> {
        Caller {
            user_agent: self.user_agent,
            accept: ACCEPT,
            token: self.token.as_deref(),
        }
    }
}

/// One list+watch.
struct Informer {
    what: String,
    component: Component,
    /// The collection with its selectors, ending in `?` or a parameter.
    path: String,
    /// Where the objects go (`namespace/name` -> resourceVersion), if anyone compares them.
    view: Option<(Arc<Views>, ViewOf)>,
}

/// Which of a node's [`Views`] an informer feeds.
type ViewOf = fn(&Views) -> &Mutex<View>;

fn informers(node: &str, views: &Arc<Views>) -> Vec<Informer> {
    let kubelet = Component {
        user_agent: KUBELET_UA,
        token: None,
    };
    let kube_proxy = Component {
        user_agent: KUBE_PROXY_UA,
        token: Some(cluster::agent_token("kube-proxy", node)),
    };
    let coredns = Component {
        user_agent: COREDNS_UA,
        token: Some(cluster::agent_token("coredns", node)),
    };
    let informer = |what: &str, component: &Component, path: String| Informer {
        what: what.to_owned(),
        component: component.clone(),
        path,
        view: None,
    };
    let mut all = vec![
        Informer {
            view: Some((views.clone(), |v| &v.kubelet_pods)),
            ..informer(
                "kubelet pods",
                &kubelet,
                format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            )
        },
        informer(
            "kubelet node",
            &kubelet,
            format!("/api/v1/nodes?fieldSelector=metadata.name%3D{node}"),
        ),
        informer(
            "kubelet services",
            &kubelet,
            "/api/v1/services?fieldSelector=spec.clusterIP%21%3DNone".into(),
        ),
    ];
    for k in 0..REFS {
        for (plural, name) in [
            ("configmaps", cluster::config_map_name(node, k)),
            ("secrets", cluster::secret_name(node, k)),
        ] {
            all.push(informer(
                &format!("kubelet {plural}"),
                &kubelet,
                format!(
                    "/api/v1/namespaces/{NAMESPACE}/{plural}?fieldSelector=metadata.name%3D{name}"
                ),
            ));
        }
    }
    all.push(Informer {
        view: Some((views.clone(), |v| &v.proxy_services)),
        ..informer(
            "kube-proxy services",
            &kube_proxy,
            format!("/api/v1/services?{PROXY_SELECTOR}"),
        )
    });
    all.push(Informer {
        view: Some((views.clone(), |v| &v.proxy_slices)),
        ..informer(
            "kube-proxy endpointslices",
            &kube_proxy,
            format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}"),
        )
    });
    for (what, path) in [
        ("coredns services", "/api/v1/services?"),
        (
            "coredns endpointslices",
            "/apis/discovery.k8s.io/v1/endpointslices?",
        ),
        ("coredns namespaces", "/api/v1/namespaces?"),
    ] {
        all.push(informer(what, &coredns, path.into()));
    }
    all
}

/// What every task of a node carries.
struct Ctx {
    proxy: SocketAddr,
    stats: Arc<ClientStats>,
    rng: Rng,
}

impl Ctx {
    /// One whole request to the hub, counted, with who answered it noted.
    async fn call(
        &self,
        caller: Caller<'_>,
        method: Method,
        path: &str,
        body: Option<(&str, Bytes)>,
    ) -> Result<client::Reply> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let reply = client::call(self.proxy, caller, method, path, body).await?;
        self.stats.served(&reply.headers);
        Ok(reply)
    }
}

/// xorshift64*: jitter only.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng((seed ^ time).max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// client-go's reflector backoff: 800 ms doubling to 30 s, full jitter, reset after 2 quiet
/// minutes.
struct Backoff {
    next: Duration,
    last: Option<Instant>,
}

impl Backoff {
    const INITIAL: Duration = Duration::from_millis(800);
    const MAX: Duration = Duration::from_secs(30);
    const RESET: Duration = Duration::from_secs(120);

    fn new() -> Backoff {
        Backoff {
            next: Self::INITIAL,
            last: None,
        }
    }

    async fn wait(&mut self, rng: &mut Rng) {
        if self.last.is_some_and(|t| t.elapsed() > Self::RESET) {
            self.next = Self::INITIAL;
        }
        let delay = self.next.mul_f64(1.0 + rng.unit());
        self.next = (self.next * 2).min(Self::MAX);
        self.last = Some(Instant::now());
        tokio::time::sleep(delay).await;
    }
}

/// Where a relist starts from.
#[derive(Clone)]
enum ListFrom {
    /// `resourceVersion=0`: anything the cache has (first list).
    Any,
    /// `resourceVersion=<rv>`: at least as new as what was seen.
    AtLeast(String),
    /// No resourceVersion: the newest (after 410).
    Newest,
}

async fn reflector(mut ctx: Ctx, informer: Informer) {
    let mut backoff = Backoff::new();
    let mut from = ListFrom::Any;
    let mut synced = false;
    loop {
        let rv = match list(&ctx, &informer, &from).await {
            Ok(rv) => rv,
            Err(e) => {
                ctx.stats.fail(&format!("{} list", informer.what), e);
                backoff.wait(&mut ctx.rng).await;
                continue;
            }
        };
        if !synced {
            synced = true;
            ctx.stats.synced.fetch_add(1, Ordering::Relaxed);
        }
        from = watch_until_relist(&mut ctx, &informer, rv, &mut backoff).await;
        backoff.wait(&mut ctx.rng).await;
    }
}

/// LISTs (following `continue`) into the informer's view; returns the list's resourceVersion.
async fn list(ctx: &Ctx, informer: &Informer, from: &ListFrom) -> Result<String> {
    let join = if informer.path.ends_with('?') {
        ""
    } else {
        "&"
    };
    let first = match from {
        ListFrom::Any => format!("{}{join}limit=500&resourceVersion=0", informer.path),
        ListFrom::AtLeast(rv) => format!("{}{join}limit=500&resourceVersion={rv}", informer.path),
        ListFrom::Newest => format!("{}{join}limit=500", informer.path),
    };
    let mut path = first;
    let mut items = View::new();
    loop {
        ctx.stats.lists.fetch_add(1, Ordering::Relaxed);
        let reply = ctx
            .call(informer.component.caller(), Method::GET, &path, None)
            .await?;
        if reply.status != StatusCode::OK {
            bail!("{} {}", reply.status, String::from_utf8_lossy(&reply.body));
        }
        let list = reply.object()?;
        for item in list["items"].as_array().into_iter().flatten() {
            items.insert(key(item), cluster::meta(item, "resourceVersion"));
        }
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match list["metadata"]["continue"].as_str() {
            Some(token) if !token.is_empty() => {
                let token: String = form_encode(token);
                path = format!("{}{join}limit=500&continue={token}", informer.path);
            }
            _ => {
                if let Some((views, field)) = &informer.view {
                    *field(views).lock().unwrap_or_else(|e| e.into_inner()) = items;
                }
                return Ok(rv);
            }
        }
    }
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn key(obj: &Value) -> String {
    let ns = cluster::meta(obj, "namespace");
    let name = cluster::meta(obj, "name");
    if ns.is_empty() {
        name
    } else {
        format!("{ns}/{name}")
    }
}

/// How one watch ended.
enum WatchEnd {
    /// Ended after a second or with events: watch again from the last version.
    Again,
    /// The request failed in a way client-go retries as a watch (refused, 429, 5xx).
    RetryWatch(String),
    /// Relist, from where.
    Relist(ListFrom, &'static str),
}

/// Watches from `rv` again and again; returns when the reflector must relist.
async fn watch_until_relist(
    ctx: &mut Ctx,
    informer: &Informer,
    mut rv: String,
    backoff: &mut Backoff,
) -> ListFrom {
    loop {
        match watch_once(ctx, informer, &mut rv).await {
            WatchEnd::Again => {}
            WatchEnd::RetryWatch(detail) => {
                ctx.stats.fail(&format!("{} watch", informer.what), detail);
                backoff.wait(&mut ctx.rng).await;
            }
            WatchEnd::Relist(from, why) => {
                ctx.stats.watch_end(why);
                return from;
            }
        }
    }
}

async fn watch_once(ctx: &mut Ctx, informer: &Informer, rv: &mut String) -> WatchEnd {
    let join = if informer.path.ends_with('?') {
        ""
    } else {
        "&"
    };
    let timeout_seconds = 300 + ctx.rng.below(300);
    let path = format!(
        "{}{join}allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={timeout_seconds}&watch=true",
        informer.path
    );
    ctx.stats.requests.fetch_add(1, Ordering::Relaxed);
    ctx.stats.watches.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let open = match client::open(
        ctx.proxy,
        informer.component.caller(),
        Method::GET,
        &path,
        None,
    )
    .await
    {
        Ok(open) => open,
        Err(e) => return WatchEnd::RetryWatch(format!("{e:#}")),
    };
    ctx.stats.served(&open.headers);
    match open.status.as_u16() {
        200 => {}
        410 => {
            return WatchEnd::Relist(ListFrom::Newest, "expired");
        }
        429 | 500 | 502 | 503 | 504 => {
            return WatchEnd::RetryWatch(format!("{}", open.status));
        }
        code => {
            ctx.stats
                .fail(&format!("{} watch", informer.what), format!("{code}"));
            return WatchEnd::Relist(ListFrom::AtLeast(rv.clone()), "refused");
        }
    }
    let mut body = open.body;
    let mut lines = EventLines::default();
    let mut events = 0u64;
    // The server ends the watch after `timeoutSeconds`; this bounds a silent, stuck stream.
    let deadline = started + Duration::from_secs(timeout_seconds as u64 + 30);
    loop {
        let frame = match tokio::time::timeout_at(deadline.into(), body.frame()).await {
            Err(_) => {
                ctx.stats.watch_end("stuck");
                return WatchEnd::Again;
            }
            Ok(frame) => frame,
        };
        let Some(Ok(frame)) = frame else {
            // Closed (or cut): client-go treats both as the end of this watch.
            let short = events == 0 && started.elapsed() < Duration::from_secs(1);
            if short {
                return WatchEnd::Relist(ListFrom::AtLeast(rv.clone()), "short");
            }
            ctx.stats.watch_end("timeout-or-closed");
            return WatchEnd::Again;
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        for event in lines.push(data) {
            let Ok(event) = event else {
                return WatchEnd::Relist(ListFrom::AtLeast(rv.clone()), "undecodable");
            };
            events += 1;
            ctx.stats.events.fetch_add(1, Ordering::Relaxed);
            match apply_event(informer, &event, rv) {
                Ok(()) => {}
                Err(expired) => return WatchEnd::Relist(expired, "error-event"),
            }
        }
    }
}

/// Applies one watch event to `rv` and the view; an ERROR event says where to relist from.
fn apply_event(informer: &Informer, event: &Value, rv: &mut String) -> Result<(), ListFrom> {
    let kind = event["type"].as_str().unwrap_or_default();
    let object = &event["object"];
    if kind == "ERROR" {
        return Err(if object["code"] == 410 {
            ListFrom::Newest
        } else {
            ListFrom::AtLeast(rv.clone())
        });
    }
    let object_rv = cluster::meta(object, "resourceVersion");
    if !object_rv.is_empty() {
        *rv = object_rv.clone();
    }
    if let Some((views, field)) = &informer.view {
        let mut view = field(views).lock().unwrap_or_else(|e| e.into_inner());
        match kind {
            "ADDED" | "MODIFIED" => {
                view.insert(key(object), object_rv);
            }
            "DELETED" => {
                view.remove(&key(object));
            }
            _ => {}
        }
    }
    Ok(())
}

/// kubelet's node lease: read (or create) it, then renew it every 10 s with the copy last
/// returned, re-reading it after a conflict.
async fn lease_loop(mut ctx: Ctx, node: String) {
    let caller = Caller {
        user_agent: KUBELET_UA,
        accept: ACCEPT,
        token: None,
    };
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}");
    let mut lease: Option<Value> = None;
    // Renewals start spread over the first period, as kubelets do.
    tokio::time::sleep(LEASE_EVERY.mul_f64(ctx.rng.unit())).await;
    loop {
        let started = Instant::now();
        let mut renewed = false;
        for _ in 0..LEASE_TRIES {
            let base = match lease.take() {
                Some(lease) => lease,
                None => match ensure_lease(&ctx, caller, &path, &node).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        ctx.stats.fail("kubelet lease get", format!("{e:#}"));
                        break;
                    }
                },
            };
            match renew(&ctx, caller, &path, base).await {
                Ok(Some(renewed_lease)) => {
                    lease = Some(renewed_lease);
                    renewed = true;
                    break;
                }
                Ok(None) => {
                    ctx.stats.lease_conflicts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    ctx.stats.fail("kubelet lease renew", format!("{e:#}"));
                    break;
                }
            }
        }
        if renewed {
            ctx.stats.lease_renewals.fetch_add(1, Ordering::Relaxed);
        }
        let jitter = Duration::from_millis(ctx.rng.below(100) as u64);
        tokio::time::sleep((LEASE_EVERY + jitter).saturating_sub(started.elapsed())).await;
    }
}

/// GETs the lease, creating it if missing.
async fn ensure_lease(ctx: &Ctx, caller: Caller<'_>, path: &str, node: &str) -> Result<Value> {
    let got = ctx
        .call(caller, Method::GET, &format!("{path}?timeout=10s"), None)
        .await?;
    match got.status.as_u16() {
        200 => got.object(),
        404 => {
            let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now_micro()}});
            let collection = path.rsplit_once('/').map_or(path, |(c, _)| c);
            let created = ctx
                .call(
                    caller,
                    Method::POST,
                    &format!("{collection}?timeout=10s"),
                    Some(("application/json", Bytes::from(lease.to_string()))),
                )
                .await?;
            if created.status != StatusCode::CREATED {
                bail!("create: {}", created.status);
            }
            created.object()
        }
        code => Err(anyhow!("{code}")),
    }
}

/// PUTs `base` renewed; `None` on a conflict.
async fn renew(
    ctx: &Ctx,
    caller: Caller<'_>,
    path: &str,
    mut base: Value,
) -> Result<Option<Value>> {
    base["spec"]["renewTime"] = now_micro().into();
    let put = ctx
        .call(
            caller,
            Method::PUT,
            &format!("{path}?timeout=10s"),
            Some(("application/json", Bytes::from(base.to_string()))),
        )
        .await?;
    match put.status.as_u16() {
        200 => put.object().map(Some),
        409 => Ok(None),
        code => Err(anyhow!("{code} {}", String::from_utf8_lossy(&put.body))),
    }
}

fn now_micro() -> String {
    outpost_core::time::micro_time(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}
