//! Partition flaps under load for a long time: a soak harness (not a test, not criterion).
//!
//! ```sh
//! cargo build --release
//! cargo run --release -p outpost --example soak                         # 10 minutes
//! cargo run --release -p outpost --example soak -- --duration=2m --report-every=10s
//! cargo run --release -p outpost --example soak -- --flap=60s --clients=5 --bin=/tmp/outpost
//! ```
//!
//! 1. Starts the bundled fake apiserver with `PODS` pods bound to `edge-1`, and the release
//!    `outpost` binary in front of it in edge mode (probes every second, as the e2e tests run
//!    it).
//! 2. Runs `--clients` kubelet-like clients through the hub: each a kube-rs reflector that lists
//!    and watches the node's pods (`fieldSelector=spec.nodeName=edge-1`, kubelet's pod source),
//!    all of one component, so they share the hub's cache; plus `GETTERS` loops GETting those
//!    pods one by one, as kubelet's status manager does.
//! 3. Changes the cloud meanwhile: every `CHURN`, one pod is created, one relabelled and one
//!    deleted, online and offline alike.
//! 4. Flaps the partition: in every `--flap` period the apiserver goes away for the last third,
//!    alternately refusing connections (a dead server) and blackholed (a silent link).
//! 5. Prints a line every `--report-every`: time, whether the cloud is reachable, the hub's RSS
//!    and open descriptors, what the clients saw so far; then, the cloud back, waits (bounded)
//!    for every client's view to equal the apiserver's pods of the node (names and
//!    resourceVersions), and prints a summary: RSS and descriptors at start, peak and end, the
//!    clients' errors by kind, and each view's verdict. Exits 1 if a view differs.
//!
//! Every child process is owned by a guard that kills it on drop; everything is on loopback and
//! every wait is bounded.

mod harness;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures_util::StreamExt;
use harness::{HubChild, NODE};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ResourceExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use outpost_testkit::FakeApiServer;
use serde_json::{Value, json};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/soak";
/// Pods on the node at the start; the churn keeps about as many.
const PODS: usize = 40;
/// How often the cloud changes (one create, one relabel, one delete).
const CHURN: Duration = Duration::from_millis(500);
/// GET loops, and the pause between their GETs.
const GETTERS: usize = 2;
const GET_EVERY: Duration = Duration::from_millis(100);
/// How long the clients may take to converge once the cloud is back for good.
const CONVERGE: Duration = Duration::from_secs(60);
/// Bound on the hub's start.
const START: Duration = Duration::from_secs(20);

fn main() -> Result<()> {
    let args = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(soak(args))
}

