//! [`SledStore`]: the cache on disk, under `--disk-cache-path`.
//!
//! # Directory layout
//! ```text
//! <root>/CURRENT     "db-<n>": the live sled database (replaced by write-temp + rename)
//! <root>/db-<n>/     sled: tree "cache" (keys::) and tree "quarantine" (corrupt entries)
//! ```
//! Any other `db-*` directory is a leftover of an interrupted compaction and is deleted on open.
//! A missing `CURRENT` means a new cache (the cache can always be refetched).
//!
//! # Crash safety
//! Every store call commits one sled batch (`Tree::apply_batch`, or a two-tree transaction when
//! quarantining), which sled recovers atomically: after a crash each batch is wholly present or
//! wholly absent, so an object is its old or its new version and a LIST replace is all or
//! nothing. Values are checksummed on top (see `record`), so damage sled does not catch is
//! quarantined rather than served. `tests/kill9.rs` checks this with SIGKILL at random moments.
//!
//! # Flush policy (what a crash can lose)
//! By default (`sync_every_write`) every write call flushes before it returns: sled writes its
//! log buffers to the file and fsyncs them. A returned write is durable against process kill
//! and power failure alike, and a crash can only lose the call in progress, never tear it.
//! Two calls write nothing worth a flush: a `put_object` of the bytes and resourceVersion
//! already stored (kubelet's Node GET every 10 s) writes nothing at all, and a BOOKMARK (a scope's
//! resourceVersion) rides on the next flushed write; losing one to a crash means a replay from
//! the previous resourceVersion, never a wrong object.
//! It costs a flush per call: a pod MODIFIED takes ~0.28 ms flushed vs ~0.09 ms unflushed on
//! this VM (`benches/store.rs`; more on SD cards). A burst of watch events is therefore written
//! as a group: [`Store::apply_events`] takes the events the proxy's writer found queued for one
//! scope (at most 256 KiB) as one call, one batch and one flush, ~47 µs per pod event for 32 of
//! them. Durability is unchanged: a call returns once its whole group is on disk, and a crash
//! loses at most the group in progress, never part of one. Flushing every call is also what
//! keeps sled 0.34 clear of its deadlock (below).
//!
//! With `sync_every_write` off, writes are made durable by sled's background thread every
//! `flush_every_ms` (500 ms), by every relist, and after every MiB written. A process kill then
//! loses what sled still buffered in memory (at most ~`flush_every_ms` of writes; writes already
//! handed to the kernel survive, as `tests/kill9.rs` shows), a power failure what was not yet
//! fsynced (the same window). Batches are still never torn.
//!
//! # Space
//! sled 0.34 needs ~2.5x the live record bytes even in a freshly written database (8 KiB values)
//! and settles at ~3-4x under overwrites (`tests/sled_disk.rs`: a 4.2 MB fresh copy grew to
//! 10-12.5 MB over 15 rounds of overwrites). [`Store::compact`] copies the live entries into a
//! fresh `db-<n+1>`, flushes it, switches `CURRENT` and deletes the old one, which reclaims down
//! to the fresh-copy size, not to the live bytes. With `compact_above_bytes` set it runs by
//! itself when the directory outgrows the bound (checked on open and after every 256 KiB
//! written); set the bound to at least ~4x the expected live data (objects plus event logs).
//!
//! # A known sled 0.34 deadlock
//! sled runs its log writes and file truncations on one shared pool of seven threads. When all
//! of them hold log buffers waiting for the segment accountant while the accountant waits for a
//! truncation queued behind them, every writer stops forever (fixed upstream by sled PR #1269,
//! never released for 0.34; see also the open sled issue #1412). Writing pods at full speed
//! (`examples/sled_stress.rs`) deadlocked within 30 s in 3 of 3 runs without a flush policy and
//! in 2 of 8 runs when flushing after every MiB; flushing after every call, which caps the log
//! buffers in flight at what one call writes, survived 9 runs (23 min, 1.35 M writes, with
//! relists of 110 pods mixed in). A group of events is bounded (256 KiB) well below one such
//! relist (~0.9 MB), the largest call the cache already makes; `sled_stress … grouped`
//! (32 events per call, a relist every 200 events) survived 3 runs of 150 s, 4.5 M writes.
//! That is evidence, not proof. (With the relists in the mix, `batched` also survived a 60 s
//! run: each relist flushes, which bounds what is in flight.)
//! A single huge batch (a relist of tens of MB) can still put many buffers in flight.
//! [`Health::busy_for`] exposes a stuck call without taking the store's lock, so the proxy can
//! stop caching and restart the process.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use tracing::{info, warn};

