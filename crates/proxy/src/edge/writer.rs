//! The cache writer: one dedicated thread that applies what the tees collected, in order.
//!
//! Responses are handed over whole (a GET or LIST body) or as the watch lines each body chunk
//! completes, through a bounded queue, and parsed here, off the request path. Watch events
//! queued for the same scope are applied together as one store call, one flush (a group
//! commit, bounded by `GROUP_MAX_BYTES`); a group waits up to `GROUP_WINDOW` (2 ms) for more of
//! a live watch's events. When the queue is full the tee gives up
//! on that response rather than slow the client down (see `tee`); what was queued is applied in
//! the order it arrived, so a LIST always lands before the watch that follows it.
//!
//! The writer and sled's threads run at a lower CPU priority ([`BACKGROUND_NICE_STEP`]): where
//! caching competes for a core with answering clients, answering wins.
//!
//! Nothing that does not parse is cached: a body that is not the expected JSON (a `Status`, a
//! truncated stream, a protobuf body) is counted in `outpost_cache_writes_total{outcome="invalid"}`
//! and dropped; the client already received it unchanged.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use outpost_cache::{
    CacheError, EventType, Gvr, ObjectKey, ReplaceOutcome, Scope, ScopeId, Store, WriteOutcome,
};
use outpost_core::wire::{EventError, ListHead, LocatedList, ObjectHead, WatchEvent};
use serde_json::value::RawValue;
use tracing::{debug, info, warn};

use super::confirmed::Confirmed;
use super::kinds::{self, KindCheck, KindInfo, TypeMetaHead};
use super::offline;
use super::relisted::Relisted;
use crate::metrics::Metrics;

/// Operations queued between a tee and the writer thread.
#[derive(Debug)]
pub enum CacheOp {
    /// A GET's 2xx body.
    Object { key: ObjectKey, body: Chunks },
    /// The object a write (create, update, patch) left, as the apiserver answered it; a
    /// create's `key.name` is empty (the answer names the object).
    Written { key: ObjectKey, body: Chunks },
    /// A GET answered 404: the object no longer exists.
    Gone { key: ObjectKey },
    /// A complete LIST body: replaces the scope.
    List { scope: Scope, body: Chunks },
    /// Consecutive lines of a watch stream (those one body chunk completed).
    Events { scope: Scope, lines: Vec<Bytes> },
    /// A streaming list: a watch's initial `ADDED` events and the bookmark that ends them, the
    /// scope's whole state at that bookmark's resourceVersion. Replaces the scope as a LIST does.
    InitialEvents { scope: Scope, lines: Vec<Bytes> },
    /// A discovery response body and its content type.
    Document {
        name: String,
        content_type: String,
        body: Chunks,
    },
    /// A document kept as it came, in any encoding, checked by its sender (a TokenRequest
    /// answer, see `crate::autonomy::tokens`).
    Verbatim {
        name: String,
        content_type: String,
        body: Bytes,
    },
}

/// A whole body as it arrived, chunk by chunk: the tee hands the chunks over uncopied and the
/// writer joins them, off the request path.
#[derive(Debug, Default)]
pub struct Chunks {
    pieces: Vec<Bytes>,
    /// Their total length, kept as they arrive: the tee checks it on every chunk.
    len: usize,
}

impl Chunks {
    pub fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        self.pieces.push(chunk);
    }

    pub fn byte_len(&self) -> usize {
        self.len
    }

    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    pub fn into_pieces(self) -> Vec<Bytes> {
        self.pieces
    }

    /// The body in one piece (no copy when it arrived in one).
    fn joined(self) -> Bytes {
        match <[Bytes; 1]>::try_from(self.pieces) {
            Ok([one]) => one,
            Err(pieces) => pieces.concat().into(),
        }
    }
}

impl From<Bytes> for Chunks {
    fn from(body: Bytes) -> Chunks {
        let mut chunks = Chunks::default();
        chunks.push(body);
        chunks
    }
}

impl CacheOp {
    /// The scope a LIST or watch events belong to.
    fn scope(&self) -> Option<&Scope> {
        match self {
            CacheOp::List { scope, .. }
            | CacheOp::Events { scope, .. }
            | CacheOp::InitialEvents { scope, .. } => Some(scope),
            CacheOp::Object { .. }
            | CacheOp::Written { .. }
            | CacheOp::Gone { .. }
            | CacheOp::Document { .. }
            | CacheOp::Verbatim { .. } => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            CacheOp::Object { .. } => "object",
            CacheOp::Written { .. } => "written",
            CacheOp::Gone { .. } => "gone",
            CacheOp::List { .. } => "list",
            CacheOp::Events { .. } => "event",
            CacheOp::InitialEvents { .. } => "streamed_list",
            CacheOp::Document { .. } => "document",
            CacheOp::Verbatim { .. } => "verbatim",
        }
    }
}

/// The sending side, shared by every tee.
#[derive(Clone)]
pub struct Writer {
    tx: SyncSender<Queued>,
    metrics: Metrics,
    shared: Arc<Shared>,
}

/// What the tees and the writer thread share.
struct Shared {
    /// Operations queued so far. Taken with each send, so that tickets follow queue order.
    queued: Mutex<u64>,
    /// The ticket of the last operation applied (or given up on); tees wait on it.
    applied: tokio::sync::watch::Sender<u64>,
    /// Scopes marked as having missed events, each with the number of operations queued when
    /// the last mark was made: a LIST queued before that must not clear it.
    marks: Mutex<HashMap<ScopeId, u64>>,
    store: Arc<dyn Store>,
    max_object_bytes: usize,
    /// The writer thread, woken early from its linger ([`next_entry`]) when someone waits.
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// GET answers found stored as they are, which need not come here again.
    confirmed: Confirmed,
}

impl Shared {
    /// Ends the writer's linger now: a tee or an offline answer is waiting for it.
    fn hurry(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

/// An operation's place in the queue: [`Writer::durable`] waits until it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// Why a scope missed watch events: the reason label of `outpost_cache_missed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// The writer's queue was full.
    QueueFull,
    /// An object over `--cache-max-object-bytes`, or a body over [`super::tee::MAX_BODY`].
    TooLarge,
    /// The file system was under the free-space floor.
    NoSpace,
    /// The store failed the write.
    WriteFailed,
    /// An event was passed on before the cache had it (the store took longer than
    /// [`super::tee::DURABLE_WITHIN`]).
    NotDurable,
}

impl Missed {
    pub fn label(self) -> &'static str {
        match self {
            Missed::QueueFull => "queue_full",
            Missed::TooLarge => "too_large",
            Missed::NoSpace => "no_space",
            Missed::WriteFailed => "write_failed",
            Missed::NotDurable => "not_durable",
        }
    }

    /// The reason kept with the mark, worded for the Status a client gets offline.
    fn reason(self) -> &'static str {
        match self {
            Missed::QueueFull => "the cache writer's queue was full",
            Missed::TooLarge => "an object or list was over the cache's size limit",
            Missed::NoSpace => "the cache's file system was under its free-space floor",
            Missed::WriteFailed => "the cache failed to store them",
            Missed::NotDurable => "the cache took too long to store them",
        }
    }
}

/// Operations queued before tees start dropping: a burst of watch events or a few relists.
const QUEUE_DEPTH: usize = 4096;

/// A queued operation, boxed: the bounded channel allocates and writes every slot up front,
/// and 4,096 unboxed operations (≈200 bytes each, mostly the scope) held 0.8 MiB from start-up.
type Queued = Box<Entry>;

#[derive(Debug)]
struct Entry {
    op: CacheOp,
    ticket: u64,
    /// A tee holds a frame back until this is applied: no group window is waited out for it.
    awaited: bool,
}

/// kube-apiserver's limit on a request body: no object it stores is larger.
pub const DEFAULT_MAX_OBJECT_BYTES: usize = 3 << 20;

impl Writer {
    /// Starts the writer thread over `store`. The thread ends when every `Writer` is dropped.
    /// `volatile`: the store keeps nothing across a restart (the disk cache could not be
    /// opened), so the cache counts as degraded whatever the store says.
    pub fn start(
        store: Arc<dyn Store>,
        metrics: Metrics,
        volatile: bool,
    ) -> std::io::Result<Writer> {
        Self::start_with(store, metrics, volatile, DEFAULT_MAX_OBJECT_BYTES)
    }

    /// [`Writer::start`] with objects over `max_object_bytes` left out of the cache.
    pub fn start_with(
        store: Arc<dyn Store>,
        metrics: Metrics,
        volatile: bool,
        max_object_bytes: usize,
    ) -> std::io::Result<Writer> {
        Self::start_checking_every(store, metrics, volatile, max_object_bytes, PRIORITY_CHECK)
    }

