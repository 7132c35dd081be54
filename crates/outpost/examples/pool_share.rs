//! Pool sharing measured (docs/pool-sharing.md): `--hubs` hubs of one NodePool in front of one
//! testkit apiserver, each with a kube-proxy-like reader that lists and watches EndpointSlices
//! through it, under EndpointSlice churn (`--updates` changes of `--slices` slices, as a
//! DaemonSet rollout makes them). Run twice on fresh clusters, in one invocation: without leader
//! hubs, then with `--leaders` of them (`leader-hub-pool-a`). Reported per run: what the cloud
//! sent the pool's hubs during the churn (TLS bytes the apiserver wrote to node identities), the
//! same over as long a time without churn just before (leases, probes, status: what the hubs
//! exchange anyway) and the difference, the upstream EndpointSlice watches, and whether every
//! reader saw every change.
//!
//! ```sh
//! cargo build --release -p outpost --bin outpost
//! cargo run --release -p outpost --example pool_share -- --hubs=50 --leaders=2
//! ```
//!
//! Hubs run from `--bin` (default `target/release/outpost`), each on its own loopback address
//! (fleetkit's), killed on drop; every wait is bounded.

#[allow(dead_code)]
mod fleetkit;
mod harness;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use fleetkit::client::{self, Caller, EventLines};
use fleetkit::hub::{self, Common, Hub};
use http::Method;
use http_body_util::BodyExt;
use outpost_testkit::FakeApiServer;
use serde_json::{Value, json};

const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const SLICES_GVR: &str = "discovery.k8s.io/v1/endpointslices";
const KUBE_PROXY: Caller<'static> = Caller {
    user_agent: "kube-proxy/v1.32.0 (linux/amd64) kubernetes/e2e",
    accept: "application/json",
    token: None,
};
/// Endpoints per slice: about 4 KB of JSON each.
const ENDPOINTS: usize = 30;
/// Bound on the hubs' start, the leaders' certificates and the readers' first lists.
const SETTLE_WITHIN: Duration = Duration::from_secs(180);
/// Bound on the readers catching up with the churn.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(120);

struct Args {
    hubs: usize,
    leaders: usize,
    slices: usize,
    updates: usize,
    rate: f64,
    bin: PathBuf,
}

/// What one run measured.
struct Outcome {
    leaders: usize,
    cloud_bytes: u64,
    /// The same over as long a time without churn.
    quiet_bytes: u64,
    watches: usize,
    watchers: usize,
    seen: u64,
    expected: u64,
}

fn main() -> Result<()> {
    let args = Args::parse()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let without = runtime.block_on(run(&args, 0))?;
    let with = runtime.block_on(run(&args, args.leaders))?;
    println!(
        "pool of {} hubs, {} EndpointSlices, {} updates at {}/s",
        args.hubs, args.slices, args.updates, args.rate
    );
    println!(
        "| leaders | cloud→edge bytes during churn | without churn | the churn's (difference) | upstream EndpointSlice watches (users) | events seen / expected |"
    );
    println!("|---|---|---|---|---|---|");
    for o in [&without, &with] {
        println!(
            "| {} | {} | {} | {} | {} ({}) | {} / {} |",
            o.leaders,
            o.cloud_bytes,
            o.quiet_bytes,
            o.churn_bytes(),
            o.watches,
            o.watchers,
            o.seen,
            o.expected
        );
    }
    let fewer = |with: u64, without: u64| 100.0 * (1.0 - with as f64 / without.max(1) as f64);
    println!(
        "with {} leaders: {:.1} % fewer bytes in all, {:.1} % fewer for the churn",
        args.leaders,
        fewer(with.cloud_bytes, without.cloud_bytes),
        fewer(with.churn_bytes(), without.churn_bytes())
    );
    ensure!(
        without.seen == without.expected && with.seen == with.expected,
        "a reader missed changes"
    );
    Ok(())
}

