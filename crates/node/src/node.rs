//! Where things live on a kubeadm node, and how node paths map under `--root`.

use std::path::{Path, PathBuf};

/// The hub's static pod, where kubelet's static pod source picks it up.
pub(crate) const MANIFEST: &str = "/etc/kubernetes/manifests/outpost.yaml";
pub(crate) const MANIFEST_DIR: &str = "/etc/kubernetes/manifests";
/// Same path as yurthub's node-servant, so tooling that knows OpenYurt nodes recognises ours.
pub(crate) const HUB_KUBECONFIG: &str = "/var/lib/openyurt/kubelet.conf";
pub(crate) const KUBEADM_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
pub(crate) const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
pub(crate) const CLUSTER_CA: &str = "/etc/kubernetes/pki/ca.crt";
pub(crate) const KUBELET_CLIENT_CERT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";
/// Copies of the originals plus the record of what convert did; revert deletes the whole folder.
pub(crate) const BACKUP_DIR: &str = "/var/lib/outpost/backup";
pub(crate) const RECORD: &str = "/var/lib/outpost/backup/conversion.record";

/// A node's filesystem, seen from `--root`.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    root: PathBuf,
}

impl Node {
    pub(crate) fn new(root: &Path) -> Self {
        Node {
            root: root.to_path_buf(),
        }
    }

    /// The host path of a node path such as `/etc/kubernetes/pki/ca.crt`.
    pub(crate) fn host(&self, node_path: impl AsRef<Path>) -> PathBuf {
        let node_path = node_path.as_ref();
        self.root
            .join(node_path.strip_prefix("/").unwrap_or(node_path))
    }

    /// Where convert keeps the original of a file it modifies.
    pub(crate) fn backup_of(&self, node_path: &str) -> PathBuf {
        self.host(BACKUP_DIR)
            .join(node_path.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths_land_under_the_root() {
        let node = Node::new(Path::new("/tmp/n"));
        assert_eq!(
            node.host(CLUSTER_CA),
            Path::new("/tmp/n/etc/kubernetes/pki/ca.crt")
        );
        assert_eq!(
            node.backup_of(KUBEADM_FLAGS),
            Path::new("/tmp/n/var/lib/outpost/backup/var/lib/kubelet/kubeadm-flags.env")
        );
        assert_eq!(
            Node::new(Path::new("/")).host(MANIFEST),
            Path::new(MANIFEST)
        );
    }
}
