//! Cold boot while offline, and memory: a measurement harness (not a test, not criterion).
//!
//! ```sh
//! cargo build --release
//! cargo run --release -p outpost --example coldboot            # 20 runs per series
//! cargo run --release -p outpost --example coldboot -- --runs=50
//! cargo run --release -p outpost --example coldboot -- --runs=5 --bin=/tmp/other/release/outpost
//! ```
//!
//! 1. Starts the bundled fake apiserver with a full node's worth of objects in real shapes: 110
//!    pods bound to `edge-1` (the fixture's real kube-system pods, renamed), 100 ConfigMaps and
//!    100 Secrets those pods mount, 1,000 Services and 1,000 EndpointSlices.
//! 2. Runs the release `outpost` binary online in edge mode, reads its RSS idle (2 s and 20 s
//!    after it is ready), makes the cache-warming LISTs of kubelet and kube-proxy through it,
//!    reads its RSS again, opens their watches and relists (steady state), and stops it with
//!    SIGTERM.
//! 3. Makes the apiserver refuse connections and, `--runs` times each (interleaved), spawns the
//!    binary on the same cache directory and times, from just before the spawn:
//!    - `list`: the first `200` (served from the edge cache) to kubelet's pod LIST;
//!    - `healthz`: the first `200` from the admin `/v1/healthz` (edge mode: includes opening sled);
//!    - `healthz-cloud`: the same in `--working-mode=cloud` (no cache: exec + flags + certificates
//!      + bind, the floor).
//! 4. Starts it once more offline, serves every warmed request from disk (checking item counts)
//!    and reads its RSS.
//!
//! Every child process is owned by a guard that kills it on drop; everything is on loopback and
//! every wait is bounded.

mod harness;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use harness::{HubChild, NODE};
use outpost_testkit::full_node::{
    MOUNTS, NAMESPACES, app_ns, config_map, endpoint_slice, pod, secret, service,
};
use outpost_testkit::{FakeApiServer, NodeCertFiles};
use serde_json::{Value, json};

const KUBELET_UA: &str = "kubelet/v1.32.4 (linux/amd64) kubernetes/x";
const KUBE_PROXY_UA: &str = "kube-proxy/v1.32.4 (linux/amd64) kubernetes/x";
const KUBE_PROXY_TOKEN: &str = "coldboot-kube-proxy";
/// What kubelet and kube-proxy really send.
const ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";
/// The list measured at cold boot, as kubelet's pod reflector re-lists.
const COLD_LIST: &str = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1";
/// kube-proxy's label selector on services and endpointslices.
const PROXY_SELECTOR: &str = "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name";

const PODS: usize = 110;
const SERVICES: usize = 1000;

/// Bound on every wait for a child process.
/// How long a hub may take to be ready, or to answer: `--deadline-secs` (link/regenerate.sh
/// runs every hub under valgrind, far slower).
static DEADLINE_SECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(10);

fn wait_bound() -> Duration {
    Duration::from_secs(DEADLINE_SECS.load(std::sync::atomic::Ordering::Relaxed))
}
/// Pause between connection attempts while the hub is starting.
const POLL: Duration = Duration::from_micros(200);
/// When an idle hub's memory has stopped growing.
const IDLE_SETTLED: Duration = Duration::from_secs(20);
/// The functions build.rs has placed together in the release binary.
const HOT_ORDER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/link/hot.order");

