//! nginx as the plain reverse-proxy baseline: `proxy_pass https://` to the same TLS upstream with
//! the node's client certificate, one worker process, keep-alive on both sides, HTTP/1.1 and
//! `proxy_buffering off` (the hub streams bodies too). It runs from a temporary prefix with its
//! own configuration on a free loopback port (`-g 'daemon off;'`), and [`Nginx`] stops it (and
//! its worker) when dropped. nginx is optional: [`Nginx::find`] says whether it is on `PATH`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::NodePemFiles;

/// Bound on start-up and on the graceful stop.
const DEADLINE: Duration = Duration::from_secs(10);

/// A running nginx; dropping it stops it.
pub struct Nginx {
    child: Child,
    addr: SocketAddr,
    prefix: tempfile::TempDir,
}

impl Nginx {
    /// The `nginx` executable on `PATH`, if any.
    pub fn find() -> Option<PathBuf> {
        crate::processes::on_path("nginx")
    }

    /// Starts `binary` proxying every path to `https://<upstream>` as the node.
    pub fn start(
        binary: &Path,
        upstream: SocketAddr,
        identity: &NodePemFiles,
    ) -> Result<Nginx, String> {
        let prefix = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        // Worker processes run as an unprivileged user when started as root: let them in.
        set_mode(prefix.path(), 0o755)?;
        let port = crate::free_loopback_port().map_err(|e| format!("free port: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let conf = prefix.path().join("nginx.conf");
        std::fs::write(&conf, config(prefix.path(), addr, upstream, identity))
            .map_err(|e| format!("writing {}: {e}", conf.display()))?;
        let log = std::fs::File::create(prefix.path().join("stderr.log"))
            .map_err(|e| format!("log file: {e}"))?;
        let child = Command::new(binary)
            .arg("-p")
            .arg(prefix.path())
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let mut nginx = Nginx {
            child,
            addr,
            prefix,
        };
        nginx.wait_ready()?;
        Ok(nginx)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The master's pid (its worker is its child).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time used so far by the master and its worker (`/proc/<pid>/schedstat`, Linux;
    /// zero elsewhere).
    pub fn cpu(&self) -> Duration {
        let pid = self.child.id();
        std::iter::once(pid)
            .chain(children_of(pid))
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .map(Duration::from_nanos)
            .sum()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "nginx exited at start-up ({status}): {}",
                    self.logs()
                ));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nginx did not listen on {} within {DEADLINE:?}: {}",
                    self.addr,
                    self.logs()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// nginx's stderr and error log.
    fn logs(&self) -> String {
        ["stderr.log", "error.log"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.prefix.path().join(f)).ok())
            .collect::<Vec<_>>()
            .join("")
            .trim()
            .to_owned()
    }

    /// SIGTERM to the master (it stops its worker), bounded; SIGKILL to both if that fails.
    fn stop(&mut self) {
        let workers = children_of(self.child.id());
        if crate::processes::stop(&mut self.child) {
            return;
        }
        for worker in workers {
            let _ = Command::new("kill")
                .args(["-KILL", &worker.to_string()])
                .status();
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

/// The direct children of `pid` (Linux; none elsewhere).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn config(prefix: &Path, listen: SocketAddr, upstream: SocketAddr, id: &NodePemFiles) -> String {
    let p = prefix.display();
    format!(
        r#"worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    upstream apiserver {{
        server {upstream};
        keepalive 32;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass https://apiserver;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_ssl_certificate {cert};
            proxy_ssl_certificate_key {key};
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_session_reuse on;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"#,
        cert = id.cert.display(),
        key = id.key.display(),
        ca = id.ca.display(),
    )
}