    /// [`Writer::start_with`], looking for sled threads to lower every `check_every`.
    fn start_checking_every(
        store: Arc<dyn Store>,
        metrics: Metrics,
        volatile: bool,
        max_object_bytes: usize,
        check_every: Duration,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = sync_channel(QUEUE_DEPTH);
        report_health(store.as_ref(), &metrics, volatile);
        let shared = Arc::new(Shared {
            queued: Mutex::new(0),
            applied: tokio::sync::watch::Sender::new(0),
            marks: Mutex::default(),
            store,
            max_object_bytes,
            thread: std::sync::OnceLock::new(),
            confirmed: Confirmed::default(),
        });
        let writer = Writer {
            tx,
            metrics,
            shared,
        };
        let thread_writer = writer.clone();
        std::thread::Builder::new()
            .name("outpost-cache-writer".into())
            .spawn(move || {
                let mut priority = Priority::lower(check_every);
                // The thread must not keep its own queue open: it ends when the tees' and the
                // hub's writers are gone.
                let Writer {
                    metrics, shared, ..
                } = thread_writer;
                let _ = shared.thread.set(std::thread::current());
                run(&shared, &rx, &metrics, volatile, &mut priority)
            })?;
        Ok(writer)
    }

    /// Objects larger than this are proxied but not cached.
    pub fn max_object_bytes(&self) -> usize {
        self.shared.max_object_bytes
    }

    /// Whether a GET's answer for `key` is what the store holds, pinned, unchanged since the
    /// writer last found it so ([`super::confirmed`]): then it is counted as an unchanged
    /// write and need not be queued.
    pub fn still_holds(&self, key: &ObjectKey, body: &Chunks) -> bool {
        let seq = self.shared.store.write_seq();
        let held = self.shared.confirmed.holds(key, body.pieces(), seq);
        if held {
            let unchanged = outcome_label(&WriteOutcome::Unchanged);
            record(&self.metrics, "object", &Ok(unchanged));
        }
        held
    }

    /// Queues `op`; `None` when the queue is full or the writer is gone (the op is dropped).
    pub fn submit(&self, op: CacheOp) -> Option<Ticket> {
        self.send(op, false)
    }

    /// [`Writer::submit`] for an operation a tee will wait for ([`Writer::durable`]): the
    /// writer applies it without waiting for more events to group with it.
    pub fn submit_awaited(&self, op: CacheOp) -> Option<Ticket> {
        self.send(op, true)
    }

    fn send(&self, op: CacheOp, awaited: bool) -> Option<Ticket> {
        let label = op.label();
        let mut queued = self
            .shared
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let ticket = *queued + 1;
        let entry = Box::new(Entry {
            op,
            ticket,
            awaited,
        });
        match self.tx.try_send(entry) {
            Ok(()) => {
                *queued = ticket;
                if awaited {
                    self.shared.hurry();
                }
                Some(Ticket(ticket))
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.cache_dropped.with_label_values(&[label]).inc();
                None
            }
        }
    }

    /// Resolves once the operation of `ticket` is applied (and so, with the daemon's store,
    /// flushed to disk): `true`, or `false` when the writer is gone. No polling: the writer
    /// wakes it.
    pub fn durable(&self, ticket: Ticket) -> impl Future<Output = bool> + Send + 'static {
        let mut applied = self.shared.applied.subscribe();
        async move { applied.wait_for(|a| *a >= ticket.0).await.is_ok() }
    }

    /// Waits, at most `within`, until every operation queued before the call is applied.
    /// Offline answers wait for it, so that they include what the hub passed on to its clients
    /// just before the cloud went away. `false`: the writer is still behind (a long relist, a
    /// stuck disk); the caller answers from the cache as it is.
    pub async fn caught_up(&self, within: Duration) -> bool {
        let target = *self
            .shared
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut applied = self.shared.applied.subscribe();
        self.shared.hurry();
        let caught_up = applied.wait_for(|a| *a >= target);
        matches!(tokio::time::timeout(within, caught_up).await, Ok(Ok(_)))
    }

    /// Marks `scope` as having missed watch events, for good (until a LIST queued after this
    /// call replaces it): its offline answers are 503 meanwhile. The mark is written to disk on
    /// the blocking pool (this is called from a tee, on an async worker), or right here when
    /// there is no runtime.
    pub fn mark_missed(&self, scope: &Scope, why: Missed) {
        let since = *self
            .shared
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shared = self.shared.clone();
        let metrics = self.metrics.clone();
        let id = scope.id();
        let mark = move || shared.mark(&metrics, &id, since, why);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(mark)),
            Err(_) => mark(),
        }
    }

    /// Counts a response the cache left out because it was too large.
    pub fn note_too_large(&self, op: &'static str) {
        self.metrics
            .cache_writes
            .with_label_values(&[op, "too_large"])
            .inc();
    }
}

impl Shared {
    /// Records a mark made when `since` operations were queued (see [`Writer::mark_missed`]).
    fn mark(&self, metrics: &Metrics, scope: &ScopeId, since: u64, why: Missed) {
        metrics.cache_missed.with_label_values(&[why.label()]).inc();
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        let at = marks.entry(scope.clone()).or_default();
        *at = (*at).max(since);
        match self.store.mark_missed(scope, why.reason()) {
            Ok(true) => {
                warn!(scope = %scope, reason = why.label(), "cached scope missed watch events; served offline as 503 until relisted")
            }
            Ok(false) => {}
            Err(e) => {
                warn!(scope = %scope, error = %e, "cannot record that a cached scope missed watch events")
            }
        }
        metrics
            .cache_missed_scopes
            .set(self.store.health().missed_scopes as i64);
    }

    /// A LIST of `ticket` replaced `scope`: clears its mark unless a newer one was made since.
    fn relisted(&self, metrics: &Metrics, scope: &ScopeId, ticket: u64) {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.get(scope).is_some_and(|since| *since >= ticket) {
            return;
        }
        marks.remove(scope);
        match self.store.clear_missed(scope) {
            Ok(true) => info!(scope = %scope, "cached scope relisted; served offline again"),
            Ok(false) => {}
            Err(e) => {
                warn!(scope = %scope, error = %e, "cannot clear a cached scope's missed-events mark")
            }
        }
        metrics
            .cache_missed_scopes
            .set(self.store.health().missed_scopes as i64);
    }
}

/// How much nicer than the hub's own threads the cache's background threads run: the writer's
/// and sled's (at the hub's default nice 0, CFS weight 110 against 1,024 for the request path).
/// Caching is work behind the responses; where it competes for a core with the proxy, the proxy
/// should win. Relative to the hub's nice, so that a hub an operator started nicer still has
/// its cache below it. Lowered, not idle (`SCHED_IDLE`): on a node whose cores stay busy the
/// writer still gets about a tenth of one, enough for a full node's relists (a few hundred ms
/// of its CPU) to land within seconds, and its queue does not overflow.
pub const BACKGROUND_NICE_STEP: i32 = 10;

/// The nicest a thread can be on Linux.
const NICEST: i32 = 19;

/// How often the writer looks for sled threads that run at normal priority.
const PRIORITY_CHECK: Duration = Duration::from_secs(5);

/// The cache threads' CPU priority, kept by the writer thread.
struct Priority {
    check_every: Duration,
    checked: Instant,
    /// The writer's own priority could be lowered (a system may refuse; the cache works on).
    lowered: bool,
    /// The nice value of the cache's threads: [`BACKGROUND_NICE_STEP`] above the hub's.
    nice: i32,
}

impl Priority {
    /// Lowers the calling thread's (the writer's) priority and that of sled's threads.
    fn lower(check_every: Duration) -> Priority {
        let me = rustix::thread::gettid();
        // The writer thread starts with its creator's nice: the hub's.
        let hubs = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
        let nice = (hubs + BACKGROUND_NICE_STEP).min(NICEST);
        let lowered = match rustix::process::setpriority_process(Some(me), nice) {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, "cannot lower the cache writer's CPU priority");
                false
            }
        };
        let mut priority = Priority {
            check_every,
            checked: Instant::now(),
            lowered,
            nice,
        };
        let sled_threads = priority.lower_sled_threads();
        debug!(nice, sled_threads, "cache threads at background priority");
        priority
    }

    /// sled starts its I/O pool, and more threads in a burst, from whichever thread writes first
    /// (a reflector saving its copy, the hub's configuration, not only the writer), and a new
    /// thread takes its creator's priority: they are looked for again every `check_every`.
    fn check(&mut self) {
        if self.checked.elapsed() >= self.check_every {
            self.lower_sled_threads();
        }
    }

    fn lower_sled_threads(&mut self) -> usize {
        use rustix::process::{Pid, setpriority_process};
        self.checked = Instant::now();
        if !self.lowered {
            return 0;
        }
        threads_named(outpost_cache::BACKGROUND_THREAD_PREFIXES)
            .into_iter()
            .filter_map(Pid::from_raw)
            .filter(|pid| setpriority_process(Some(*pid), self.nice).is_ok())
            .count()
    }
}

/// This process's threads whose name starts with one of `prefixes`.
fn threads_named(prefixes: &[&str]) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| prefixes.iter().any(|p| comm.starts_with(p)))
        })
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