fn main() -> Result<()> {
    let Args { runs, bin } = parse_args()?;
    println!("{}", hot_order_coverage(&bin));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let fake = rt.block_on(harness::cluster())?;
    // kube-proxy goes with its service account's token, as in a cluster; the node may not list
    // EndpointSlices.
    fake.add_token(
        KUBE_PROXY_TOKEN,
        "system:serviceaccount:kube-system:kube-proxy",
        &["system:serviceaccounts", "system:authenticated"],
    );
    let dir = tempfile::tempdir()?;
    let files = fake
        .pki()
        .write_node_files(&dir.path().join("pki"), NODE)
        .context("node cert files")?;
    let setup = Setup {
        bin,
        server: fake.url(),
        files,
        dir: dir.path().to_owned(),
    };

    let t = Instant::now();
    let warm = populate(&fake)?;
    println!(
        "fake apiserver {}: {} objects created in {:.0} ms",
        fake.url(),
        PODS + 2 * MOUNTS + 2 * SERVICES + NAMESPACES,
        t.elapsed().as_secs_f64() * 1000.0
    );

    // ---- online: RSS idle, warm the cache, RSS with the full-node cache ------------------------
    let hub = Hub::start_ready(&setup, Mode::Edge)?;
    std::thread::sleep(Duration::from_secs(2));
    let idle = hub.memory()?;
    println!("online, idle (2 s after ready):              {idle}");
    // The first seconds' probes, heartbeats and watches still add a little (≈0.8 MiB of heap).
    std::thread::sleep(IDLE_SETTLED - Duration::from_secs(2));
    let idle = hub.memory()?;
    println!("online, idle (20 s after ready):             {idle}");
    let t = Instant::now();
    let mut bytes = 0;
    for w in &warm {
        let resp = http_get(hub.proxy, &w.path, w.agent)?;
        ensure!(
            resp.status == 200,
            "warming {} as {}: {} {}",
            w.path,
            w.agent,
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
        ensure!(
            resp.header("x-outpost-served-from").is_none(),
            "warming {} was not proxied",
            w.path
        );
        let n = item_count(&resp)?;
        ensure!(n == w.items, "{}: {n} items, want {}", w.path, w.items);
        bytes += resp.body.len();
    }
    println!(
        "warmed: {} LISTs, {:.1} MiB of JSON, in {:.2} s",
        warm.len(),
        bytes as f64 / 1048576.0,
        t.elapsed().as_secs_f64()
    );
    // The cache writer applies asynchronously, and the hub gives freed memory back once the burst
    // is over: the RSS is read each second for 10 s, and reported at 3 s and at 10 s.
    let mut settling = Vec::new();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        settling.push(hub.memory()?);
    }
    println!(
        "online, after warming (3 s settle):          {}",
        settling[2]
    );
    println!(
        "online, after warming (10 s settle):         {}",
        settling[9]
    );
    let series: Vec<String> = settling
        .iter()
        .map(|m| format!("{:.1}", mib(m.rss_kib)))
        .collect();
    println!(
        "  VmRSS each second after warming (MiB):     {}",
        series.join(" ")
    );
    let (events, shared) = steady_state(hub.proxy, &warm)?;
    println!(
        "steady state: {events} events from kubelet's and kube-proxy's watches (1 s); \
         {shared} of kube-proxy's 2 relists answered from the shared cache"
    );
    let status = hub.terminate()?;
    ensure!(status.success(), "online hub exited with {status}");
    println!(
        "disk cache: {:.1} MiB on disk",
        dir_size(&setup.dir.join("cache")) as f64 / 1048576.0
    );

    // ---- offline: cold boots ----------------------------------------------------------------
    fake.refuse_connections();
    let mut list = Vec::new();
    let mut accepted = Vec::new();
    let mut healthz = Vec::new();
    let mut healthz_cloud = Vec::new();
    let mut non_ok = 0;
    let mut killed = 0;
    for _ in 0..runs {
        let boots = [
            cold_boot(&setup, Mode::Edge, Probe::List)?,
            cold_boot(&setup, Mode::Edge, Probe::Healthz)?,
            cold_boot(&setup, Mode::Cloud, Probe::Healthz)?,
        ];
        list.push(boots[0].answered);
        accepted.push(boots[0].accepted);
        healthz.push(boots[1].answered);
        healthz_cloud.push(boots[2].answered);
        non_ok += boots[0].non_ok;
        killed += boots.iter().filter(|b| b.killed).count();
    }
    println!("\ncold boot with the apiserver refusing connections, {runs} runs each (ms):");
    println!("  series                                               min     p50     p90     max");
    report("spawn -> first cached pod LIST 200 (edge)", &mut list);
    report("  of which: spawn -> proxy port accepts", &mut accepted);
    report(
        "spawn -> first /v1/healthz 200 (edge, sled opened)",
        &mut healthz,
    );
    report(
        "spawn -> first /v1/healthz 200 (cloud, no cache)",
        &mut healthz_cloud,
    );
    println!("  non-200 answers to the pod LIST before its first 200: {non_ok}");
    println!(
        "  hubs that SIGTERM killed outright (its handler not installed yet): {killed} of {}",
        3 * runs
    );

    // ---- offline: everything served from disk, RSS ------------------------------------------
    let hub = Hub::start_ready(&setup, Mode::Edge)?;
    let t = Instant::now();
    let mut pages = 0;
    for w in &warm {
        // Offline, the cache pages by `limit` even with `resourceVersion=0` (the apiserver's watch
        // cache ignores `limit` then), so follow `continue` as a reflector does.
        let mut n = 0;
        let mut next = String::new();
        loop {
            let path = match next.as_str() {
                "" => w.path.clone(),
                token => format!(
                    "{}&continue={token}",
                    w.path.replace("&resourceVersion=0", "")
                ),
            };
            let resp = http_get(hub.proxy, &path, w.agent)?;
            ensure!(
                resp.status == 200 && resp.header("x-outpost-served-from") == Some("edge-cache"),
                "offline {path} as {}: {} {:?} {}",
                w.agent,
                resp.status,
                resp.header("x-outpost-served-from"),
                String::from_utf8_lossy(&resp.body)
            );
            let list: Value = serde_json::from_slice(&resp.body)?;
            n += list["items"].as_array().map_or(0, Vec::len);
            pages += 1;
            match list["metadata"]["continue"].as_str() {
                Some(token) if !token.is_empty() => next = encode(token),
                _ => break,
            }
        }
        ensure!(
            n == w.items,
            "offline {}: {n} items, want {}",
            w.path,
            w.items
        );
    }
    println!(
        "\noffline: all {} warmed LISTs ({pages} pages) served from the edge cache with the right item counts in {:.2} s",
        warm.len(),
        t.elapsed().as_secs_f64()
    );
    let offline = hub.memory()?;
    println!("offline restart, after serving them all:     {offline}");
    let status = hub.terminate()?;
    ensure!(status.success(), "offline hub exited with {status}");
    drop(rt);
    Ok(())
}