use crate::Store;
use crate::engine::Engine;
use crate::error::{CacheError, ReplayError, is_lock_conflict};
use crate::kv::{Entry, Kv, WriteBatch};
use crate::model::*;

/// A reconnecting watch is normally seconds behind. An entry names its object (tens of bytes);
/// only a DELETED entry carries the object (~8 KiB for a pod).
pub(crate) const DEFAULT_MAX_EVENTS: usize = 256;
const MAIN_TREE: &str = "cache";
const QUARANTINE_TREE: &str = "quarantine";
const CURRENT: &str = "CURRENT";
const DB_PREFIX: &str = "db-";
/// Bytes handed to the store between two size checks for automatic compaction: a check costs a
/// few `stat`s, and sled's file can outgrow the bound by about this much times its write
/// amplification before the next check.
const SIZE_CHECK_EVERY_BYTES: u64 = 256 << 10;
/// Without `sync_every_write`, bytes handed to the store between two forced flushes: a flush
/// waits for every log buffer in flight, which bounds them (see the deadlock note above).
const FLUSH_EVERY_BYTES: u64 = 1 << 20;
/// How long `open` waits for another handle's file lock to go away.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Entries per batch when copying into a compacted database.
const COPY_BATCH: u64 = 1024;

/// How sled 0.34 names the threads it writes on: its I/O pool (`sled-io-<n>`, started by the
/// first store opened in the process) and each database's log flusher. Prefixes of
/// `/proc/self/task/<tid>/comm`, for a caller that schedules the cache's background work (the
/// proxy's writer lowers their CPU priority).
pub const BACKGROUND_THREAD_PREFIXES: &[&str] = &["sled-io", "log flusher"];

/// Tunables of a [`SledStore`]; `Default` is what the daemon should use.
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// Flush before every write call returns (see "Flush policy"); on by default.
    pub sync_every_write: bool,
    /// sled's background flush interval; matters when `sync_every_write` is off.
    pub flush_every_ms: Option<u64>,
    /// Watch events kept per scope for offline WATCH replay.
    pub max_events_per_scope: usize,
    /// Compact automatically once the directory is larger than this.
    pub compact_above_bytes: Option<u64>,
    /// sled's page cache. Its default (1 GiB) is far too much for an edge node.
    pub cache_capacity_bytes: u64,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            sync_every_write: true,
            flush_every_ms: Some(500),
            max_events_per_scope: DEFAULT_MAX_EVENTS,
            compact_above_bytes: None,
            cache_capacity_bytes: 16 << 20,
        }
    }
}

/// One open sled database.
pub(crate) struct SledKv {
    db: sled::Db,
    main: sled::Tree,
    quarantine: sled::Tree,
    /// `db-<n>`, as named in `CURRENT`.
    name: String,
    root: PathBuf,
}

impl SledKv {
    fn open(root: &Path, name: &str, options: &SledOptions) -> Result<Self, CacheError> {
        let config = sled::Config::new()
            .path(root.join(name))
            .cache_capacity(options.cache_capacity_bytes)
            .flush_every_ms(options.flush_every_ms);
        let db = open_waiting_for_lock(&config).map_err(CacheError::sled("open"))?;
        let main = db.open_tree(MAIN_TREE).map_err(CacheError::sled("open"))?;
        let quarantine = db
            .open_tree(QUARANTINE_TREE)
            .map_err(CacheError::sled("open"))?;
        Ok(SledKv {
            db,
            main,
            quarantine,
            name: name.to_owned(),
            root: root.to_owned(),
        })
    }

    fn flush(&self) -> Result<(), CacheError> {
        self.db.flush().map_err(CacheError::sled("flush"))?;
        Ok(())
    }

    fn commit_with_quarantine(
        &self,
        main: sled::Batch,
        quarantine: sled::Batch,
    ) -> Result<(), CacheError> {
        (&self.main, &self.quarantine)
            .transaction(|(m, q)| {
                m.apply_batch(&main)?;
                q.apply_batch(&quarantine)?;
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(source) => CacheError::Sled {
                    op: "quarantine",
                    source,
                },
                TransactionError::Abort(()) => CacheError::Sled {
                    op: "quarantine",
                    source: sled::Error::Unsupported("transaction aborted".into()),
                },
            })
    }
}

