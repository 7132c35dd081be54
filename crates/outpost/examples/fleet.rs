//! A fleet of hubs in front of one apiserver, through an outage: a measurement harness (not a
//! test, not criterion) for issue 27's fleet-scale targets.
//!
//! ```sh
//! cargo build --release -p outpost --bin outpost
//! cargo run --release -p outpost --example fleet -- --hubs=10 --outage=20
//! cargo run --release -p outpost --example fleet -- --hubs=200 --json=fleet.json
//! cargo run --release -p outpost --example fleet -- --http1-only-apiserver --hub-arg=--v=2
//! ```
//!
//! 1. Starts the bundled fake apiserver (HTTP/2 and HTTP/1.1 by ALPN unless
//!    `--http1-only-apiserver`; gzip for large answers unless `--apiserver-gzip=false`;
//!    bookmarks every minute, as kube-apiserver's watch cache sends them) with one Node per hub,
//!    its `--pods-per-node` pods, the 10 ConfigMaps and 10 Secrets they mount, and `--services`
//!    Services with their EndpointSlices; reads kube-proxy's Service + EndpointSlice LISTs once
//!    straight from it, plain and gzip-accepting, to price them on the wire.
//! 2. Starts `--hubs` release `outpost` binaries, `--start-batch` at a time (fewer if the next
//!    batch would leave less than `--min-free-memory` GiB of memory or `--min-free-disk` GiB
//!    under `--dir`, where the hubs' directories go: the run then says so), each with its own
//!    node name and client certificate, root and cache directories and loopback address
//!    (127.77.x.y, ports picked by the OS), edge mode with the hub's defaults, plus
//!    `--hub-arg`s; and for each, as soon as it is ready, its node's workload
//!    (`fleetkit::workload`: kubelet, kube-proxy, coredns as client-go's reflectors run them).
//! 3. Changes the cloud at `--churn` updates per second for the whole run (in turn a pod's
//!    label, an EndpointSlice's label, a ConfigMap's data, on a random node).
//! 4. Phases, each reported per hub (median, max) and for the fleet: start-up (until every
//!    reflector has listed), `--settle` seconds, the steady state (`--steady` seconds), the
//!    outage (`--outage` seconds of refused connections; half-way through, one pod of every
//!    node is relabelled, so that every hub has something to catch up), and the reconnect: from the return
//!    until every hub's cache and kube-proxy's view equal the apiserver (bounded by
//!    `--converge-within`), and at least `--reconnect-window` seconds.
//! 5. Prints a table per phase (or with `--json`, one JSON document; `--json=PATH` writes it
//!    next to the tables), the requests lost (client requests without a usable answer outside
//!    the outage) and the hubs' most frequent warnings; `--dump-requests=PATH` writes the
//!    apiserver's whole request log, `--keep-logs=DIR` every hub's log. Exits 1 if a hub did
//!    not converge.
//!
//! Upstream figures come from the fake's per-connection accounting: a hub's connections are
//! those whose client certificate names its node, or (kube-proxy's and coredns's bearer-token
//! connections) whose first request carries a token of its node. Every child process is owned by
//! a guard that kills it on drop; everything is on loopback and every wait is bounded.

mod fleetkit;
mod harness;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use fleetkit::cluster::{self, NAMESPACE, REFS, Shape};
use fleetkit::converge::{self, Converged};
use fleetkit::hub::{self, Hub};
use fleetkit::report::{Phase, Row, Unit, percentile};
use fleetkit::requests::{self, HubIndex};
use fleetkit::sample::{self, HubCounters, HubProbe, Snapshot};
use fleetkit::workload::{Failure, NodeClients, Rng};
use outpost_testkit::{FakeApiServer, FakeConfig, RequestRecord};
use serde_json::{Value, json};

/// Bound on one batch of hubs' first lists.
const SYNC_WITHIN: Duration = Duration::from_secs(180);
/// kube-apiserver's watch cache sends a bookmark about once a minute.
const BOOKMARKS_EVERY: Duration = Duration::from_secs(60);

fn main() -> Result<()> {
    let args = Args::parse()?;
    // Two runtimes, so that the apiserver's CPU can be told from the clients'.
    let fake_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fake")
        .enable_all()
        .build()?;
    let clients_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("clients")
        .enable_all()
        .build()?;
    let outcome = clients_rt.block_on(run(&args, fake_rt.handle().clone()));
    drop(clients_rt);
    drop(fake_rt);
    let converged = outcome?;
    ensure!(converged, "a hub did not converge within --converge-within");
    Ok(())
}