/// `--runs=N` (default 20) and `--bin=PATH` (default: the workspace's release build), so that
/// builds with other profiles can be measured by the same harness.
struct Args {
    runs: usize,
    bin: PathBuf,
}

fn parse_args() -> Result<Args> {
    let mut runs = 20;
    let mut bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/outpost");
    for arg in std::env::args().skip(1) {
        if let Some(n) = arg.strip_prefix("--runs=") {
            runs = n.parse().context("--runs=N")?;
        } else if let Some(path) = arg.strip_prefix("--bin=") {
            bin = PathBuf::from(path);
        } else if let Some(n) = arg.strip_prefix("--deadline-secs=") {
            let secs: u64 = n.parse().context("--deadline-secs=N")?;
            DEADLINE_SECS.store(secs, std::sync::atomic::Ordering::Relaxed);
        } else {
            bail!(
                "unknown argument {arg:?} (usage: coldboot [--runs=N] [--bin=PATH] [--deadline-secs=N])"
            );
        }
    }
    ensure!(runs > 0, "--runs must be at least 1");
    ensure!(
        bin.is_file(),
        "{} is missing: run `cargo build --release` in the workspace first",
        bin.display()
    );
    Ok(Args { runs, bin })
}

/// After the start-up lists: kubelet's and kube-proxy's watches (from resourceVersion 0, so
/// they start with every object; one second each, at once) and kube-proxy's relists. Returns the
/// events seen and how many relists the shared cache answered. This is also the steady state
/// `link/regenerate.sh` profiles.
fn steady_state(proxy: SocketAddr, warm: &[Warm]) -> Result<(usize, usize)> {
    let kube_proxy: Vec<&Warm> = warm.iter().filter(|w| w.agent == KUBE_PROXY_UA).collect();
    let watched: Vec<&Warm> = warm[..2]
        .iter()
        .chain(kube_proxy[1..].iter().copied())
        .collect();
    let events = std::thread::scope(|scope| {
        let watches: Vec<_> = watched
            .iter()
            .map(|w| {
                let path = w.path.replace("&limit=500", "") + "&watch=true&timeoutSeconds=1";
                scope.spawn(move || -> Result<usize> {
                    let resp = http_get(proxy, &path, w.agent)?;
                    ensure!(resp.status == 200, "watch {path}: {}", resp.status);
                    let events = resp.body.split(|b| *b == b'\n').filter(|l| !l.is_empty());
                    let events = events.count();
                    ensure!(events >= w.items, "watch {path}: {events} events");
                    Ok(events)
                })
            })
            .collect();
        watches
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow!("a watch panicked"))?)
            .sum::<Result<usize>>()
    })?;
    let mut shared = 0;
    for w in &kube_proxy[1..] {
        let resp = http_get(proxy, &w.path, w.agent)?;
        ensure!(resp.status == 200, "relist {}: {}", w.path, resp.status);
        ensure!(item_count(&resp)? == w.items, "relist {}", w.path);
        shared += usize::from(resp.header("x-outpost-served-from") == Some("shared-cache"));
    }
    Ok((events, shared))
}