fn run(
    shared: &Shared,
    rx: &Receiver<Queued>,
    metrics: &Metrics,
    volatile: bool,
    priority: &mut Priority,
) {
    let store = shared.store.as_ref();
    let mut known_kinds: HashMap<Gvr, KindInfo> = HashMap::new();
    let mut relisted = Relisted::default();
    let mut next: Option<Entry> = None;
    let mut busy = false;
    loop {
        priority.check();
        let mut entry = match next.take() {
            Some(entry) => entry,
            None => match next_entry(rx, priority.check_every, busy) {
                Ok(entry) => *entry,
                Err(RecvTimeoutError::Timeout) => {
                    // Idle: the store's state can still change (space freed, a mark cleared).
                    report_health(store, metrics, volatile);
                    busy = false;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        if let CacheOp::Events { scope, lines } = &mut entry.op {
            let window = if entry.awaited {
                Duration::ZERO
            } else {
                GROUP_WINDOW
            };
            let gathered = gather_events(rx, scope, std::mem::take(lines), window);
            *lines = gathered.lines;
            entry.ticket = gathered.last_ticket.unwrap_or(entry.ticket);
            next = gathered.next;
        }
        let Entry { op, ticket, .. } = entry;
        let label = op.label();
        let scope = op.scope().cloned();
        let outcomes = apply(
            store,
            op,
            &mut known_kinds,
            shared.max_object_bytes,
            &shared.confirmed,
            &mut relisted,
        );
        // Counted before the scope is marked: whoever sees a scope's missed mark also sees
        // the write that missed.
        for outcome in &outcomes {
            record(metrics, label, outcome);
        }
        if let Some(scope) = &scope {
            after_scope_op(shared, metrics, label, scope, ticket, &outcomes);
        }
        shared.applied.send_replace(ticket);
        report_health(store, metrics, volatile);
        busy = true;
    }
    if let Err(e) = store.flush() {
        warn!(error = %e, "final cache flush failed");
    }
}

/// How long the writer, its queue drained, waits before it looks again rather than parking on
/// the queue. A parked writer is woken by every send, a futex call on the request path and a
/// context switch per cached answer; one that lingers takes what came meanwhile in one wake-up.
/// Sends that someone waits for end the linger at once ([`Shared::hurry`]).
const LINGER: Duration = Duration::from_millis(1);

/// The next queued operation. `busy`: the writer has just applied one, so it lingers once
/// ([`LINGER`]) before it parks on the queue (at most `idle_wait`).
fn next_entry(
    rx: &Receiver<Queued>,
    idle_wait: Duration,
    busy: bool,
) -> Result<Queued, RecvTimeoutError> {
    if let Ok(entry) = rx.try_recv() {
        return Ok(entry);
    }
    if busy {
        std::thread::park_timeout(LINGER);
        if let Ok(entry) = rx.try_recv() {
            return Ok(entry);
        }
    }
    rx.recv_timeout(idle_wait)
}

fn report_health(store: &dyn Store, metrics: &Metrics, volatile: bool) {
    let health = store.health();
    metrics
        .cache_degraded
        .set(i64::from(volatile || health.degraded));
    metrics.cache_missed_scopes.set(health.missed_scopes as i64);
}

/// What a LIST or watch events did to their scope's missed-events mark: a LIST that replaced
/// the scope clears it; events or a LIST that could not be stored set it (what the client got
/// is not in the cache).
fn after_scope_op(
    shared: &Shared,
    metrics: &Metrics,
    label: &'static str,
    scope: &Scope,
    ticket: u64,
    outcomes: &[Applied],
) {
    let missed = outcomes.iter().find_map(|o| match o {
        Err(ApplyError::Store(CacheError::LowSpace { .. })) => Some(Missed::NoSpace),
        Err(ApplyError::Store(_)) => Some(Missed::WriteFailed),
        Err(ApplyError::Unstored(why)) => Some(*why),
        Err(ApplyError::TooLarge(_)) => Some(Missed::TooLarge),
        _ => None,
    });
    if let Some(why) = missed {
        let since = *shared.queued.lock().unwrap_or_else(PoisonError::into_inner);
        shared.mark(metrics, &scope.id(), since, why);
        return;
    }
    let relisted = label != "event" && matches!(outcomes, [Ok("replaced" | "renewed")]);
    if relisted {
        shared.relisted(metrics, &scope.id(), ticket);
    }
}

fn record(metrics: &Metrics, label: &'static str, applied: &Applied) {
    let outcome = match applied {
        Ok(outcome) => *outcome,
        Err(ApplyError::Invalid(reason)) => {
            debug!(op = label, reason, "response not cached");
            "invalid"
        }
        Err(ApplyError::Mismatch(reason)) => {
            warn!(
                op = label,
                reason, "upstream answer is not what was asked for; not cached"
            );
            "mismatch"
        }
        Err(ApplyError::TooLarge(reason)) => {
            debug!(op = label, reason, "response not cached");
            "too_large"
        }
        Err(ApplyError::Store(e @ CacheError::LowSpace { .. })) => {
            // The store logs the floor once when it is crossed.
            debug!(op = label, error = %e, "cache write refused");
            "no_space"
        }
        Err(ApplyError::Store(e)) => {
            warn!(op = label, error = %e, "cache write failed");
            if e.is_damage() { "damaged" } else { "error" }
        }
        Err(ApplyError::Unstored(Missed::NoSpace)) => "no_space",
        Err(ApplyError::Unstored(_)) => "error",
    };
    metrics
        .cache_writes
        .with_label_values(&[label, outcome])
        .inc();
    crate::work::note_work();
}

/// Watch events of one scope applied as one store call: a group commit, one flush for the lot.
/// The bound keeps a group well below one relist of a node's pods (~1 MB), the largest single
/// write the cache already makes; see "A known sled 0.34 deadlock" in `outpost_cache::sled_store`.
const GROUP_MAX_BYTES: usize = 256 << 10;
const GROUP_MAX_EVENTS: usize = 128;

/// How long a group waits for more events of its scope once the queue is drained. A live watch
/// delivers events one at a time, a few hundred microseconds apart; without the wait each one
/// would be committed and flushed alone. Nothing is less durable for it: until applied, the
/// events sit in the in-memory queue either way. Offline answers still wait until the writer
/// has caught up ([`Writer::caught_up`]).
const GROUP_WINDOW: Duration = Duration::from_millis(2);

/// What [`gather_events`] took off the queue.
struct Gathered {
    lines: Vec<Bytes>,
    /// The ticket of the last operation merged into `lines`, if any besides the first.
    last_ticket: Option<u64>,
    /// The first other operation taken off the queue, to be applied next.
    next: Option<Entry>,
}

/// `first` and the lines of the same scope's events queued behind it, up to a group's worth or
/// until `window` ([`GROUP_WINDOW`]) has passed since `first` was taken (at once, for events a
/// tee waits for). The first other operation taken off the queue ends the group and comes
/// back, to be applied next, so the order is kept.
fn gather_events(
    rx: &Receiver<Queued>,
    scope: &Scope,
    first: Vec<Bytes>,
    window: Duration,
) -> Gathered {
    let mut deadline = Instant::now() + window;
    let mut lines = first;
    let mut bytes: usize = lines.iter().map(Bytes::len).sum();
    let mut last_ticket = None;
    let mut next = None;
    while lines.len() < GROUP_MAX_EVENTS && bytes < GROUP_MAX_BYTES {
        let wait = deadline.saturating_duration_since(Instant::now());
        let entry = match wait.is_zero() {
            true => rx.try_recv().ok(),
            false => rx.recv_timeout(wait).ok(),
        };
        let Some(entry) = entry.map(|e| *e) else {
            break;
        };
        match entry {
            Entry {
                op:
                    CacheOp::Events {
                        scope: s,
                        lines: more,
                    },
                ticket,
                awaited,
            } if s == *scope => {
                bytes += more.iter().map(Bytes::len).sum::<usize>();
                lines.extend(more);
                last_ticket = Some(ticket);
                if awaited {
                    deadline = Instant::now();
                }
            }
            other => {
                next = Some(other);
                break;
            }
        }
    }
    Gathered {
        lines,
        last_ticket,
        next,
    }
}

/// `lines` cut into groups within the bounds (a group always takes at least one line).
fn groups(lines: &[Bytes]) -> Vec<&[Bytes]> {
    let mut groups = Vec::new();
    let mut rest = lines;
    while !rest.is_empty() {
        let mut bytes = 0;
        let mut n = 0;
        while n < rest.len()
            && n < GROUP_MAX_EVENTS
            && (n == 0 || bytes + rest[n].len() <= GROUP_MAX_BYTES)
        {
            bytes += rest[n].len();
            n += 1;
        }
        let (group, tail) = rest.split_at(n);
        groups.push(group);
        rest = tail;
    }
    groups
}

enum ApplyError {
    /// The bytes are not what the cache stores; nothing was written.
    Invalid(String),
    /// The upstream answered with another object than the one asked for (another kind, name
    /// or namespace); nothing was written.
    Mismatch(String),
    /// An object over the size limit; nothing was written.
    TooLarge(String),
    Store(CacheError),
    /// One event of a group the store failed as a whole (logged once, for the group).
    Unstored(Missed),
}

impl From<CacheError> for ApplyError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::InvalidObject(reason) => ApplyError::Invalid(reason),
            other => ApplyError::Store(other),
        }
    }
}

type Applied = Result<&'static str, ApplyError>;

