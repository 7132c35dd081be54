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
//! The writer and sled's threads run at a lower CPU priority ([`BACKGROUND_NICE`]): where
//! caching competes for a core with answering clients, answering wins.
//!
//! Nothing that does not parse is cached: a body that is not the expected JSON (a `Status`, a
//! truncated stream, a protobuf body) is counted in `outpost_cache_writes_total{outcome="invalid"}`
//! and dropped; the client already received it unchanged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use bytes::Bytes;
use outpost_cache::{CacheError, EventType, Gvr, ObjectKey, Scope, Store, WriteOutcome};
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::{debug, warn};

use super::kinds::{self, KindCheck, KindInfo, TypeMetaHead};
use super::offline;
use crate::metrics::Metrics;

/// Operations queued between a tee and the writer thread.
#[derive(Debug)]
pub enum CacheOp {
    /// A GET's 2xx body.
    Object { key: ObjectKey, body: Chunks },
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
    fn label(&self) -> &'static str {
        match self {
            CacheOp::Object { .. } => "object",
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
    progress: Arc<Progress>,
}

/// Operations handed to the writer and operations it has applied (or given up on).
#[derive(Debug, Default)]
struct Progress {
    queued: AtomicU64,
    applied: AtomicU64,
}

/// Operations queued before tees start dropping: a burst of watch events or a few relists.
const QUEUE_DEPTH: usize = 4096;

/// A queued operation, boxed: the bounded channel allocates and writes every slot up front,
/// and 4,096 unboxed operations (≈200 bytes each, mostly the scope) held 0.8 MiB from start-up.
type Queued = Box<CacheOp>;

impl Writer {
    /// Starts the writer thread over `store`. The thread ends when every `Writer` is dropped.
    /// `volatile`: the store keeps nothing across a restart (the disk cache could not be
    /// opened), so the cache counts as degraded whatever the store says.
    pub fn start(
        store: Arc<dyn Store>,
        metrics: Metrics,
        volatile: bool,
    ) -> std::io::Result<Writer> {
        Self::start_checking_every(store, metrics, volatile, PRIORITY_CHECK)
    }

    /// [`Writer::start`], looking for sled threads to lower every `check_every`.
    fn start_checking_every(
        store: Arc<dyn Store>,
        metrics: Metrics,
        volatile: bool,
        check_every: Duration,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = sync_channel(QUEUE_DEPTH);
        let thread_metrics = metrics.clone();
        thread_metrics.cache_degraded.set(i64::from(volatile));
        let progress = Arc::new(Progress::default());
        let applied = progress.clone();
        std::thread::Builder::new()
            .name("outpost-cache-writer".into())
            .spawn(move || {
                let mut priority = Priority::lower(check_every);
                run(
                    store.as_ref(),
                    &rx,
                    &thread_metrics,
                    volatile,
                    &applied,
                    &mut priority,
                )
            })?;
        Ok(Writer {
            tx,
            metrics,
            progress,
        })
    }

    /// Queues `op`; `false` when the queue is full or the writer is gone (the op is dropped).
    pub fn submit(&self, op: CacheOp) -> bool {
        let label = op.label();
        match self.tx.try_send(Box::new(op)) {
            Ok(()) => {
                self.progress.queued.fetch_add(1, Ordering::AcqRel);
                true
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.cache_dropped.with_label_values(&[label]).inc();
                false
            }
        }
    }

