//! `outpost demo`: the product on one screen, with nothing to install.
//!
//! It starts the bundled fake apiserver (HTTPS, client certificates, the 1.32 node authorizer), puts
//! the hub in front of it on loopback in edge mode exactly as on a node (sled cache in a temporary
//! directory), and drives a kubelet-like kube-rs client through it: list and watch, then the link
//! is cut and the client keeps its pods, the cloud changes while the node is offline, the link
//! returns and the client converges. Then the node reboots while the link is down: a Kubernetes
//! 1.32 kubelet's boot (`outpost_testkit::kubelet_boot`: protobuf bodies, tokens, registration,
//! pod status) is answered by the hub from its cache, kube-proxy sees the pods' new IPs, and
//! when the link returns the cloud gets the offline status. It prints each step and exits 0 when
//! every step behaved as expected.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use outpost_agent::{EdgeConfig, Hub, HubConfig, LbMode, Server, UpstreamConfig};
use outpost_cache::{SledOptions, SledStore};
use outpost_certs::UpstreamTls;
use outpost_proxy::edge::CacheAgents;
use outpost_testkit::{FakeApiServer, FakeConfig};
use serde_json::json;

const NODE: &str = "edge-1";
const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/outpost-demo";

pub fn main() -> ExitCode {
    // The steps say what happens; set RUST_LOG to see the hub's own log lines as well.
    crate::run::init_tracing_with("off");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outpost: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => {
            println!("\ndemo finished: every step behaved as expected");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("outpost demo: failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn step(text: &str) {
    println!("\n==> {text}");
}

async fn run() -> Result<()> {
    step("starting the bundled fake apiserver (HTTPS, client certificates, node authorizer)");
    let fake = FakeApiServer::start(FakeConfig::default())
        .await
        .context("fake apiserver")?;
    println!("    apiserver: {}", fake.url());
    // The hub's own RBAC, as `manifests/cluster/` installs it next to the node authorizer.
    let rbac =
        outpost_testkit::manifest::parse_yaml(include_str!("../../../manifests/cluster/rbac.yaml"))
            .context("the hub's RBAC manifest")?;
    fake.apply_rbac(&rbac)
        .map_err(|s| anyhow::anyhow!("RBAC: {}", s.message))?;
    let dir = tempfile::tempdir().context("temporary directory")?;
    let files = fake
        .pki()
        .write_node_files(dir.path(), NODE)
        .context("node certificate files")?;
    println!(
        "    node identity: system:node:{NODE} in {}",
        files.client_pem.display()
    );

    step("starting the hub in edge mode on loopback, with its sled cache on disk");
    let cache_dir = dir.path().join("cache");
    println!("    cache: {}", cache_dir.display());
    let hub = start_hub(&fake, &files, &cache_dir).await?;
    println!(
        "    proxy: http://{}   admin: http://{}",
        hub.proxy_addr(),
        hub.admin_addr()
    );

    let result = drive_client(&fake, &hub).await;
    let result = match result {
        Ok(()) => reboot_offline(&fake, &files, &cache_dir, hub).await,
        Err(e) => {
            hub.shutdown().await;
            Err(e)
        }
    };
    fake.shutdown().await;
    result
}

/// The hub in edge mode in front of `fake`, its cache in `cache_dir`.
async fn start_hub(
    fake: &FakeApiServer,
    files: &outpost_testkit::NodeCertFiles,
    cache_dir: &std::path::Path,
) -> Result<Hub> {
    let store = SledStore::open(cache_dir, SledOptions::default()).context("edge cache")?;
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt)?;
    let upstream = UpstreamConfig {
        servers: vec![Server::parse(&fake.url()).map_err(anyhow::Error::msg)?],
        lb_mode: LbMode::RoundRobin,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(30),
        tls,
        http2: Default::default(),
    };
    let hub = Hub::start(HubConfig {
        proxy_addr: "127.0.0.1:0".parse()?,
        admin_addr: "127.0.0.1:0".parse()?,
        edge: Some(EdgeConfig {
            store: Arc::new(store),
            agents: CacheAgents::default(),
            volatile: None,
            min_request_timeout: outpost_proxy::edge::watch::DEFAULT_MIN_REQUEST_TIMEOUT,
            max_object_bytes: outpost_proxy::edge::writer::DEFAULT_MAX_OBJECT_BYTES,
            hung_after: outpost_agent::admin::CACHE_HUNG_AFTER,
        }),
        namespace: "kube-system".into(),
        // One-second probes instead of yurthub's ten, so the demo's outage and recovery take
        // seconds; two good probes still make the apiserver healthy again.
        health: outpost_agent::health::HealthConfig {
            interval: Duration::from_secs(1),
            heartbeat: Some(outpost_agent::health::HeartbeatConfig {
                grace: Duration::from_secs(40),
                kubelet_healthz_url: None,
            }),
            ..outpost_agent::health::HealthConfig::default()
        },
        ..HubConfig::new(NODE, upstream)
    })
    .await?;
    Ok(hub)
}

const KUBE_PROXY_UA: &str = "kube-proxy/v1.32.4 (linux/amd64) kubernetes/outpost-demo";

/// The story an edge proxy exists for: the node reboots while the link is down, and its pods
/// come back; when the link returns, the cloud learns what happened.
async fn reboot_offline(
    fake: &FakeApiServer,
    files: &outpost_testkit::NodeCertFiles,
    cache_dir: &std::path::Path,
    hub: Hub,
) -> Result<()> {
    let old_ip = |i: usize| format!("10.244.1.{}", 10 + i);
    let new_ip = |i: usize| format!("10.244.1.{}", 100 + i);
    boot_online(fake, &hub, &old_ip).await?;
    step("the node reboots while the link to the cloud is down");
    fake.refuse_connections();
    fake.cut_watches();
    hub.shutdown().await;
    let hub = start_hub(fake, files, cache_dir).await?;
    wait_for(&hub, false).await?;
    println!("    hub restarted from its cache; the cloud is unreachable");

    boot_offline(&hub, &new_ip).await?;
    until_the_cloud_learns(fake, &new_ip(0)).await?;
    hub.shutdown().await;
    Ok(())
}

/// The cloud's web app on this node, and kubelet's first boot through the hub, online.
async fn boot_online(
    fake: &FakeApiServer,
    hub: &Hub,
    old_ip: &(dyn Fn(usize) -> String + Sync),
) -> Result<()> {
    use outpost_testkit::kubelet_boot::{self, Boot, Scenario};
    step(
        "the cloud runs a web app on this node: pods with a ConfigMap, a Secret, a service-account token, and a Service",
    );
    for name in ["web-0", "web-2"] {
        fake.delete("v1/pods", Some("default"), name)
            .map_err(|s| anyhow::anyhow!("delete {name}: {}", s.message))?;
    }
    Scenario::create(fake, NODE, 2, old_ip);
    wait_for(hub, true).await?;
    let online = kubelet_boot::replay(&Boot {
        hub: hub.proxy_addr(),
        node: NODE,
        boot_id: "boot-1",
        pod_ip: old_ip,
        now: "2026-11-26T10:00:00Z",
    })
    .await;
    ensure!(
        online.unusable().is_empty(),
        "online boot:\n{}",
        online.summary()
    );
    let slices = slice_addresses(hub.proxy_addr()).await?;
    println!(
        "    kubelet booted through the hub ({} requests, protobuf bodies); kube-proxy routes web to {}",
        online.exchanges.len(),
        slices.join(", ")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    Ok(())
}

/// kubelet's boot through the hub restarted offline: every request answered, kube-proxy sees
/// the pods' new IPs.
async fn boot_offline(hub: &Hub, new_ip: &(dyn Fn(usize) -> String + Sync)) -> Result<()> {
    use outpost_testkit::kubelet_boot::{self, Boot};
    step("kubelet boots: registration, lease, pods, ConfigMaps, Secrets, tokens, status, events");
    let offline = kubelet_boot::replay(&Boot {
        hub: hub.proxy_addr(),
        node: NODE,
        boot_id: "boot-2",
        pod_ip: new_ip,
        now: "2026-11-26T11:00:00Z",
    })
    .await;
    let answered = |what: &str| {
        offline
            .find(what)
            .map(|e| {
                format!(
                    "{} {}",
                    e.status,
                    e.served_from.as_deref().unwrap_or("cloud")
                )
            })
            .unwrap_or_else(|| "not sent".into())
    };
    for what in [
        "registration",
        "lease renew",
        "node status",
        "pod informer list",
        "secrets web-secret list",
        "token web-0",
        "pod status web-0",
        "event web-0",
    ] {
        println!("    {what:<24} -> {}", answered(what));
    }
    ensure!(
        offline.unusable().is_empty(),
        "offline boot:\n{}",
        offline.summary()
    );
    println!(
        "    all {} requests answered in {} ms: every pod can start",
        offline.exchanges.len(),
        offline.elapsed.as_millis()
    );
    let slices = slice_addresses(hub.proxy_addr()).await?;
    println!(
        "    kube-proxy routes web to {} (the pods' new IPs, from kubelet's own reports)",
        slices.join(", ")
    );
    ensure!(
        slices == [new_ip(0), new_ip(1)],
        "kube-proxy's slices: {slices:?}"
    );

    Ok(())
}

/// The link returns: the cloud gets the node's and the pods' offline status and events.
async fn until_the_cloud_learns(fake: &FakeApiServer, new_ip_0: &str) -> Result<()> {
    use outpost_testkit::kubelet_boot;
    step("the link returns: the cloud gets the node's and the pods' offline status and events");
    fake.restore().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pod_ip = fake
            .get("v1/pods", Some(kubelet_boot::NAMESPACE), "web-0")
            .map(|p| p["status"]["podIP"].clone());
        let events = fake.list("v1/events", Some(kubelet_boot::NAMESPACE)).len();
        if pod_ip == Some(json!(new_ip_0)) && events >= 4 {
            println!(
                "    the cloud's web-0 has podIP {}; {events} events recorded",
                new_ip_0
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the cloud never got the offline status ({pod_ip:?}, {events} events)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The addresses kube-proxy sees in the `web` EndpointSlice.
async fn slice_addresses(hub: std::net::SocketAddr) -> Result<Vec<String>> {
    let mut config = kube::Config::new(format!("http://{hub}").parse()?);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(KUBE_PROXY_UA),
    ));
    let client = kube::Client::try_from(config)?;
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client, outpost_testkit::kubelet_boot::NAMESPACE);
    let list = slices.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .flat_map(|e| e.addresses.first().cloned())
        .collect())
}

/// Waits (bounded) until the hub sees the cloud `online`, or serves from its cache.
async fn wait_for(hub: &Hub, online: bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while hub.is_online() != online {
        ensure!(
            Instant::now() < deadline,
            "the hub never saw the cloud online={online}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn drive_client(fake: &FakeApiServer, hub: &Hub) -> Result<()> {
    let mut config = kube::Config::new(format!("http://{}", hub.proxy_addr()).parse()?);
    // kube-rs sends no User-Agent by default; the hub keys the component on it.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(KUBELET_UA),
    ));
    let client = kube::Client::try_from(config)?;
    let pods: Api<Pod> = Api::all(client.clone());
    let fields = format!("spec.nodeName={NODE}");

    step("the cloud schedules two pods onto this node");
    for name in ["web-0", "web-1"] {
        fake.create("v1/pods", demo_pod(name))
            .map_err(|s| anyhow::anyhow!("create {name}: {}", s.message))?;
        println!("    created pod default/{name} (spec.nodeName={NODE})");
    }

    step("kubelet lists and watches its pods through the hub (fieldSelector=spec.nodeName)");
    let (view, writer) = reflector::store::<Pod>();
    let stream = reflector::reflector(
        writer,
        watcher(pods.clone(), watcher::Config::default().fields(&fields)),
    )
    .default_backoff()
    .applied_objects();
    let watch_task = tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let result = offline_and_back(fake, &pods, &fields, &view).await;
    watch_task.abort();
    result
}

async fn offline_and_back(
    fake: &FakeApiServer,
    pods: &Api<Pod>,
    fields: &str,
    view: &Store<Pod>,
) -> Result<()> {
    wait_for_view(view, &["web-0", "web-1"]).await?;
    println!("    kubelet sees: {}", names(view).join(", "));

    step("an unscoped pod list is refused by the node authorizer; the 403 Status comes through");
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => println!("    {} {}: {}", s.code, s.reason, s.message),
        other => bail!("expected a 403, got {other:?}"),
    }

    step("the link to the cloud is cut (connections refused, open watches dropped)");
    fake.refuse_connections();
    fake.cut_watches();
    let list = list_until_offline(pods, fields).await?;
    println!(
        "    kubelet lists again: {} (served from the edge cache, resourceVersion {})",
        list.items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
            .join(", "),
        list.metadata.resource_version.unwrap_or_default()
    );
    change_the_cloud(fake, view).await?;
    the_link_returns(fake, view).await?;
    second_outage(fake, pods, fields).await?;
    fake.restore().await;
    Ok(())
}

