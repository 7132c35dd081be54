//! The cache semantics, written once over any [`Kv`]: both stores are an `Engine` plus
//! engine-specific plumbing. Start with [`write`] (how LISTs, watch events and GETs change the
//! keyspace), then [`read`] (how a query picks its scope). [`document`] holds the named
//! documents that live beside the objects.
//!
//! Concurrency: one `RwLock` around the engine. Writers take it exclusively, plan a
//! [`WriteBatch`] from what they read, and commit it atomically, so planning never races
//! another writer. Readers share it and so see whole writes only (a LIST is a consistent
//! snapshot). Corrupt entries found by readers are quarantined afterwards under the write lock.

pub(crate) mod document;
pub(crate) mod maintain;
pub(crate) mod read;
pub(crate) mod write;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use bytes::Bytes;
use tracing::warn;

use crate::error::CacheError;
use crate::keys;
use crate::kv::{Kv, WriteBatch};
use crate::model::Health;
use crate::record::now_millis;

/// A stored value that failed its checks, seen by a reader.
#[derive(Debug)]
pub(crate) struct Suspect {
    pub key: Vec<u8>,
    pub raw: Bytes,
    pub reason: String,
}

pub(crate) struct Engine<K> {
    kv: RwLock<K>,
    /// Degraded flag and last error; never held together with `kv` by readers of health.
    health: Mutex<Health>,
    /// Entries in the quarantine tree, kept here so `health` never waits for the `kv` lock.
    quarantined: AtomicU64,
    /// When the storage call in progress started (ms since the epoch), 0 if none: a stuck
    /// engine shows in `health` even though its lock is held forever.
    busy_since_ms: AtomicU64,
    /// Watch events kept per scope; older watches get 410.
    max_events: usize,
    /// Bumped by every commit (see [`crate::Store::write_seq`]).
    writes: AtomicU64,
}

impl<K: Kv> Engine<K> {
    pub(crate) fn new(kv: K, max_events: usize) -> Self {
        Engine {
            quarantined: AtomicU64::new(kv.quarantine_len() as u64),
            kv: RwLock::new(kv),
            health: Mutex::new(Health::default()),
            busy_since_ms: AtomicU64::new(0),
            max_events,
            writes: AtomicU64::new(0),
        }
    }

    /// Runs one storage call (commit, flush, compaction) under the stall watch.
    pub(crate) fn timed<T>(&self, call: impl FnOnce() -> T) -> T {
        self.busy_since_ms
            .store(now_millis().max(1), Ordering::Relaxed);
        let out = call();
        self.busy_since_ms.store(0, Ordering::Relaxed);
        out
    }

    // A panic while holding the lock cannot leave the keyspace half-written (commits are
    // atomic), so a poisoned lock is still safe to use.
    pub(crate) fn read_kv(&self) -> RwLockReadGuard<'_, K> {
        self.kv.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write_kv(&self) -> RwLockWriteGuard<'_, K> {
        self.kv.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lock-free with respect to the store: answers even while a write is stuck.
    pub(crate) fn health(&self) -> Health {
        let mut health = self
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        health.quarantined = self.quarantined.load(Ordering::Relaxed);
        let since = self.busy_since_ms.load(Ordering::Relaxed);
        health.busy_for =
            (since != 0).then(|| Duration::from_millis(now_millis().saturating_sub(since)));
        health
    }

    /// Records the result of anything that touched storage; returns it unchanged.
    pub(crate) fn observe<T>(&self, result: Result<T, CacheError>) -> Result<T, CacheError> {
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(_) => {
                health.degraded = false;
            }
            Err(e) if e.is_storage() => {
                warn!(error = %e, "cache storage failure; cache degraded");
                health.degraded = true;
                health.last_error = Some(e.to_string());
            }
            Err(_) => {}
        }
        result
    }

    /// Plans a write against the current state and commits it, all under the write lock.
    pub(crate) fn write<T>(
        &self,
        plan: impl FnOnce(&K) -> Result<(WriteBatch, T), CacheError>,
    ) -> Result<T, CacheError> {
        let mut kv = self.write_kv();
        let (batch, out) = match plan(&kv) {
            Ok(planned) => planned,
            Err(e) => return self.observe(Err(e)),
        };
        // Only a write that reached the disk says anything about the disk's health.
        if batch.is_empty() {
            return Ok(out);
        }
        let result = self.timed(|| kv.commit(batch));
        // Under the write lock, so a reader that notes the number before taking the read lock
        // can only see it move on from what it read.
        self.note_write();
        drop(kv);
        self.observe(result.map(|()| out))
    }

    /// Runs a read under the shared lock, then quarantines what it found corrupt.
    pub(crate) fn read<T>(
        &self,
        op: impl FnOnce(&K, &mut Vec<Suspect>) -> Result<T, CacheError>,
    ) -> Result<T, CacheError> {
        let mut suspects = Vec::new();
        let out = {
            let kv = self.read_kv();
            op(&kv, &mut suspects)
        };
        if !suspects.is_empty()
            && let Err(e) = self.quarantine(suspects)
        {
            // The read still answers without them; they are caught again on the next read.
            warn!(error = %e, "could not quarantine corrupt cache entries");
        }
        out
    }

    /// Moves entries that are still exactly as the reader saw them to the quarantine tree.
    pub(crate) fn quarantine(&self, suspects: Vec<Suspect>) -> Result<u64, CacheError> {
        let moved = self.write(|kv| {
            let mut batch = WriteBatch::default();
            for s in suspects {
                if kv.get(&s.key)?.as_deref() != Some(&s.raw[..]) {
                    continue;
                }
                warn!(key = %keys::describe(&s.key), reason = %s.reason, "quarantining corrupt cache entry");
                batch.remove(s.key.clone());
                batch.quarantine.push((s.key, s.raw.to_vec()));
            }
            let n = batch.quarantine.len() as u64;
            Ok((batch, n))
        })?;
        self.quarantined.fetch_add(moved, Ordering::Relaxed);
        Ok(moved)
    }

    /// Counts a change to the keyspace (a commit, a compaction's switch).
    pub(crate) fn note_write(&self) {
        self.writes.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn write_seq(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    pub(crate) fn max_events(&self) -> usize {
        self.max_events
    }
}
