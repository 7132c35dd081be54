//! What a convert or revert run changed (or, with `--dry-run`, would change).

use std::fmt;
use std::io::Write;
use std::path::PathBuf;

use crate::error::NodeError;

/// One file or directory on the node, by its host path (under `--root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(PathBuf),
    Modified(PathBuf),
    Restored(PathBuf),
    Removed(PathBuf),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (verb, path) = match self {
            Change::Created(p) => ("created", p),
            Change::Modified(p) => ("modified", p),
            Change::Restored(p) => ("restored", p),
            Change::Removed(p) => ("removed", p),
        };
        write!(f, "{verb} {}", path.display())
    }
}

/// The result of a run that did not fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// In the order they were made. convert does not list the backup folder it keeps; revert
    /// lists its removal.
    pub changes: Vec<Change>,
    /// The changes were only printed.
    pub dry_run: bool,
    pub kubelet_restarted: bool,
}

impl Outcome {
    /// True when the node was already in the requested state.
    pub fn nothing_to_do(&self) -> bool {
        self.changes.is_empty()
    }
}

/// Writes one line of the progress report.
pub(crate) fn say(out: &mut dyn Write, line: impl fmt::Display) -> Result<(), NodeError> {
    writeln!(out, "{line}").map_err(NodeError::Report)
}
