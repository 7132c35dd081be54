//! Flags of `outpost node convert` and `outpost node revert`, and the checks that keep every value
//! safe to put into a YAML manifest and a host path.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::error::NodeError;

/// The image convert puts in the static pod unless `--image` says otherwise.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/outpost/outpost:", env!("CARGO_PKG_VERSION"));

/// The hub's `--working-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkingMode {
    Edge,
    Cloud,
}

impl WorkingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkingMode::Edge => "edge",
            WorkingMode::Cloud => "cloud",
        }
    }
}

/// Install the outpost static pod on this node and, once it is ready, point kubelet at it.
#[derive(Args, Debug, Clone)]
pub struct ConvertArgs {
    /// The node's filesystem root; every node path is taken under it.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Apiserver address(es) for the hub, comma separated, e.g. https://10.0.0.1:6443.
    #[arg(long, value_name = "ADDRS")]
    pub server_addr: String,
    /// This node's name, as registered in the cluster.
    #[arg(long)]
    pub node_name: String,
    /// The node pool this node belongs to (the hub refuses to start without one).
    #[arg(long)]
    pub nodepool_name: String,
    /// The hub's working mode.
    #[arg(long, value_enum, default_value = "edge")]
    pub working_mode: WorkingMode,
    /// Container image of the hub.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// How long to wait for the hub to report ready before giving up ("120s", "2m", or seconds).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub wait_ready_timeout: Duration,
    /// The hub's readiness endpoint (plain HTTP).
    #[arg(long, default_value = "http://127.0.0.1:10267/v1/readyz")]
    pub readyz_url: String,
    /// Restart kubelet once it is redirected (otherwise the command to run is printed).
    #[arg(long)]
    pub restart_kubelet: bool,
    /// Print a unified diff of every change and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The hub's cache directory on the node.
    #[arg(long, default_value = "/etc/kubernetes/cache/")]
    pub disk_cache_path: PathBuf,
    /// The hub's working directory on the node.
    #[arg(long, default_value = "/var/lib/yurthub")]
    pub root_dir: PathBuf,
    /// The systemctl program used by --restart-kubelet.
    #[arg(long, default_value = "systemctl", hide = true)]
    pub systemctl: PathBuf,
}

/// Undo `outpost node convert`: restore kubelet's files from the backups and remove the hub.
#[derive(Args, Debug, Clone)]
pub struct RevertArgs {
    /// The node's filesystem root; every node path is taken under it.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Also delete the hub's cache directory and working directory.
    #[arg(long)]
    pub purge: bool,
    /// Print a unified diff of every change and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Restart kubelet once its files are restored (otherwise the command to run is printed).
    #[arg(long)]
    pub restart_kubelet: bool,
    /// The hub's cache directory on the node (deleted with --purge).
    #[arg(long, default_value = "/etc/kubernetes/cache/")]
    pub disk_cache_path: PathBuf,
    /// The hub's working directory on the node (deleted with --purge).
    #[arg(long, default_value = "/var/lib/yurthub")]
    pub root_dir: PathBuf,
    /// The systemctl program used by --restart-kubelet.
    #[arg(long, default_value = "systemctl", hide = true)]
    pub systemctl: PathBuf,
}

impl ConvertArgs {
    /// Refuses values that would break the manifest or point outside the node's tree.
    pub(crate) fn validate(&self) -> Result<(), NodeError> {
        dns_subdomain("--node-name", &self.node_name)?;
        dns_subdomain("--nodepool-name", &self.nodepool_name)?;
        server_addrs(&self.server_addr)?;
        no_blanks("--image", &self.image)?;
        node_path("--disk-cache-path", &self.disk_cache_path)?;
        node_path("--root-dir", &self.root_dir)?;
        Ok(())
    }
}

impl RevertArgs {
    /// Refuses purge targets that could take a system directory with them.
    pub(crate) fn validate(&self) -> Result<(), NodeError> {
        for (flag, path) in [
            ("--disk-cache-path", &self.disk_cache_path),
            ("--root-dir", &self.root_dir),
        ] {
            node_path(flag, path)?;
            if self.purge {
                purgeable(flag, path)?;
            }
        }
        Ok(())
    }
}

