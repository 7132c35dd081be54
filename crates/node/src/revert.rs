//! `outpost node revert`: undo exactly what the conversion record lists, after checking that every
//! listed file still holds what convert wrote, so an edit made since is never silently lost.

use std::io::Write;
use std::path::PathBuf;

use crate::args::RevertArgs;
use crate::diff;
use crate::error::NodeError;
use crate::fsops;
use crate::kubelet::{self, RESTART_HINT};
use crate::node::{BACKUP_DIR, MANIFEST, Node, RECORD};
use crate::outcome::{Change, Outcome, say};
use crate::record::{Entry, Record, sha256};

/// What to do with one file convert touched.
#[derive(Debug)]
enum Undo {
    /// Put the original back over convert's version.
    Restore {
        host: PathBuf,
        current: Vec<u8>,
        original: Vec<u8>,
    },
    /// Delete a file convert created.
    Remove { host: PathBuf, current: Vec<u8> },
}

/// Restores kubelet's files, removes the hub's static pod and kubeconfig, and with `--purge` the
/// hub's cache and working directories.
///
/// Progress goes to `out`. A node convert never touched is reported and left alone.
pub fn revert(args: &RevertArgs, out: &mut dyn Write) -> Result<Outcome, NodeError> {
    args.validate()?;
    let node = Node::new(&args.root);
    let Some(record) = Record::load(&node)? else {
        return not_converted(&node, out);
    };
    let undos = plan(&node, &record)?;
    let dirs: Vec<&str> = record
        .entries()
        .iter()
        .rev()
        .filter(|e| matches!(e, Entry::Dir { .. }))
        .map(Entry::path)
        .collect();
    let purge = purge_targets(&node, args);
    if args.dry_run {
        return dry_run(&node, args, &undos, &dirs, &purge, out);
    }
    let mut outcome = Outcome::default();
    for undo in &undos {
        report(execute(undo)?, &mut outcome, out)?;
    }
    remove_leftovers(&node, &dirs, &purge, &mut outcome, out)?;
    if undos.iter().any(|u| matches!(u, Undo::Restore { .. })) {
        outcome.kubelet_restarted = kubelet::restart_or_advise(
            &args.systemctl,
            args.restart_kubelet,
            "for kubelet to talk to the apiserver directly again",
            out,
        )?;
    }
    say(out, "reverted")?;
    Ok(outcome)
}

fn not_converted(node: &Node, out: &mut dyn Write) -> Result<Outcome, NodeError> {
    let manifest = node.host(MANIFEST);
    if manifest.exists() {
        return Err(NodeError::refused(
            manifest,
            format!(
                "present, but there is no conversion record ({}), so there is nothing to restore \
                 kubelet from; remove the outpost static pod and kubelet's redirect by hand",
                node.host(RECORD).display()
            ),
        ));
    }
    say(
        out,
        format!(
            "not converted by outpost (no {}): nothing to do",
            node.host(RECORD).display()
        ),
    )?;
    Ok(Outcome::default())
}

/// Checks every recorded file before anything is changed; newest first, so kubelet is restored
/// before the hub it relies on goes away.
fn plan(node: &Node, record: &Record) -> Result<Vec<Undo>, NodeError> {
    let mut undos = Vec::new();
    for entry in record.entries().iter().rev() {
        let undo = match entry {
            Entry::Dir { .. } => None,
            Entry::Created { path, sha } => created(node, path, sha)?,
            Entry::Modified {
                path,
                sha,
                original_sha,
            } => modified(node, path, sha, original_sha)?,
        };
        undos.extend(undo);
    }
    Ok(undos)
}

fn created(node: &Node, path: &str, sha: &str) -> Result<Option<Undo>, NodeError> {
    let host = node.host(path);
    match fsops::read_opt(&host)? {
        None => Ok(None),
        Some(current) if sha256(&current) == sha => Ok(Some(Undo::Remove { host, current })),
        Some(_) => Err(NodeError::refused(
            host,
            "changed since outpost node convert wrote it; delete it by hand if that is intended, \
             then run revert again",
        )),
    }
}

