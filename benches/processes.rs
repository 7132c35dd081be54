//! Proxies as processes of their own, so that each one's CPU is read the same way: the
//! process's utime + stime from `/proc/<pid>/stat` (all its threads, and its direct children
//! for nginx's worker), see [`Proc::cpu`]. Used by `proxy.rs`'s per-request CPU comparison:
//!
//! - [`go_build`] builds the Go programs under `go/` (a canned HTTPS upstream, and
//!   `httputil.ReverseProxy` alone) into the target directory, when `go` is on `PATH`;
//! - [`Proc::go`] runs one, [`Proc::outpost`] the release `outpost` binary ([`outpost_bin`]),
//!   [`Proc::haproxy`] haproxy (HTTP/1.1 or HTTP/2 upstream);
//! - [`wrk`] runs `wrk` against one of them.
//!
//! Every [`Proc`] is stopped (SIGTERM, then SIGKILL) when dropped.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::NodePemFiles;

/// Bound on a start-up and on a graceful stop.
const DEADLINE: Duration = Duration::from_secs(20);

/// `name` on `PATH`, if there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The directory cargo built this bench into (`<target>/release`).
fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // <target>/release/deps/proxy-<hash>
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// The release `outpost` binary: `$OUTPOST_BIN`, else the one beside this bench in the target
/// directory (`cargo build --release -p outpost` first).
pub fn outpost_bin() -> Result<PathBuf, String> {
    let bin = match std::env::var_os("OUTPOST_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => profile_dir().ok_or("no target directory")?.join("outpost"),
    };
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "no {} (cargo build --release -p outpost, or set OUTPOST_BIN)",
            bin.display()
        ))
    }
}

/// Builds `go/<name>/main.go` (standard library only) into `<target>/release/bench-go/<name>`.
pub fn go_build(name: &str) -> Result<PathBuf, String> {
    let go = on_path("go").ok_or("no `go` on PATH (apt-get install golang-go)")?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("go")
        .join(name)
        .join("main.go");
    let out = profile_dir()
        .ok_or("no target directory")?
        .join("bench-go")
        .join(name);
    let built = Command::new(go)
        .arg("build")
        .arg("-o")
        .arg(&out)
        .arg(&source)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("go build: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "go build {}: {}",
            source.display(),
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    Ok(out)
}

/// A proxy (or the upstream) as a child process; stopped on drop.
pub struct Proc {
    pub name: &'static str,
    child: Child,
    addr: SocketAddr,
    /// The admin port's address (the hub's), for `/metrics`.
    pub admin: Option<SocketAddr>,
    _dir: Option<tempfile::TempDir>,
}

impl Proc {
    /// A Go program of [`go_build`] with `args`; it prints its address on stdout's first line.
    pub fn go(name: &'static str, binary: &Path, args: &[String]) -> Result<Proc, String> {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("{name}: reading its address: {e}"))?;
        let addr = line
            .trim()
            .parse()
            .map_err(|e| format!("{name}: address {line:?}: {e}"))?;
        Ok(Proc {
            name,
            child,
            addr,
            admin: None,
            _dir: None,
        })
    }

    /// The `outpost` binary with `args` and `envs`, ready once it logs "ready to serve" (its
    /// stderr is drained by a thread from then on).
    pub fn outpost(
        name: &'static str,
        binary: &Path,
        args: &[String],
        envs: &[(&str, &str)],
    ) -> Result<Proc, String> {
        let mut child = Command::new(binary)
            .args(args)
            .env_remove("RUST_LOG")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut ready = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                match &ready {
                    Some(tx) if line.contains("ready to serve") => {
                        let _ = tx.send(Ok(line));
                        ready = None;
                    }
                    Some(tx) if line.contains("error") => {
                        let _ = tx.send(Err(line));
                    }
                    _ => {}
                }
            }
        });
        let deadline = Instant::now() + DEADLINE;
        let ready = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(line)) => break line,
                Ok(Err(line)) => eprintln!("{name}: {line}"),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{name} did not start within {DEADLINE:?}"));
                }
            }
        };
        let field = |key: &str| -> Result<SocketAddr, String> {
            ready
                .split(key)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|a| a.trim_matches('"').parse().ok())
                .ok_or_else(|| format!("{name}: no {key} in {ready:?}"))
        };
        Ok(Proc {
            name,
            addr: field("proxy=")?,
            admin: Some(field("admin=")?),
            child,
            _dir: None,
        })
    }

    /// haproxy in the foreground, one thread, `http-reuse always`, proxying every path to
    /// `https://<upstream>` with the node's client certificate.
    /// haproxy in front of `upstream`, speaking `upstream_protocol` to it (`Http1` as nginx
    /// does, `Http2` as the hubs and client-go do: its streams multiplexed on one connection).
    pub fn haproxy(
        binary: &Path,
        upstream: SocketAddr,
        identity: &NodePemFiles,
        upstream_protocol: UpstreamProtocol,
    ) -> Result<Proc, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let combined = dir.path().join("node.pem");
        let pem = [&identity.cert, &identity.key]
            .iter()
            .map(std::fs::read_to_string)
            .collect::<Result<String, _>>()
            .map_err(|e| format!("node PEM files: {e}"))?;
        std::fs::write(&combined, pem).map_err(|e| format!("writing node.pem: {e}"))?;
        let port = crate::free_loopback_port().map_err(|e| format!("free port: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let conf = dir.path().join("haproxy.cfg");
        std::fs::write(
            &conf,
            haproxy_config(addr, upstream, &combined, &identity.ca, upstream_protocol),
        )
        .map_err(|e| format!("writing haproxy.cfg: {e}"))?;
        let child = Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let mut proc = Proc {
            name: upstream_protocol.haproxy_leg(),
            child,
            addr,
            admin: None,
            _dir: Some(dir),
        };
        proc.wait_listening()?;
        Ok(proc)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime of the process (all its threads) and of its direct children.
    pub fn cpu(&self) -> Duration {
        process_tree_cpu(self.pid())
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited at start-up ({status})", self.name));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not listen on {}", self.name, self.addr));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// SIGTERM, a bounded wait for the exit, then SIGKILL; `true` when it ended on SIGTERM.
pub fn stop(child: &mut Child) -> bool {
    if let Ok(Some(_)) = child.try_wait() {
        return true;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// utime + stime (`/proc/<pid>/stat`, every thread of the process, USER_HZ = 100) of `pid` and
/// of its direct children (nginx's worker). Linux only; zero elsewhere.
pub fn process_tree_cpu(pid: u32) -> Duration {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid)
        .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
        .map(|p| crate::stat_cpu(Path::new(&format!("/proc/{p}"))))
        .sum()
}

/// What a proxy speaks to its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    Http1,
    Http2,
}

impl UpstreamProtocol {
    fn haproxy_leg(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "haproxy",
            UpstreamProtocol::Http2 => "haproxy-h2",
        }
    }

    fn alpn(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http/1.1",
            UpstreamProtocol::Http2 => "h2",
        }
    }
}