/// While the node is offline, the cloud changes; kubelet keeps what it saw.
async fn change_the_cloud(fake: &FakeApiServer, view: &Store<Pod>) -> Result<()> {
    step(
        "while the node is offline, the cloud changes: web-2 added, web-0 relabelled, web-1 deleted",
    );
    fake.create("v1/pods", demo_pod("web-2"))
        .map_err(|s| anyhow::anyhow!("create web-2: {}", s.message))?;
    let mut web0 = fake
        .get("v1/pods", Some("default"), "web-0")
        .context("web-0 upstream")?;
    web0["metadata"]["labels"]["version"] = json!("v2");
    fake.update("v1/pods", web0)
        .map_err(|s| anyhow::anyhow!("update web-0: {}", s.message))?;
    fake.delete("v1/pods", Some("default"), "web-1")
        .map_err(|s| anyhow::anyhow!("delete web-1: {}", s.message))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "    kubelet still sees: {} (its pods keep running)",
        names(view).join(", ")
    );

    Ok(())
}

/// The link returns: offline watches end, and kubelet converges on the cloud's changes.
async fn the_link_returns(fake: &FakeApiServer, view: &Store<Pod>) -> Result<()> {
    step("the link returns: offline watches end, kubelet resumes against the cloud");
    let back = Instant::now();
    fake.restore().await;
    wait_for_view(view, &["web-0", "web-2"]).await?;
    let web0 = view
        .state()
        .into_iter()
        .find(|p| p.name_any() == "web-0")
        .context("web-0 in view")?;
    ensure!(
        web0.labels().get("version").map(String::as_str) == Some("v2"),
        "web-0 should carry the change made while offline"
    );
    println!(
        "    kubelet sees: {} (web-0 version={}) after {} ms",
        names(view).join(", "),
        web0.labels()["version"],
        back.elapsed().as_millis()
    );

    Ok(())
}

