//! `outpost demo`: the product on one screen, with nothing to install.
//!
//! It starts the bundled fake apiserver (HTTPS, client certificates, the 1.32 node authorizer), puts
//! the hub in front of it on loopback exactly as on a node, and drives a kubelet-like kube-rs client
//! through the hub, printing each step. It exits 0 when every step behaved as expected.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use outpost_certs::UpstreamTls;
use outpost_proxy::{Hub, HubConfig, LbMode, Server, UpstreamConfig};
use outpost_testkit::{FakeApiServer, FakeConfig};
use serde_json::json;

const NODE: &str = "edge-1";
const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/outpost-demo";

pub fn main() -> ExitCode {
    crate::run::init_tracing_with("warn");
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
    let dir = tempfile::tempdir().context("temporary directory")?;
    let files = fake
        .pki()
        .write_node_files(dir.path(), NODE)
        .context("node certificate files")?;
    println!(
        "    node identity: system:node:{NODE} in {}",
        files.client_pem.display()
    );

    step("starting the hub on loopback, borrowing the node's client certificate");
    let tls = UpstreamTls::load(&files.client_pem, &files.ca_crt)?;
    let hub = Hub::start(HubConfig {
        proxy_addr: "127.0.0.1:0".parse()?,
        admin_addr: "127.0.0.1:0".parse()?,
        upstream: UpstreamConfig {
            servers: vec![Server::parse(&fake.url()).map_err(anyhow::Error::msg)?],
            lb_mode: LbMode::RoundRobin,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            tls,
        },
        edge: None,
            namespace: "kube-system".into(),
    })
    .await?;
    println!(
        "    proxy: http://{}   admin: http://{}",
        hub.proxy_addr(),
        hub.admin_addr()
    );

    let result = drive_client(&fake, &hub).await;
    hub.shutdown().await;
    fake.shutdown().await;
    result
}

async fn drive_client(fake: &FakeApiServer, hub: &Hub) -> Result<()> {
    let mut config = kube::Config::new(format!("http://{}", hub.proxy_addr()).parse()?);
    // kube-rs sends no User-Agent by default; the hub keys the component on it.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(KUBELET_UA),
    ));
    let client = kube::Client::try_from(config)?;

    step("the cloud schedules two pods onto this node");
    for name in ["web-0", "web-1"] {
        fake.create("v1/pods", demo_pod(name))
            .map_err(|s| anyhow::anyhow!("create {name}: {}", s.message))?;
        println!("    created pod default/{name} (spec.nodeName={NODE})");
    }

    step("kubelet lists its pods through the hub (fieldSelector=spec.nodeName)");
    let pods: Api<Pod> = Api::all(client.clone());
    let scoped = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
    let list = pods.list(&scoped).await?;
    for p in &list.items {
        println!("    pod {}", p.metadata.name.as_deref().unwrap_or("?"));
    }
    ensure!(
        list.items.len() == 2,
        "expected 2 pods, got {}",
        list.items.len()
    );

    step(
        "an unscoped pod list is refused by the node authorizer, and the 403 Status comes through",
    );
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => println!("    {} {}: {}", s.code, s.reason, s.message),
        other => bail!("expected a 403, got {other:?}"),
    }

    step("kubelet watches its pods through the hub; the cloud adds one");
    let wp = WatchParams::default()
        .fields(&format!("spec.nodeName={NODE}"))
        .timeout(15);
    let mut stream = pods
        .watch(&wp, &list.metadata.resource_version.unwrap_or_default())
        .await?
        .boxed();
    fake.create("v1/pods", demo_pod("web-2"))
        .map_err(|s| anyhow::anyhow!("create web-2: {}", s.message))?;
    let event = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .context("no watch event within 10s")??;
    match event {
        Some(WatchEvent::Added(p)) => println!(
            "    watch event: ADDED pod {}",
            p.metadata.name.unwrap_or_default()
        ),
        other => bail!("unexpected watch event {other:?}"),
    }

    step("kubelet reports node status and renews its lease through the hub");
    let nodes: Api<Node> = Api::all(client.clone());
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "kubelet is posting ready status"}]}});
    nodes
        .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    println!("    PATCH nodes/{NODE}/status: Ready=True");
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut lease = leases.get(NODE).await?;
    lease.spec.get_or_insert_with(Default::default).renew_time =
        Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    let renewed = leases.replace(NODE, &PostParams::default(), &lease).await?;
    println!(
        "    PUT lease kube-node-lease/{NODE}: resourceVersion {} -> {}",
        lease.metadata.resource_version.unwrap_or_default(),
        renewed.metadata.resource_version.unwrap_or_default()
    );

    step("what the apiserver saw: every request authenticated as the node");
    let log = fake.requests();
    let api: Vec<_> = log.iter().filter(|r| r.path.starts_with("/api")).collect();
    for r in &api {
        println!(
            "    {:<6} {:<55} {} as {}",
            r.method, r.path, r.status, r.user
        );
    }
    ensure!(
        api.iter().all(|r| r.user == format!("system:node:{NODE}")),
        "a request reached the apiserver without the node identity"
    );
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
