//! The cache semantics, written once over any [`Kv`]: both stores are an `Engine` plus
//! engine-specific plumbing. Start with [`write`] (how LISTs, watch events and GETs change the
//! keyspace), then [`read`] (how a query picks its scope). [`document`] holds the named
//! documents that live beside the objects.
//!
//! Concurrency: one `RwLock` around the engine. Writers take it exclusively, plan a
//! [`WriteBatch`] from what they read, and commit it atomically, so planning never races
//! another writer. Readers share it and so see whole writes only (a LIST is a consistent
//! snapshot). Corrupt entries found by readers are quarantined afterwards under the write lock.
//! Every call registers itself ([`Engine::busy`]) before it waits for the lock, so a call stuck
//! behind a stuck one shows in [`Health::busy_for`] too. [`missed`] keeps its own lock: marks
//! are written even while the database is stuck.

pub(crate) mod document;
pub(crate) mod maintain;
pub(crate) mod missed;
pub(crate) mod read;
pub(crate) mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use bytes::Bytes;
use tracing::warn;

use crate::error::CacheError;
use crate::keys;
use crate::kv::{Kv, WriteBatch};
use crate::model::{Health, ScopeId};
use crate::record::now_millis;
use missed::MissedScopes;

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
    /// The store calls in progress: a stuck engine shows in `health` even though its lock is
    /// held forever.
    calls: Calls,
    /// Set when a call met damage (`CacheError::is_damage`); the on-disk store then starts a
    /// fresh database before its next write.
    damaged: AtomicBool,
    /// Scopes known to have missed watch events.
    missed: MissedScopes,
    /// Watch events kept per scope; older watches get 410.
    max_events: usize,
    /// Bumped by every commit (see [`crate::Store::write_seq`]).
    writes: AtomicU64,
    /// Per resource ([`keys::item_resource`]), the write sequence of the last commit that
    /// changed any of its objects, pins, memberships or watch logs; and the sequence of the last
    /// switch to another database. What a scope's renewal is checked against
    /// ([`Engine::items_unchanged_since`]).
    item_writes: Mutex<HashMap<Vec<u8>, u64>>,
    switched_at: AtomicU64,
}

/// Store calls in progress, each with the time (ms since the epoch) it started or last made
/// progress.
#[derive(Default)]
struct Calls {
    next_id: AtomicU64,
    running: Mutex<BTreeMap<u64, u64>>,
}

/// One store call in progress, from before it waits for the lock until it returns.
pub(crate) struct Busy<'a> {
    calls: &'a Calls,
    id: u64,
}

impl Busy<'_> {
    /// A long call (a compaction) says it is still moving.
    pub(crate) fn progress(&self) {
        let mut running = self
            .calls
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        running.insert(self.id, now_millis());
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut running = self
            .calls
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        running.remove(&self.id);
    }
}

impl<K: Kv> Engine<K> {
    pub(crate) fn new(kv: K, max_events: usize, missed: MissedScopes) -> Self {
        Engine {
            quarantined: AtomicU64::new(kv.quarantine_len() as u64),
            kv: RwLock::new(kv),
            health: Mutex::new(Health::default()),
            calls: Calls::default(),
            damaged: AtomicBool::new(false),
            missed,
            max_events,
            writes: AtomicU64::new(0),
            item_writes: Mutex::new(HashMap::new()),
            switched_at: AtomicU64::new(0),
        }
    }

