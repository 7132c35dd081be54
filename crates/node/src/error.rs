//! The one error type of `outpost node`: each variant prints as a single line that names the file or
//! flag involved and what was found, and maps to the binary's exit code.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node is not in a state this command can act on safely; nothing was changed.
    #[error("refusing: {}: {found}", .path.display())]
    Refused { path: PathBuf, found: String },
    /// A flag value that cannot be used.
    #[error("invalid {flag}: {problem}")]
    InvalidArgument { flag: &'static str, problem: String },
    /// The hub's static pod is in place but never reported ready; kubelet was not redirected.
    #[error(
        "outpost did not become ready within {waited:?} (last answer from {url}: {last}); kubelet \
         was left untouched and {} stays in place: re-run convert to retry, or revert to remove it",
        .manifest.display()
    )]
    NotReady {
        url: String,
        last: ProbeError,
        waited: Duration,
        manifest: PathBuf,
    },
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `systemctl` (or whatever `--systemctl` names) failed.
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    /// The progress report could not be written.
    #[error("cannot write the report: {0}")]
    Report(#[source] std::io::Error),
}

impl NodeError {
    /// Refusals and bad flags exit 2, like the hub's own configuration errors; failures exit 1.
    pub fn exit_code(&self) -> u8 {
        if self.is_refusal() { 2 } else { 1 }
    }

    /// True when nothing was changed because the node or the flags were not as expected.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            NodeError::Refused { .. } | NodeError::InvalidArgument { .. }
        )
    }

    pub(crate) fn refused(path: impl Into<PathBuf>, found: impl Into<String>) -> Self {
        NodeError::Refused {
            path: path.into(),
            found: found.into(),
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        NodeError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Why one readiness probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} has no address")]
    NoAddress(String),
    #[error("HTTP {0}")]
    Status(u16),
    #[error("not an HTTP response")]
    NotHttp,
}