async fn soak(args: Args) -> Result<()> {
    let fake = harness::cluster().await?;
    let dir = tempfile::tempdir()?;
    let files = fake
        .pki()
        .write_node_files(&dir.path().join("pki"), NODE)
        .context("node cert files")?;
    for i in 0..PODS {
        create_pod(&fake, &format!("soak-{i}"))?;
    }
    let hub = Hub::start(&args.bin, &hub_args(&fake.url(), &files, dir.path()))?;
    println!(
        "soak: {} for {:?}, {} list+watch clients and {GETTERS} GET loops as kubelet, the cloud \
         away for the last third of every {:?}; a line every {:?}",
        args.bin.display(),
        args.duration,
        args.clients,
        args.flap,
        args.report_every
    );

    let client = kube_client(hub.proxy)?;
    let stats = Arc::new(Stats::default());
    let views: Vec<Store<Pod>> = (0..args.clients)
        .map(|i| spawn_reflector(&client, i, stats.clone()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..GETTERS {
        tokio::spawn(get_loop(
            client.clone(),
            views[0].clone(),
            stats.clone(),
            stop.clone(),
        ));
    }
    let fake = Arc::new(fake);
    let churn = tokio::spawn(churn(fake.clone(), stop.clone()));

    let started = Instant::now();
    let mut samples = vec![hub.sample(started)?];
    println!("{}", samples[0].line(&stats, true));
    let mut cloud_up = true;
    let mut outages = 0;
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let in_period = started.elapsed().as_secs_f64() % args.flap.as_secs_f64();
        let want_up = in_period < args.flap.as_secs_f64() * 2.0 / 3.0;
        if want_up != cloud_up {
            if want_up {
                fake.restore().await;
            } else if outages % 2 == 0 {
                fake.refuse_connections();
            } else {
                fake.blackhole();
            }
            outages += usize::from(!want_up);
            cloud_up = want_up;
        }
        if started.elapsed() >= args.report_every * samples.len() as u32 {
            let sample = hub.sample(started)?;
            println!("{}", sample.line(&stats, cloud_up));
            samples.push(sample);
        }
    }
    stop.store(true, Ordering::Release);
    churn.await?;
    fake.restore().await;
    let converged_in = converge(&fake, &views).await;
    let end = hub.sample(started)?;
    println!("{}", end.line(&stats, true));
    samples.push(end);
    let verdicts = views
        .iter()
        .map(|view| compare(&upstream_view(&fake), &client_view(view)))
        .collect::<Vec<_>>();
    summary(&samples, &stats, outages, converged_in, &verdicts);
    let log = hub.log_text();
    let panicked = log.lines().filter(|l| l.contains("panicked")).count();
    ensure!(panicked == 0, "the hub logged {panicked} panics");
    ensure!(
        verdicts.iter().all(Option::is_none),
        "a client's view differs from the apiserver's"
    );
    Ok(())
}

// ---- the clients ---------------------------------------------------------------------------

/// What the clients saw, shared by all of them.
#[derive(Default)]
struct Stats {
    /// Watch-stream errors by kind (a reflector relists after each).
    watch_errors: Mutex<BTreeMap<String, u64>>,
    gets_ok: AtomicU64,
    gets_not_found: AtomicU64,
    /// GETs answered otherwise, by code or error.
    get_errors: Mutex<BTreeMap<String, u64>>,
}

impl Stats {
    fn count(map: &Mutex<BTreeMap<String, u64>>, kind: String) {
        *map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    fn total(map: &Mutex<BTreeMap<String, u64>>) -> u64 {
        map.lock().unwrap_or_else(|e| e.into_inner()).values().sum()
    }

    fn kinds(map: &Mutex<BTreeMap<String, u64>>) -> String {
        let map = map.lock().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return "none".into();
        }
        map.iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn kube_client(proxy: SocketAddr) -> Result<kube::Client> {
    let mut config = kube::Config::new(format!("http://{proxy}").parse()?);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(KUBELET_UA),
    ));
    Ok(kube::Client::try_from(config)?)
}

/// kubelet's pod source: a reflector over the node's pods, restarting (with backoff) after
/// every error, which is counted.
fn spawn_reflector(client: &kube::Client, index: usize, stats: Arc<Stats>) -> Store<Pod> {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={NODE}"));
    let (view, writer) = reflector::store::<Pod>();
    let stream = reflector::reflector(writer, watcher(pods, config)).default_backoff();
    tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                Stats::count(&stats.watch_errors, error_kind(&e));
                if std::env::var_os("SOAK_VERBOSE").is_some() {
                    eprintln!("client {index}: {e}");
                }
            }
        }
    });
    view
}

/// kubelet's status manager: GETs of its pods, one after another.
async fn get_loop(
    client: kube::Client,
    view: Store<Pod>,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
) {
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut n = 0usize;
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(GET_EVERY).await;
        let names: Vec<String> = view.state().iter().map(|p| p.name_any()).collect();
        let Some(name) = names.get(n % names.len().max(1)) else {
            continue;
        };
        n += 1;
        match pods.get_opt(name).await {
            Ok(Some(_)) => stats.gets_ok.fetch_add(1, Ordering::Relaxed),
            Ok(None) => stats.gets_not_found.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                Stats::count(&stats.get_errors, error_kind(&e));
                0
            }
        };
    }
}

fn error_kind(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    // A Status names its code and reason; anything else is named by its first words.
    match text.find("code: ") {
        Some(at) => text[at..].split(',').next().unwrap_or_default().to_owned(),
        None => text.split(':').next().unwrap_or_default().trim().to_owned(),
    }
}