async fn run(args: &Args, leaders: usize) -> Result<Outcome> {
    let fake = harness::cluster().await?;
    let dir = tempfile::tempdir()?;
    for j in 0..args.slices {
        fake.create(SLICES_GVR, slice(j, 0))
            .map_err(|s| anyhow::anyhow!("slice: {}", s.message))?;
    }
    let nodes: Vec<String> = (0..args.hubs).map(|i| format!("edge-{i}")).collect();
    pool(&fake, &nodes, leaders)?;
    let port = free_port(leaders.max(1))?;
    let extra = [format!("--multiplexer-port={port}")];
    let common = Common {
        bin: &args.bin,
        server: &fake.url(),
        pki: fake.pki(),
        extra: &extra,
    };
    let hubs: Vec<Hub> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| Hub::spawn(&common, i, node, &dir.path().join(node)))
        .collect::<Result<_>>()?;
    let mut proxies = Vec::new();
    for hub in &hubs {
        proxies.push(hub.ready().await?.proxy);
    }
    for leader in &hubs[..leaders] {
        until_logged(leader, "leader hub port open").await?;
        until_logged(leader, "serving certificate issued").await?;
    }
    let seen = Arc::new(AtomicU64::new(0));
    for proxy in &proxies {
        let rv = until_shared(*proxy).await?;
        tokio::spawn(read(*proxy, rv, seen.clone()));
    }
    // The same time without churn: what the hubs exchange anyway (leases, probes, status).
    let quiet_from = node_bytes(&fake);
    tokio::time::sleep(churn_time(args)).await;
    let before = node_bytes(&fake);
    let quiet_bytes = before - quiet_from;
    churn(&fake, args).await?;
    let expected = (args.updates * args.hubs) as u64;
    let started = Instant::now();
    while seen.load(Ordering::Relaxed) < expected && started.elapsed() < CATCH_UP_WITHIN {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cloud_bytes = node_bytes(&fake) - before;
    let watches: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.verb == "watch" && r.resource == "endpointslices")
        .map(|r| r.user)
        .collect();
    let mut watchers = watches.clone();
    watchers.sort();
    watchers.dedup();
    drop(hubs);
    Ok(Outcome {
        leaders,
        cloud_bytes,
        quiet_bytes,
        watches: watches.len(),
        watchers: watchers.len(),
        seen: seen.load(Ordering::Relaxed),
        expected,
    })
}

impl Outcome {
    /// What the churn itself cost: the bytes during it less those of as long a quiet time.
    fn churn_bytes(&self) -> u64 {
        self.cloud_bytes.saturating_sub(self.quiet_bytes)
    }
}

/// How long the churn lasts.
fn churn_time(args: &Args) -> Duration {
    Duration::from_secs_f64(args.updates as f64 / args.rate)
}