/// A second outage serves the converged state: nothing stale, nothing resurrected.
async fn second_outage(fake: &FakeApiServer, pods: &Api<Pod>, fields: &str) -> Result<()> {
    step("a second outage serves the converged state, nothing stale, nothing resurrected");
    fake.refuse_connections();
    fake.cut_watches();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list = list_until_offline(pods, fields).await?;
        let mut listed: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
        listed.sort();
        if listed == ["web-0", "web-2"] {
            println!(
                "    kubelet lists: {} (from the edge cache)",
                listed.join(", ")
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the cache did not converge: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Lists until the hub has noticed the outage and answers from its cache (bounded).
async fn list_until_offline(pods: &Api<Pod>, fields: &str) -> Result<kube::api::ObjectList<Pod>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match pods.list(&ListParams::default().fields(fields)).await {
            Ok(list) => return Ok(list),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "list while going offline");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).context("offline list"),
        }
    }
}

fn names(view: &Store<Pod>) -> Vec<String> {
    let mut names: Vec<String> = view.state().iter().map(|p| p.name_any()).collect();
    names.sort();
    names
}

async fn wait_for_view(view: &Store<Pod>, expected: &[&str]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while names(view) != expected {
        ensure!(
            Instant::now() < deadline,
            "kubelet's view is {:?}, expected {expected:?}",
            names(view)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn demo_pod(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "web", "image": "nginx:1.27"}]}
    })
}