/// The cloud changing under the node: a pod created, one relabelled, one deleted.
async fn churn(fake: Arc<FakeApiServer>, stop: Arc<AtomicBool>) {
    let mut next = PODS;
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(CHURN).await;
        let _ = create_pod(&fake, &format!("soak-{next}"));
        next += 1;
        let mut names: Vec<String> = fake
            .list("v1/pods", Some("default"))
            .iter()
            .filter(|p| p["spec"]["nodeName"] == NODE)
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        names.sort_by_key(|n| n.trim_start_matches("soak-").parse::<usize>().unwrap_or(0));
        if let Some(mut pod) = names
            .get(names.len() / 2)
            .and_then(|n| fake.get("v1/pods", Some("default"), n))
        {
            pod["metadata"]["labels"]["generation"] = json!(next.to_string());
            let _ = fake.update("v1/pods", pod);
        }
        if names.len() > PODS
            && let Some(oldest) = names.first()
        {
            let _ = fake.delete("v1/pods", Some("default"), oldest);
        }
    }
}

fn create_pod(fake: &FakeApiServer, name: &str) -> Result<()> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "soak"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]}
    });
    fake.create("v1/pods", pod)
        .map(|_| ())
        .map_err(|s| anyhow!("create {name}: {}", s.message))
}

// ---- convergence -------------------------------------------------------------------------

/// `name -> resourceVersion` of the node's pods.
type View = BTreeMap<String, String>;

fn upstream_view(fake: &FakeApiServer) -> View {
    fake.list("v1/pods", Some("default"))
        .iter()
        .filter(|p| p["spec"]["nodeName"] == NODE)
        .map(|p| (field(p, "name"), field(p, "resourceVersion")))
        .collect()
}

fn field(pod: &Value, name: &str) -> String {
    pod["metadata"][name]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn client_view(view: &Store<Pod>) -> View {
    view.state()
        .iter()
        .map(|p| (p.name_any(), p.resource_version().unwrap_or_default()))
        .collect()
}

/// `None` when equal; otherwise what differs, briefly.
fn compare(upstream: &View, client: &View) -> Option<String> {
    if upstream == client {
        return None;
    }
    let missing = upstream.keys().filter(|k| !client.contains_key(*k)).count();
    let extra = client.keys().filter(|k| !upstream.contains_key(*k)).count();
    let stale = upstream
        .iter()
        .filter(|(k, v)| client.get(*k).is_some_and(|c| c != *v))
        .count();
    Some(format!(
        "{missing} missing, {extra} extra, {stale} at another resourceVersion"
    ))
}

/// Waits (bounded) until every client's view equals the apiserver's; how long it took.
async fn converge(fake: &FakeApiServer, views: &[Store<Pod>]) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < CONVERGE {
        let upstream = upstream_view(fake);
        if views
            .iter()
            .all(|v| compare(&upstream, &client_view(v)).is_none())
        {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

// ---- reporting ---------------------------------------------------------------------------

/// The hub's resources at one moment.
struct Sample {
    at: Duration,
    rss_kib: u64,
    fds: usize,
}

impl Sample {
    fn line(&self, stats: &Stats, cloud_up: bool) -> String {
        format!(
            "t={:>5.0}s cloud={:<4} rss={:>6.1} MiB fds={:>4} | gets ok={} not-found={} errors={} | watch errors={}",
            self.at.as_secs_f64(),
            if cloud_up { "up" } else { "down" },
            self.rss_kib as f64 / 1024.0,
            self.fds,
            stats.gets_ok.load(Ordering::Relaxed),
            stats.gets_not_found.load(Ordering::Relaxed),
            Stats::total(&stats.get_errors),
            Stats::total(&stats.watch_errors),
        )
    }
}

fn summary(
    samples: &[Sample],
    stats: &Stats,
    outages: usize,
    converged_in: Option<Duration>,
    verdicts: &[Option<String>],
) {
    let (first, last) = (&samples[0], &samples[samples.len() - 1]);
    let peak_rss = samples.iter().map(|s| s.rss_kib).max().unwrap_or_default();
    let peak_fds = samples.iter().map(|s| s.fds).max().unwrap_or_default();
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "summary after {:.0} s, {outages} outages:",
        last.at.as_secs_f64()
    );
    println!(
        "  RSS  start {:.1} MiB, peak {:.1} MiB, end {:.1} MiB",
        mib(first.rss_kib),
        mib(peak_rss),
        mib(last.rss_kib)
    );
    println!(
        "  fds  start {}, peak {peak_fds}, end {}",
        first.fds, last.fds
    );
    println!(
        "  GETs {} ok, {} not found; errors: {}",
        stats.gets_ok.load(Ordering::Relaxed),
        stats.gets_not_found.load(Ordering::Relaxed),
        Stats::kinds(&stats.get_errors)
    );
    println!(
        "  watch errors (each followed by a relist): {}",
        Stats::kinds(&stats.watch_errors)
    );
    match converged_in {
        Some(d) => println!(
            "  with the cloud back, every view converged in {:.1} s",
            d.as_secs_f64()
        ),
        None => println!("  with the cloud back, the views did not converge within {CONVERGE:?}"),
    }
    for (i, verdict) in verdicts.iter().enumerate() {
        match verdict {
            None => println!("  client {i}: its view equals the apiserver's pods of {NODE}"),
            Some(diff) => println!("  client {i}: DIFFERS from the apiserver: {diff}"),
        }
    }
}

// ---- the hub as a child process ----------------------------------------------------------

/// The e2e tests' flags (`tests/support`): ports picked by the OS, probes every second.
fn hub_args(server: &str, files: &outpost_testkit::NodeCertFiles, dir: &Path) -> Vec<String> {
    let mut args = harness::hub_flags(server, files, dir);
    args.extend([
        "--proxy-port=0".into(),
        "--serve-port=0".into(),
        "--heartbeat-interval-seconds=1".into(),
        "--kubelet-healthz-url=".into(),
    ]);
    args
}

/// The hub and its proxy port.
struct Hub {
    process: HubChild,
    proxy: SocketAddr,
}

impl Hub {
    /// Spawns `bin` and waits (bounded) for its "ready to serve" line, which names its ports.
    fn start(bin: &Path, args: &[String]) -> Result<Hub> {
        let process = HubChild::spawn(bin, args)?;
        let line = process.ready.recv_timeout(START).map_err(|_| {
            anyhow!(
                "hub not ready within {START:?}; log:\n{}",
                process.log_text()
            )
        })?;
        let proxy = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("proxy="))
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("proxy address in {line:?}"))?;
        Ok(Hub { process, proxy })
    }

    fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// The hub's RSS and open descriptors, from `/proc`.
    fn sample(&self, started: Instant) -> Result<Sample> {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.process.child.id()))?.count();
        Ok(Sample {
            at: started.elapsed(),
            rss_kib: self.process.status_kib("VmRSS:")?,
            fds,
        })
    }
}

