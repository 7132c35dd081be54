//! The one seam between cache semantics and a storage engine: a sorted byte map with prefix
//! scans and atomic multi-key commits, plus a quarantine map. [`MemKv`] is the `BTreeMap`
//! version; `sled_store::SledKv` is the on-disk one.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::error::CacheError;

/// A key and its value; values are shared `Bytes` so a read hands sled's buffer on uncopied.
pub(crate) type Entry = (Vec<u8>, Bytes);

/// Writes that must land together or not at all.
#[derive(Debug, Default)]
pub(crate) struct WriteBatch {
    /// Main-tree writes; `None` deletes. A map so a later write to a key replaces an earlier
    /// one within the batch; planners read their own writes through it (`engine::write`).
    pub main: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Entries to add to the quarantine tree (their main key is deleted via `main`).
    pub quarantine: Vec<(Vec<u8>, Vec<u8>)>,
}

impl WriteBatch {
    pub(crate) fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.main.insert(key, Some(value));
    }

    pub(crate) fn remove(&mut self, key: Vec<u8>) {
        self.main.insert(key, None);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.main.is_empty() && self.quarantine.is_empty()
    }
}

pub(crate) trait Kv: Send + Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, CacheError>;

    /// Entries whose key starts with `prefix`, in key order.
    fn scan(&self, prefix: &[u8]) -> impl Iterator<Item = Result<Entry, CacheError>> + '_;

    /// Applies the whole batch atomically, also across a crash.
    fn commit(&mut self, batch: WriteBatch) -> Result<(), CacheError>;

    fn quarantine_len(&self) -> usize;

    /// Approximate bytes used.
    fn size(&self) -> Result<u64, CacheError>;
}

/// In-memory engine for tests and for a proxy run without `--disk-cache-path`.
#[derive(Debug, Default)]
pub(crate) struct MemKv {
    pub(crate) main: BTreeMap<Vec<u8>, Vec<u8>>,
    quarantine: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Kv for MemKv {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, CacheError> {
        Ok(self.main.get(key).map(|v| Bytes::copy_from_slice(v)))
    }

    fn scan(&self, prefix: &[u8]) -> impl Iterator<Item = Result<Entry, CacheError>> + '_ {
        let prefix = prefix.to_vec();
        self.main
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| Ok((k.clone(), Bytes::copy_from_slice(v))))
    }

    fn commit(&mut self, batch: WriteBatch) -> Result<(), CacheError> {
        for (k, v) in batch.main {
            match v {
                Some(v) => self.main.insert(k, v),
                None => self.main.remove(&k),
            };
        }
        self.quarantine.extend(batch.quarantine);
        Ok(())
    }

    fn quarantine_len(&self) -> usize {
        self.quarantine.len()
    }

    fn size(&self) -> Result<u64, CacheError> {
        let bytes = self
            .main
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
        Ok(bytes as u64)
    }
}