/// EndpointSlice `j`, its endpoints' addresses varied by `version`.
fn slice(j: usize, version: usize) -> Value {
    let endpoints: Vec<Value> = (0..ENDPOINTS)
        .map(|e| {
            json!({"addresses": [format!("10.{}.{}.{}", j % 250, e, version % 250)],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": format!("edge-{e}"), "zone": "zone-a"})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{j}-x"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": format!("svc-{j}")}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

/// NodePool `pool-a` with every node, and `leader-hub-pool-a` naming the first `leaders`.
fn pool(fake: &FakeApiServer, nodes: &[String], leaders: usize) -> Result<()> {
    let status = |s: outpost_core::Status| anyhow::anyhow!("{}", s.message);
    let mut pool = fake
        .create(
            "apps.openyurt.io/v1beta1/nodepools",
            json!({"apiVersion": "apps.openyurt.io/v1beta1", "kind": "NodePool",
                   "metadata": {"name": "pool-a"}, "spec": {"type": "Edge"}}),
        )
        .map_err(status)?;
    pool["status"] = json!({ "nodes": nodes });
    fake.update("apps.openyurt.io/v1beta1/nodepools", pool)
        .map_err(status)?;
    if leaders == 0 {
        return Ok(());
    }
    let named: Vec<String> = (0..leaders)
        .map(|i| format!("{}/{}", nodes[i], hub::address(i)))
        .collect();
    fake.create(
        "v1/configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "leader-hub-pool-a", "namespace": "kube-system"},
               "data": {"leaders": named.join(","), "enable-leader-election": "true",
                        "interconnectivity": "true",
                        "pool-scoped-metadata": "/v1/services,discovery.k8s.io/v1/endpointslices"}}),
    )
    .map_err(status)?;
    Ok(())
}

/// A port free on the first `n` hubs' addresses, for `--multiplexer-port`.
fn free_port(n: usize) -> Result<u16> {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind((hub::address(0), 0))?;
        let port = first.local_addr()?.port();
        let free = (1..n).all(|i| std::net::TcpListener::bind((hub::address(i), port)).is_ok());
        if free {
            return Ok(port);
        }
    }
    bail!("no port free on the leaders' addresses")
}

async fn until_logged(hub: &Hub, needle: &str) -> Result<()> {
    let started = Instant::now();
    while !hub.process.log_text().contains(needle) {
        if started.elapsed() > SETTLE_WITHIN {
            bail!(
                "{} never logged {needle:?}:\n{}",
                hub.node,
                hub.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Lists until the hub's shared cache answers; the list's resourceVersion.
async fn until_shared(proxy: std::net::SocketAddr) -> Result<String> {
    let started = Instant::now();
    loop {
        let reply = client::call(proxy, KUBE_PROXY, Method::GET, SLICES, None).await?;
        if reply.status.is_success() && client::served_from(&reply.headers) == Some("shared-cache")
        {
            let list = reply.object()?;
            return Ok(list["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned());
        }
        if started.elapsed() > SETTLE_WITHIN {
            bail!("{proxy}: never answered by the shared cache");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// kube-proxy's watch from `rv`, counting the changes it sees.
async fn read(proxy: std::net::SocketAddr, rv: String, seen: Arc<AtomicU64>) -> Result<()> {
    let path = format!("{SLICES}?watch=true&resourceVersion={rv}&timeoutSeconds=600");
    let mut open = client::open(proxy, KUBE_PROXY, Method::GET, &path, None).await?;
    ensure!(
        open.status.is_success(),
        "{proxy}: watch answered {}",
        open.status
    );
    let mut lines = EventLines::default();
    while let Some(frame) = open.body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        for event in lines.push(&data) {
            if event.context("event")?["type"] == "MODIFIED" {
                seen.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// `--updates` changes of the slices, in turn, at `--rate` a second.
async fn churn(fake: &FakeApiServer, args: &Args) -> Result<()> {
    let pause = Duration::from_secs_f64(1.0 / args.rate);
    for u in 0..args.updates {
        let j = u % args.slices;
        let mut current = fake
            .get(SLICES_GVR, Some("default"), &format!("svc-{j}-x"))
            .context("slice")?;
        current["endpoints"] = slice(j, u + 1)["endpoints"].clone();
        fake.update(SLICES_GVR, current)
            .map_err(|s| anyhow::anyhow!("update: {}", s.message))?;
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// TLS bytes the apiserver wrote to node identities so far.
fn node_bytes(fake: &FakeApiServer) -> u64 {
    fake.traffic()
        .iter()
        .filter(|(identity, _)| identity.starts_with("system:node:"))
        .map(|(_, t)| t.bytes_written)
        .sum()
}

impl Args {
    fn parse() -> Result<Args> {
        let mut args = Args {
            hubs: 50,
            leaders: 2,
            slices: 50,
            updates: 300,
            rate: 20.0,
            bin: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/release/outpost"
            )),
        };
        for arg in std::env::args().skip(1) {
            let (key, value) = arg.split_once('=').unwrap_or((&arg, ""));
            let number = |v: &str| v.parse::<usize>().with_context(|| format!("{key}={v}"));
            match key {
                "--hubs" => args.hubs = number(value)?,
                "--leaders" => args.leaders = number(value)?,
                "--slices" => args.slices = number(value)?,
                "--updates" => args.updates = number(value)?,
                "--rate" => args.rate = value.parse().context("--rate")?,
                "--bin" => args.bin = PathBuf::from(value),
                _ => bail!(
                    "usage: pool_share [--hubs=50] [--leaders=2] [--slices=50] [--updates=300] [--rate=20] [--bin=PATH]"
                ),
            }
        }
        ensure!(
            args.hubs > args.leaders && args.leaders > 0,
            "--leaders must be 1 to --hubs - 1"
        );
        ensure!(
            args.slices > 0 && args.rate > 0.0,
            "--slices and --rate must be positive"
        );
        ensure!(
            args.bin.exists(),
            "{} is missing (--bin=PATH)",
            args.bin.display()
        );
        Ok(args)
    }
}