// ---- arguments ---------------------------------------------------------------------------

struct Args {
    duration: Duration,
    report_every: Duration,
    flap: Duration,
    clients: usize,
    bin: PathBuf,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        duration: Duration::from_secs(600),
        report_every: Duration::from_secs(10),
        flap: Duration::from_secs(30),
        clients: 3,
        bin: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/outpost"),
    };
    const USAGE: &str = "usage: soak [--duration=10m] [--report-every=10s] [--flap=30s] \
                         [--clients=3] [--bin=PATH]";
    for arg in std::env::args().skip(1) {
        let (key, value) = arg
            .split_once('=')
            .with_context(|| format!("{arg:?}: {USAGE}"))?;
        match key {
            "--duration" => args.duration = duration(value)?,
            "--report-every" => args.report_every = duration(value)?,
            "--flap" => args.flap = duration(value)?,
            "--clients" => args.clients = value.parse().context("--clients=N")?,
            "--bin" => args.bin = PathBuf::from(value),
            _ => bail!("unknown argument {arg:?} ({USAGE})"),
        }
    }
    ensure!(args.clients > 0, "--clients must be at least 1");
    ensure!(
        !args.report_every.is_zero() && args.flap >= Duration::from_secs(3),
        "--report-every must be more than 0 and --flap at least 3s"
    );
    ensure!(
        args.bin.is_file(),
        "{} is missing: run `cargo build --release` in the workspace first (or pass --bin=PATH)",
        args.bin.display()
    );
    Ok(args)
}

/// `90s`, `10m`, `1h`, or plain seconds.
fn duration(text: &str) -> Result<Duration> {
    let (number, unit) = text.split_at(text.trim_end_matches(char::is_alphabetic).len());
    let n: u64 = number
        .parse()
        .with_context(|| format!("duration {text:?}"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => bail!("duration {text:?}: the unit is s, m or h"),
    };
    Ok(Duration::from_secs(seconds))
}