macro_rules! progress {
    ($start:expr, $($arg:tt)*) => {
        eprintln!("[{:>6.1}s] {}", $start.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

/// A hub, its ports and its node's clients.
struct Member {
    hub: Hub,
    ready: hub::Ready,
    clients: NodeClients,
}

async fn run(args: &Args, fake_rt: tokio::runtime::Handle) -> Result<bool> {
    let t0 = Instant::now();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    progress!(t0, "load average before the run: {}", loadavg.trim());
    let config = FakeConfig {
        http2: !args.http1_only_apiserver,
        gzip: args.apiserver_gzip,
        bookmark_interval: BOOKMARKS_EVERY,
        ..FakeConfig::default()
    };
    let fake = Arc::new(
        fake_rt
            .spawn(harness::cluster_with(config))
            .await
            .context("the fake's runtime")??,
    );
    fake.add_token(
        fleetkit::probe::TOKEN,
        fleetkit::probe::USER,
        &[cluster::AGENTS_GROUP, "system:authenticated"],
    );
    let shape = Shape {
        nodes: args.hubs,
        pods_per_node: args.pods_per_node,
        services: args.services,
    };
    let created = cluster::populate(&fake, &shape)?;
    progress!(t0, "apiserver {}: {created} objects", fake.url());
    let list_cost = fleetkit::probe::list_cost(&fake).await?;

    let dir = tempfile::Builder::new()
        .prefix("outpost-fleet-")
        .tempdir_in(&args.dir)
        .with_context(|| format!("the fleet's directory in {}", args.dir.display()))?;
    let url = fake.url();
    let common = hub::Common {
        bin: &args.bin,
        server: &url,
        pki: fake.pki(),
        extra: &args.hub_args,
    };
    let mut nodes: Vec<String> = (0..args.hubs).map(cluster::node_name).collect();
    let churned = Arc::new(AtomicU64::new(0));
    let churn = tokio::spawn(churn(
        fake.clone(),
        args.churn,
        nodes.clone(),
        (args.pods_per_node, args.services),
        churned.clone(),
    ));

    // ---- start-up ----------------------------------------------------------------------------
    let start = sample::take(&fake, &[]);
    let mut fleet: Vec<Member> = Vec::new();
    let mut held_back = None;
    for batch in (0..args.hubs).collect::<Vec<_>>().chunks(args.start_batch) {
        if let Some(short) = short_of_room(args, dir.path(), batch.len()) {
            progress!(t0, "not starting more hubs: {short}");
            held_back = Some(short);
            break;
        }
        let mut spawned = Vec::new();
        for &i in batch {
            let node = &nodes[i];
            spawned.push(Hub::spawn(&common, i, node, &dir.path().join(node))?);
        }
        let first = fleet.len();
        for hub in spawned {
            let ready = hub.ready().await?;
            let clients = NodeClients::start(&hub.node, ready.proxy, hub.index as u64);
            fleet.push(Member {
                hub,
                ready,
                clients,
            });
        }
        wait_synced(&fleet[first..]).await?;
        progress!(t0, "{} hubs up, their clients synced", fleet.len());
    }
    // The nodes without a hub keep their objects; only the hubs' are measured and changed.
    nodes.truncate(fleet.len());
    let synced = snapshot(&fake, &fleet);
    let startup_until = Instant::now();
    progress!(t0, "settling for {:?}", args.settle);
    tokio::time::sleep(args.settle).await;

    // ---- steady state ------------------------------------------------------------------------
    let steady_from = snapshot(&fake, &fleet);
    tokio::time::sleep(args.steady).await;
    let steady_to = snapshot(&fake, &fleet);
    progress!(t0, "steady state measured; the apiserver goes away");

    // ---- outage ------------------------------------------------------------------------------
    let down = Instant::now();
    fake.refuse_connections();
    tokio::time::sleep(args.outage / 2).await;
    // Every node's pods change while its hub is cut off, so that every cache has to catch up.
    let offline_changes = relabel_one_pod_per_node(&fake, &nodes, args.pods_per_node);
    tokio::time::sleep((down + args.outage).saturating_duration_since(Instant::now())).await;
    let outage_to = snapshot(&fake, &fleet);
    let restore = fake.clone();
    fake_rt
        .spawn(async move { restore.restore().await })
        .await
        .context("restore")?;
    let up = Instant::now();
    progress!(t0, "the apiserver is back after {:?}", up - down);

    // ---- reconnect ---------------------------------------------------------------------------
    let targets: Vec<converge::Target> = fleet
        .iter()
        .map(|m| converge::Target {
            node: m.hub.node.clone(),
            admin: m.ready.admin,
            views: m.clients.views.clone(),
        })
        .collect();
    let converged = converge::wait(&fake, &targets, up, args.converge_within).await;
    let last = converged
        .iter()
        .flat_map(|c| [c.cache, c.kube_proxy])
        .map(|t| t.unwrap_or(args.converge_within.as_secs_f64()))
        .fold(0.0, f64::max);
    let window = args
        .reconnect_window
        .max(Duration::from_secs_f64(last + 10.0));
    tokio::time::sleep((up + window).saturating_duration_since(Instant::now())).await;
    let reconnect_to = snapshot(&fake, &fleet);
    let end = Instant::now();
    progress!(t0, "reconnect measured; stopping");
    churn.abort();
    for member in &mut fleet {
        member.clients.stop();
    }

    // ---- report ------------------------------------------------------------------------------
    let records = fake.requests();
    let index = HubIndex::new(&nodes);
    let failures: Vec<Vec<Failure>> = fleet.iter().map(|m| m.clients.stats.failures()).collect();
    let mut phases = vec![
        phase(
            "start-up (until every reflector listed)",
            (&start, &synced),
            &records,
            &index,
        ),
        phase("steady state", (&steady_from, &steady_to), &records, &index),
        phase(
            "outage (apiserver refusing connections)",
            (&steady_to, &outage_to),
            &records,
            &index,
        ),
        phase(
            "reconnect (from the return)",
            (&outage_to, &reconnect_to),
            &records,
            &index,
        ),
    ];
    let (returns, per_second) = requests::reconnect(&records, &index, up, end);
    add_reconnect(&mut phases[3], &returns, &per_second, &converged, &nodes);
    let lost = lost_requests(&failures, down, up);
    let warnings = hub_warnings(&fleet);
    let summary = json!({
        "config": args.json(),
        "hubs_started": fleet.len(),
        "hubs_held_back_because": held_back,
        "machine": machine(),
        "load_average_before": loadavg.trim(),
        "objects": created,
        "churn_updates": churned.load(Ordering::Relaxed),
        "pods_changed_during_the_outage": offline_changes,
        "startup_seconds": (startup_until - t0).as_secs_f64(),
        "kube_proxy_list_cost": list_cost.json(),
        "phases": phases.iter().map(Phase::json).collect::<Vec<_>>(),
        "requests_lost": lost.json(),
        "hub_warnings": warnings.iter().map(|(m, n, h)| json!({"message": m, "lines": n, "hubs": h})).collect::<Vec<_>>(),
        "requests_per_second_after_return": per_second,
    });
    if args.json_to_stdout {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_tables(args, &summary, &phases, &list_cost, &lost, &warnings);
    }
    if let Some(logs) = &args.keep_logs {
        std::fs::create_dir_all(logs)?;
        for member in &fleet {
            let path = logs.join(format!("{}.log", member.hub.node));
            std::fs::write(&path, member.hub.process.log_text())
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(path) = &args.dump_requests {
        dump_requests(path, &records, t0).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json_path {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let all_converged = converged
        .iter()
        .all(|c| c.cache.is_some() && c.kube_proxy.is_some());
    drop(fleet);
    Ok(all_converged)
}

/// Why `more` hubs would not fit: memory (`--min-free-memory`) or the directory's disk
/// (`--min-free-disk`), with one hub's share of each measured on the first one.
fn short_of_room(args: &Args, dir: &std::path::Path, more: usize) -> Option<String> {
    let available = |key: &str| -> Option<u64> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    let memory = available("MemAvailable:").unwrap_or(u64::MAX);
    let disk = rustix::fs::statvfs(dir)
        .map(|s| s.f_bavail * s.f_frsize)
        .unwrap_or(u64::MAX);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let need_memory = args.min_free_memory + more as u64 * PER_HUB_MEMORY;
    let need_disk = args.min_free_disk + more as u64 * PER_HUB_DISK;
    if memory < need_memory {
        return Some(format!(
            "{:.1} GiB of memory available, {more} more hubs need {:.1} GiB over the {:.1} GiB kept free",
            gib(memory),
            gib(more as u64 * PER_HUB_MEMORY),
            gib(args.min_free_memory)
        ));
    }
    if disk < need_disk {
        return Some(format!(
            "{:.1} GiB free under {}, {more} more hubs need {:.1} GiB over the {:.1} GiB kept free",
            gib(disk),
            dir.display(),
            gib(more as u64 * PER_HUB_DISK),
            gib(args.min_free_disk)
        ));
    }
    None
}

/// What one hub takes once its node's clients have synced, with the default workload (RSS
/// about 65 MiB, its sled cache about 23 MiB), rounded up.
const PER_HUB_MEMORY: u64 = 80 << 20;
const PER_HUB_DISK: u64 = 32 << 20;

fn snapshot(fake: &FakeApiServer, fleet: &[Member]) -> Snapshot {
    let logs: Vec<_> = fleet.iter().map(|m| m.hub.process.log()).collect();
    let probes: Vec<HubProbe<'_>> = fleet
        .iter()
        .zip(&logs)
        .map(|(m, log)| HubProbe {
            node: &m.hub.node,
            pid: m.hub.process.child.id(),
            stats: Some(&m.clients.stats),
            log: Some(log),
        })
        .collect();
    sample::take(fake, &probes)
}

/// Waits (bounded) until every reflector of these hubs has listed once.
async fn wait_synced(members: &[Member]) -> Result<()> {
    let started = Instant::now();
    while !members.iter().all(|m| m.clients.synced()) {
        if started.elapsed() > SYNC_WITHIN {
            let late: Vec<String> = members
                .iter()
                .filter(|m| !m.clients.synced())
                .map(|m| {
                    let failures = m.clients.stats.failures();
                    format!(
                        "{} ({} of {} synced; last failure: {:?})",
                        m.hub.node,
                        m.clients.stats.synced.load(Ordering::Relaxed),
                        m.clients.informers,
                        failures.last().map(|f| format!("{}: {}", f.what, f.detail))
                    )
                })
                .collect();
            bail!(
                "not synced within {SYNC_WITHIN:?}: {}; first hub's log ends:\n{}",
                late.join(", "),
                members[0].hub.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Relabels one pod of every node; returns how many were changed.
fn relabel_one_pod_per_node(fake: &FakeApiServer, nodes: &[String], pods_per_node: usize) -> usize {
    if pods_per_node == 0 {
        return 0;
    }
    nodes
        .iter()
        .filter_map(|node| fake.get("v1/pods", Some(NAMESPACE), &cluster::pod_name(node, 0)))
        .filter(|pod| {
            let mut pod = pod.clone();
            pod["metadata"]["labels"]["changed-offline"] = "true".into();
            fake.update("v1/pods", pod).is_ok()
        })
        .count()
}

/// The cloud changing: every `1/rate` s, in turn, a random node's pod gets a new label, an
/// EndpointSlice a new label (kube-proxy and coredns see it on every node), or a random node's
/// ConfigMap new data.
async fn churn(
    fake: Arc<FakeApiServer>,
    rate: f64,
    nodes: Vec<String>,
    (pods_per_node, services): (usize, usize),
    count: Arc<AtomicU64>,
) {
    if rate <= 0.0 || nodes.is_empty() {
        return;
    }
    let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut rng = Rng::new(27);
    for generation in 1u64.. {
        every.tick().await;
        let node = &nodes[rng.below(nodes.len())];
        let (gvr, namespace, name) = match generation % 3 {
            0 if pods_per_node > 0 => (
                "v1/pods",
                NAMESPACE.to_owned(),
                cluster::pod_name(node, rng.below(pods_per_node)),
            ),
            1 if services > 0 => {
                let i = rng.below(services);
                (
                    "discovery.k8s.io/v1/endpointslices",
                    outpost_testkit::full_node::app_ns(i),
                    format!("svc-{i}-x7k2p"),
                )
            }
            _ => (
                "v1/configmaps",
                NAMESPACE.to_owned(),
                cluster::config_map_name(node, rng.below(REFS)),
            ),
        };
        let changed = fake
            .get(gvr, Some(&namespace), &name)
            .map(|mut object| {
                let mark = generation.to_string();
                match gvr {
                    "v1/configmaps" => object["data"]["GENERATION"] = mark.into(),
                    _ => object["metadata"]["labels"]["fleet-churn"] = mark.into(),
                }
                fake.update(gvr, object).is_ok()
            })
            .unwrap_or(false);
        count.fetch_add(u64::from(changed), Ordering::Relaxed);
    }
}

// ---- phases --------------------------------------------------------------------------------

fn delta((a, b): (&Snapshot, &Snapshot), field: impl Fn(&HubCounters) -> f64) -> Vec<f64> {
    b.hubs
        .iter()
        .enumerate()
        .map(|(i, hb)| field(hb) - a.hubs.get(i).map_or(0.0, &field))
        .collect()
}

fn at_end(b: &Snapshot, field: impl Fn(&HubCounters) -> f64) -> Vec<f64> {
    b.hubs.iter().map(field).collect()
}

fn phase(
    name: &str,
    (a, b): (&Snapshot, &Snapshot),
    records: &[RequestRecord],
    index: &HubIndex<'_>,
) -> Phase {
    let span = (a, b);
    let mut p = Phase::new(name, (b.at - a.at).as_secs_f64());
    let mib = 1.0 / 1024.0;
    p.rows = vec![
        Row::new(
            "upstream connections open (at the end)",
            Unit::Count,
            at_end(b, |h| h.open as f64),
        ),
        Row::new(
            "  of them HTTP/2",
            Unit::Count,
            at_end(b, |h| h.open_http2 as f64),
        ),
        Row::new(
            "upstream connections accepted",
            Unit::Count,
            delta(span, |h| h.accepted as f64),
        ),
        Row::new(
            "upstream requests",
            Unit::Count,
            delta(span, |h| h.requests as f64),
        ),
        Row::new(
            "  LISTs (first pages)",
            Unit::Count,
            requests::count_per_hub(records, index, a.at, b.at, requests::is_list),
        ),
        Row::new(
            "  WATCHes",
            Unit::Count,
            requests::count_per_hub(records, index, a.at, b.at, |r| r.verb == "watch"),
        ),
        Row::new(
            "WAN bytes in (apiserver to hub, TLS)",
            Unit::Bytes,
            delta(span, |h| h.wan_in as f64),
        ),
        Row::new(
            "WAN bytes out (hub to apiserver, TLS)",
            Unit::Bytes,
            delta(span, |h| h.wan_out as f64),
        ),
        Row::new("hub CPU", Unit::Seconds, delta(span, |h| h.cpu_seconds)),
        Row::new(
            "hub RSS (at the end)",
            Unit::MiB,
            at_end(b, |h| h.rss_kib as f64 * mib),
        )
        .unsummed(),
        Row::new(
            "apiserver marked unhealthy (hub log)",
            Unit::Count,
            delta(span, |h| h.went_unhealthy as f64),
        ),
        Row::new(
            "apiserver marked healthy (hub log)",
            Unit::Count,
            delta(span, |h| h.went_healthy as f64),
        ),
        Row::new(
            "client requests to the hub",
            Unit::Count,
            delta(span, |h| h.client_requests as f64),
        ),
        Row::new(
            "  answered by the hub itself (cache)",
            Unit::Count,
            delta(span, |h| h.client_served_by_hub as f64),
        ),
        Row::new(
            "  without a usable answer",
            Unit::Count,
            delta(span, |h| h.client_failures as f64),
        ),
    ];
    let own = |key: &str| {
        b.own_cpu.get(key).copied().unwrap_or(0.0) - a.own_cpu.get(key).copied().unwrap_or(0.0)
    };
    let hubs_cpu: f64 = delta(span, |h| h.cpu_seconds).iter().sum();
    let machine = b.machine_busy_seconds - a.machine_busy_seconds;
    let seconds = p.seconds.max(0.001);
    let cores = |cpu: f64| format!("{cpu:.1} CPU-s ({:.2} cores)", cpu / seconds);
    p.note(
        "apiserver CPU (fake's runtime)",
        cores(own("fake")),
        json!(own("fake")),
    );
    p.note(
        "clients CPU (all nodes' workloads)",
        cores(own("clients")),
        json!(own("clients")),
    );
    p.note("hubs CPU (sum)", cores(hubs_cpu), json!(hubs_cpu));
    p.note(
        "machine busy CPU (everything)",
        cores(machine),
        json!(machine),
    );
    let others = machine - hubs_cpu - own("total");
    p.note(
        "  of it outside this run (other agents)",
        cores(others.max(0.0)),
        json!(others),
    );
    p.note(
        "load average at the end",
        b.loadavg.clone(),
        json!(b.loadavg),
    );
    // A connection without a certificate is attributed at its first request, so these totals
    // can also shrink.
    let unattributed = b.unattributed_connections as i64 - a.unattributed_connections as i64;
    let without_handshake =
        b.unattributed_without_handshake as i64 - a.unattributed_without_handshake as i64;
    p.note(
        "connections no hub is known for",
        format!("{unattributed} ({without_handshake} without a finished TLS handshake)"),
        json!({"connections": unattributed, "without_handshake": without_handshake}),
    );
    p
}

fn add_reconnect(
    p: &mut Phase,
    returns: &[requests::Return],
    per_second: &[u64],
    converged: &[Converged],
    nodes: &[String],
) {
    let secs = |v: Option<f64>| v.unwrap_or(f64::NAN);
    p.rows.extend([
        Row::new(
            "first upstream request after the return",
            Unit::Seconds,
            returns.iter().map(|r| secs(r.first_request)).collect(),
        )
        .unsummed(),
        Row::new(
            "first upstream LIST after the return",
            Unit::Seconds,
            returns.iter().map(|r| secs(r.first_list)).collect(),
        )
        .unsummed(),
        Row::new(
            "(resource, selector) listed more than once",
            Unit::Count,
            returns.iter().map(|r| r.keys_relisted as f64).collect(),
        ),
        Row::new(
            "most LISTs of one (resource, selector)",
            Unit::Count,
            returns
                .iter()
                .map(|r| r.max_lists_of_one_key as f64)
                .collect(),
        )
        .unsummed(),
        Row::new(
            "cache = apiserver after",
            Unit::Seconds,
            converged.iter().map(|c| secs(c.cache)).collect(),
        )
        .unsummed(),
        Row::new(
            "kube-proxy's view = apiserver after",
            Unit::Seconds,
            converged.iter().map(|c| secs(c.kube_proxy)).collect(),
        )
        .unsummed(),
    ]);
    let (peak_second, peak) = per_second
        .iter()
        .enumerate()
        .max_by_key(|(_, n)| **n)
        .map_or((0, 0), |(s, n)| (s, *n));
    p.note(
        "peak upstream requests per second",
        format!("{peak} (in second {peak_second} after the return)"),
        json!({"requests": peak, "second": peak_second}),
    );
    let firsts: Vec<f64> = returns.iter().filter_map(|r| r.first_request).collect();
    let lists: Vec<f64> = returns.iter().filter_map(|r| r.first_list).collect();
    let spread = |v: &[f64]| {
        let (lo, hi) = (percentile(v, 0.0), percentile(v, 1.0));
        (
            format!(
                "{:.1} s (first {lo:.1} s, p10 {:.1}, p50 {:.1}, p90 {:.1}, last {hi:.1} s; {} hubs)",
                hi - lo,
                percentile(v, 0.1),
                percentile(v, 0.5),
                percentile(v, 0.9),
                v.len()
            ),
            json!({"seconds": hi - lo, "first": lo, "p10": percentile(v, 0.1), "p50": percentile(v, 0.5),
                   "p90": percentile(v, 0.9), "last": hi, "hubs": v.len()}),
        )
    };
    let (text, value) = spread(&firsts);
    p.note("reconnect spread (first requests)", text, value);
    let (text, value) = spread(&lists);
    p.note("relist spread (first LISTs)", text, value);
    let relisting: Vec<Value> = returns
        .iter()
        .zip(nodes)
        .filter(|(r, _)| r.keys_relisted > 0)
        .map(|(r, node)| json!({"hub": node, "repeated": r.repeated}))
        .collect();
    let example = relisting
        .first()
        .map(|v| format!("; e.g. {v}"))
        .unwrap_or_default();
    p.note(
        "hubs relisting a (resource, selector) twice+",
        format!("{} of {}{example}", relisting.len(), returns.len()),
        json!(relisting),
    );
    let count = |f: &dyn Fn(&Converged) -> bool| converged.iter().filter(|c| f(c)).count();
    p.note(
        "hubs converged (cache / kube-proxy)",
        format!(
            "{} / {} of {}",
            count(&|c| c.cache.is_some()),
            count(&|c| c.kube_proxy.is_some()),
            converged.len()
        ),
        json!({"cache": count(&|c| c.cache.is_some()), "kube_proxy": count(&|c| c.kube_proxy.is_some())}),
    );
}

/// Client requests without a usable answer, split by whether the apiserver was away.
struct Lost {
    during_outage: usize,
    outside: Vec<(String, Failure)>,
}

impl Lost {
    fn by_what(&self) -> BTreeMap<String, usize> {
        let mut by_what = BTreeMap::new();
        for (_, f) in &self.outside {
            *by_what.entry(f.what.clone()).or_default() += 1;
        }
        by_what
    }

    fn json(&self) -> Value {
        json!({
            "during_outage": self.during_outage,
            "outside_outage": self.outside.len(),
            "outside_by_request": self.by_what(),
            "examples": self.outside.iter().take(20).map(|(hub, f)| json!({"hub": hub, "what": f.what, "detail": f.detail})).collect::<Vec<_>>(),
        })
    }
}

fn lost_requests(failures: &[Vec<Failure>], down: Instant, up: Instant) -> Lost {
    let mut lost = Lost {
        during_outage: 0,
        outside: Vec::new(),
    };
    for (i, hub_failures) in failures.iter().enumerate() {
        for f in hub_failures {
            if f.at >= down && f.at < up {
                lost.during_outage += 1;
            } else {
                lost.outside.push((cluster::node_name(i), f.clone()));
            }
        }
    }
    lost
}

/// The hubs' WARN and ERROR lines by message and cause: (message, lines, hubs), most frequent
/// first.
fn hub_warnings(fleet: &[Member]) -> Vec<(String, usize, usize)> {
    let mut by_message: BTreeMap<String, (usize, std::collections::BTreeSet<usize>)> =
        BTreeMap::new();
    for (i, member) in fleet.iter().enumerate() {
        for line in member.hub.log_lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(level) = words.iter().position(|w| *w == "WARN" || *w == "ERROR") else {
                continue;
            };
            let message: Vec<&str> = words[level..]
                .iter()
                .take_while(|w| !w.contains('='))
                .copied()
                .collect();
            let mut message = message.join(" ");
            // The cause says why (refused, timed out…); other fields name the hub's own things.
            if let Some(cause) = line.split_once(" cause=").map(|(_, c)| c) {
                let cause: String = cause.chars().take(90).collect();
                message = format!("{message} (cause={cause})");
            }
            let entry = by_message.entry(message).or_default();
            entry.0 += 1;
            entry.1.insert(i);
        }
    }
    let mut all: Vec<(String, usize, usize)> = by_message
        .into_iter()
        .map(|(m, (n, hubs))| (m, n, hubs.len()))
        .collect();
    all.sort_by_key(|(_, lines, _)| std::cmp::Reverse(*lines));
    all.truncate(20);
    all
}

fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default();
    json!({"cpus": cpus, "memory": mem})
}

fn print_tables(
    args: &Args,
    summary: &Value,
    phases: &[Phase],
    list_cost: &fleetkit::probe::ListCost,
    lost: &Lost,
    warnings: &[(String, usize, usize)],
) {
    println!(
        "fleet: {} of {} hubs ({}), {} pods per node, {} Services + EndpointSlices, churn {}/s, outage {:?}; apiserver {} {}",
        summary["hubs_started"],
        args.hubs,
        args.bin.display(),
        args.pods_per_node,
        args.services,
        args.churn,
        args.outage,
        if args.http1_only_apiserver {
            "HTTP/1.1 only"
        } else {
            "HTTP/2 + HTTP/1.1"
        },
        if args.apiserver_gzip {
            "with gzip"
        } else {
            "without gzip"
        },
    );
    println!(
        "machine: {}; load before: {}; start-up took {:.0} s",
        summary["machine"], summary["load_average_before"], summary["startup_seconds"]
    );
    if let Some(why) = summary["hubs_held_back_because"].as_str() {
        println!("not all hubs started: {why}");
    }
    let sum = |ls: &[fleetkit::probe::Listed; 2]| ls.iter().map(|l| l.wire_bytes).sum::<u64>();
    let (plain, gzip) = (sum(&list_cost.plain), sum(&list_cost.gzip));
    println!(
        "kube-proxy's Service + EndpointSlice LISTs ({} + {} items) on the wire: {:.1} KiB as the hub asks today, {:.1} KiB with gzip ({:.1}x smaller)",
        list_cost.plain[0].items,
        list_cost.plain[1].items,
        plain as f64 / 1024.0,
        gzip as f64 / 1024.0,
        plain as f64 / gzip.max(1) as f64
    );
    for phase in phases {
        print!("{}", phase.table());
    }
    println!(
        "\nrequests lost (no usable answer outside the outage): {}; during the outage: {}",
        lost.outside.len(),
        lost.during_outage
    );
    for (what, n) in lost.by_what() {
        println!("  {n:>6}  {what}");
    }
    for (hub, f) in lost.outside.iter().take(5) {
        println!("  e.g. {hub} {}: {}", f.what, f.detail);
    }
    println!("\nthe hubs' most frequent warnings (lines, hubs):");
    for (message, lines, hubs) in warnings {
        println!("  {lines:>6} {hubs:>4}  {message}");
    }
}

/// The apiserver's request log, one line per request: seconds from the start, status, user,
/// User-Agent, verb, path and query.
fn dump_requests(path: &std::path::Path, records: &[RequestRecord], t0: Instant) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in records {
        writeln!(
            out,
            "{:.3} {} {} {:?} {} {}?{}",
            r.at.saturating_duration_since(t0).as_secs_f64(),
            r.status,
            r.user,
            r.user_agent.as_deref().unwrap_or(""),
            r.verb,
            r.path,
            r.query
        )?;
    }
    Ok(())
}

// ---- arguments -----------------------------------------------------------------------------

struct Args {
    hubs: usize,
    outage: Duration,
    pods_per_node: usize,
    churn: f64,
    services: usize,
    settle: Duration,
    steady: Duration,
    converge_within: Duration,
    reconnect_window: Duration,
    start_batch: usize,
    http1_only_apiserver: bool,
    apiserver_gzip: bool,
    hub_args: Vec<String>,
    bin: PathBuf,
    json_to_stdout: bool,
    json_path: Option<PathBuf>,
    dump_requests: Option<PathBuf>,
    keep_logs: Option<PathBuf>,
    dir: PathBuf,
    min_free_memory: u64,
    min_free_disk: u64,
}

const USAGE: &str = "usage: fleet [--hubs=200] [--outage=60] [--pods-per-node=10] [--churn=2] \
    [--services=1000] [--settle=20] [--steady=30] [--converge-within=180] \
    [--reconnect-window=60] [--start-batch=10] [--http1-only-apiserver] \
    [--apiserver-gzip=true] [--hub-arg=FLAG]... [--bin=PATH] [--json[=PATH]] \
    [--dump-requests=PATH] [--keep-logs=DIR] [--dir=PATH] [--min-free-memory=3] \
    [--min-free-disk=10]";

impl Args {
    fn parse() -> Result<Args> {
        let mut args = Args {
            hubs: 200,
            outage: Duration::from_secs(60),
            pods_per_node: 10,
            churn: 2.0,
            services: 1000,
            settle: Duration::from_secs(20),
            steady: Duration::from_secs(30),
            converge_within: Duration::from_secs(180),
            reconnect_window: Duration::from_secs(60),
            start_batch: 10,
            http1_only_apiserver: false,
            apiserver_gzip: true,
            hub_args: Vec::new(),
            bin: default_bin(),
            json_to_stdout: false,
            json_path: None,
            dump_requests: None,
            keep_logs: None,
            dir: std::env::temp_dir(),
            min_free_memory: 3 << 30,
            min_free_disk: 10 << 30,
        };
        let gib = |v: &str, flag: &str| -> Result<u64> {
            let gib: f64 = v.parse().with_context(|| format!("{flag}=GIB"))?;
            Ok((gib * (1u64 << 30) as f64) as u64)
        };
        let secs = |v: &str, flag: &str| -> Result<Duration> {
            Ok(Duration::from_secs(
                v.parse().with_context(|| format!("{flag}=SECONDS"))?,
            ))
        };
        let number = |v: &str, flag: &str| -> Result<usize> {
            v.parse().with_context(|| format!("{flag}=N"))
        };
        for arg in std::env::args().skip(1) {
            let (key, value) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
            match key {
                "--hubs" => args.hubs = number(value, key)?,
                "--outage" => args.outage = secs(value, key)?,
                "--pods-per-node" => args.pods_per_node = number(value, key)?,
                "--churn" => args.churn = value.parse().context("--churn=UPDATES_PER_SECOND")?,
                "--services" => args.services = number(value, key)?,
                "--settle" => args.settle = secs(value, key)?,
                "--steady" => args.steady = secs(value, key)?,
                "--converge-within" => args.converge_within = secs(value, key)?,
                "--reconnect-window" => args.reconnect_window = secs(value, key)?,
                "--start-batch" => args.start_batch = number(value, key)?,
                "--http1-only-apiserver" => args.http1_only_apiserver = flag(value, key)?,
                "--apiserver-gzip" => args.apiserver_gzip = flag(value, key)?,
                "--hub-arg" if !value.is_empty() => args.hub_args.push(value.to_owned()),
                "--bin" => args.bin = PathBuf::from(value),
                "--json" if value.is_empty() => args.json_to_stdout = true,
                "--json" => args.json_path = Some(PathBuf::from(value)),
                "--dump-requests" => args.dump_requests = Some(PathBuf::from(value)),
                "--dir" => args.dir = PathBuf::from(value),
                "--keep-logs" => args.keep_logs = Some(PathBuf::from(value)),
                "--min-free-memory" => args.min_free_memory = gib(value, key)?,
                "--min-free-disk" => args.min_free_disk = gib(value, key)?,
                _ => bail!("unknown argument {arg:?}\n{USAGE}"),
            }
        }
        ensure!(
            args.hubs > 0 && args.hubs <= 250 * 256,
            "--hubs: 1 to 64000"
        );
        ensure!(args.start_batch > 0, "--start-batch must be at least 1");
        ensure!(args.churn >= 0.0, "--churn must not be negative");
        ensure!(
            args.bin.is_file(),
            "{} is missing: run `cargo build --release -p outpost --bin outpost` first (or pass --bin=PATH)",
            args.bin.display()
        );
        Ok(args)
    }

    fn json(&self) -> Value {
        json!({
            "hubs": self.hubs, "outage_seconds": self.outage.as_secs(), "pods_per_node": self.pods_per_node,
            "churn_per_second": self.churn, "services": self.services, "settle_seconds": self.settle.as_secs(),
            "steady_seconds": self.steady.as_secs(), "converge_within_seconds": self.converge_within.as_secs(),
            "reconnect_window_seconds": self.reconnect_window.as_secs(), "start_batch": self.start_batch,
            "http1_only_apiserver": self.http1_only_apiserver, "apiserver_gzip": self.apiserver_gzip,
            "hub_args": self.hub_args, "bin": self.bin, "dir": self.dir,
            "min_free_memory_bytes": self.min_free_memory, "min_free_disk_bytes": self.min_free_disk,
        })
    }
}

fn flag(value: &str, key: &str) -> Result<bool> {
    match value {
        "" | "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(anyhow!("{key}: true or false, not {value:?}")),
    }
}

/// `outpost` next to this example's directory: `<target>/release/outpost` for
/// `<target>/release/examples/fleet`, whatever the target directory.
fn default_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("outpost")))
        .unwrap_or_else(|| PathBuf::from("target/release/outpost"))
}
