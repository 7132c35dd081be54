//! Scopes known to have missed watch events: the proxy passed an event on that the cache could
//! not store (the writer's queue was full, the disk was under its free-space floor, a write
//! failed, an object was over the size limit). Such a scope's members may lack what was created
//! or still hold what was deleted since, so reads report it (`ListResult::missed`,
//! `ReplayError::Missed`) and the proxy answers 503 instead of serving it as the truth.
//!
//! A mark stays until the proxy clears it after a LIST replaced the scope. It is kept in memory
//! and, for the on-disk store, in a small file beside the database (`MISSED`), rewritten whole
//! (temp file, fsync, rename, fsync of the directory) on every change: it must survive a crash,
//! and it is written even when sled cannot be (a full or stuck database), into the room the
//! store's free-space floor leaves.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::CacheError;
use crate::model::ScopeId;

#[derive(Default)]
pub(crate) struct MissedScopes {
    marks: Mutex<BTreeMap<ScopeId, String>>,
    /// `None` for the in-memory store.
    file: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct Mark {
    scope: ScopeId,
    reason: String,
}

impl MissedScopes {
    /// The marks kept in `file`. The file is only ever replaced whole, so an unreadable one is
    /// damage from outside; it is logged and read as no marks, and rewritten on the next change.
    pub(crate) fn load(file: PathBuf) -> MissedScopes {
        let marks = match fs::read(&file) {
            Ok(bytes) => match serde_json::from_slice::<Vec<Mark>>(&bytes) {
                Ok(marks) => marks.into_iter().map(|m| (m.scope, m.reason)).collect(),
                Err(e) => {
                    warn!(file = %file.display(), error = %e, "unreadable list of scopes that missed events; ignored");
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                warn!(file = %file.display(), error = %e, "cannot read the list of scopes that missed events");
                BTreeMap::new()
            }
        };
        MissedScopes {
            marks: Mutex::new(marks),
            file: Some(file),
        }
    }

    /// Marks `scope`; `Ok(true)` if it was not marked before. The mark holds in memory at once,
    /// and on disk once this returns `Ok`.
    pub(crate) fn mark(&self, scope: &ScopeId, reason: &str) -> Result<bool, CacheError> {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.contains_key(scope) {
            return Ok(false);
        }
        marks.insert(scope.clone(), reason.to_owned());
        self.persist(&marks)?;
        Ok(true)
    }

    /// Clears `scope`'s mark; `Ok(true)` if it had one.
    pub(crate) fn clear(&self, scope: &ScopeId) -> Result<bool, CacheError> {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.remove(scope).is_none() {
            return Ok(false);
        }
        self.persist(&marks)?;
        Ok(true)
    }

    /// Forgets every mark (the database they were about is gone).
    pub(crate) fn clear_all(&self) -> Result<(), CacheError> {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        marks.clear();
        self.persist(&marks)
    }

    pub(crate) fn reason(&self, scope: &ScopeId) -> Option<String> {
        let marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        marks.get(scope).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.marks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn persist(&self, marks: &BTreeMap<ScopeId, String>) -> Result<(), CacheError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let list: Vec<Mark> = marks
            .iter()
            .map(|(scope, reason)| Mark {
                scope: scope.clone(),
                reason: reason.clone(),
            })
            .collect();
        let bytes = serde_json::to_vec(&list).expect("marks serialize");
        write_durably(file, &bytes)
    }
}

/// Replaces `path` with `bytes` atomically and durably: temp file, fsync, rename, fsync dir.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), CacheError> {
    let name = path
        .file_name()
        .map_or_else(|| "file".to_owned(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!("{name}.tmp"));
    let io = |op| CacheError::io(op, tmp.clone());
    let mut file = fs::File::create(&tmp).map_err(io("write"))?;
    file.write_all(bytes).map_err(io("write"))?;
    file.sync_all().map_err(io("sync"))?;
    fs::rename(&tmp, path).map_err(io("rename"))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CacheError::io("sync", dir.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Gvr, Scope};

    fn scope(component: &str) -> ScopeId {
        Scope::unfiltered(component, &Gvr::new("", "v1", "pods"), None).id()
    }

    #[test]
    fn marks_survive_a_reload_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("MISSED");
        let marks = MissedScopes::load(file.clone());
        assert!(marks.mark(&scope("kubelet"), "queue full").unwrap());
        assert!(!marks.mark(&scope("kubelet"), "again").unwrap(), "once");
        assert!(marks.mark(&scope("coredns"), "no space").unwrap());
        let reloaded = MissedScopes::load(file.clone());
        assert_eq!(
            reloaded.reason(&scope("kubelet")).as_deref(),
            Some("queue full")
        );
        assert_eq!(reloaded.len(), 2);
        assert!(reloaded.clear(&scope("kubelet")).unwrap());
        assert!(!reloaded.clear(&scope("kubelet")).unwrap());
        let again = MissedScopes::load(file.clone());
        assert_eq!(again.reason(&scope("kubelet")), None);
        assert_eq!(again.len(), 1);
        std::fs::write(&file, b"garbage").unwrap();
        assert_eq!(MissedScopes::load(file).len(), 0);
    }
}
