//! What the measurement harnesses (`coldboot`, `soak`, `fleet`) share: the `outpost` binary as a
//! child process whose log is kept, and the flags the e2e tests run it with (`tests/support`).

// Each harness is its own crate and uses part of this.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use outpost_testkit::{FakeApiServer, FakeConfig, NodeCertFiles};

/// The node the harnesses act as.
pub const NODE: &str = "edge-1";

/// The hub as a child process: its stderr kept line by line, killed (and reaped) on drop.
pub struct HubChild {
    pub child: std::process::Child,
    log: Arc<Mutex<Vec<String>>>,
    /// Gets the "ready to serve" line (which names the ports) once the hub logs it.
    pub ready: Receiver<String>,
}

impl HubChild {
    pub fn spawn(bin: &Path, args: &[String]) -> Result<HubChild> {
        let mut child = Command::new(bin)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let stderr = child.stderr.take().context("piped stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, ready) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("ready to serve") {
                    let _ = tx.send(line.clone());
                }
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        Ok(HubChild { child, log, ready })
    }

    /// The log so far, shared (it keeps growing).
    pub fn log(&self) -> Arc<Mutex<Vec<String>>> {
        self.log.clone()
    }

    pub fn log_text(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// A field of `/proc/<pid>/status` in kiB (`VmRSS:`, `RssAnon:`…).
    pub fn status_kib(&self, key: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{key} in /proc/<pid>/status"))
    }
}

impl Drop for HubChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bundled fake apiserver with the hub's RBAC installed, as a cluster has it.
pub async fn cluster() -> Result<FakeApiServer> {
    cluster_with(FakeConfig::default()).await
}

/// [`cluster`] with its fake configured by `config`.
pub async fn cluster_with(config: FakeConfig) -> Result<FakeApiServer> {
    let fake = FakeApiServer::start(config)
        .await
        .context("fake apiserver starts")?;
    let rbac = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../manifests/cluster/rbac.yaml"
    );
    fake.apply_rbac(&outpost_testkit::manifest::load_yaml(rbac)?)
        .map_err(|s| anyhow!("hub RBAC: {}", s.message))?;
    Ok(fake)
}

/// The e2e tests' flags for [`NODE`] against `server` (kubelet's certificate, no dummy
/// interface, a secure port picked by the OS), the hub's directories under `dir`. Ports, mode
/// and the rest are the caller's.
pub fn hub_flags(server: &str, files: &NodeCertFiles, dir: &Path) -> Vec<String> {
    hub_flags_for(server, NODE, files, dir)
}

/// [`hub_flags`] for the node `node`.
pub fn hub_flags_for(server: &str, node: &str, files: &NodeCertFiles, dir: &Path) -> Vec<String> {
    vec![
        format!("--server-addr={server}"),
        format!("--node-name={node}"),
        "--nodepool-name=pool-a".into(),
        "--bootstrap-mode=kubeletcertificate".into(),
        format!(
            "--kubelet-client-certificate={}",
            files.client_pem.display()
        ),
        format!("--kubelet-ca-file={}", files.ca_crt.display()),
        format!("--root-dir={}", dir.join("root").display()),
        format!("--disk-cache-path={}", dir.join("cache").display()),
        "--enable-dummy-if=false".into(),
        "--proxy-secure-port=0".into(),
    ]
}