    /// Waits, at most `within`, until every operation queued before the call is applied.
    /// Offline answers wait for it, so that they include what the hub passed on to its clients
    /// just before the cloud went away. `false`: the writer is still behind (a long relist, a
    /// stuck disk); the caller answers from the cache as it is.
    pub async fn caught_up(&self, within: Duration) -> bool {
        let target = self.progress.queued.load(Ordering::Acquire);
        let deadline = tokio::time::Instant::now() + within;
        while self.progress.applied.load(Ordering::Acquire) < target {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

/// The cache's background threads' nice value: the writer's and sled's (CFS weight 110 against
/// 1,024 for the request path). Caching is work behind the responses; where it competes for a
/// core with the proxy, the proxy should win. Lowered, not idle (`SCHED_IDLE`): on a node whose
/// cores stay busy the writer still gets about a tenth of one, enough for a full node's relists
/// (a few hundred ms of its CPU) to land within seconds, and its queue does not overflow.
pub const BACKGROUND_NICE: i32 = 10;

/// How often the writer looks for sled threads that run at normal priority.
const PRIORITY_CHECK: Duration = Duration::from_secs(5);

/// The cache threads' CPU priority, kept by the writer thread.
struct Priority {
    check_every: Duration,
    checked: Instant,
    /// The writer's own priority could be lowered (a system may refuse; the cache works on).
    lowered: bool,
}

impl Priority {
    /// Lowers the calling thread's (the writer's) priority and that of sled's threads.
    fn lower(check_every: Duration) -> Priority {
        let me = rustix::thread::gettid();
        let lowered = match rustix::process::setpriority_process(Some(me), BACKGROUND_NICE) {
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
        };
        let sled_threads = priority.lower_sled_threads();
        debug!(
            nice = BACKGROUND_NICE,
            sled_threads, "cache threads at background priority"
        );
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
            .filter(|pid| setpriority_process(Some(*pid), BACKGROUND_NICE).is_ok())
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
    store: &dyn Store,
    rx: &Receiver<Queued>,
    metrics: &Metrics,
    volatile: bool,
    progress: &Progress,
    priority: &mut Priority,
) {
    let mut known_kinds: HashMap<Gvr, KindInfo> = HashMap::new();
    let mut next = None;
    loop {
        priority.check();
        let mut op = match next.take() {
            Some(op) => op,
            None => match rx.recv_timeout(priority.check_every) {
                Ok(op) => *op,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        let mut ops = 1;
        if let CacheOp::Events { scope, lines } = &mut op {
            let gathered = gather_events(rx, scope, std::mem::take(lines), GROUP_WINDOW);
            *lines = gathered.lines;
            ops += gathered.more_ops;
            next = gathered.next;
        }
        let label = op.label();
        for outcome in apply(store, op, &mut known_kinds) {
            record(metrics, label, outcome);
        }
        progress.applied.fetch_add(ops, Ordering::AcqRel);
        metrics
            .cache_degraded
            .set(i64::from(volatile || store.health().degraded));
    }
    if let Err(e) = store.flush() {
        warn!(error = %e, "final cache flush failed");
    }
}

fn record(metrics: &Metrics, label: &'static str, applied: Applied) {
    let outcome = match applied {
        Ok(outcome) => outcome,
        Err(ApplyError::Invalid(reason)) => {
            debug!(op = label, reason, "response not cached");
            "invalid"
        }
        Err(ApplyError::Store(e)) => {
            warn!(op = label, error = %e, "cache write failed");
            "error"
        }
    };
    metrics
        .cache_writes
        .with_label_values(&[label, outcome])
        .inc();
    crate::memory::note_work();
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
    /// Queued operations merged into `lines` besides the first.
    more_ops: u64,
    /// The first other operation taken off the queue, to be applied next.
    next: Option<CacheOp>,
}

/// `first` and the lines of the same scope's events queued behind it, up to a group's worth or
/// until `window` ([`GROUP_WINDOW`]) has passed since `first` was taken. The first other
/// operation taken off the queue ends the group and comes back, to be applied next, so the
/// order is kept.
fn gather_events(
    rx: &Receiver<Queued>,
    scope: &Scope,
    first: Vec<Bytes>,
    window: Duration,
) -> Gathered {
    let deadline = Instant::now() + window;
    let mut lines = first;
    let mut bytes: usize = lines.iter().map(Bytes::len).sum();
    let mut more_ops = 0;
    let mut next = None;
    while lines.len() < GROUP_MAX_EVENTS && bytes < GROUP_MAX_BYTES {
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait).map(|op| *op) {
            Ok(CacheOp::Events {
                scope: s,
                lines: more,
            }) if s == *scope => {
                bytes += more.iter().map(Bytes::len).sum::<usize>();
                lines.extend(more);
                more_ops += 1;
            }
            Ok(other) => {
                next = Some(other);
                break;
            }
            Err(_) => break,
        }
    }
    Gathered {
        lines,
        more_ops,
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
    Store(CacheError),
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
fn apply(store: &dyn Store, op: CacheOp, kinds: &mut HashMap<Gvr, KindInfo>) -> Vec<Applied> {
    let applied = match op {
        CacheOp::Object { key, body } => {
            apply_object(store, &key, &body.joined(), kinds).and_then(|outcome| {
                forget_absence(store, &key)?;
                Ok(outcome)
            })
        }
        CacheOp::Gone { key } => apply_gone(store, &key),
        CacheOp::List { scope, body } => apply_list(store, &scope, &body.joined(), kinds),
        CacheOp::InitialEvents { scope, lines } => {
            apply_streamed_list(store, &scope, &lines, kinds)
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
    let kind = KindInfo::from_object(body)
        .ok_or_else(|| ApplyError::Invalid("object without kind/apiVersion".into()))?;
    if kind.kind == "Status" || kind.kind.ends_with("List") {
        return Err(ApplyError::Invalid(format!(
            "a {} is not an object",
            kind.kind
        )));
    }
    remember_kind(store, &key.gvr, kind, kinds)?;
    Ok(outcome_label(&store.put_object(
        &key.component,
        &key.gvr,
        body,
    )?))
}

#[derive(Deserialize)]
struct ListBody<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: String,
}

fn apply_list(
    store: &dyn Store,
    scope: &Scope,
    body: &[u8],
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Applied {
    let list: ListBody<'_> =
        serde_json::from_slice(body).map_err(|e| ApplyError::Invalid(format!("list body: {e}")))?;
    let kind = KindInfo::from_list(&list.kind, &list.api_version)
        .ok_or_else(|| ApplyError::Invalid(format!("a {} is not a list", list.kind)))?;
    if !list.metadata.continue_token.is_empty() {
        // One page of a chunked list cannot replace a scope; the full list will.
        return Ok("partial");
    }
    if list.metadata.resource_version.is_empty() {
        return Err(ApplyError::Invalid("list without resourceVersion".into()));
    }
    let raw_items = list.items.unwrap_or_default();
    let head = TypeMetaHead::of(&kind);
    let replace = |check| {
        let items: Vec<_> = raw_items
            .iter()
            .map(|raw| kinds::with_type_meta(raw.get().as_bytes(), &head, check))
            .collect();
        let item_refs: Vec<&[u8]> = items.iter().map(AsRef::as_ref).collect();
        store.replace_scope(scope, &list.metadata.resource_version, &item_refs)
    };
    match replace(KindCheck::UpToMetadata) {
        Ok(_) => {}
        Err(CacheError::InvalidObject(reason)) => {
            // Possibly a `kind` after `metadata` that the short read missed; read them whole.
            debug!(reason, "list items read again in whole");
            replace(KindCheck::Whole)?;
        }
        Err(e) => return Err(e.into()),
    }
    remember_kind(store, &scope.gvr, kind, kinds)?;
    Ok("replaced")
}

/// See [`CacheOp::InitialEvents`]. Every line but the last must be an `ADDED` event, the last
/// the bookmark; anything else is not a streaming list and changes nothing.
fn apply_streamed_list(
    store: &dyn Store,
    scope: &Scope,
    lines: &[Bytes],
    kinds: &mut HashMap<Gvr, KindInfo>,
) -> Applied {
    #[derive(Deserialize)]
    struct Marker {
        #[serde(default)]
        metadata: ListMeta,
    }
    let invalid = |what: &str| ApplyError::Invalid(format!("streaming list: {what}"));
    let (last, added) = lines.split_last().ok_or_else(|| invalid("no lines"))?;
    let marker = match read_line(last) {
        Line::ToStore(EventType::Bookmark, object) => object,
        _ => return Err(invalid("it does not end with a bookmark")),
    };
    let resource_version = serde_json::from_slice::<Marker>(marker)
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
    store.replace_scope(scope, &resource_version, &items)?;
    let kind = KindInfo::from_object(marker).or_else(|| KindInfo::from_object(items.first()?));
    if let Some(kind) = kind {
        remember_kind(store, &scope.gvr, kind, kinds)?;
    }
    Ok("replaced")
}

#[derive(Deserialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    event_type: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// What became of one watch line before the store saw it.
enum Line<'a> {
    /// Decided without the store (an ERROR event, or not a watch event at all).
    Done(Applied),
    ToStore(EventType, &'a [u8]),
}

fn read_line(line: &[u8]) -> Line<'_> {
    let event: EventLine<'_> = match serde_json::from_slice(line) {
        Ok(event) => event,
        Err(e) => return Line::Done(Err(ApplyError::Invalid(format!("watch event: {e}")))),
    };
    if event.event_type == "ERROR" {
        // A 410 or other error ends the stream; the client relists and the list replaces the scope.
        return Line::Done(Ok("error_event"));
    }
    match event.event_type.parse::<EventType>() {
        Ok(event_type) => Line::ToStore(event_type, event.object.get().as_bytes()),
        Err(reason) => Line::Done(Err(ApplyError::Invalid(reason))),
    }
}

/// One outcome per line, in order; the lines the store takes go to it in one call.
fn apply_events(store: &dyn Store, scope: &Scope, lines: &[Bytes]) -> Vec<Applied> {
    let lines: Vec<Line<'_>> = lines.iter().map(|line| read_line(line)).collect();
    let events: Vec<(EventType, &[u8])> = lines
        .iter()
        .filter_map(|line| match line {
            Line::ToStore(event_type, object) => Some((*event_type, *object)),
            Line::Done(_) => None,
        })
        .collect();
    // One warning for a failed group rather than one per event; each still counts as "error".
    let mut stored = match store.apply_events(scope, &events) {
        Ok(outcomes) => Some(outcomes.into_iter()),
        Err(e) => {
            warn!(events = events.len(), error = %e, "cache write of watch events failed");
            None
        }
    };
    lines
        .into_iter()
        .map(|line| match line {
            Line::Done(applied) => applied,
            Line::ToStore(..) => match stored.as_mut().and_then(Iterator::next) {
                Some(outcome) => Ok(outcome_label(&outcome?)),
                None => Ok("error"),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outpost_cache::{Lookup, MemStore};
    use serde_json::Value;

    fn pods() -> Gvr {
        Gvr::new("", "v1", "pods")
    }

    fn scope() -> Scope {
        Scope::unfiltered("kubelet", &pods(), None)
    }

    fn apply_all(store: &MemStore, ops: Vec<CacheOp>) -> Vec<&'static str> {
        let mut kinds = HashMap::new();
        ops.into_iter()
            .flat_map(|op| apply(store, op, &mut kinds))
            .map(|applied| match applied {
                Ok(o) => o,
                Err(ApplyError::Invalid(_)) => "invalid",
                Err(ApplyError::Store(e)) => panic!("{e}"),
            })
            .collect()
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
        for op in [
            events(&scope(), vec![line(2), line(3)]),
            events(&scope(), vec![line(4)]),
            events(&other, vec![line(5)]),
            events(&scope(), vec![line(6)]),
        ] {
            tx.send(Box::new(op)).unwrap();
        }
        let gathered = gather_events(&rx, &scope(), vec![line(1)], GROUP_WINDOW);
        assert_eq!(gathered.lines, [line(1), line(2), line(3), line(4)]);
        assert_eq!(gathered.more_ops, 2);
        assert!(
            matches!(gathered.next, Some(CacheOp::Events { scope, .. }) if scope == other),
            "the other scope's events come back to be applied next"
        );
        let gathered = gather_events(&rx, &other, vec![line(5)], GROUP_WINDOW);
        assert_eq!(gathered.lines, [line(5)]);
        assert!(
            matches!(gathered.next, Some(CacheOp::Events { ref lines, .. }) if *lines == [line(6)])
        );
        let started = Instant::now();
        let gathered = gather_events(&rx, &scope(), vec![line(6)], GROUP_WINDOW);
        assert_eq!(
            (gathered.lines, gathered.next.is_none()),
            (vec![line(6)], true)
        );
        assert!(
            started.elapsed() >= GROUP_WINDOW,
            "an empty queue ends the group once the window has passed"
        );
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
            tx.send(Box::new(more)).expect("the writer side is there");
            // Dropping the sender ends the wait at once: the group need not sit out the window.
        });
        let started = Instant::now();
        let window = Duration::from_secs(30);
        let gathered = gather_events(&rx, &scope(), vec![Bytes::from_static(b"1")], window);
        sender.join().expect("sender");
        assert_eq!(gathered.lines, [&b"1"[..], &b"2"[..]]);
        assert_eq!(gathered.more_ops, 1);
        assert!(started.elapsed() < window);
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
            .any(|tid| nice_of(tid) == Some(BACKGROUND_NICE))
    }

    /// A thread's nice value, from `/proc/self/task/<tid>/stat` (field 19); `None` once it ended.
    fn nice_of(tid: i32) -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        // Fields after the name (which may hold spaces) start with the state, field 3.
        let after_name = &stat[stat.rfind(')')? + 1..];
        after_name.split_whitespace().nth(16)?.parse().ok()
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
                .all(|tid| nice_of(*tid).is_none_or(|nice| nice == BACKGROUND_NICE))
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
            || nice_of(tid) == Some(BACKGROUND_NICE),
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
        assert!(writer.submit(CacheOp::List {
            scope: scope(),
            body: Bytes::from_static(LIST.as_bytes()).into(),
        }));
        for i in 0..200 {
            let lines = vec![event(&format!("p{i}"), 11 + i)];
            assert!(writer.submit(CacheOp::Events {
                scope: scope(),
                lines
            }));
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
            .map(|o| match o {
                Ok(label) => label,
                Err(ApplyError::Invalid(_)) => "invalid",
                Err(ApplyError::Store(e)) => panic!("{e}"),
            })
            .collect();
        assert_eq!(
            outcomes,
            ["stored", "invalid", "error_event", "stored", "deleted"]
        );
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.resource_version.as_str(), "14");
        assert_eq!(list.items.len(), 1);
    }
}