/// One outcome per object the operation carried (one, or one per watch line).
fn apply(
    store: &dyn Store,
    op: CacheOp,
    kinds: &mut HashMap<Gvr, KindInfo>,
    max_object: usize,
    confirmed: &Confirmed,
    relisted: &mut Relisted,
) -> Vec<Applied> {
    let applied = match op {
        CacheOp::Object { key, body } => apply_get(store, key, body.joined(), kinds, confirmed),
        CacheOp::Written { key, body } => apply_written(store, key, &body.joined(), kinds),
        CacheOp::Gone { key } => apply_gone(store, &key),
        CacheOp::List { scope, body } => {
            apply_list(store, &scope, body.joined(), kinds, max_object, relisted)
        }
        CacheOp::InitialEvents { scope, lines } => {
            apply_streamed_list(store, &scope, &lines, kinds, max_object)
        }
        CacheOp::Events { scope, lines } => {
            return groups(&lines)
                .into_iter()
                .flat_map(|group| apply_events(store, &scope, group))
                .collect();
        }
        CacheOp::Document {
            name,
            content_type,
            body,
        } => apply_document(store, &name, &content_type, &body.joined()),
        CacheOp::Verbatim {
            name,
            content_type,
            body,
        } => store
            .put_document(&name, &offline::discovery_document(&content_type, &body))
            .map(|()| "stored")
            .map_err(ApplyError::from),
    };
    vec![applied]
}

/// A GET's answer. One found stored as it is, pinned, is remembered with the write sequence
/// noted before the look ([`Confirmed`]), so that the same answer again stays on the request
/// path while nothing has been committed since.
fn apply_get(
    store: &dyn Store,
    key: ObjectKey,
    body: Bytes,
    kinds: &mut HashMap<Gvr, KindInfo>,
    confirmed: &Confirmed,
) -> Applied {
    let seq = store.write_seq();
    let outcome = apply_object(store, &key, &body, kinds)?;
    // A note of its absence deleted here moves the sequence past `seq`: nothing is remembered.
    forget_absence(store, &key)?;
    if outcome == outcome_label(&WriteOutcome::Unchanged) {
        confirmed.remember(key, seq, body);
    }
    Ok(outcome)
}

/// The object a write left, kept as a GET's answer would be (a create's name read from it) —
/// but only an object the component reads: one the cache holds, or whose absence it noted
/// (kubelet's CSINode, created after its GET found none). The events a component writes and
/// never reads are not kept.
fn apply_written(
    store: &dyn Store,
    mut key: ObjectKey,
    body: &[u8],
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Applied {
    if key.name.is_empty() {
        let head =
            ObjectHead::parse(body).map_err(|e| ApplyError::Invalid(format!("object: {e}")))?;
        key.name = head.metadata.name.into_owned();
    }
    let absent = offline::absence_document(&key);
    let read_before = matches!(store.get(&key)?, outpost_cache::Lookup::Found(_))
        || store.get_document(&absent)?.is_some();
    if !read_before {
        return Ok("not_read");
    }
    let outcome = apply_object(store, &key, body, kinds)?;
    forget_absence(store, &key)?;
    Ok(outcome)
}

/// A GET the cloud answered 404: the object goes, and its absence is noted, so that the cache
/// may answer NotFound for it offline (see `offline::get`).
fn apply_gone(store: &dyn Store, key: &ObjectKey) -> Applied {
    let existed = store.delete_object(key)?;
    store.put_document(&offline::absence_document(key), b"")?;
    Ok(if existed { "deleted" } else { "absent" })
}

/// An object the cloud returned exists: a note of its absence goes.
fn forget_absence(store: &dyn Store, key: &ObjectKey) -> Result<(), CacheError> {
    let name = offline::absence_document(key);
    if store.get_document(&name)?.is_some() {
        store.delete_document(&name)?;
    }
    Ok(())
}

fn apply_document(store: &dyn Store, name: &str, content_type: &str, body: &[u8]) -> Applied {
    serde_json::from_slice::<&RawValue>(body)
        .map_err(|e| ApplyError::Invalid(format!("discovery body: {e}")))?;
    store.put_document(name, &offline::discovery_document(content_type, body))?;
    Ok("stored")
}

fn apply_object(
    store: &dyn Store,
    key: &ObjectKey,
    body: &[u8],
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Applied {
    // A repeated GET of an object stored as it is: checked in full when it was stored.
    if store.holds_pinned(key, body)? {
        return Ok(outcome_label(&WriteOutcome::Unchanged));
    }
    let head = ObjectHead::parse(body).map_err(|e| ApplyError::Invalid(format!("object: {e}")))?;
    let (Some(kind), Some(api_version)) = (head.kind, head.api_version) else {
        return Err(ApplyError::Invalid("object without kind/apiVersion".into()));
    };
    if kind == "Status" || kind.ends_with("List") {
        return Err(ApplyError::Invalid(format!("a {kind} is not an object")));
    }
    kinds::check_kind(&key.gvr, &kind, &api_version)
        .map_err(|e| ApplyError::Mismatch(e.to_string()))?;
    let names = &head.metadata;
    if names.name != key.name || names.namespace != key.namespace {
        return Err(ApplyError::Mismatch(format!(
            "object {:?}/{:?} answers a request for {key}",
            names.namespace, names.name
        )));
    }
    let kind = KindInfo {
        kind: kind.into_owned(),
        api_version: api_version.into_owned(),
    };
    remember_kind(store, &key.gvr, kind, kinds)?;
    Ok(outcome_label(&store.put_object(
        &key.component,
        &key.gvr,
        body,
    )?))
}

/// A LIST's answer: the scope renewed when the list repeats the one that last replaced it and
/// no item of its resource was written since ([`Relisted`], `Store::renew_scope`); replaced
/// otherwise.
fn apply_list(
    store: &dyn Store,
    scope: &Scope,
    body: Bytes,
    kinds: &mut HashMap<Gvr, KindInfo>,
    max_object: usize,
    relisted: &mut Relisted,
) -> Applied {
    let id = scope.id();
    // A body whose head does not read is refused by the whole read below, with its reason.
    let head = ListHead::parse(&body).ok().flatten();
    if let Some(head) = &head
        && let Some(renewed) = renew_list(store, scope, head, &body, relisted)?
    {
        return Ok(renewed);
    }
    relisted.forget(&id);
    let seq = store.write_seq();
    let applied = replace_list(store, scope, &body, kinds, max_object)?;
    // Kept only when the replace's was the one commit since: then `seq + 1` is the state
    // the list left, and a commit by anyone else moves the sequence past it.
    if applied == "replaced"
        && store.write_seq() == seq + 1
        && let Some(head) = head
    {
        relisted.remember(id, seq + 1, body.clone(), head.metadata_at);
    }
    Ok(applied)
}

/// `renewed` (or `older_than_cached`) when `body` repeats the list kept for `scope` and the store
/// renewed the scope from it; `None` when the list must replace the scope instead.
fn renew_list(
    store: &dyn Store,
    scope: &Scope,
    head: &ListHead<'_>,
    body: &[u8],
    relisted: &Relisted,
) -> Result<Option<&'static str>, ApplyError> {
    let id = scope.id();
    let meta = &head.metadata;
    if !meta.continue_token.is_empty() || meta.resource_version.is_empty() {
        return Ok(None);
    }
    let Some(seq) = relisted.repeated(&id, body, &head.metadata_at) else {
        return Ok(None);
    };
    let Some(outcome) = store.renew_scope(scope, &meta.resource_version, seq)? else {
        return Ok(None);
    };
    Ok(Some(replaced_label(
        scope,
        &meta.resource_version,
        &outcome,
        "renewed",
    )))
}

/// Replaces `scope` with the list in `body`.
fn replace_list(
    store: &dyn Store,
    scope: &Scope,
    body: &[u8],
    kinds: &mut HashMap<Gvr, KindInfo>,
    max_object: usize,
) -> Applied {
    // Items located, not read: the store holds most of a relist byte for byte already, and
    // reads every other item whole before writing it (`Store::replace_scope`).
    let list =
        LocatedList::parse(body).map_err(|e| ApplyError::Invalid(format!("list body: {e}")))?;
    let (Some(list_kind), Some(api_version)) = (&list.kind, &list.api_version) else {
        return Err(ApplyError::Invalid(
            "list body without kind/apiVersion".into(),
        ));
    };
    let kind = KindInfo::from_list(list_kind, api_version)
        .ok_or_else(|| ApplyError::Invalid(format!("a {list_kind} is not a list")))?;
    kinds::check_kind(&scope.gvr, &kind.kind, &kind.api_version)
        .map_err(|e| ApplyError::Mismatch(e.to_string()))?;
    if !list.metadata.continue_token.is_empty() {
        // One page of a chunked list cannot replace a scope; the full list will.
        return Ok("partial");
    }
    if list.metadata.resource_version.is_empty() {
        return Err(ApplyError::Invalid("list without resourceVersion".into()));
    }
    // A scope must never silently lack an item: one too large, and the list is not cached.
    if let Some(big) = list.items.iter().find(|i| i.len() > max_object) {
        return Err(ApplyError::TooLarge(format!(
            "a list item of {} bytes, over the {max_object}-byte limit",
            big.len()
        )));
    }
    let head = TypeMetaHead::of(&kind);
    let replace = |check| {
        let items: Vec<_> = list
            .items
            .iter()
            .map(|item| kinds::with_type_meta(item, &head, check))
            .collect();
        let item_refs: Vec<&[u8]> = items.iter().map(AsRef::as_ref).collect();
        store.replace_scope(scope, &list.metadata.resource_version, &item_refs)
    };
    let outcome = match replace(KindCheck::UpToMetadata) {
        Ok(outcome) => outcome,
        Err(CacheError::InvalidObject(reason)) => {
            // Possibly a `kind` after `metadata` that the short read missed; read them whole.
            debug!(reason, "list items read again in whole");
            replace(KindCheck::Whole)?
        }
        Err(e) => return Err(e.into()),
    };
    remember_kind(store, &scope.gvr, kind, kinds)?;
    Ok(replaced_label(
        scope,
        &list.metadata.resource_version,
        &outcome,
        "replaced",
    ))
}

/// `done`, or `older_than_cached` (logged once per list) when the scope already held a newer
/// state than the list's and kept it (see `outpost_cache::Store::replace_scope`).
fn replaced_label(
    scope: &Scope,
    list_rv: &str,
    outcome: &ReplaceOutcome,
    done: &'static str,
) -> &'static str {
    match &outcome.refused_older_than {
        None => done,
        Some(held) => {
            warn!(scope = %scope.id(), list_rv, cached_rv = %held, "a LIST older than the cached scope was not cached (another watch of the scope had moved it on)");
            "older_than_cached"
        }
    }
}