/// sled releases its file lock only when its I/O threads drop their last handle, a moment after
/// the previous `Db` is dropped: an in-process reopen waits for that, while a second process
/// holding the cache still fails (after `LOCK_WAIT`).
fn open_waiting_for_lock(config: &sled::Config) -> sled::Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(sled::Error::Io(e)) if is_lock_conflict(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

fn entry(result: sled::Result<(sled::IVec, sled::IVec)>) -> Result<Entry, CacheError> {
    let (k, v) = result.map_err(CacheError::sled("read"))?;
    Ok((k.to_vec(), Bytes::from_owner(v)))
}

impl Kv for SledKv {
    /// The value shares sled's buffer (no copy): an offline LIST hands ~1 MB of pods on this way.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, CacheError> {
        let value = self.main.get(key).map_err(CacheError::sled("read"))?;
        Ok(value.map(Bytes::from_owner))
    }

    fn scan(&self, prefix: &[u8]) -> impl Iterator<Item = Result<Entry, CacheError>> + '_ {
        self.main.scan_prefix(prefix).map(entry)
    }

    fn commit(&mut self, batch: WriteBatch) -> Result<(), CacheError> {
        let mut main = sled::Batch::default();
        for (k, v) in batch.main {
            match v {
                Some(v) => main.insert(k, v),
                None => main.remove(k),
            }
        }
        if batch.quarantine.is_empty() {
            return self
                .main
                .apply_batch(main)
                .map_err(CacheError::sled("write"));
        }
        let mut quarantine = sled::Batch::default();
        for (k, v) in batch.quarantine {
            quarantine.insert(k, v);
        }
        self.commit_with_quarantine(main, quarantine)
    }

    fn quarantine_len(&self) -> usize {
        self.quarantine.len()
    }

    fn size(&self) -> Result<u64, CacheError> {
        dir_size(&self.root)
    }
}