/// How many of `link/hot.order`'s functions the binary defines: few means the file is stale
/// (another compiler, changed dependencies) and the idle RSS figures are the unordered layout's.
fn hot_order_coverage(bin: &Path) -> String {
    let Ok(order) = std::fs::read_to_string(HOT_ORDER) else {
        return format!("{HOT_ORDER} is missing");
    };
    let wanted: Vec<&str> = order.lines().filter(|l| !l.starts_with('#')).collect();
    let nm = Command::new("nm").arg("--defined-only").arg(bin).output();
    let Some(nm) = nm.ok().filter(|out| out.status.success()) else {
        return format!(
            "hot functions: cannot read {}'s symbols with nm",
            bin.display()
        );
    };
    let defined: std::collections::HashSet<&str> = std::str::from_utf8(&nm.stdout)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let found = wanted.iter().filter(|s| defined.contains(*s)).count();
    format!(
        "hot functions placed together: {found} of the {} in link/hot.order are in this binary",
        wanted.len()
    )
}

// ---- the full node ----------------------------------------------------------------------------

/// One cache-warming request and how many items its list must hold.
struct Warm {
    path: String,
    agent: &'static str,
    items: usize,
}

/// Creates the node's objects in the fake and returns kubelet's and kube-proxy's start-up LISTs.
fn populate(fake: &FakeApiServer) -> Result<Vec<Warm>> {
    let create = |gvr: &str, obj: Value| {
        fake.create(gvr, obj)
            .map(drop)
            .map_err(|s| anyhow!("create {gvr}: {}", s.message))
    };
    for ns in 0..NAMESPACES {
        create(
            "v1/namespaces",
            json!({"metadata": {"name": format!("app-{ns}")}}),
        )?;
    }
    let fixture: Value =
        serde_json::from_str(include_str!("../../testkit/fixtures/kube-system-pods.json"))?;
    let shapes = fixture["items"]
        .as_array()
        .filter(|a| !a.is_empty())
        .context("fixture pods")?;
    for i in 0..PODS {
        create("v1/pods", pod(&shapes[i % shapes.len()], i, NODE))?;
    }
    for i in 0..MOUNTS {
        create("v1/configmaps", config_map(i))?;
        create("v1/secrets", secret(i))?;
    }
    for i in 0..SERVICES {
        create("v1/services", service(i))?;
        create(
            "discovery.k8s.io/v1/endpointslices",
            endpoint_slice(i, NODE),
        )?;
    }

    let by_name = "&limit=500&resourceVersion=0";
    let mut warm = vec![
        Warm {
            path: format!("/api/v1/nodes?fieldSelector=metadata.name%3D{NODE}{by_name}"),
            agent: KUBELET_UA,
            items: 1,
        },
        Warm {
            path: format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}{by_name}"),
            agent: KUBELET_UA,
            items: PODS,
        },
    ];
    for i in 0..MOUNTS {
        for (plural, name) in [("configmaps", "app-config"), ("secrets", "app-secret")] {
            warm.push(Warm {
                path: format!(
                    "/api/v1/namespaces/{}/{plural}?fieldSelector=metadata.name%3D{name}-{i}{by_name}",
                    app_ns(i)
                ),
                agent: KUBELET_UA,
                items: 1,
            });
        }
    }
    warm.push(Warm {
        path: format!("/api/v1/nodes?fieldSelector=metadata.name%3D{NODE}{by_name}"),
        agent: KUBE_PROXY_UA,
        items: 1,
    });
    // The seeded `default/kubernetes` Service is listed too; it has no EndpointSlice.
    warm.push(Warm {
        path: format!("/api/v1/services?{PROXY_SELECTOR}{by_name}"),
        agent: KUBE_PROXY_UA,
        items: SERVICES + 1,
    });
    warm.push(Warm {
        path: format!("/apis/discovery.k8s.io/v1/endpointslices?{PROXY_SELECTOR}{by_name}"),
        agent: KUBE_PROXY_UA,
        items: SERVICES,
    });
    Ok(warm)
}

