//! The hub's files are the node's secrets: its client key and bootstrap token (`pki/`,
//! `bootstrap-hub.conf`), digests of the tokens it accepted, the state dump, and in the edge cache
//! every Secret kubelet fetched, in clear. Only the hub's user may read them, whatever umask the
//! hub was started with.
//!
//! [`restrict_umask`] makes everything the process creates from then on (its own files and
//! sled's) 0600 and its directories 0700. [`tighten`] runs at start over `--root-dir` and
//! `--disk-cache-path`: what an earlier version, another tool or an operator left readable by
//! others loses its group and other bits, and one log line says how many paths were tightened.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Group and other permission bits: none of them stays on the hub's files.
const OTHERS: u32 = 0o077;

/// Sets the process umask to 077. Returns the umask the process had.
pub fn restrict_umask() -> u32 {
    let before = rustix::process::umask(rustix::fs::Mode::from_raw_mode(OTHERS));
    before.as_raw_mode()
}

/// Creates `dir` (and missing parents) as 0700.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What [`tighten`] changed, and what it could not check.
#[derive(Debug, Default)]
pub struct Tightened {
    pub paths: Vec<PathBuf>,
    pub failed: Vec<(PathBuf, io::Error)>,
}

/// Takes the group and other bits off `dir` and everything under it (symbolic links are not
/// followed: what they point at is not the hub's). Directories become at most 0700, files at
/// most 0600 (0700 if they were executable).
pub fn tighten(dir: &Path) -> Tightened {
    let mut out = Tightened::default();
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                out.failed.push((path, e));
                continue;
            }
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & OTHERS != 0 {
            match fs::set_permissions(&path, fs::Permissions::from_mode(mode & !OTHERS & 0o7777)) {
                Ok(()) => out.paths.push(path.clone()),
                Err(e) => {
                    out.failed.push((path, e));
                    continue;
                }
            }
        }
        if meta.is_dir() {
            match fs::read_dir(&path) {
                Ok(entries) => pending.extend(entries.flatten().map(|e| e.path())),
                Err(e) => out.failed.push((path, e)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn set(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn loose_files_and_directories_lose_their_group_and_other_bits() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("pki")).unwrap();
        fs::write(root.join("servers.json"), "[]").unwrap();
        fs::write(root.join("pki/key.pem"), "key").unwrap();
        fs::write(root.join("private"), "already private").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        set(&root, 0o755);
        set(&root.join("pki"), 0o775);
        set(&root.join("servers.json"), 0o644);
        set(&root.join("pki/key.pem"), 0o666);
        set(&root.join("private"), 0o400);

        let tightened = tighten(&root);
        assert!(tightened.failed.is_empty(), "{:?}", tightened.failed);
        let mut paths = tightened.paths.clone();
        paths.sort();
        assert_eq!(
            paths,
            [
                root.clone(),
                root.join("pki"),
                root.join("pki/key.pem"),
                root.join("servers.json")
            ]
        );
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("pki")), 0o700);
        assert_eq!(mode(&root.join("servers.json")), 0o600);
        assert_eq!(mode(&root.join("pki/key.pem")), 0o600);
        assert_eq!(mode(&root.join("private")), 0o400, "never loosened");
        assert!(tighten(&root).paths.is_empty(), "nothing left to do");
    }

    #[test]
    fn a_missing_directory_is_nothing_to_tighten() {
        let dir = tempfile::tempdir().unwrap();
        let out = tighten(&dir.path().join("absent"));
        assert!(out.paths.is_empty() && out.failed.is_empty());
    }

    #[test]
    fn directories_are_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        create_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
    }
}