/// Bytes of all files under `path`.
fn dir_size(path: &Path) -> Result<u64, CacheError> {
    let mut total = 0;
    let entries = fs::read_dir(path).map_err(CacheError::io("measure", path.to_owned()))?;
    for entry in entries {
        let entry = entry.map_err(CacheError::io("measure", path.to_owned()))?;
        let meta = entry
            .metadata()
            .map_err(CacheError::io("measure", entry.path()))?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

fn read_current(root: &Path) -> Result<Option<String>, CacheError> {
    let path = root.join(CURRENT);
    match fs::read_to_string(&path) {
        Ok(s) if is_db_name(s.trim()) => Ok(Some(s.trim().to_owned())),
        Ok(s) => Err(CacheError::Io {
            op: "read",
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad content {s:?}"),
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CacheError::io("read", path)(e)),
    }
}

fn is_db_name(name: &str) -> bool {
    name.strip_prefix(DB_PREFIX)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn next_db_name(name: &str) -> String {
    let n: u64 = name[DB_PREFIX.len()..].parse().unwrap_or(0);
    format!("{DB_PREFIX}{}", n + 1)
}

/// Points `CURRENT` at `name` atomically and durably (temp file, fsync, rename, fsync dir).
fn write_current(root: &Path, name: &str) -> Result<(), CacheError> {
    let tmp = root.join("CURRENT.tmp");
    let io = |op| CacheError::io(op, tmp.clone());
    let mut file = fs::File::create(&tmp).map_err(io("write"))?;
    file.write_all(format!("{name}\n").as_bytes())
        .map_err(io("write"))?;
    file.sync_all().map_err(io("sync"))?;
    fs::rename(&tmp, root.join(CURRENT)).map_err(io("rename"))?;
    let dir = fs::File::open(root).map_err(CacheError::io("sync", root.to_owned()))?;
    dir.sync_all()
        .map_err(CacheError::io("sync", root.to_owned()))
}

/// Deletes `db-*` directories other than the live one (interrupted compactions).
fn remove_stale_dbs(root: &Path, live: &str) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_db_name(&name) && name != live {
            info!(dir = %entry.path().display(), "removing leftover of an interrupted compaction");
            if let Err(e) = fs::remove_dir_all(entry.path()) {
                warn!(error = %e, dir = %entry.path().display(), "cannot remove stale cache db");
            }
        }
    }
}

pub struct SledStore {
    engine: Engine<SledKv>,
    options: SledOptions,
    root: PathBuf,
    /// Bytes written since the last size check.
    unchecked_bytes: AtomicU64,
    /// Bytes written since the last explicit flush (see `FLUSH_EVERY_BYTES`).
    unflushed_bytes: AtomicU64,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("root", &self.root)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (or creates) the cache under `root`. Fails with a typed error, never a panic, when
    /// the directory cannot be created or written, or sled cannot open its files.
    pub fn open(root: impl AsRef<Path>, options: SledOptions) -> Result<Self, CacheError> {
        let root = root.as_ref().to_owned();
        fs::create_dir_all(&root).map_err(CacheError::io("create", root.clone()))?;
        let current = read_current(&root)?;
        let name = current.clone().unwrap_or_else(|| format!("{DB_PREFIX}0"));
        // Lock the live database first: if another process (a running hub) holds it, a `db-*`
        // beside it may be its compaction in progress, not a leftover.
        let kv = SledKv::open(&root, &name, &options)?;
        remove_stale_dbs(&root, &name);
        if current.is_none() {
            write_current(&root, &name)?;
        }
        let store = SledStore {
            engine: Engine::new(kv, options.max_events_per_scope),
            options,
            root,
            unchecked_bytes: AtomicU64::new(0),
            unflushed_bytes: AtomicU64::new(0),
        };
        store.compact_if_too_big();
        Ok(store)
    }

    /// The live sled directory, for tooling and tests that inspect raw entries.
    pub fn active_db_dir(&self) -> PathBuf {
        let kv = self.engine.read_kv();
        kv.root.join(&kv.name)
    }

    /// Accounts for what a write stored: flushes per the flush policy (`relist` always does) and
    /// compacts when the directory outgrew its bound.
    fn after_write<T>(
        &self,
        result: Result<T, CacheError>,
        bytes: usize,
        relist: bool,
    ) -> Result<T, CacheError> {
        let result = result?;
        // Each version is written once: log entries name their object (a DELETED entry carries
        // it, but the object's record goes).
        let weight = bytes as u64;
        let unflushed = self.unflushed_bytes.fetch_add(weight, Ordering::Relaxed) + weight;
        if relist || self.options.sync_every_write || unflushed >= FLUSH_EVERY_BYTES {
            self.flush()?;
        }
        let unchecked = self.unchecked_bytes.fetch_add(weight, Ordering::Relaxed) + weight;
        if unchecked >= SIZE_CHECK_EVERY_BYTES {
            self.unchecked_bytes.store(0, Ordering::Relaxed);
            self.compact_if_too_big();
        }
        Ok(result)
    }

    fn compact_if_too_big(&self) {
        let Some(bound) = self.options.compact_above_bytes else {
            return;
        };
        match self.size_on_disk() {
            Ok(size) if size > bound => {
                info!(size, bound, "cache above its size bound; compacting");
                if let Err(e) = self.compact() {
                    warn!(error = %e, "cache compaction failed");
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot measure cache size"),
        }
    }

    /// Copies every entry of both trees (objects, scopes, logs, documents: whatever the main tree
    /// holds, by key order) into a new database `name`, flushed.
    fn copy_into(&self, old: &SledKv, name: &str) -> Result<(SledKv, u64), CacheError> {
        let new = SledKv::open(&self.root, name, &self.options)?;
        let mut entries = 0;
        for (from, to) in [(&old.main, &new.main), (&old.quarantine, &new.quarantine)] {
            let mut batch = sled::Batch::default();
            let mut pending = 0;
            for item in from.iter() {
                let (k, v) = item.map_err(CacheError::sled("compact"))?;
                batch.insert(k, v);
                pending += 1;
                if pending == COPY_BATCH {
                    to.apply_batch(std::mem::take(&mut batch))
                        .map_err(CacheError::sled("compact"))?;
                    entries += pending;
                    pending = 0;
                }
            }
            to.apply_batch(batch).map_err(CacheError::sled("compact"))?;
            entries += pending;
        }
        new.flush()?;
        Ok((new, entries))
    }

    fn compact_locked(&self, kv: &mut SledKv) -> Result<u64, CacheError> {
        kv.flush()?;
        let name = next_db_name(&kv.name);
        let dir = self.root.join(&name);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(CacheError::io("remove", dir.clone()))?;
        }
        let swapped = self.copy_into(kv, &name).and_then(|(new, entries)| {
            write_current(&self.root, &name)?;
            Ok((new, entries))
        });
        let (new, entries) = match swapped {
            Ok(ok) => ok,
            Err(e) => {
                // The old database is still live and untouched; drop the partial copy.
                if let Err(rm) = fs::remove_dir_all(&dir) {
                    warn!(error = %rm, dir = %dir.display(), "cannot remove partial compaction");
                }
                return Err(e);
            }
        };
        let old = std::mem::replace(kv, new);
        // Same entries, other buffers: answers kept from the old database are let go.
        self.engine.note_write();
        let old_dir = old.root.join(&old.name);
        drop(old);
        if let Err(e) = fs::remove_dir_all(&old_dir) {
            warn!(error = %e, dir = %old_dir.display(), "cannot remove compacted cache db");
        }
        Ok(entries)
    }
}

impl Store for SledStore {
    fn put_object(
        &self,
        component: &str,
        gvr: &Gvr,
        object: &[u8],
    ) -> Result<WriteOutcome, CacheError> {
        match self.engine.put_object(component, gvr, object) {
            Ok(WriteOutcome::Unchanged) => Ok(WriteOutcome::Unchanged),
            result => self.after_write(result, object.len(), false),
        }
    }

    fn delete_object(&self, key: &ObjectKey) -> Result<bool, CacheError> {
        self.after_write(self.engine.delete_object(key), 0, false)
    }

    fn replace_scope(
        &self,
        scope: &Scope,
        list_rv: &str,
        items: &[&[u8]],
    ) -> Result<ReplaceOutcome, CacheError> {
        let outcome = self.engine.replace_scope(scope, list_rv, items);
        let bytes = items.iter().map(|i| i.len()).sum();
        self.after_write(outcome, bytes, true)
    }

    fn apply_events(
        &self,
        scope: &Scope,
        events: &[(EventType, &[u8])],
    ) -> Result<Vec<Result<WriteOutcome, CacheError>>, CacheError> {
        let outcomes = self.engine.apply_events(scope, events);
        let bytes: usize = events.iter().map(|(_, object)| object.len()).sum();
        // Bookmarks are a few bytes of scope metadata; the next flushed write carries them.
        let nothing_but_bookmarks = outcomes.as_ref().is_ok_and(|outcomes| {
            outcomes
                .iter()
                .all(|o| matches!(o, Ok(WriteOutcome::Bookmarked) | Err(_)))
        });
        if nothing_but_bookmarks {
            self.unflushed_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
            return outcomes;
        }
        self.after_write(outcomes, bytes, false)
    }

    fn get(&self, key: &ObjectKey) -> Result<Lookup, CacheError> {
        self.engine.get(key)
    }

    fn objects(
        &self,
        component: &str,
        gvr: &Gvr,
    ) -> Result<Vec<(ObjectKey, CachedObject)>, CacheError> {
        self.engine.objects(component, gvr)
    }

    fn list(&self, query: &Scope) -> Result<Option<ListResult>, CacheError> {
        self.engine.list(query)
    }

    fn scope_resource_version(&self, scope: &Scope) -> Result<Option<ResourceVersion>, CacheError> {
        self.engine.scope_resource_version(scope)
    }

    fn events_since(&self, query: &Scope, rv: &str) -> Result<Vec<Event>, ReplayError> {
        self.engine.events_since(query, rv)
    }

    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        self.after_write(self.engine.put_document(name, bytes), bytes.len(), false)
    }

    fn get_document(&self, name: &str) -> Result<Option<bytes::Bytes>, CacheError> {
        self.engine.get_document(name)
    }

    fn delete_document(&self, name: &str) -> Result<(), CacheError> {
        self.after_write(self.engine.delete_document(name), 0, false)
    }

    fn documents(&self, prefix: &str) -> Result<Vec<(String, bytes::Bytes)>, CacheError> {
        self.engine.documents(prefix)
    }

    fn verify(&self) -> Result<VerifyReport, CacheError> {
        self.engine.verify()
    }

    fn stats(&self) -> Result<Vec<ResourceStats>, CacheError> {
        self.engine.stats()
    }

    fn health(&self) -> Health {
        self.engine.health()
    }

    fn write_seq(&self) -> u64 {
        self.engine.write_seq()
    }

    fn flush(&self) -> Result<(), CacheError> {
        let kv = self.engine.read_kv();
        let result = self.engine.timed(|| kv.flush());
        drop(kv);
        self.unflushed_bytes.store(0, Ordering::Relaxed);
        self.engine.observe(result)
    }

    /// Every file under the cache root, including a compaction in progress.
    fn size_on_disk(&self) -> Result<u64, CacheError> {
        dir_size(&self.root)
    }

    /// Blocks all reads and writes while it copies the live entries (~0.2 s for 9 MB of live
    /// records, debug build). A failure leaves the old database live.
    fn compact(&self) -> Result<CompactReport, CacheError> {
        let mut kv = self.engine.write_kv();
        let before_bytes = dir_size(&self.root)?;
        let result = self.engine.timed(|| self.compact_locked(&mut kv));
        drop(kv);
        let entries = self.engine.observe(result)?;
        let after_bytes = dir_size(&self.root)?;
        info!(before_bytes, after_bytes, entries, "cache compacted");
        Ok(CompactReport {
            before_bytes,
            after_bytes,
            entries,
        })
    }
}
