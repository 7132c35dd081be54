//! An offline reboot, timed: from the hub's start with the cloud unreachable until a Kubernetes
//! 1.32 kubelet's whole boot (`outpost_testkit::kubelet_boot`) is answered. A measurement
//! harness, not a test.
//!
//! ```sh
//! cargo build --release
//! cargo run --release -p outpost --example offline_boot                 # 10 runs, 30 pods
//! cargo run --release -p outpost --example offline_boot -- --runs=20 --pods=110
//! ```
//!
//! 1. The bundled fake apiserver holds a node with `--pods` pods, each with a ConfigMap, a
//!    Secret and a projected service-account token, and a Service whose EndpointSlice points
//!    at them.
//! 2. The release binary boots kubelet online once (so the cache has what kubelet read), then
//!    stops; the apiserver starts refusing connections.
//! 3. `--runs` times: the binary is spawned on the same cache and kubelet's boot is sent from
//!    just after the spawn, again and again until every answer is one kubelet can go on with
//!    (as kubelet retries). Reported: the time from the spawn until such a boot completed
//!    (`boot answered`), and how long that last replay took (`replay`).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use outpost_testkit::kubelet_boot::{self, Boot, Scenario};
use outpost_testkit::{FakeApiServer, FakeConfig, NodeCertFiles};

const NODE: &str = "edge-1";
/// Bound on the wait for one boot to be answered.
const DEADLINE: Duration = Duration::from_secs(30);

fn main() -> Result<()> {
    let (runs, pods) = parse_args()?;
    let bin = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/release/outpost"
    ));
    ensure!(
        bin.is_file(),
        "{} is missing: cargo build --release",
        bin.display()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let fake = rt.block_on(FakeApiServer::start(FakeConfig::default()))?;
    let rbac = outpost_testkit::manifest::load_yaml(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../manifests/cluster/rbac.yaml"
    ))?;
    fake.apply_rbac(&rbac)
        .map_err(|s| anyhow!("hub RBAC: {}", s.message))?;
    let old_ip = |i: usize| format!("10.244.{}.{}", 1 + i / 200, 10 + i % 200);
    let new_ip = |i: usize| format!("10.245.{}.{}", 1 + i / 200, 10 + i % 200);
    Scenario::create(&fake, NODE, pods, old_ip);
    let dir = tempfile::tempdir()?;
    let files = fake.pki().write_node_files(&dir.path().join("pki"), NODE)?;
    let setup = Setup {
        bin,
        server: fake.url(),
        files,
        dir: dir.path().to_owned(),
    };

    let hub = Hub::spawn(&setup)?;
    let online = rt.block_on(boot_answered(&hub, "boot-0", &old_ip))?;
    println!(
        "online: kubelet's boot ({} requests, {pods} pods) answered in {:.1} ms",
        online.1,
        online.0.as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_millis(500));
    drop(hub);
    fake.refuse_connections();

    let (mut answered, mut replays) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let started = Instant::now();
        let hub = Hub::spawn(&setup)?;
        let boot_id = format!("boot-{}", run + 1);
        let (replay, _) = rt.block_on(boot_answered(&hub, &boot_id, &new_ip))?;
        answered.push(started.elapsed());
        replays.push(replay);
    }
    report("offline: hub start -> boot answered", &mut answered);
    report("offline: the answered boot's replay", &mut replays);
    rt.block_on(fake.shutdown());
    Ok(())
}

/// Replays kubelet's boot until every answer is usable; the last replay's duration and size.
async fn boot_answered(
    hub: &Hub,
    boot_id: &str,
    ip: &(dyn Fn(usize) -> String + Sync),
) -> Result<(Duration, usize)> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let report = kubelet_boot::replay(&Boot {
            hub: hub.proxy,
            node: NODE,
            boot_id,
            pod_ip: ip,
            now: "2026-11-26T12:00:00Z",
        })
        .await;
        if report.unusable().is_empty() {
            return Ok((report.elapsed, report.exchanges.len()));
        }
        ensure!(
            Instant::now() < deadline,
            "kubelet's boot never answered:\n{}",
            report.summary()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn report(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name}: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms ({} runs)",
        ms(at(0.5)),
        ms(at(0.9)),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

fn parse_args() -> Result<(usize, usize)> {
    let (mut runs, mut pods) = (10, 30);
    for arg in std::env::args().skip(1) {
        match arg.split_once('=') {
            Some(("--runs", n)) => runs = n.parse().context("--runs")?,
            Some(("--pods", n)) => pods = n.parse().context("--pods")?,
            _ => anyhow::bail!("unknown argument {arg} (--runs=N, --pods=N)"),
        }
    }
    ensure!(runs > 0 && pods > 0, "--runs and --pods must be positive");
    Ok((runs, pods))
}

struct Setup {
    bin: PathBuf,
    server: String,
    files: NodeCertFiles,
    dir: PathBuf,
}

/// The release binary as a child process; killed (and reaped) on drop.
struct Hub {
    child: Child,
    proxy: SocketAddr,
}

impl Hub {
    fn spawn(setup: &Setup) -> Result<Hub> {
        let (proxy, admin) = {
            let a = TcpListener::bind("127.0.0.1:0")?;
            let b = TcpListener::bind("127.0.0.1:0")?;
            (a.local_addr()?.port(), b.local_addr()?.port())
        };
        let d = &setup.dir;
        let child = Command::new(&setup.bin)
            .args([
                format!("--server-addr={}", setup.server),
                format!("--node-name={NODE}"),
                "--bootstrap-mode=kubeletcertificate".into(),
                format!(
                    "--kubelet-client-certificate={}",
                    setup.files.client_pem.display()
                ),
                format!("--kubelet-ca-file={}", setup.files.ca_crt.display()),
                format!("--proxy-port={proxy}"),
                format!("--serve-port={admin}"),
                format!("--root-dir={}", d.join("root").display()),
                format!("--disk-cache-path={}", d.join("cache").display()),
                "--enable-dummy-if=false".into(),
                "--proxy-secure-port=0".into(),
                "--heartbeat-interval-seconds=1".into(),
                "--kubelet-healthz-url=".into(),
            ])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn outpost")?;
        let proxy: SocketAddr = format!("127.0.0.1:{proxy}").parse()?;
        let hub = Hub { child, proxy };
        // Until the port is bound, kubelet's requests are refused; the replay retries them.
        let deadline = Instant::now() + DEADLINE;
        while TcpStream::connect(proxy).is_err() {
            ensure!(Instant::now() < deadline, "the hub never listened");
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(hub)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