/// See [`CacheOp::InitialEvents`]. Every line but the last must be an `ADDED` event, the last
/// the bookmark; anything else is not a streaming list and changes nothing.
fn apply_streamed_list(
    store: &dyn Store,
    scope: &Scope,
    lines: &[Bytes],
    kinds: &mut HashMap<Gvr, KindInfo>,
    max_object: usize,
) -> Applied {
    let invalid = |what: &str| ApplyError::Invalid(format!("streaming list: {what}"));
    let (last, added) = lines.split_last().ok_or_else(|| invalid("no lines"))?;
    let marker = match read_line(last) {
        Line::ToStore(EventType::Bookmark, object) => object,
        _ => return Err(invalid("it does not end with a bookmark")),
    };
    let resource_version = ObjectHead::parse(marker)
        .map_err(|e| invalid(&format!("bookmark: {e}")))?
        .metadata
        .resource_version;
    if resource_version.is_empty() {
        return Err(invalid("bookmark without resourceVersion"));
    }
    let items = added
        .iter()
        .map(|line| match read_line(line) {
            Line::ToStore(EventType::Added, object) => Ok(object),
            _ => Err(invalid("an initial event that is not ADDED")),
        })
        .collect::<Result<Vec<&[u8]>, ApplyError>>()?;
    if let Some(big) = items.iter().find(|i| i.len() > max_object) {
        return Err(ApplyError::TooLarge(format!(
            "an initial event's object of {} bytes, over the {max_object}-byte limit",
            big.len()
        )));
    }
    for item in &items {
        check_event_kind(scope, item)?;
    }
    let outcome = store.replace_scope(scope, &resource_version, &items)?;
    let kind = KindInfo::from_object(marker).or_else(|| KindInfo::from_object(items.first()?));
    if let Some(kind) = kind {
        remember_kind(store, &scope.gvr, kind, kinds)?;
    }
    Ok(replaced_label(
        scope,
        &resource_version,
        &outcome,
        "replaced",
    ))
}

/// A watch event's object must be of the watched resource (see [`kinds::check_kind`]).
fn check_event_kind(scope: &Scope, object: &[u8]) -> Result<(), ApplyError> {
    let (kind, api_version) = kinds::type_meta(object)
        .ok_or_else(|| ApplyError::Invalid("watch event object without kind/apiVersion".into()))?;
    kinds::check_kind(&scope.gvr, &kind, &api_version)
        .map_err(|e| ApplyError::Mismatch(e.to_string()))
}

/// What became of one watch line before the store saw it.
enum Line<'a> {
    /// Decided without the store (an ERROR event, or not a watch event at all).
    Done(Applied),
    ToStore(EventType, &'a [u8]),
}

fn read_line(line: &[u8]) -> Line<'_> {
    let invalid = |e: EventError| Line::Done(Err(ApplyError::Invalid(e.to_string())));
    let event = match WatchEvent::parse(line) {
        Ok(event) => event,
        Err(e) => return invalid(e.into()),
    };
    match event.event_type().and_then(|t| Ok((t, event.object()?))) {
        // A 410 or other error ends the stream; the client relists and the list replaces the scope.
        Ok((EventType::Error, _)) => Line::Done(Ok("error_event")),
        Ok((event_type, object)) => Line::ToStore(event_type, object.as_bytes()),
        Err(e) => invalid(e),
    }
}

/// One outcome per line, in order; the lines the store takes go to it in one call.
fn apply_events(store: &dyn Store, scope: &Scope, lines: &[Bytes]) -> Vec<Applied> {
    let lines: Vec<Line<'_>> = lines
        .iter()
        .map(|line| match read_line(line) {
            Line::ToStore(event_type, object) if event_type != EventType::Bookmark => {
                match check_event_kind(scope, object) {
                    Ok(()) => Line::ToStore(event_type, object),
                    Err(e) => Line::Done(Err(e)),
                }
            }
            other => other,
        })
        .collect();
    let events: Vec<(EventType, &[u8])> = lines
        .iter()
        .filter_map(|line| match line {
            Line::ToStore(event_type, object) => Some((*event_type, *object)),
            Line::Done(_) => None,
        })
        .collect();
    // One log line for a failed group rather than one per event.
    let (mut stored, failed) = match store.apply_events(scope, &events) {
        Ok(outcomes) => (Some(outcomes.into_iter()), None),
        Err(e) => {
            let why = match e {
                CacheError::LowSpace { .. } => {
                    debug!(events = events.len(), error = %e, "cache write of watch events refused");
                    Missed::NoSpace
                }
                _ => {
                    warn!(events = events.len(), error = %e, "cache write of watch events failed");
                    Missed::WriteFailed
                }
            };
            (None, Some(why))
        }
    };
    lines
        .into_iter()
        .map(|line| match line {
            Line::Done(applied) => applied,
            Line::ToStore(..) => match (stored.as_mut().and_then(Iterator::next), failed) {
                (Some(outcome), _) => Ok(outcome_label(&outcome?)),
                (None, Some(why)) => Err(ApplyError::Unstored(why)),
                (None, None) => Ok("error"),
            },
        })
        .collect()
}

