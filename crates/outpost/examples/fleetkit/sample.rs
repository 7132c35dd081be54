//! Counters read at phase boundaries: the fake apiserver's per-connection accounting attributed
//! to hubs, each hub's CPU and memory, the clients' counts, and the machine's CPU (to tell the
//! fleet's share from whatever else runs).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use outpost_testkit::{ConnectionRecord, FakeApiServer, HttpVersion};

use super::cluster::node_of_user;
use super::workload::ClientStats;

/// One hub's cumulative counters at a moment.
#[derive(Clone, Debug, Default)]
pub struct HubCounters {
    /// Upstream connections the apiserver accepted from the hub, and of them still open.
    pub accepted: u64,
    pub open: u64,
    pub open_http1: u64,
    pub open_http2: u64,
    /// Requests the apiserver received from the hub.
    pub requests: u64,
    /// Bytes the apiserver wrote to the hub's connections: the hub's WAN bytes in.
    pub wan_in: u64,
    pub wan_out: u64,
    pub cpu_seconds: f64,
    pub rss_kib: u64,
    /// The node's clients: requests sent to the hub, and those without a usable answer.
    pub client_requests: u64,
    pub client_failures: u64,
    /// Answers the hub gave from its own caches (`x-outpost-served-from`).
    pub client_served_by_hub: u64,
    /// How often the hub logged an apiserver as unhealthy, and as healthy.
    pub went_unhealthy: u64,
    pub went_healthy: u64,
}

/// Everything at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub at: Instant,
    pub hubs: Vec<HubCounters>,
    /// Connections no hub is known for (a probe; a connection without a client certificate
    /// that carried no request; a failed handshake), and of them those whose TLS handshake
    /// never completed.
    pub unattributed_connections: u64,
    pub unattributed_without_handshake: u64,
    /// CPU seconds of this process's threads by runtime: `fake` (the apiserver), `clients`
    /// (every node's workload), `other` (live threads only), and `total` (the whole process).
    pub own_cpu: HashMap<String, f64>,
    /// The whole machine's busy CPU seconds (all processes), from `/proc/stat`.
    pub machine_busy_seconds: f64,
    pub loadavg: String,
}

/// What the sampler needs of each hub.
pub struct HubProbe<'a> {
    pub node: &'a str,
    pub pid: u32,
    pub stats: Option<&'a ClientStats>,
    /// The hub's log so far.
    pub log: Option<&'a Mutex<Vec<String>>>,
}

pub fn take(fake: &FakeApiServer, hubs: &[HubProbe<'_>]) -> Snapshot {
    let index: HashMap<&str, usize> = hubs.iter().enumerate().map(|(i, h)| (h.node, i)).collect();
    let mut counters = vec![HubCounters::default(); hubs.len()];
    let (mut unattributed, mut without_handshake) = (0, 0);
    for conn in fake.connections() {
        match node_of_user(&conn.identity).and_then(|node| index.get(node)) {
            Some(&i) => add(&mut counters[i], &conn),
            None => {
                unattributed += 1;
                without_handshake += u64::from(conn.version.is_none());
            }
        }
    }
    for (c, hub) in counters.iter_mut().zip(hubs) {
        c.cpu_seconds = process_cpu_seconds(hub.pid).unwrap_or(0.0);
        c.rss_kib = rss_kib(hub.pid).unwrap_or(0);
        if let Some(log) = hub.log {
            let log = log.lock().unwrap_or_else(|e| e.into_inner());
            let count = |marker: &str| log.iter().filter(|l| l.contains(marker)).count() as u64;
            c.went_unhealthy = count("apiserver unhealthy");
            c.went_healthy = count("apiserver healthy");
        }
        if let Some(stats) = hub.stats {
            c.client_requests = stats.requests.load(Ordering::Relaxed);
            c.client_failures = stats.failures().len() as u64;
            c.client_served_by_hub = stats
                .served_from
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .sum();
        }
    }
    Snapshot {
        at: Instant::now(),
        hubs: counters,
        unattributed_connections: unattributed,
        unattributed_without_handshake: without_handshake,
        own_cpu: {
            let mut own = own_cpu_by_runtime();
            own.insert(
                "total".into(),
                process_cpu_seconds(std::process::id()).unwrap_or(0.0),
            );
            own
        },
        machine_busy_seconds: machine_busy_seconds().unwrap_or(0.0),
        loadavg: std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
    }
}

fn add(c: &mut HubCounters, conn: &ConnectionRecord) {
    let open = conn.closed_at.is_none();
    c.accepted += 1;
    c.open += u64::from(open);
    c.open_http1 += u64::from(open && conn.version == Some(HttpVersion::Http1));
    c.open_http2 += u64::from(open && conn.version == Some(HttpVersion::Http2));
    c.requests += conn.requests;
    c.wan_in += conn.bytes_written;
    c.wan_out += conn.bytes_read;
}

/// Clock ticks per second of `/proc/*/stat` (Linux reports in USER_HZ, 100).
const TICKS: f64 = 100.0;

/// utime + stime of a process (or a task under `/proc/self/task`), in seconds.
fn stat_cpu_seconds(stat_path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS)
}

pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// This process's CPU seconds per thread-name prefix (`fake-…`, `clients-…`, the rest).
fn own_cpu_by_runtime() -> HashMap<String, f64> {
    let mut by_runtime: HashMap<String, f64> = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_runtime;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let runtime = match name.trim() {
            n if n.starts_with("fake") => "fake",
            n if n.starts_with("clients") => "clients",
            _ => "other",
        };
        let cpu = stat_cpu_seconds(&path.join("stat").to_string_lossy()).unwrap_or(0.0);
        *by_runtime.entry(runtime.to_owned()).or_default() += cpu;
    }
    by_runtime
}

/// Busy CPU seconds of the whole machine since boot (everything but idle and iowait).
fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0.0);
    Some((total - idle) / TICKS)
}
