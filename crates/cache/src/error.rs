//! Errors of the cache. [`CacheError`] is every failure of a store call; [`ReplayError`] adds the
//! one expected outcome of an offline WATCH that the cache cannot serve.

use std::path::PathBuf;

use crate::model::ResourceVersion;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A file-system operation on the cache directory failed (create, read `CURRENT`, swap).
    #[error("cache {op} at {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// sled failed: opening, writing, flushing. After a write error sled may refuse every later
    /// write until the store is reopened.
    #[error("cache {op}: {source}")]
    Sled {
        op: &'static str,
        #[source]
        source: sled::Error,
    },
    /// The bytes handed to the cache are not a Kubernetes object it can key (not JSON, no
    /// `metadata.name`, wrong namespace for the scope). Nothing was written.
    #[error("cannot cache object: {0}")]
    InvalidObject(String),
    /// The cache's files are damaged: sled panicked or reported corruption. The on-disk store
    /// moves the database aside and starts a fresh one (see `sled_store`, "Damage").
    #[error("cache damaged: {0}")]
    Damaged(String),
    /// The file system holding the cache has less free space than the floor the store keeps:
    /// writes are refused (nothing was written) until space is freed, so that sled never meets
    /// a full disk.
    #[error(
        "cache not written: {} has {} MiB free, under the {} MiB floor",
        path.display(),
        free >> 20,
        floor >> 20
    )]
    LowSpace {
        path: PathBuf,
        free: u64,
        floor: u64,
    },
}

impl CacheError {
    pub(crate) fn sled(op: &'static str) -> impl FnOnce(sled::Error) -> CacheError {
        move |source| CacheError::Sled { op, source }
    }

    pub(crate) fn io(op: &'static str, path: PathBuf) -> impl FnOnce(std::io::Error) -> CacheError {
        move |source| CacheError::Io { op, path, source }
    }

    /// Whether opening failed because another process holds the cache's file lock: sled locks
    /// its database exclusively, so while a hub runs on a cache no other process can open it.
    pub fn is_locked(&self) -> bool {
        matches!(self, CacheError::Sled { op: "open", source: sled::Error::Io(e) } if is_lock_conflict(e))
    }

    /// Whether the error is about storage (and so makes the store degraded) rather than input.
    pub fn is_storage(&self) -> bool {
        !matches!(self, CacheError::InvalidObject(_))
    }

    /// Whether the error says the cache's own files are damaged, so that a fresh database (and
    /// not the same one again) is the way out: a panic inside sled, sled's corruption reports,
    /// unreadable data. A held lock or an environment the store cannot work in (permissions,
    /// a read-only or full file system) is not damage: a fresh database would fail the same way,
    /// and moving the old one aside would lose what it holds for nothing.
    pub fn is_damage(&self) -> bool {
        match self {
            CacheError::Damaged(_) => true,
            CacheError::Sled { source, .. } => match source {
                sled::Error::Corruption { .. } | sled::Error::ReportableBug(_) => true,
                sled::Error::Io(e) => !is_lock_conflict(e) && !is_environment(e),
                sled::Error::Unsupported(_) | sled::Error::CollectionNotFound(_) => false,
            },
            CacheError::Io { source, .. } => source.kind() == std::io::ErrorKind::InvalidData,
            CacheError::InvalidObject(_) | CacheError::LowSpace { .. } => false,
        }
    }
}

/// I/O failures that come from where the cache lives, not from what its files hold.
fn is_environment(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        PermissionDenied
            | ReadOnlyFilesystem
            | StorageFull
            | QuotaExceeded
            | FileTooLarge
            | OutOfMemory
            | Interrupted
            | WouldBlock
            | TimedOut
    )
}

/// sled 0.34 reports a held file lock only as an `Io` error of kind `Other` with this text.
pub(crate) fn is_lock_conflict(e: &std::io::Error) -> bool {
    e.to_string().contains("could not acquire lock")
}

/// Why [`Store::events_since`](crate::Store::events_since) returned no events.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The cache cannot prove it holds every event after the requested version (the log was
    /// trimmed or reset by a relist, the version is unknown, or no scope covers the watch).
    /// Answer `410 Gone` so the client relists.
    #[error("resourceVersion too old for the cached watch log")]
    TooOld(TooOld),
    /// The answering scope missed watch events (see
    /// [`Store::mark_missed`](crate::Store::mark_missed)): nothing it holds can be replayed as
    /// the truth until a LIST replaces it.
    #[error("the cached scope missed watch events: {0}")]
    Missed(String),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooOld {
    /// The oldest version a watch could start from, when a scope covers the request.
    pub oldest_available: Option<ResourceVersion>,
}

/// Worded for the Status message a client sees.
impl std::fmt::Display for TooOld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.oldest_available {
            Some(rv) => write!(f, "the oldest it can replay from is {rv}"),
            None => f.write_str("no cached list covers this watch"),
        }
    }
}