// ---- the hub as a child process -----------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Edge,
    Cloud,
}

#[derive(Clone, Copy)]
enum Probe {
    List,
    Healthz,
}

struct Setup {
    bin: PathBuf,
    server: String,
    files: NodeCertFiles,
    dir: PathBuf,
}

impl Setup {
    /// The flags of the e2e tests' `hub_args`, with fixed loopback ports.
    fn args(&self, mode: Mode, proxy: u16, admin: u16) -> Vec<String> {
        let mode = match mode {
            Mode::Edge => "edge",
            Mode::Cloud => "cloud",
        };
        let mut args = harness::hub_flags(&self.server, &self.files, &self.dir);
        args.extend([
            format!("--working-mode={mode}"),
            format!("--proxy-port={proxy}"),
            format!("--serve-port={admin}"),
            "--v=2".into(),
        ]);
        args
    }
}

/// Two distinct free loopback ports (bound together, then released).
fn free_ports() -> Result<(u16, u16)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// The `outpost` binary as a child process; killed (and reaped) on drop.
struct Hub {
    process: HubChild,
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Hub {
    fn spawn(setup: &Setup, mode: Mode) -> Result<Hub> {
        let (proxy, admin) = free_ports()?;
        Ok(Hub {
            process: HubChild::spawn(&setup.bin, &setup.args(mode, proxy, admin))?,
            proxy: SocketAddr::from(([127, 0, 0, 1], proxy)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
        })
    }

    /// Spawns and waits (bounded) for the "ready to serve" line.
    fn start_ready(setup: &Setup, mode: Mode) -> Result<Hub> {
        let hub = Hub::spawn(setup, mode)?;
        if hub.process.ready.recv_timeout(wait_bound()).is_err() {
            bail!(
                "hub not ready within {:?}; log:\n{}",
                wait_bound(),
                hub.log_text()
            );
        }
        Ok(hub)
    }

    fn log_text(&self) -> String {
        self.process.log_text()
    }

    fn memory(&self) -> Result<Memory> {
        let field = |key: &str| self.process.status_kib(key);
        Ok(Memory {
            rss_kib: field("VmRSS:")?,
            anon_kib: field("RssAnon:")?,
            file_kib: field("RssFile:")?,
            hwm_kib: field("VmHWM:")?,
        })
    }

    /// SIGTERM, then a bounded wait for the exit.
    fn terminate(mut self) -> Result<ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.process.child.id().to_string()])
            .status()
            .context("kill -TERM")?;
        let deadline = Instant::now() + wait_bound();
        loop {
            if let Some(status) = self.process.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("hub did not exit after SIGTERM; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

struct Memory {
    rss_kib: u64,
    /// Heap, stacks, sled's page cache.
    anon_kib: u64,
    /// Mapped files: mostly the binary's own pages.
    file_kib: u64,
    hwm_kib: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.1} MiB (anon {:.1}, file {:.1}; peak VmHWM {:.1})",
            mib(self.rss_kib),
            mib(self.anon_kib),
            mib(self.file_kib),
            mib(self.hwm_kib)
        )
    }
}