fn modified(
    node: &Node,
    path: &str,
    sha: &str,
    original_sha: &str,
) -> Result<Option<Undo>, NodeError> {
    let backup = node.backup_of(path);
    let original = match fsops::read_opt(&backup)? {
        Some(bytes) if sha256(&bytes) == original_sha => bytes,
        Some(_) => {
            return Err(NodeError::refused(
                backup,
                "the backup does not match the checksum in the conversion record",
            ));
        }
        None => {
            return Err(NodeError::refused(
                backup,
                "the backup of the original is missing",
            ));
        }
    };
    let host = node.host(path);
    let Some(current) = fsops::read_opt(&host)? else {
        return Err(NodeError::refused(
            host,
            format!("missing; its original is in {}", backup.display()),
        ));
    };
    let current_sha = sha256(&current);
    if current_sha == original_sha {
        Ok(None)
    } else if current_sha == sha {
        Ok(Some(Undo::Restore {
            host,
            current,
            original,
        }))
    } else {
        Err(NodeError::refused(
            host,
            format!(
                "changed since outpost node convert modified it; its original is in {}: put it \
                 back by hand, then run revert again",
                backup.display()
            ),
        ))
    }
}

fn execute(undo: &Undo) -> Result<Change, NodeError> {
    match undo {
        Undo::Restore { host, original, .. } => {
            fsops::write_atomic(host, original)?;
            Ok(Change::Restored(host.clone()))
        }
        Undo::Remove { host, .. } => {
            fsops::remove_file(host)?;
            Ok(Change::Removed(host.clone()))
        }
    }
}

/// The backup folder, the directories convert created (if empty), and the purged directories.
fn remove_leftovers(
    node: &Node,
    dirs: &[&str],
    purge: &[PathBuf],
    outcome: &mut Outcome,
    out: &mut dyn Write,
) -> Result<(), NodeError> {
    let backup = node.host(BACKUP_DIR);
    fsops::remove_tree(&backup)?;
    report(Change::Removed(backup), outcome, out)?;
    for dir in dirs.iter().map(|d| node.host(d)) {
        if !dir.exists() {
            continue;
        }
        if fsops::remove_empty_dir(&dir) {
            report(Change::Removed(dir), outcome, out)?;
        } else {
            say(out, format!("kept {}: not empty", dir.display()))?;
        }
    }
    for dir in purge {
        fsops::remove_tree(dir)?;
        report(Change::Removed(dir.clone()), outcome, out)?;
    }
    Ok(())
}

fn report(change: Change, outcome: &mut Outcome, out: &mut dyn Write) -> Result<(), NodeError> {
    say(out, &change)?;
    outcome.changes.push(change);
    Ok(())
}

/// Existing hub directories to delete, only with `--purge`.
fn purge_targets(node: &Node, args: &RevertArgs) -> Vec<PathBuf> {
    if !args.purge {
        return Vec::new();
    }
    [&args.disk_cache_path, &args.root_dir]
        .into_iter()
        .map(|p| node.host(p))
        .filter(|p| p.exists())
        .collect()
}

fn dry_run(
    node: &Node,
    args: &RevertArgs,
    undos: &[Undo],
    dirs: &[&str],
    purge: &[PathBuf],
    out: &mut dyn Write,
) -> Result<Outcome, NodeError> {
    say(
        out,
        "dry run: nothing is changed; revert would make these changes:",
    )?;
    let mut outcome = Outcome {
        dry_run: true,
        ..Outcome::default()
    };
    for undo in undos {
        let change = match undo {
            Undo::Restore {
                host,
                current,
                original,
            } => {
                diff::print(out, host, Some(current), Some(original))?;
                Change::Restored(host.clone())
            }
            Undo::Remove { host, current } => {
                diff::print(out, host, Some(current), None)?;
                Change::Removed(host.clone())
            }
        };
        outcome.changes.push(change);
    }
    let mut removals = vec![node.host(BACKUP_DIR)];
    removals.extend(dirs.iter().map(|d| node.host(d)).filter(|d| d.exists()));
    removals.extend(purge.iter().cloned());
    for dir in removals {
        say(out, format!("would remove {}", dir.display()))?;
        outcome.changes.push(Change::Removed(dir));
    }
    if undos.iter().any(|u| matches!(u, Undo::Restore { .. })) {
        let kubelet = if args.restart_kubelet {
            "would be restarted"
        } else {
            "would not be restarted"
        };
        say(out, format!("kubelet {kubelet} ({RESTART_HINT})"))?;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_targets_only_with_purge_and_only_existing_dirs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("var/lib/yurthub")).unwrap();
        let node = Node::new(dir.path());
        let mut args = RevertArgs {
            root: dir.path().into(),
            purge: false,
            dry_run: false,
            restart_kubelet: false,
            disk_cache_path: "/etc/kubernetes/cache/".into(),
            root_dir: "/var/lib/yurthub".into(),
            systemctl: "systemctl".into(),
        };
        assert!(purge_targets(&node, &args).is_empty());
        args.purge = true;
        assert_eq!(
            purge_targets(&node, &args),
            [dir.path().join("var/lib/yurthub")]
        );
    }
}