    /// Registers a store call for the stall watch ([`Health::busy_for`]) until the guard drops.
    pub(crate) fn busy(&self) -> Busy<'_> {
        let id = self.calls.next_id.fetch_add(1, Ordering::Relaxed);
        let busy = Busy {
            calls: &self.calls,
            id,
        };
        busy.progress();
        busy
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
        health.missed_scopes = self.missed.len() as u64;
        let oldest = {
            let running = self
                .calls
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            running.values().min().copied()
        };
        health.busy_for =
            oldest.map(|since| Duration::from_millis(now_millis().saturating_sub(since)));
        health
    }

    /// Records the result of a write or flush; returns it unchanged.
    pub(crate) fn observe<T>(&self, result: Result<T, CacheError>) -> Result<T, CacheError> {
        match &result {
            Ok(_) => {
                let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
                health.degraded = false;
            }
            Err(e) => self.note_failure(e),
        }
        result
    }

    /// Records a failed call's error (a read's, too: a read that meets damage must make the
    /// store degraded, and a fresh database is started before the next write). A success of a
    /// read says nothing about writes and clears nothing.
    pub(crate) fn note_failure(&self, e: &CacheError) {
        if !e.is_storage() {
            return;
        }
        if e.is_damage() && !self.damaged.swap(true, Ordering::AcqRel) {
            warn!(error = %e, "cache damaged; a fresh cache replaces it before the next write");
        }
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        if !health.degraded {
            warn!(error = %e, "cache storage failure; cache degraded");
        }
        health.degraded = true;
        health.last_error = Some(e.to_string());
    }

    /// Whether damage was met since the database was last replaced.
    pub(crate) fn is_damaged(&self) -> bool {
        self.damaged.load(Ordering::Acquire)
    }

    /// The database was replaced by a fresh one or a copy: its damage and quarantine are gone,
    /// and answers kept from it are let go.
    pub(crate) fn replaced(&self) {
        self.damaged.store(false, Ordering::Release);
        self.quarantined
            .store(self.read_kv().quarantine_len() as u64, Ordering::Relaxed);
        self.switched();
    }

    /// The live database was swapped for another (a compaction's copy, a fresh one): no scope
    /// can be renewed from a state noted before. The store calls it with the write lock still
    /// held from the swap, so that no renewal can check in between (and `replaced` once more).
    pub(crate) fn switched(&self) {
        let seq = self.note_write();
        self.switched_at.store(seq, Ordering::Release);
    }

    /// Whether no item of `resource` ([`keys::item_resource`]) has been written since the write
    /// sequence was `seq`, nor the database switched: its scopes' items are as they were then.
    pub(crate) fn items_unchanged_since(&self, resource: &[u8], seq: u64) -> bool {
        if self.switched_at.load(Ordering::Acquire) > seq {
            return false;
        }
        let writes = self
            .item_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        writes.get(resource).is_none_or(|at| *at <= seq)
    }

    pub(crate) fn missed(&self) -> &MissedScopes {
        &self.missed
    }

    pub(crate) fn missed_reason(&self, scope: &ScopeId) -> Option<String> {
        self.missed.reason(scope)
    }

    /// Plans a write against the current state and commits it, all under the write lock.
    pub(crate) fn write<T>(
        &self,
        plan: impl FnOnce(&K) -> Result<(WriteBatch, T), CacheError>,
    ) -> Result<T, CacheError> {
        let _busy = self.busy();
        let mut kv = self.write_kv();
        let (batch, out) = match plan(&kv) {
            Ok(planned) => planned,
            Err(e) => return self.observe(Err(e)),
        };
        // Only a write that reached the disk says anything about the disk's health.
        if batch.is_empty() {
            return Ok(out);
        }
        let touched = touched_resources(&batch);
        let result = kv.commit(batch);
        // Under the write lock, so a reader that notes the number before taking the read lock
        // can only see it move on from what it read.
        let seq = self.note_write();
        self.note_item_writes(touched, seq);
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
            let _busy = self.busy();
            let kv = self.read_kv();
            op(&kv, &mut suspects)
        };
        if let Err(e) = &out {
            self.note_failure(e);
        }
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

    /// Counts a change to the keyspace (a commit, a compaction's switch); the new sequence.
    pub(crate) fn note_write(&self) -> u64 {
        self.writes.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn note_item_writes(&self, resources: BTreeSet<Vec<u8>>, seq: u64) {
        if resources.is_empty() {
            return;
        }
        let mut writes = self
            .item_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for resource in resources {
            writes.insert(resource, seq);
        }
    }

    pub(crate) fn write_seq(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    pub(crate) fn max_events(&self) -> usize {
        self.max_events
    }
}

/// The resources whose items (objects, pins, memberships, watch logs) `batch` writes.
fn touched_resources(batch: &WriteBatch) -> BTreeSet<Vec<u8>> {
    let quarantined = batch.quarantine.iter().map(|(key, _)| key);
    let mut touched = BTreeSet::new();
    for key in batch.main.keys().chain(quarantined) {
        if let Some(resource) = keys::item_resource(key)
            && !touched.contains(resource)
        {
            touched.insert(resource.to_vec());
        }
    }
    touched
}