/// One cold boot, timed from just before the spawn.
struct Boot {
    /// The first `200` to the probe.
    answered: Duration,
    /// The first accepted connection to the probed port.
    accepted: Duration,
    /// Answers other than `200` before that.
    non_ok: usize,
    /// SIGTERM killed the hub before its handler was installed.
    killed: bool,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Spawns the hub and polls `probe` until it answers `200`.
fn cold_boot(setup: &Setup, mode: Mode, probe: Probe) -> Result<Boot> {
    let start = Instant::now();
    let mut hub = Hub::spawn(setup, mode)?;
    let deadline = start + wait_bound();
    let (addr, path, agent) = match probe {
        Probe::List => (hub.proxy, COLD_LIST, KUBELET_UA),
        Probe::Healthz => (hub.admin, "/v1/healthz", "coldboot"),
    };
    let mut accepted = None;
    let mut non_ok = 0;
    let resp = loop {
        if let Some(status) = hub.process.child.try_wait()? {
            bail!("hub exited with {status}; log:\n{}", hub.log_text());
        }
        match TcpStream::connect(addr) {
            Ok(stream) => {
                accepted.get_or_insert_with(|| start.elapsed());
                let resp = exchange(stream, path, agent)?;
                if resp.status == 200 {
                    break resp;
                }
                non_ok += 1;
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e).context("connect to the hub"),
        }
        if Instant::now() > deadline {
            bail!(
                "no 200 for {path} within {:?}; log:\n{}",
                deadline - start,
                hub.log_text()
            );
        }
        std::thread::sleep(POLL);
    };
    let answered = start.elapsed();
    if let Probe::List = probe {
        ensure!(
            resp.header("x-outpost-served-from") == Some("edge-cache"),
            "cold LIST not served from the edge cache: {:?}",
            resp.headers
        );
        let n = item_count(&resp)?;
        ensure!(n == PODS, "cold LIST: {n} pods, want {PODS}");
    }
    // The hub installs its SIGTERM handler only after "ready to serve", a little after its ports
    // answer; a SIGTERM before that kills it with the default disposition. Wait (bounded) for the
    // line, and count the deaths by signal that still happen.
    let ready = hub.process.ready.recv_timeout(wait_bound()).is_ok();
    let log = hub.process.log();
    let status = hub.terminate()?;
    let killed = status.signal() == Some(15);
    ensure!(
        ready && (status.success() || killed),
        "hub exited with {status} (ready line seen: {ready}); log:\n{}",
        log.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    );
    Ok(Boot {
        answered,
        accepted: accepted.unwrap_or(answered),
        non_ok,
        killed,
    })
}

fn report(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // Nearest rank.
    let rank =
        |p: f64| samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "  {name:<50} {:>6.1}  {:>6.1}  {:>6.1}  {:>6.1}",
        ms(samples[0]),
        ms(rank(0.5)),
        ms(rank(0.9)),
        ms(samples[samples.len() - 1])
    );
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

// ---- a minimal blocking HTTP/1.1 client -------------------------------------------------------

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn http_get(addr: SocketAddr, path: &str, agent: &str) -> Result<Response> {
    exchange(TcpStream::connect(addr)?, path, agent)
}

/// One `GET` with `Connection: close`; reads until EOF (bounded by a read timeout).
fn exchange(mut stream: TcpStream, path: &str, agent: &str) -> Result<Response> {
    stream.set_read_timeout(Some(wait_bound()))?;
    stream.set_nodelay(true)?;
    let auth = if agent == KUBE_PROXY_UA {
        format!("Authorization: Bearer {KUBE_PROXY_TOKEN}\r\n")
    } else {
        String::new()
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: {agent}\r\nAccept: {ACCEPT}\r\n{auth}Connection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).context("read the response")?;
    parse(&buf)
}

fn parse(buf: &[u8]) -> Result<Response> {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("no header end in {:?}", String::from_utf8_lossy(buf)))?;
    let head = String::from_utf8_lossy(&buf[..split]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .context("status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let raw = &buf[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(raw)? } else { raw.to_vec() };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("chunk size line")?;
        let text = String::from_utf8_lossy(&raw[..end]);
        let size = usize::from_str_radix(text.split(';').next().unwrap_or("").trim(), 16)
            .context("chunk size")?;
        raw = &raw[end + 2..];
        if size == 0 {
            return Ok(out);
        }
        ensure!(raw.len() >= size + 2, "truncated chunk");
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Percent-encodes a `continue` token for a query string.
fn encode(token: &str) -> String {
    token
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn item_count(resp: &Response) -> Result<usize> {
    let list: Value = serde_json::from_slice(&resp.body).context("list body is JSON")?;
    list["items"]
        .as_array()
        .map(Vec::len)
        .context("list has items")
}