/// A duration flag that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: use e.g. 120s, 2m, 1m30s or a number of seconds")]
pub struct InvalidDuration(String);

/// Parses "120s", "2m", "1m30s", "500ms", "1h", or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let bad = || InvalidDuration(text.to_owned());
    if text.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        total += unit(&rest[..unit_len], number).ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

fn unit(name: &str, n: u64) -> Option<Duration> {
    match name {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
        _ => None,
    }
}

fn invalid(flag: &'static str, problem: impl Into<String>) -> NodeError {
    NodeError::InvalidArgument {
        flag,
        problem: problem.into(),
    }
}

/// Kubernetes object names (nodes, node pools) are DNS-1123 subdomains.
fn dns_subdomain(flag: &'static str, value: &str) -> Result<(), NodeError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if value.len() <= 253 && value.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(invalid(
            flag,
            format!(
                "{value:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"
            ),
        ))
    }
}

fn server_addrs(value: &str) -> Result<(), NodeError> {
    no_blanks("--server-addr", value)?;
    if value.split(',').any(str::is_empty) {
        return Err(invalid(
            "--server-addr",
            format!("{value:?} has an empty address"),
        ));
    }
    Ok(())
}

fn no_blanks(flag: &'static str, value: &str) -> Result<(), NodeError> {
    if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            flag,
            format!("{value:?} must be non-empty, without spaces"),
        ));
    }
    Ok(())
}

fn node_path(flag: &'static str, path: &Path) -> Result<(), NodeError> {
    let text = path.to_string_lossy();
    let parent_dirs = path.components().any(|c| c == Component::ParentDir);
    if !path.is_absolute() || parent_dirs || text.chars().any(char::is_control) {
        return Err(invalid(
            flag,
            format!("{text:?} must be an absolute path without '..'"),
        ));
    }
    Ok(())
}

/// `--purge` deletes whole trees, so a typo such as `--root-dir=/var` must not be taken literally.
fn purgeable(flag: &'static str, path: &Path) -> Result<(), NodeError> {
    const KEEP: &[&str] = &[
        "/etc/kubernetes",
        "/etc/kubernetes/manifests",
        "/etc/kubernetes/pki",
        "/var/lib/kubelet",
        "/var/lib/containerd",
        "/var/lib/etcd",
        "/usr/local",
        "/var/lib/outpost",
    ];
    let normal = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let clean: PathBuf = path.components().collect();
    if normal < 2 || KEEP.iter().any(|k| clean == Path::new(k)) {
        return Err(invalid(
            flag,
            format!(
                "refusing to purge {}: it is not a hub-only directory",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "2 m", "2d", "-1s", "1.5s", "m2"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn names_must_be_dns_subdomains() {
        assert!(dns_subdomain("--node-name", "edge-1.example").is_ok());
        for bad in [
            "", "Edge", "edge_1", "-edge", "edge-", "a..b", "a b", "x: y",
        ] {
            assert!(
                dns_subdomain("--node-name", bad).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn purge_targets_must_be_hub_only() {
        assert!(purgeable("--root-dir", Path::new("/var/lib/yurthub")).is_ok());
        assert!(purgeable("--root-dir", Path::new("/etc/kubernetes/cache/")).is_ok());
        for bad in [
            "/",
            "/var",
            "/etc/kubernetes",
            "/etc/kubernetes/pki/",
            "/var/lib/kubelet",
        ] {
            assert!(
                purgeable("--root-dir", Path::new(bad)).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn paths_must_be_absolute_without_parent_dirs() {
        assert!(node_path("--root-dir", Path::new("/var/lib/yurthub")).is_ok());
        assert!(node_path("--root-dir", Path::new("var/lib/yurthub")).is_err());
        assert!(node_path("--root-dir", Path::new("/var/lib/../../etc")).is_err());
    }
}
