//! One hub of the fleet: the `outpost` binary for its own node, with its own client certificate,
//! root and cache directories, and loopback address (`127.77.x.y`, ports picked by the OS), run as
//! a [`HubChild`] (killed on drop).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::harness::{self, HubChild};

/// Bound on a hub's start, from spawn to its "ready to serve" line.
pub const READY_WITHIN: Duration = Duration::from_secs(90);

/// Hub `i`'s address: 127.77.0.1, 127.77.0.2 … (250 per third octet).
pub fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 77, (i / 250) as u8, (1 + i % 250) as u8))
}

/// What every hub shares.
pub struct Common<'a> {
    pub bin: &'a Path,
    pub server: &'a str,
    pub pki: &'a outpost_testkit::TestPki,
    /// Passed through after the fleet's flags, replacing flags of the same name.
    pub extra: &'a [String],
}

pub struct Hub {
    pub index: usize,
    pub node: String,
    pub process: HubChild,
}

/// A hub that logged "ready to serve".
pub struct Ready {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
}

impl Hub {
    pub fn spawn(common: &Common<'_>, index: usize, node: &str, dir: &Path) -> Result<Hub> {
        std::fs::create_dir_all(dir)?;
        let files = common
            .pki
            .write_node_files(&dir.join("pki"), node)
            .context("node cert files")?;
        let ip = address(index);
        let mut args = harness::hub_flags_for(common.server, node, &files, dir);
        args.extend([
            format!("--bind-proxy-address={ip}"),
            format!("--bind-address={ip}"),
            "--proxy-port=0".into(),
            "--serve-port=0".into(),
            // No kubelet health endpoint here: the simulated kubelet's requests keep the
            // heartbeat going.
            "--kubelet-healthz-url=".into(),
        ]);
        let args = with_overrides(args, common.extra);
        Ok(Hub {
            index,
            node: node.to_owned(),
            process: HubChild::spawn(common.bin, &args)?,
        })
    }

    /// Waits (bounded) for the "ready to serve" line and reads the ports from it.
    pub async fn ready(&self) -> Result<Ready> {
        let started = Instant::now();
        let line = loop {
            match self.process.ready.try_recv() {
                Ok(line) => break line,
                Err(std::sync::mpsc::TryRecvError::Empty) if started.elapsed() < READY_WITHIN => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => bail!(
                    "hub {} not ready within {READY_WITHIN:?}; its log ends:\n{}",
                    self.node,
                    self.log_tail(30)
                ),
            }
        };
        let field = |name: &str| -> Result<SocketAddr> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| anyhow!("{name} in {line:?}"))
        };
        Ok(Ready {
            proxy: field("proxy=")?,
            admin: field("admin=")?,
        })
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = self.process.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.process.log_text().lines().map(str::to_owned).collect()
    }
}

/// `base` with every flag named in `extra` replaced by `extra`'s.
fn with_overrides(base: Vec<String>, extra: &[String]) -> Vec<String> {
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_owned();
    let overridden: Vec<String> = extra.iter().map(|a| flag(a)).collect();
    base.into_iter()
        .filter(|a| !overridden.contains(&flag(a)))
        .chain(extra.iter().cloned())
        .collect()
}