fn haproxy_config(
    listen: SocketAddr,
    upstream: SocketAddr,
    cert: &Path,
    ca: &Path,
    protocol: UpstreamProtocol,
) -> String {
    format!(
        r#"global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    http-reuse always
frontend proxy
    bind {listen}
    default_backend apiserver
backend apiserver
    server apiserver {upstream} ssl crt {cert} ca-file {ca} verify required verifyhost localhost sni str(localhost) alpn {alpn}
"#,
        cert = cert.display(),
        ca = ca.display(),
        alpn = protocol.alpn(),
    )
}

/// What one `wrk` run did.
#[derive(Debug, Clone, Copy)]
pub struct WrkRun {
    pub requests: u64,
    pub seconds: f64,
}

impl WrkRun {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

/// `wrk -t1 -c<connections> -d<duration>` on `url` with kubelet's headers; an error when any
/// answer was not a 2xx.
pub fn wrk(url: &str, connections: usize, duration: Duration) -> Result<WrkRun, String> {
    let out = Command::new("wrk")
        .args(["-t1", &format!("-c{connections}")])
        .arg(format!("-d{}s", duration.as_secs().max(1)))
        .args(["-H", &format!("User-Agent: {}", crate::KUBELET_UA)])
        .args(["-H", &format!("Accept: {}", crate::KUBELET_ACCEPT)])
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("Non-2xx") || text.contains("Socket errors") {
        return Err(format!("wrk {url}: {text}"));
    }
    // "  123456 requests in 5.00s, 300.00MB read"
    text.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            let requests = words.next()?.parse().ok()?;
            (words.next()? == "requests" && words.next()? == "in").then_some(())?;
            let seconds = words.next()?.trim_end_matches(',').trim_end_matches('s');
            Some(WrkRun {
                requests,
                seconds: seconds.parse().ok()?,
            })
        })
        .ok_or_else(|| format!("wrk {url}: no request count in {text}"))
}
