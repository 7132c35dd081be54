//! [`ListMemo`]: offline LIST answers kept in memory for as long as the cache has not changed.
//!
//! While the cloud is away the cache barely changes, and clients relist the same scopes again
//! and again (informers after every broken watch, kubectl). A memo answers those from memory:
//! no trip to the blocking pool, no sled read, no checksum over the same megabyte. It is keyed by
//! the query and tagged with [`Store::write_seq`] as noted *before* the read, so any write since
//! (an event, a relist, a quarantine, a compaction) makes it miss and the store is read again.
//! Answers that are kept share their objects with the cache's buffers; the first reuse renders
//! the unpaged answer into one buffer, which hyper writes in one go. The memo holds at most
//! [`MAX_BYTES`], counting both.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bytes::Bytes;
use outpost_cache::{ListResult, Scope, Store};

use super::kinds::KindInfo;
use super::reads;
use crate::error::ProxyError;

/// The covered list of a scope and its kind, shared.
pub type Covered = Arc<Listed>;

/// A scope's cached list as read at one point of the cache's history.
pub struct Listed {
    pub result: ListResult,
    pub kind: KindInfo,
    /// The unpaged answer as one buffer, rendered when first reused from memory: hyper writes
    /// it in one go instead of an item at a time, and the first answer after a read does not
    /// pay for a copy that may never be used again.
    whole: OnceLock<Bytes>,
}

impl Listed {
    pub fn new(result: ListResult, kind: KindInfo) -> Listed {
        Listed {
            result,
            kind,
            whole: OnceLock::new(),
        }
    }

    /// The unpaged answer, rendered by `render` once and shared by every answer after.
    pub fn whole_body(&self, render: impl FnOnce(&Listed) -> Bytes) -> Bytes {
        self.whole.get_or_init(|| render(self)).clone()
    }
}

/// Bytes the memo may keep alive: each answer's objects and their rendering in one buffer.
pub const MAX_BYTES: usize = 4 << 20;

struct Kept {
    query: Scope,
    seq: u64,
    bytes: usize,
    answer: Covered,
}

/// Where [`ListMemo::covered`] found its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Memory,
    Store,
}

#[derive(Default)]
pub struct ListMemo {
    kept: Mutex<Vec<Kept>>,
}

impl ListMemo {
    /// The list covering `query`: from memory if the cache has not changed since it was read,
    /// else from the store (and then kept).
    pub async fn covered(
        &self,
        store: &Arc<dyn Store>,
        query: Scope,
    ) -> Result<(Covered, Source), ProxyError> {
        let seq = store.write_seq();
        if let Some(answer) = self.lookup(&query, seq) {
            return Ok((answer, Source::Memory));
        }
        let (result, kind) = reads::covered_list(store, query.clone()).await?;
        let answer: Covered = Arc::new(Listed::new(result, kind));
        self.keep(query, seq, answer.clone());
        Ok((answer, Source::Store))
    }

    fn lookup(&self, query: &Scope, seq: u64) -> Option<Covered> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter()
            .find(|k| k.seq == seq && k.query == *query)
            .map(|k| k.answer.clone())
    }

    /// Keeps `answer`, dropping what is out of date and then the oldest until it fits.
    fn keep(&self, query: Scope, seq: u64, answer: Covered) {
        let objects: usize = answer.result.items.iter().map(|o| o.bytes.len()).sum();
        let bytes = 2 * objects;
        if bytes > MAX_BYTES {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|k| k.seq == seq && k.query != query);
        while kept.iter().map(|k| k.bytes).sum::<usize>() + bytes > MAX_BYTES {
            kept.remove(0);
        }
        kept.push(Kept {
            query,
            seq,
            bytes,
            answer,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_cache::{Gvr, MemStore};

    fn pods() -> Gvr {
        Gvr::new("", "v1", "pods")
    }

    fn pod(name: &str, rv: &str) -> Vec<u8> {
        format!(r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"d","resourceVersion":"{rv}"}}}}"#).into_bytes()
    }

    fn names(covered: &Covered) -> Vec<String> {
        covered
            .result
            .items
            .iter()
            .map(|o| {
                let v: serde_json::Value = serde_json::from_slice(&o.bytes).unwrap();
                v["metadata"]["name"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_kept_answer_is_reused_until_anything_is_written() {
        let mem = Arc::new(MemStore::new());
        let store: Arc<dyn Store> = mem.clone();
        let kubelet = Scope::unfiltered("kubelet", &pods(), None);
        store
            .replace_scope(&kubelet, "5", &[&pod("a", "4")])
            .unwrap();
        let memo = ListMemo::default();
        let (first, source) = memo.covered(&store, kubelet.clone()).await.unwrap();
        assert_eq!(source, Source::Store);
        let (again, source) = memo.covered(&store, kubelet.clone()).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "unchanged cache: from memory");
        assert_eq!(source, Source::Memory);

        // A write anywhere, here to another component's scope, moves the cache on.
        let proxy = Scope::unfiltered("kube-proxy", &pods(), None);
        store.replace_scope(&proxy, "6", &[&pod("z", "6")]).unwrap();
        let (after_other, _) = memo.covered(&store, kubelet.clone()).await.unwrap();
        assert!(
            !Arc::ptr_eq(&first, &after_other),
            "read again after a write"
        );

        store
            .apply_event(&kubelet, outpost_cache::EventType::Added, &pod("b", "7"))
            .unwrap();
        let (after_event, _) = memo.covered(&store, kubelet.clone()).await.unwrap();
        assert_eq!(names(&after_event), ["a", "b"], "never a stale answer");
        let (proxy_list, _) = memo.covered(&store, proxy).await.unwrap();
        assert_eq!(names(&proxy_list), ["z"], "answers are kept per query");
    }

    #[test]
    fn the_memo_keeps_at_most_max_bytes() {
        let memo = ListMemo::default();
        let big = |n: usize| -> Covered {
            let object = outpost_cache::CachedObject {
                bytes: bytes::Bytes::from(vec![b' '; n]),
                resource_version: outpost_cache::ResourceVersion::new("1"),
                uid: String::new(),
                checksum: 0,
                written_at: std::time::UNIX_EPOCH,
            };
            let list = ListResult {
                served_from: Scope::unfiltered("kubelet", &pods(), None).id(),
                resource_version: outpost_cache::ResourceVersion::new("1"),
                items: vec![object],
                missing: Vec::new(),
                missed: None,
            };
            Arc::new(Listed::new(
                list,
                KindInfo::from_list("PodList", "v1").unwrap(),
            ))
        };
        let scope = |ns: &str| Scope::unfiltered("kubelet", &pods(), Some(ns));
        // Each answer counts twice: its objects, and their rendering in one buffer.
        memo.keep(scope("a"), 1, big(MAX_BYTES / 4));
        memo.keep(scope("b"), 1, big(MAX_BYTES / 4));
        memo.keep(scope("c"), 1, big(MAX_BYTES / 4));
        assert!(memo.lookup(&scope("a"), 1).is_none(), "the oldest went");
        assert!(memo.lookup(&scope("b"), 1).is_some());
        assert!(memo.lookup(&scope("c"), 1).is_some());
        memo.keep(scope("d"), 2, big(10));
        assert!(
            memo.lookup(&scope("c"), 1).is_none(),
            "out of date: dropped"
        );
        memo.keep(scope("e"), 2, big(MAX_BYTES / 2 + 1));
        assert!(memo.lookup(&scope("e"), 2).is_none(), "too big to keep");
    }
}
