//! File operations that leave either the old or the new file in place, never a torn one.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use crate::error::NodeError;
use crate::node::Node;

/// The file's bytes, or `None` when it does not exist.
pub(crate) fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, NodeError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(NodeError::io("read", path, e)),
    }
}

/// Writes through a temporary file and a rename, keeping the permissions of a file it replaces.
///
/// The temporary name starts with a dot because kubelet's static pod source ignores hidden files:
/// a half-written manifest must never be picked up.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    let permissions = fs::metadata(path).ok().map(|m| m.permissions());
    write_with(path, bytes, permissions)
}

/// [`write_atomic`] for a file only its owner may read, 0600 whatever the umask or the file it
/// replaces: convert's backups (kubelet's kubeconfig may embed its client key) and its record.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    write_with(path, bytes, Some(fs::Permissions::from_mode(0o600)))
}

/// Creates `dir` and its missing parents as 0700, and makes an existing `dir` 0700.
pub(crate) fn private_dir(dir: &Path) -> Result<(), NodeError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| fs::set_permissions(dir, fs::Permissions::from_mode(0o700)))
        .map_err(|e| NodeError::io("create directory", dir, e))
}

fn write_with(
    path: &Path,
    bytes: &[u8],
    permissions: Option<fs::Permissions>,
) -> Result<(), NodeError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.outpost-tmp"));
    let written = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        if let Some(p) = permissions {
            file.set_permissions(p)?;
        }
        file.sync_all()
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        // Best effort: the error that matters is the one reported below.
        fs::remove_file(&tmp).ok();
        return Err(NodeError::io("write", path, e));
    }
    Ok(())
}

/// Creates the node directory `dir` and its missing parents; returns the node paths it created,
/// outermost first, so that revert can remove exactly those.
pub(crate) fn create_dirs(node: &Node, dir: &str) -> Result<Vec<String>, NodeError> {
    let mut missing: Vec<&Path> = Path::new(dir)
        .ancestors()
        .take_while(|d| !node.host(d).exists())
        .collect();
    missing.reverse();
    for d in &missing {
        let host = node.host(d);
        fs::create_dir(&host).map_err(|e| NodeError::io("create directory", host, e))?;
    }
    Ok(missing
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect())
}

/// Removes a file; a file that is already gone is fine.
pub(crate) fn remove_file(path: &Path) -> Result<(), NodeError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(NodeError::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Removes a directory tree; one that is already gone is fine.
pub(crate) fn remove_tree(path: &Path) -> Result<(), NodeError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(NodeError::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Removes a directory if it is empty; true when it is gone afterwards.
pub(crate) fn remove_empty_dir(path: &Path) -> bool {
    fs::remove_dir(path).is_ok() || !path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_keeps_permissions_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flags.env");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn private_writes_are_0600_whatever_they_replace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup/kubelet.conf");
        private_dir(path.parent().unwrap()).unwrap();
        write_private(&path, b"client-key-data: x").unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(path.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(path.parent().unwrap()).unwrap();
        write_private(&path, b"again").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(
            mode(path.parent().unwrap()),
            0o700,
            "an existing directory is tightened"
        );
    }

    #[test]
    fn create_dirs_reports_only_what_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::new(dir.path());
        let created = create_dirs(&node, "/a/b/c").unwrap();
        assert_eq!(created, ["/a", "/a/b", "/a/b/c"]);
        assert!(dir.path().join("a/b/c").is_dir());
        assert!(create_dirs(&node, "/a/b").unwrap().is_empty());
    }
}