/// Records a resource's kind once per process (and so once on disk).
fn remember_kind(
    store: &dyn Store,
    gvr: &Gvr,
    kind: KindInfo,
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Result<(), ApplyError> {
    if kinds.get(gvr) == Some(&kind) {
        return Ok(());
    }
    let doc = serde_json::to_vec(&kind).expect("a KindInfo serializes");
    store.put_document(&kinds::document_name(gvr), &doc)?;
    kinds.insert(gvr.clone(), kind);
    Ok(())
}

fn outcome_label(outcome: &WriteOutcome) -> &'static str {
    match outcome {
        WriteOutcome::Stored => "stored",
        WriteOutcome::Deleted => "deleted",
        WriteOutcome::KeptNewer { .. } => "kept_newer",
        WriteOutcome::Bookmarked => "bookmarked",
        WriteOutcome::ScopeUnknown => "scope_unknown",
        WriteOutcome::Unchanged => "unchanged",
        WriteOutcome::Superseded { .. } => "superseded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_cache::{Lookup, MemStore};
    use outpost_testkit::threads::nice_of;
    use serde_json::Value;

    fn pods() -> Gvr {
        Gvr::new("", "v1", "pods")
    }

    fn scope() -> Scope {
        Scope::unfiltered("kubelet", &pods(), None)
    }

    fn apply_all(store: &dyn Store, ops: Vec<CacheOp>) -> Vec<&'static str> {
        apply_all_with(store, ops, &mut Relisted::default())
    }

    /// [`apply_all`] with the writer's memo of the lists it last replaced scopes with.
    fn apply_all_with(
        store: &dyn Store,
        ops: Vec<CacheOp>,
        relisted: &mut Relisted,
    ) -> Vec<&'static str> {
        let mut kinds = HashMap::new();
        let confirmed = Confirmed::default();
        ops.into_iter()
            .flat_map(|op| {
                apply(
                    store,
                    op,
                    &mut kinds,
                    DEFAULT_MAX_OBJECT_BYTES,
                    &confirmed,
                    relisted,
                )
            })
            .map(label_of)
            .collect()
    }

    /// The outcome label of one applied object, a store failure failing the test.
    fn label_of(applied: Applied) -> &'static str {
        match applied {
            Ok(o) => o,
            Err(ApplyError::Invalid(_)) => "invalid",
            Err(ApplyError::Mismatch(_)) => "mismatch",
            Err(ApplyError::TooLarge(_)) => "too_large",
            Err(ApplyError::Store(e)) => panic!("{e}"),
            Err(ApplyError::Unstored(why)) => panic!("{why:?}"),
        }
    }

    const LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[{"metadata":{"name":"a","namespace":"d","resourceVersion":"9","uid":"u1"}}]}"#;

    #[test]
    fn a_streamed_list_that_is_not_one_changes_nothing() {
        let store = MemStore::new();
        let line = |text: &'static str| Bytes::from_static(text.as_bytes());
        let added = line(
            r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"d","resourceVersion":"11"}}}"#,
        );
        let modified = line(
            r#"{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"c","namespace":"d","resourceVersion":"12"}}}"#,
        );
        let end = line(
            r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"13","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
        );
        let streamed = |lines: Vec<Bytes>| CacheOp::InitialEvents {
            scope: scope(),
            lines,
        };
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(LIST.as_bytes()).into(),
                },
                streamed(vec![added.clone(), modified.clone(), end.clone()]),
                streamed(vec![added.clone(), modified]),
                streamed(vec![]),
            ],
        );
        assert_eq!(outcomes, ["replaced", "invalid", "invalid", "invalid"]);
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.resource_version.as_str(), "10", "the LIST's state");

        let outcomes = apply_all(&store, vec![streamed(vec![added, end])]);
        assert_eq!(outcomes, ["replaced"]);
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.resource_version.as_str(), "13");
        assert_eq!(list.items.len(), 1, "only b, the last good stream's state");
    }

    #[test]
    fn a_list_then_events_build_the_scope() {
        let store = MemStore::new();
        let added = r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"d","resourceVersion":"11","uid":"u2"}}}"#;
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(LIST.as_bytes()).into(),
                },
                CacheOp::Events {
                    scope: scope(),
                    lines: vec![Bytes::from_static(added.as_bytes())],
                },
            ],
        );
        assert_eq!(outcomes, ["replaced", "stored"]);
        let Lookup::Found(a) = store
            .get(&ObjectKey::new("kubelet", &pods(), "d", "a"))
            .unwrap()
        else {
            panic!("a is cached");
        };
        let a: Value = serde_json::from_slice(&a.bytes).unwrap();
        assert_eq!(a["kind"], "Pod", "list items are stored as whole objects");
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.resource_version.as_str(), "11");
        let kind = store.get_document("kinds/pods.v1.core").unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<KindInfo>(&kind).unwrap().kind,
            "Pod"
        );
    }

    #[test]
    fn what_does_not_parse_is_not_cached() {
        let store = MemStore::new();
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}"#;
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(b"{\"kind\":\"PodList\",\"items\":[{").into(),
                },
                CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(status.as_bytes()).into(),
                },
                CacheOp::Object {
                    key: ObjectKey::new("kubelet", &pods(), "d", "a"),
                    body: Bytes::from_static(status.as_bytes()).into(),
                },
                CacheOp::Events {
                    scope: scope(),
                    lines: vec![Bytes::from_static(b"\x08\x01k8s protobuf")],
                },
                CacheOp::Document {
                    name: "discovery/x".into(),
                    content_type: "application/json".into(),
                    body: Bytes::from_static(b"<html>").into(),
                },
            ],
        );
        assert_eq!(outcomes, ["invalid"; 5]);
        assert!(store.list(&scope()).unwrap().is_none());
        assert!(store.get_document("discovery/x").unwrap().is_none());
    }

    /// A list's items are located, not parsed, before the store sees them: an item that is not
    /// JSON inside must still keep the list out, whether or not the scope held its neighbours.
    #[test]
    fn a_list_with_an_item_that_is_not_json_inside_is_not_cached() {
        let odd = r#"{"metadata":{"name":"b","namespace":"d","resourceVersion":"12","uid":"u2"},"spec":{"x":tru}}"#;
        let a = r#"{"metadata":{"name":"a","namespace":"d","resourceVersion":"9","uid":"u1"}}"#;
        let store = MemStore::new();
        assert_eq!(
            apply_all(&store, vec![list_of("12", &[a, odd])]),
            ["invalid"]
        );
        assert!(store.list(&scope()).unwrap().is_none());

        let outcomes = apply_all(&store, vec![list_of("10", &[a]), list_of("13", &[a, odd])]);
        assert_eq!(outcomes, ["replaced", "invalid"]);
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(
            (list.items.len(), list.resource_version.as_str()),
            (1, "10")
        );
    }

    /// A pod list as kube-apiserver writes it, at `rv`, of pods each padded to 2 KB (so that the
    /// list is large enough to be kept for a repeat).
    fn padded_list(rv: &str, pods: &[(&str, &str)]) -> CacheOp {
        let pad = "x".repeat(2048);
        let items: Vec<String> = pods
            .iter()
            .map(|(name, pod_rv)| {
                format!(
                    r#"{{"metadata":{{"name":"{name}","namespace":"d","resourceVersion":"{pod_rv}","uid":"u-{name}"}},"spec":{{"pad":"{pad}"}}}}"#
                )
            })
            .collect();
        list_of(rv, &items)
    }

    /// A pod list as kube-apiserver writes it, at `rv`, of `items` (each an object's JSON).
    fn list_of(rv: &str, items: &[impl AsRef<str>]) -> CacheOp {
        let items: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
        CacheOp::List {
            scope: scope(),
            body: Bytes::from(format!(
                r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":[{}]}}"#,
                items.join(",")
            ))
            .into(),
        }
    }

    fn names_and_rv(store: &dyn Store) -> (Vec<String>, String) {
        let list = store.list(&scope()).unwrap().expect("cached");
        let names = list
            .items
            .iter()
            .map(|o| {
                let v: Value = serde_json::from_slice(&o.bytes).unwrap();
                v["metadata"]["name"].as_str().unwrap().to_owned()
            })
            .collect();
        (names, list.resource_version.as_str().to_owned())
    }

    const PODS: [(&str, &str); 10] = [
        ("p0", "1"),
        ("p1", "2"),
        ("p2", "3"),
        ("p3", "4"),
        ("p4", "5"),
        ("p5", "6"),
        ("p6", "7"),
        ("p7", "8"),
        ("p8", "9"),
        ("p9", "10"),
    ];

    /// An informer's relist of an unchanged scope: the items repeat byte for byte, only the
    /// list's version moved on (and its watch saw bookmarks alone). The scope is renewed, and
    /// answers as a replace would have left it.
    /// (The first list of a resource also records its kind, a commit of its own after the
    /// replace's: the list after it replaces the scope once more.)
    #[test]
    fn a_list_repeating_the_last_one_renews_the_scope() {
        let store = MemStore::new();
        let outcomes = apply_all(
            &store,
            vec![
                padded_list("20", &PODS),
                padded_list("28", &PODS),
                CacheOp::Events {
                    scope: scope(),
                    lines: vec![Bytes::from(
                        r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"29"}}}"#,
                    )],
                },
                padded_list("30", &PODS),
                padded_list("25", &PODS),
                padded_list("31", &PODS[1..]),
            ],
        );
        assert_eq!(
            outcomes,
            [
                "replaced",
                "replaced",
                "bookmarked",
                "renewed",
                "older_than_cached",
                "replaced"
            ]
        );
        let (names, rv) = names_and_rv(&store);
        assert_eq!(
            (names.len(), names[0].as_str(), rv.as_str()),
            (9, "p1", "31")
        );
    }

    /// A renewal reads no item, so a record that rotted on disk after the replace (a flipped
    /// bit its checksum catches) stays while the cloud repeats the list, to be found only
    /// offline. A kept list renews its scope for a while only; the repeat after that replaces
    /// the scope, which writes the damaged record again from the cloud's list.
    #[test]
    fn a_record_damaged_under_a_renewed_scope_is_mended_by_a_later_replace() {
        let damaged = ObjectKey::new("kubelet", &pods(), "d", "p3");
        for (renews_for, third, mended) in [
            (super::super::relisted::RENEWS_FOR, "renewed", false),
            (Duration::ZERO, "replaced", true),
        ] {
            let store = MemStore::new();
            let mut relisted = Relisted::renewing_for(renews_for);
            let first = apply_all_with(
                &store,
                vec![padded_list("20", &PODS), padded_list("28", &PODS)],
                &mut relisted,
            );
            assert_eq!(first, ["replaced", "replaced"]);
            assert!(store.damage_object(&damaged));
            let repeat = apply_all_with(&store, vec![padded_list("30", &PODS)], &mut relisted);
            assert_eq!(repeat, [third], "renewing for {renews_for:?}");
            let list = store.list(&scope()).unwrap().expect("cached");
            assert_eq!(
                (list.missing.is_empty(), list.items.len()),
                (mended, if mended { 10 } else { 9 }),
                "renewing for {renews_for:?}"
            );
        }
    }

    /// Anything committed between two lists (here the scope's own watch deleting a pod) means
    /// the store no longer holds what the last list left: the repeat must replace the scope, or
    /// the cache would answer with a list the cloud never sent.
    #[test]
    fn a_repeated_list_after_a_commit_replaces_the_scope() {
        let store = MemStore::new();
        let deleted = Bytes::from(
            r#"{"type":"DELETED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p9","namespace":"d","resourceVersion":"21","uid":"u-p9"}}}"#,
        );
        let outcomes = apply_all(
            &store,
            vec![
                padded_list("19", &PODS),
                padded_list("20", &PODS),
                CacheOp::Events {
                    scope: scope(),
                    lines: vec![deleted],
                },
                padded_list("22", &PODS),
            ],
        );
        assert_eq!(outcomes, ["replaced", "replaced", "deleted", "replaced"]);
        let (names, rv) = names_and_rv(&store);
        assert_eq!((names.len(), rv.as_str()), (10, "22"), "{names:?}");
    }

    #[test]
    fn list_items_naming_their_kind_late_are_cached_with_one_kind() {
        let store = MemStore::new();
        let late = r#"{"kind":"WidgetList","apiVersion":"x.io/v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"w","namespace":"d","resourceVersion":"6"},"kind":"Widget","apiVersion":"x.io/v1"}]}"#;
        let gvr = Gvr::new("x.io", "v1", "widgets");
        let widgets = Scope::unfiltered("kubelet", &gvr, None);
        let outcomes = apply_all(
            &store,
            vec![CacheOp::List {
                scope: widgets.clone(),
                body: Bytes::from_static(late.as_bytes()).into(),
            }],
        );
        assert_eq!(outcomes, ["replaced"]);
        let list = store.list(&widgets).unwrap().unwrap();
        let item = std::str::from_utf8(&list.items[0].bytes).unwrap();
        assert_eq!(item.matches(r#""kind""#).count(), 1, "{item}");
    }

    #[test]
    fn paged_lists_do_not_replace_scopes() {
        let store = MemStore::new();
        let page = LIST.replace(
            r#""resourceVersion":"10"}"#,
            r#""resourceVersion":"10","continue":"abc"}"#,
        );
        let outcomes = apply_all(
            &store,
            vec![CacheOp::List {
                scope: scope(),
                body: Bytes::from(page).into(),
            }],
        );
        assert_eq!(outcomes, ["partial"]);
        assert!(store.list(&scope()).unwrap().is_none());
    }

    #[test]
    fn a_404_forgets_the_object() {
        let store = MemStore::new();
        let key = ObjectKey::new("kubelet", &pods(), "d", "a");
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::Object {
                    key: key.clone(),
                    body: Bytes::from_static(
                        br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"3"}}"#,
                    ).into(),
                },
                CacheOp::Gone { key: key.clone() },
                CacheOp::Gone { key: key.clone() },
            ],
        );
        assert_eq!(outcomes, ["stored", "deleted", "absent"]);
        assert_eq!(store.get(&key).unwrap(), Lookup::NotCached);
    }
    #[test]
    fn queued_events_of_one_scope_are_gathered_in_order_up_to_another_op() {
        let (tx, rx) = sync_channel(16);
        let other = Scope::unfiltered("kube-proxy", &pods(), None);
        let line = |n: u8| Bytes::from(vec![b'0' + n]);
        let events = |scope: &Scope, lines: Vec<Bytes>| CacheOp::Events {
            scope: scope.clone(),
            lines,
        };
        for (ticket, op) in [
            events(&scope(), vec![line(2), line(3)]),
            events(&scope(), vec![line(4)]),
            events(&other, vec![line(5)]),
            events(&scope(), vec![line(6)]),
        ]
        .into_iter()
        .enumerate()
        {
            let ticket = ticket as u64 + 2;
            tx.send(queued(op, ticket, false)).unwrap();
        }
        let gathered = gather_events(&rx, &scope(), vec![line(1)], GROUP_WINDOW);
        assert_eq!(gathered.lines, [line(1), line(2), line(3), line(4)]);
        assert_eq!(
            gathered.last_ticket,
            Some(3),
            "applied up to the last merged"
        );
        assert!(
            matches!(gathered.next, Some(Entry { op: CacheOp::Events { scope, .. }, ticket: 4, .. }) if scope == other),
            "the other scope's events come back to be applied next"
        );
        let gathered = gather_events(&rx, &other, vec![line(5)], GROUP_WINDOW);
        assert_eq!(gathered.lines, [line(5)]);
        assert!(
            matches!(gathered.next, Some(Entry { op: CacheOp::Events { ref lines, .. }, .. }) if *lines == [line(6)])
        );
        let started = Instant::now();
        let gathered = gather_events(&rx, &scope(), vec![line(6)], GROUP_WINDOW);
        assert_eq!(
            (
                gathered.lines,
                gathered.next.is_none(),
                gathered.last_ticket
            ),
            (vec![line(6)], true, None)
        );
        assert!(
            started.elapsed() >= GROUP_WINDOW,
            "an empty queue ends the group once the window has passed"
        );
    }

    fn queued(op: CacheOp, ticket: u64, awaited: bool) -> Queued {
        Box::new(Entry {
            op,
            ticket,
            awaited,
        })
    }

    #[test]
    fn events_arriving_within_the_window_join_the_group() {
        let (tx, rx) = sync_channel(16);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            let more = CacheOp::Events {
                scope: scope(),
                lines: vec![Bytes::from_static(b"2")],
            };
            tx.send(queued(more, 2, false))
                .expect("the writer side is there");
            // Dropping the sender ends the wait at once: the group need not sit out the window.
        });
        let started = Instant::now();
        let window = Duration::from_secs(30);
        let gathered = gather_events(&rx, &scope(), vec![Bytes::from_static(b"1")], window);
        sender.join().expect("sender");
        assert_eq!(gathered.lines, [&b"1"[..], &b"2"[..]]);
        assert_eq!(gathered.last_ticket, Some(2));
        assert!(started.elapsed() < window);
    }

    /// Events a tee waits for are applied without waiting out the window: what is queued
    /// already still joins the group.
    #[test]
    fn an_awaited_event_ends_the_window() {
        let (tx, rx) = sync_channel(16);
        let event = |n: &'static [u8]| CacheOp::Events {
            scope: scope(),
            lines: vec![Bytes::from_static(n)],
        };
        tx.send(queued(event(b"2"), 2, true)).unwrap();
        let window = Duration::from_secs(30);
        let started = Instant::now();
        let gathered = gather_events(&rx, &scope(), vec![Bytes::from_static(b"1")], window);
        assert_eq!(gathered.lines, [&b"1"[..], &b"2"[..]]);
        assert!(started.elapsed() < Duration::from_secs(5), "not the window");
        drop(tx);
    }

    /// Polls `done` every 5 ms; panics with `what` if it is still false after 5 s.
    fn wait_until(what: impl Fn() -> String, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{}", what());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether a cache writer thread (this test's, or another's running beside it) is lowered.
    fn a_writer_is_lowered() -> bool {
        threads_named(&["outpost-cache-w"])
            .into_iter()
            .any(|tid| nice_of(tid) == Some(background_nice()))
    }

    /// The cache threads' nice in a writer started from the calling thread.
    fn background_nice() -> i32 {
        let me = rustix::thread::gettid().as_raw_nonzero().get();
        (nice_of(me).expect("own nice") + BACKGROUND_NICE_STEP).min(NICEST)
    }

    #[test]
    fn the_writer_and_sleds_threads_run_at_background_priority() {
        let dir = tempfile::tempdir().unwrap();
        let store = outpost_cache::SledStore::open(dir.path(), Default::default()).unwrap();
        // A flushed write starts sled's I/O pool, as the cache's first writes do in the hub.
        store
            .put_object("kubelet", &pods(), br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"1","uid":"u"}}"#)
            .unwrap();
        let sled_threads = threads_named(outpost_cache::BACKGROUND_THREAD_PREFIXES);
        assert!(!sled_threads.is_empty(), "sled runs threads of its own");
        let writer = Writer::start(Arc::new(store), Metrics::new(), false).unwrap();
        // Other tests start stores of their own meanwhile: only the sled threads seen before the
        // writer started are checked, and one that ended since is skipped.
        let lowered = |tids: &[i32]| {
            tids.iter()
                .all(|tid| nice_of(*tid).is_none_or(|nice| nice == background_nice()))
        };
        wait_until(
            || {
                let niceness: Vec<_> = sled_threads.iter().map(|t| (t, nice_of(*t))).collect();
                format!(
                    "writer lowered: {}; sled threads: {niceness:?}",
                    a_writer_is_lowered()
                )
            },
            || a_writer_is_lowered() && lowered(&sled_threads),
        );
        drop(writer);
    }

    #[test]
    fn a_sled_thread_started_later_at_normal_priority_is_lowered_too() {
        let writer = Writer::start_checking_every(
            Arc::new(MemStore::new()),
            Metrics::new(),
            false,
            DEFAULT_MAX_OBJECT_BYTES,
            Duration::from_millis(20),
        )
        .unwrap();
        // Past the writer's first look at the threads (right after it lowered itself).
        wait_until(
            || "the writer never lowered itself".into(),
            a_writer_is_lowered,
        );
        std::thread::sleep(Duration::from_millis(100));
        // As sled starts its I/O pool from whichever thread writes first: this test's, at nice 0.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let late = std::thread::Builder::new()
            .name("sled-io-late".into())
            .spawn(move || {
                tid_tx
                    .send(rustix::thread::gettid().as_raw_nonzero().get())
                    .unwrap();
                let _ = done_rx.recv();
            })
            .unwrap();
        let tid = tid_rx.recv().unwrap();
        wait_until(
            || format!("never lowered: {:?}", nice_of(tid)),
            || nice_of(tid) == Some(background_nice()),
        );
        done_tx.send(()).unwrap();
        late.join().unwrap();
        drop(writer);
    }

    #[test]
    fn groups_stay_within_their_bounds_and_keep_every_line_in_order() {
        let big = Bytes::from(vec![b' '; GROUP_MAX_BYTES / 2]);
        let huge = Bytes::from(vec![b' '; GROUP_MAX_BYTES + 1]);
        let small = Bytes::from_static(b"{}");
        let lines = [
            big.clone(),
            big.clone(),
            big.clone(),
            huge.clone(),
            small.clone(),
        ];
        let sizes: Vec<usize> = groups(&lines).iter().map(|g| g.len()).collect();
        assert_eq!(sizes, [2, 1, 1, 1], "a line larger than a group goes alone");
        let many = vec![small; GROUP_MAX_EVENTS * 2 + 1];
        let cut = groups(&many);
        assert_eq!(
            cut.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [GROUP_MAX_EVENTS, GROUP_MAX_EVENTS, 1]
        );
        assert_eq!(cut.concat(), many);
    }

    #[tokio::test]
    async fn caught_up_waits_for_what_was_queued_before() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        let event = |name: &str, rv: u32| {
            Bytes::from(format!(
                r#"{{"type":"ADDED","object":{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"d","resourceVersion":"{rv}"}}}}}}"#
            ))
        };
        assert!(
            writer
                .submit(CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(LIST.as_bytes()).into(),
                })
                .is_some()
        );
        for i in 0..200 {
            let lines = vec![event(&format!("p{i}"), 11 + i)];
            assert!(
                writer
                    .submit(CacheOp::Events {
                        scope: scope(),
                        lines
                    })
                    .is_some()
            );
        }
        assert!(writer.caught_up(Duration::from_secs(10)).await);
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.items.len(), 201, "everything queued before is applied");
        assert_eq!(list.resource_version.as_str(), "210");
        assert!(
            writer.caught_up(Duration::ZERO).await,
            "nothing queued: no wait"
        );
    }

    /// kubelet GETs its Node in a loop: once the writer has found an answer stored as it is,
    /// the same answer again is not queued, until anything is committed (here the offline
    /// node status's own write): then it goes to the writer again and is stored back.
    #[tokio::test]
    async fn a_repeated_answer_skips_the_queue_until_the_store_changes() {
        let store = Arc::new(MemStore::new());
        let metrics = Metrics::new();
        let writer = Writer::start(store.clone(), metrics.clone(), false).unwrap();
        let nodes = Gvr::new("", "v1", "nodes");
        let key = ObjectKey::new("kubelet", &nodes, "", "edge-1");
        let node = |label: &str| {
            Bytes::from(format!(
                r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"edge-1","resourceVersion":"3","labels":{{"l":"{label}"}}}}}}"#
            ))
        };
        let answer = |body: Bytes| async {
            let queued = !writer.still_holds(&key, &body.clone().into());
            if queued {
                let op = CacheOp::Object {
                    key: key.clone(),
                    body: body.into(),
                };
                assert!(writer.submit(op).is_some());
                assert!(writer.caught_up(Duration::from_secs(10)).await);
            }
            queued
        };
        let unchanged = || {
            metrics
                .cache_writes
                .with_label_values(&["object", "unchanged"])
                .get()
        };
        assert!(answer(node("x")).await, "first answer: stored");
        assert!(answer(node("x")).await, "the writer confirms it");
        assert_eq!(unchanged(), 1);
        assert!(!answer(node("x")).await, "the same again stays here");
        assert_eq!(unchanged(), 2, "and counts as unchanged");
        assert!(answer(node("w")).await, "another answer is queued");
        assert!(answer(node("x")).await);
        assert!(answer(node("x")).await);
        assert!(!answer(node("x")).await);

        store.put_object("kubelet", &nodes, &node("y")).unwrap();
        assert!(answer(node("x")).await, "a commit since: queued again");
        let Lookup::Found(held) = store.get(&key).unwrap() else {
            panic!("the node is cached");
        };
        assert_eq!(held.bytes, node("x"), "and stored back");
    }

    #[test]
    fn a_group_keeps_one_outcome_per_line() {
        let store = MemStore::new();
        apply_all(
            &store,
            vec![CacheOp::List {
                scope: scope(),
                body: Bytes::from_static(LIST.as_bytes()).into(),
            }],
        );
        let event = |t: &str, name: &str, rv: &str| {
            Bytes::from(format!(
                r#"{{"type":"{t}","object":{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"d","resourceVersion":"{rv}","uid":"u-{name}"}}}}}}"#
            ))
        };
        let lines = [
            event("ADDED", "b", "11"),
            Bytes::from_static(b"not json"),
            event("ERROR", "x", "12"),
            event("MODIFIED", "b", "13"),
            event("DELETED", "a", "14"),
        ];
        let outcomes: Vec<_> = apply_events(&store, &scope(), &lines)
            .into_iter()
            .map(label_of)
            .collect();
        assert_eq!(
            outcomes,
            ["stored", "invalid", "error_event", "stored", "deleted"]
        );
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.resource_version.as_str(), "14");
        assert_eq!(list.items.len(), 1);
    }

    /// An upstream answer for another object than the one asked for is not cached: another
    /// kind on the path (a Secret for a ConfigMap), another name or namespace, another list.
    #[test]
    fn an_answer_for_another_object_is_not_cached() {
        let store = MemStore::new();
        let configmaps = Gvr::new("", "v1", "configmaps");
        let key = ObjectKey::new("kubelet", &configmaps, "d", "a");
        let object = |kind: &str, ns: &str, name: &str| -> Chunks {
            Bytes::from(format!(
                r#"{{"kind":"{kind}","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"3"}}}}"#
            ))
            .into()
        };
        let cm_scope = Scope::unfiltered("kubelet", &configmaps, None);
        let secret_list = r#"{"kind":"SecretList","apiVersion":"v1","metadata":{"resourceVersion":"4"},"items":[{"metadata":{"name":"s","namespace":"d","resourceVersion":"3"}}]}"#;
        let secret_event = r#"{"type":"ADDED","object":{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s","namespace":"d","resourceVersion":"5"}}}"#;
        let outcomes = apply_all(
            &store,
            vec![
                CacheOp::Object {
                    key: key.clone(),
                    body: object("Secret", "d", "a"),
                },
                CacheOp::Object {
                    key: key.clone(),
                    body: object("ConfigMap", "d", "b"),
                },
                CacheOp::Object {
                    key: key.clone(),
                    body: object("ConfigMap", "e", "a"),
                },
                CacheOp::List {
                    scope: cm_scope.clone(),
                    body: Bytes::from_static(secret_list.as_bytes()).into(),
                },
                CacheOp::Events {
                    scope: scope(),
                    lines: vec![Bytes::from_static(secret_event.as_bytes())],
                },
                CacheOp::Object {
                    key: key.clone(),
                    body: object("ConfigMap", "d", "a"),
                },
            ],
        );
        assert_eq!(
            outcomes,
            [
                "mismatch", "mismatch", "mismatch", "mismatch", "mismatch", "stored"
            ]
        );
        assert_eq!(store.objects("kubelet", &configmaps).unwrap().len(), 1);
        assert!(store.list(&cm_scope).unwrap().is_none());
    }

    /// Polls (bounded) until `scope`'s missed-events mark is `marked`.
    async fn until_marked(store: &MemStore, scope: &Scope, marked: bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let is_marked = || {
            store
                .list(scope)
                .unwrap()
                .is_some_and(|l| l.missed.is_some())
        };
        while is_marked() != marked {
            assert!(Instant::now() < deadline, "never marked={marked}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A mark made after a LIST was queued outlives that LIST (the events it stands for came
    /// after it); a LIST queued after the mark clears it.
    #[tokio::test]
    async fn only_a_list_queued_after_a_mark_clears_it() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        let list = || CacheOp::List {
            scope: scope(),
            body: Bytes::from_static(LIST.as_bytes()).into(),
        };
        assert!(writer.submit(list()).is_some());
        writer.mark_missed(&scope(), Missed::QueueFull);
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        until_marked(&store, &scope(), true).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        until_marked(&store, &scope(), true).await;
        assert!(writer.submit(list()).is_some());
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        until_marked(&store, &scope(), false).await;
    }

    /// Under the free-space floor, events the store refuses mark their scope, counted.
    #[tokio::test]
    async fn events_refused_for_want_of_space_mark_their_scope() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = outpost_cache::SledStore::open(dir.path(), Default::default()).unwrap();
            let applied = apply_all(
                &store,
                vec![CacheOp::List {
                    scope: scope(),
                    body: Bytes::from_static(LIST.as_bytes()).into(),
                }],
            );
            assert_eq!(applied, ["replaced"]);
        }
        let floored = outpost_cache::SledOptions {
            min_free_bytes: Some(u64::MAX),
            ..Default::default()
        };
        let store = Arc::new(outpost_cache::SledStore::open(dir.path(), floored).unwrap());
        let metrics = Metrics::new();
        let writer = Writer::start(store.clone(), metrics.clone(), false).unwrap();
        let added = r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"d","resourceVersion":"11"}}}"#;
        assert!(
            writer
                .submit(CacheOp::Events {
                    scope: scope(),
                    lines: vec![Bytes::from_static(added.as_bytes())],
                })
                .is_some()
        );
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.items.len(), 1, "b was not written");
        assert!(list.missed.is_some_and(|why| why.contains("floor")));
        let count = |family: &prometheus::IntCounterVec, labels: &[&str]| {
            family.with_label_values(labels).get()
        };
        assert_eq!(count(&metrics.cache_writes, &["event", "no_space"]), 1);
        assert_eq!(count(&metrics.cache_missed, &["no_space"]), 1);
        assert_eq!(metrics.cache_missed_scopes.get(), 1);
        assert_eq!(metrics.cache_degraded.get(), 1);
    }
}
