//! Copies a response body into the cache while it streams to the client.
//!
//! The client gets every frame as it arrives; the tee keeps a copy. A whole body (GET, LIST,
//! discovery) is queued when it has ended cleanly; a watch stream is cut into lines and each
//! complete event is queued at once, except a streaming list's initial events (below). A body
//! that fails mid-way, grows past its limit, or meets a full writer queue is abandoned: nothing
//! more of it is cached (a truncated list never replaces a scope). The copy stops as soon as a
//! limit is passed, so an oversized answer never sits in memory whole: a GET's body may be
//! [`Writer::max_object_bytes`] (`--cache-max-object-bytes`), a watch line that much plus its
//! envelope, a LIST or discovery document [`MAX_BODY`]. A LIST with one item over the object
//! limit is not cached either (a scope must never silently lack an item): the tee follows the
//! items as they stream ([`ItemSizes`]) and stops at the first one over the limit.
//!
//! # Scopes that missed events
//! When a watch (or a LIST, whose watch would then apply onto an older scope) is abandoned for
//! a full queue or a size limit, the client got what the cache will never hold: the scope is
//! marked ([`Writer::mark_missed`]) and answered 503 offline until a later LIST replaces it.
//!
//! # Durable before forwarded
//! A frame that carries an `ADDED` or `DELETED` event is held back until the writer has applied
//! (and, with the daemon's store, flushed) the events it carries: after a crash the cache never
//! lists a pod the client saw deleted, nor lacks one the client saw created and started
//! (kubelet kills a pod missing from its list). `MODIFIED` events are not waited for: a version
//! behind is harmless there, and they are the high-rate ones (leases, status updates). The wait
//! is bounded by [`DURABLE_WITHIN`]: a stuck disk must not stall a watch; the frame then goes on
//! and the scope is marked as having missed events. The frame that ends a streaming list waits
//! the same way for the list's replacement of the scope. What this costs per event is measured
//! in `benches/edge.rs` (`deleted_event_delivery`).
//!
//! A watch that may open with a streaming list (`sendInitialEvents`, see
//! [`super::CachePlan::Watch`]) holds its leading `ADDED` events back. When the
//! `k8s.io/initial-events-end` bookmark follows, they are the scope's whole state at that
//! bookmark's resourceVersion and replace the scope, as a LIST does: what was deleted upstream
//! meanwhile leaves the cache. Any other line first means no list is being streamed, and the held
//! events go on as ordinary ones.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use outpost_cache::{ObjectKey, Scope};
use outpost_core::wire::{EventType, LineFramer, WatchEvent};

use super::list_items::ItemSizes;
use super::writer::{CacheOp, Chunks, Missed, Ticket, Writer};
use crate::body::{BoxError, ProxyBody};

/// Larger LIST and discovery bodies are proxied but not cached (a 1,000-Service list is ~1 MB).
pub const MAX_BODY: usize = 64 << 20;

/// How long a frame carrying `ADDED` or `DELETED` waits for the cache to have them (see
/// "Durable before forwarded"): well above a flushed write on an SD card, or a relist queued
/// ahead of it.
pub const DURABLE_WITHIN: Duration = Duration::from_secs(3);

/// What a watch line adds around its object: `{"type":"MODIFIED","object":` and `}`.
const EVENT_ENVELOPE: usize = 64;

/// Where the collected bytes go.
#[derive(Debug, Clone)]
pub enum Sink {
    Object(ObjectKey),
    /// The object a write left (a create's `key.name` is empty: the answer names it).
    Written(ObjectKey),
    List(Scope),
    Watch {
        scope: Scope,
        initial_events: bool,
    },
    Document {
        name: String,
        content_type: String,
    },
}

impl Sink {
    fn scope(&self) -> Option<&Scope> {
        match self {
            Sink::List(scope) | Sink::Watch { scope, .. } => Some(scope),
            Sink::Object(_) | Sink::Written(_) | Sink::Document { .. } => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Sink::Object(_) | Sink::Written(_) => "object",
            Sink::List(_) => "list",
            Sink::Watch { .. } => "event",
            Sink::Document { .. } => "document",
        }
    }
}

/// A response body that streams through while a copy is collected for the cache.
pub struct TeeBody {
    inner: ProxyBody,
    sink: Sink,
    writer: Writer,
    /// A whole body (GET, LIST, discovery), until it ends: its chunks, shared, not copied.
    whole: Chunks,
    /// A watch's lines.
    framer: LineFramer,
    /// A watch's leading `ADDED` events, held while they may be a streaming list.
    initial: Option<Chunks>,
    /// Set once the copy is given up or handed over; later frames only pass through.
    done: bool,
    /// A frame held back until the cache has what it carries.
    held: Option<Held>,
    /// A LIST's items, followed for their sizes once the body is past the object limit.
    items: Option<ItemSizes>,
}

/// A frame and the wait for its events to be stored. The wait is behind a mutex only to make
/// the body `Sync` (hyper's boxed bodies are); it is only ever used through `&mut`.
struct Held {
    frame: Frame<Bytes>,
    stored: Mutex<Pin<Box<dyn Future<Output = Stored> + Send>>>,
}

enum Stored {
    Yes,
    /// Not within [`DURABLE_WITHIN`].
    Late,
    /// The writer is gone (the hub is stopping): nothing more will be stored.
    WriterGone,
}

impl Held {
    fn new(frame: Frame<Bytes>, writer: &Writer, ticket: Ticket) -> Held {
        let durable = writer.durable(ticket);
        let stored = async move {
            match tokio::time::timeout(DURABLE_WITHIN, durable).await {
                Ok(true) => Stored::Yes,
                Ok(false) => Stored::WriterGone,
                Err(_) => Stored::Late,
            }
        };
        Held {
            frame,
            stored: Mutex::new(Box::pin(stored)),
        }
    }
}

impl TeeBody {
    pub fn new(inner: ProxyBody, sink: Sink, writer: Writer) -> TeeBody {
        let initial = matches!(
            sink,
            Sink::Watch {
                initial_events: true,
                ..
            }
        )
        .then(Chunks::default);
        TeeBody {
            items: None,
            initial,
            inner,
            sink,
            writer,
            whole: Chunks::default(),
            framer: LineFramer::new(),
            done: false,
            held: None,
        }
    }

    /// Takes a copy of `data`; the ticket of what the frame must wait for, if anything.
    fn collect(&mut self, data: &Bytes) -> Option<Ticket> {
        if self.done {
            return None;
        }
        let limit = match &self.sink {
            Sink::Object(_) | Sink::Written(_) => self.writer.max_object_bytes(),
            Sink::List(_) | Sink::Document { .. } => MAX_BODY,
            Sink::Watch { .. } => return self.collect_lines(data),
        };
        if self.whole.byte_len() + data.len() > limit {
            self.abandon(Some(Missed::TooLarge));
            return None;
        }
        self.whole.push(data.clone());
        if !self.list_items_fit(data) {
            self.abandon(Some(Missed::TooLarge));
        }
        None
    }

    /// Whether a LIST's items still fit the object limit, `data` pushed. The scan starts once
    /// the body is larger than the limit, over what came before too (see [`ItemSizes`]).
    fn list_items_fit(&mut self, data: &Bytes) -> bool {
        if !matches!(self.sink, Sink::List(_)) {
            return true;
        }
        let limit = self.writer.max_object_bytes();
        match &mut self.items {
            Some(items) => items.fits(data),
            None if self.whole.byte_len() <= limit => true,
            None => {
                let mut items = ItemSizes::new(limit);
                let fits = self.whole.pieces().iter().all(|piece| items.fits(piece));
                self.items = Some(items);
                fits
            }
        }
    }

    /// A watch goes to the writer as the lines each chunk completes: one queued operation per
    /// chunk. Each line is copied out on its own: a slice would pin the connection's whole
    /// read buffer until the writer got to it, and hyper would allocate (and fault in) a fresh
    /// buffer for every read meanwhile, which costs more than copying the line.
    fn collect_lines(&mut self, data: &Bytes) -> Option<Ticket> {
        let scope = self.sink.scope().cloned()?;
        let line_limit = self.writer.max_object_bytes() + EVENT_ENVELOPE;
        self.framer.push(data.clone());
        let mut lines = Vec::new();
        while let Some(line) = self.framer.next_line() {
            if line.trim_ascii().is_empty() {
                continue;
            }
            if line.len() > line_limit {
                self.abandon(Some(Missed::TooLarge));
                return None;
            }
            lines.push(Bytes::copy_from_slice(&line));
        }
        if self.framer.buffered() > line_limit {
            self.abandon(Some(Missed::TooLarge));
            return None;
        }
        if lines.is_empty() {
            return None;
        }
        let Some((lines, initial_ticket)) =
            hold_initial(&mut self.initial, &self.writer, &scope, lines)
        else {
            self.abandon(Some(Missed::QueueFull));
            return None;
        };
        if self
            .initial
            .as_ref()
            .is_some_and(|i| i.byte_len() > MAX_BODY)
        {
            self.abandon(Some(Missed::TooLarge));
            return None;
        }
        if lines.is_empty() {
            return initial_ticket;
        }
        let awaited = lines.iter().any(|line| must_be_durable(line));
        let op = CacheOp::Events { scope, lines };
        let submitted = match awaited {
            true => self.writer.submit_awaited(op),
            false => self.writer.submit(op),
        };
        match submitted {
            None => {
                self.abandon(Some(Missed::QueueFull));
                None
            }
            // Tickets grow with the queue: waiting for the later one waits for both.
            Some(ticket) if awaited => Some(ticket),
            Some(_) => initial_ticket,
        }
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let body = std::mem::take(&mut self.whole);
        // Cloned only for the writer: an answer the cache holds as it is costs no copy.
        let op = match &self.sink {
            Sink::Object(key) if self.writer.still_holds(key, &body) => return,
            Sink::Object(key) => CacheOp::Object {
                key: key.clone(),
                body,
            },
            Sink::Written(key) => CacheOp::Written {
                key: key.clone(),
                body,
            },
            Sink::List(scope) => CacheOp::List {
                scope: scope.clone(),
                body,
            },
            Sink::Document { name, content_type } => CacheOp::Document {
                name: name.clone(),
                content_type: content_type.clone(),
                body,
            },
            Sink::Watch { scope, .. } => {
                // Ended before any marker: what was held goes on as ordinary events.
                let lines = self.initial.take().unwrap_or_default().into_pieces();
                if lines.is_empty() {
                    return;
                }
                CacheOp::Events {
                    scope: scope.clone(),
                    lines,
                }
            }
        };
        if self.writer.submit(op).is_none() {
            self.note_missed(Missed::QueueFull);
        }
    }

    /// Gives the copy up; `why`, when the client got (or gets) what the cache will not hold.
    fn abandon(&mut self, why: Option<Missed>) {
        self.done = true;
        self.items = None;
        self.whole = Chunks::default();
        self.framer = LineFramer::new();
        self.initial = None;
        if let Some(why) = why {
            if why == Missed::TooLarge {
                self.writer.note_too_large(self.sink.label());
            }
            self.note_missed(why);
        }
    }

    /// A LIST or watch the cache could not keep: its scope missed events.
    fn note_missed(&self, why: Missed) {
        if let Some(scope) = self.sink.scope() {
            self.writer.mark_missed(scope, why);
        }
    }
}

/// Whether a watch line is an `ADDED` or `DELETED` event (see "Durable before forwarded"), read
/// off its first bytes as kube-apiserver writes them; an event written otherwise is not waited
/// for.
fn must_be_durable(line: &[u8]) -> bool {
    matches!(
        EventType::of_line(line),
        Some(EventType::Added | EventType::Deleted)
    )
}

/// Takes the lines a streaming list's initial events may still need into `initial`, and queues
/// them once the marker comes (with the ticket to wait for); returns the rest, to be queued as
/// ordinary events (see the module doc). `None`: the writer's queue was full, and the stream is
/// to be abandoned.
fn hold_initial(
    initial: &mut Option<Chunks>,
    writer: &Writer,
    scope: &Scope,
    lines: Vec<Bytes>,
) -> Option<(Vec<Bytes>, Option<Ticket>)> {
    let Some(held) = initial.as_mut() else {
        return Some((lines, None));
    };
    let mut lines = lines.into_iter();
    while let Some(line) = lines.next() {
        match InitialLine::of(&line) {
            InitialLine::Added => held.push(line),
            InitialLine::End => {
                held.push(line);
                let op = CacheOp::InitialEvents {
                    scope: scope.clone(),
                    lines: initial.take().unwrap_or_default().into_pieces(),
                };
                let ticket = writer.submit_awaited(op)?;
                return Some((lines.collect(), Some(ticket)));
            }
            InitialLine::Other => {
                let mut ordinary = initial.take().unwrap_or_default().into_pieces();
                ordinary.push(line);
                ordinary.extend(lines);
                return Some((ordinary, None));
            }
        }
    }
    Some((Vec::new(), None))
}

/// What a watch line means for a streaming list, read off its first bytes: kube-apiserver
/// writes `{"type":…` first; a line written otherwise counts as [`InitialLine::Other`], and its
/// events are then cached as ordinary ones.
#[derive(Debug, PartialEq)]
enum InitialLine {
    Added,
    /// The `k8s.io/initial-events-end` bookmark.
    End,
    Other,
}

impl InitialLine {
    fn of(line: &[u8]) -> InitialLine {
        match EventType::of_line(line) {
            Some(EventType::Added) => InitialLine::Added,
            Some(EventType::Bookmark)
                if WatchEvent::parse(line).is_ok_and(|e| e.ends_initial_events()) =>
            {
                InitialLine::End
            }
            _ => InitialLine::Other,
        }
    }
}

impl Body for TeeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(held) = this.held.as_mut() {
                let stored = held
                    .stored
                    .get_mut()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Stored::Late = ready!(stored.as_mut().poll(cx)) {
                    this.note_missed(Missed::NotDurable);
                }
                let frame = this.held.take().map(|h| h.frame);
                return Poll::Ready(frame.map(Ok));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let wait = frame.data_ref().and_then(|data| this.collect(data));
                    // hyper stops polling once a body reports its end, so the last frame may be
                    // the last call we get.
                    if this.inner.is_end_stream() {
                        this.finish();
                    }
                    match wait {
                        None => return Poll::Ready(Some(Ok(frame))),
                        Some(ticket) => this.held = Some(Held::new(frame, &this.writer, ticket)),
                    }
                }
                Some(Err(e)) => {
                    this.abandon(None);
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.finish();
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::writer::DEFAULT_MAX_OBJECT_BYTES;
    use crate::metrics::Metrics;
    use http_body_util::{BodyExt, StreamBody};
    use outpost_cache::{Gvr, MemStore, Store};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn scope() -> Scope {
        Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), None)
    }

    fn chunks(parts: Vec<Result<&'static [u8], &'static str>>) -> ProxyBody {
        let frames = parts.into_iter().map(|p| {
            p.map(|b| Frame::data(Bytes::from_static(b)))
                .map_err(|e| BoxError::from(e.to_owned()))
        });
        StreamBody::new(futures_util::stream::iter(frames)).boxed()
    }

    fn wait_for(mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(Instant::now() < deadline, "condition not met in time");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A writer over a store whose scope holds [`LIST`] (pod `a` at version 4).
    async fn listed(max_object_bytes: usize) -> (Arc<MemStore>, Writer) {
        let store = Arc::new(MemStore::new());
        let writer =
            Writer::start_with(store.clone(), Metrics::new(), false, max_object_bytes).unwrap();
        let list = CacheOp::List {
            scope: scope(),
            body: Bytes::from_static(LIST).into(),
        };
        assert!(writer.submit(list).is_some());
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        (store, writer)
    }

    const LIST: &[u8] = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a","namespace":"d","resourceVersion":"4"}}]}"#;

    #[tokio::test]
    async fn a_list_split_over_frames_reaches_client_and_cache_whole() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        let (a, b) = LIST.split_at(40);
        let body = chunks(vec![Ok(a), Ok(b)]);
        let tee = TeeBody::new(body, Sink::List(scope()), writer);
        let received = tee.collect().await.unwrap().to_bytes();
        assert_eq!(&received[..], LIST);
        wait_for(|| store.list(&scope()).unwrap().is_some());
    }

    /// hyper stops at `is_end_stream`, never polling for the final `None` of a sized body.
    #[tokio::test]
    async fn a_sized_body_is_cached_without_a_final_poll() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        let mut tee = TeeBody::new(crate::body::full(LIST), Sink::List(scope()), writer);
        while !tee.is_end_stream() {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut tee).poll_frame(cx)).await;
            assert!(frame.is_some());
        }
        wait_for(|| store.list(&scope()).unwrap().is_some());
    }

    #[tokio::test]
    async fn a_broken_body_is_passed_on_but_never_cached() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        let (a, _) = LIST.split_at(40);
        let body = chunks(vec![Ok(a), Err("connection reset")]);
        let tee = TeeBody::new(body, Sink::List(scope()), writer.clone());
        assert!(tee.collect().await.is_err());
        // A marker op queued after the broken body proves the writer got past it.
        let marker = Bytes::from_static(LIST);
        let other = Scope::unfiltered("kube-proxy", &Gvr::new("", "v1", "pods"), None);
        assert!(
            writer
                .submit(CacheOp::List {
                    scope: other.clone(),
                    body: marker.into()
                })
                .is_some()
        );
        wait_for(|| store.list(&other).unwrap().is_some());
        assert!(store.list(&scope()).unwrap().is_none());
    }

    #[tokio::test]
    async fn watch_events_are_applied_line_by_line() {
        let (store, writer) = listed(DEFAULT_MAX_OBJECT_BYTES).await;
        let event = br#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"d","resourceVersion":"6"}}}
"#;
        let (x, y) = event.split_at(30);
        let body = chunks(vec![Ok(x), Ok(y), Ok(b"{\"type\":\"ADD")]);
        let sink = Sink::Watch {
            scope: scope(),
            initial_events: false,
        };
        let tee = TeeBody::new(body, sink, writer);
        let received = tee.collect().await.unwrap().to_bytes();
        assert!(received.starts_with(event));
        wait_for(|| {
            store
                .list(&scope())
                .unwrap()
                .is_some_and(|l| l.items.len() == 2)
        });
        let list = store.list(&scope()).unwrap().unwrap();
        assert_eq!(list.resource_version.as_str(), "6");
    }
    fn pod_event(kind: &str, name: &str, rv: u32) -> String {
        format!(
            r#"{{"type":"{kind}","object":{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"d","resourceVersion":"{rv}"}}}}}}"#
        ) + "\n"
    }

    fn bookmark(rv: u32, end: bool) -> String {
        let annotations = if end {
            r#","annotations":{"k8s.io/initial-events-end":"true"}"#
        } else {
            ""
        };
        format!(
            r#"{{"type":"BOOKMARK","object":{{"kind":"Pod","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"{annotations}}}}}}}"#
        ) + "\n"
    }

    /// One frame per string.
    fn frames(parts: &[String]) -> ProxyBody {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from(p.clone()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames)).boxed()
    }

    /// Streams `lines` through a tee over a scope that already holds pod `a` at version 4.
    async fn streamed(lines: &[String], initial_events: bool) -> Vec<(String, String)> {
        let (store, writer) = listed(DEFAULT_MAX_OBJECT_BYTES).await;
        let sink = Sink::Watch {
            scope: scope(),
            initial_events,
        };
        let tee = TeeBody::new(frames(lines), sink, writer.clone());
        tee.collect().await.unwrap();
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        let list = store.list(&scope()).unwrap().unwrap();
        let mut names: Vec<(String, String)> = list
            .items
            .iter()
            .map(|o| {
                let v: serde_json::Value = serde_json::from_slice(&o.bytes).unwrap();
                let name = v["metadata"]["name"].as_str().unwrap().to_owned();
                (
                    name,
                    v["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                )
            })
            .collect();
        names.sort();
        names.push(("list".into(), list.resource_version.as_str().to_owned()));
        names
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn a_streaming_list_replaces_the_scope_then_events_follow() {
        let lines = [
            pod_event("ADDED", "b", 7),
            pod_event("ADDED", "c", 8),
            bookmark(9, true),
            pod_event("MODIFIED", "c", 10),
        ];
        assert_eq!(
            streamed(&lines, true).await,
            pairs(&[("b", "7"), ("c", "10"), ("list", "10")]),
            "a, absent from the streamed state, is gone"
        );
        assert_eq!(
            streamed(&[lines.concat()], true).await,
            pairs(&[("b", "7"), ("c", "10"), ("list", "10")]),
            "all in one chunk"
        );
        // Without the plan's permission the same stream only adds to the scope.
        assert_eq!(
            streamed(&lines, false).await,
            pairs(&[("a", "4"), ("b", "7"), ("c", "10"), ("list", "10")])
        );
    }

    #[tokio::test]
    async fn without_the_marker_held_events_go_on_as_ordinary_ones() {
        let expected = pairs(&[("a", "4"), ("b", "7"), ("c", "8"), ("list", "8")]);
        // Another bookmark first: no list is being streamed.
        let lines = [
            pod_event("ADDED", "b", 7),
            bookmark(7, false),
            pod_event("ADDED", "c", 8),
        ];
        assert_eq!(streamed(&lines, true).await, expected);
        // A change first.
        let lines = [pod_event("ADDED", "b", 7), pod_event("MODIFIED", "c", 8)];
        assert_eq!(streamed(&lines, true).await, expected);
        // The stream ends first.
        let lines = [pod_event("ADDED", "b", 7), pod_event("ADDED", "c", 8)];
        assert_eq!(streamed(&lines, true).await, expected);
    }

    /// The next frame of `tee`, as hyper polls it.
    async fn next_frame(tee: &mut TeeBody) -> Option<Bytes> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *tee).poll_frame(cx)).await?;
        Some(frame.unwrap().into_data().unwrap())
    }

    fn cached_names(store: &MemStore) -> Vec<String> {
        let list = store.list(&scope()).unwrap().unwrap();
        let mut names: Vec<String> = list
            .items
            .iter()
            .map(|o| {
                let v: serde_json::Value = serde_json::from_slice(&o.bytes).unwrap();
                v["metadata"]["name"].as_str().unwrap().to_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// A frame carrying ADDED or DELETED reaches the client only once the cache has it: at that
    /// moment, not some time later, the cache already agrees with what the client saw.
    #[tokio::test]
    async fn added_and_deleted_reach_the_client_once_the_cache_has_them() {
        let (store, writer) = listed(DEFAULT_MAX_OBJECT_BYTES).await;
        let lines = [
            pod_event("ADDED", "b", 6),
            pod_event("MODIFIED", "b", 7),
            pod_event("DELETED", "a", 8),
        ];
        let sink = Sink::Watch {
            scope: scope(),
            initial_events: false,
        };
        let mut tee = TeeBody::new(frames(&lines), sink, writer);
        assert!(
            next_frame(&mut tee)
                .await
                .unwrap()
                .starts_with(br#"{"type":"ADDED""#)
        );
        assert_eq!(
            cached_names(&store),
            ["a", "b"],
            "b is cached when it arrives"
        );
        assert!(next_frame(&mut tee).await.is_some());
        assert!(
            next_frame(&mut tee)
                .await
                .unwrap()
                .starts_with(br#"{"type":"DELETED""#)
        );
        assert_eq!(
            cached_names(&store),
            ["b"],
            "a is gone when its DELETED arrives"
        );
        assert!(next_frame(&mut tee).await.is_none());
    }

    /// A GET over the object limit reaches the client whole; the copy stops at the limit.
    #[tokio::test]
    async fn an_object_over_the_limit_is_passed_on_but_not_copied() {
        let store = Arc::new(MemStore::new());
        let metrics = Metrics::new();
        let writer = Writer::start_with(store.clone(), metrics.clone(), false, 1024).unwrap();
        let parts: Vec<String> = (0..10).map(|_| "x".repeat(512)).collect();
        let key = ObjectKey::new("kubelet", &Gvr::new("", "v1", "configmaps"), "d", "big");
        let mut tee = TeeBody::new(frames(&parts), Sink::Object(key), writer);
        let mut received = 0;
        for n in 1..=10 {
            received += next_frame(&mut tee).await.unwrap().len();
            assert_eq!(tee.done, n * 512 > 1024, "after {n} chunks");
            assert!(
                tee.whole.byte_len() <= 1024,
                "never more than the limit held"
            );
        }
        assert!(next_frame(&mut tee).await.is_none());
        assert_eq!(received, 5120);
        let counted = metrics
            .cache_writes
            .with_label_values(&["object", "too_large"])
            .get();
        assert_eq!(counted, 1);
    }

    /// A watch event over the limit: the stream is passed on, the copy given up, and the scope
    /// marked as having missed it.
    #[tokio::test]
    async fn a_watch_event_over_the_limit_marks_its_scope() {
        let (store, writer) = listed(300).await;
        let big = format!(
            r#"{{"type":"MODIFIED","object":{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"a","namespace":"d","resourceVersion":"9","annotations":{{"x":"{}"}}}}}}}}"#,
            "y".repeat(400)
        ) + "\n";
        let lines = [
            pod_event("MODIFIED", "a", 6),
            big,
            pod_event("ADDED", "c", 10),
        ];
        let sink = Sink::Watch {
            scope: scope(),
            initial_events: false,
        };
        let tee = TeeBody::new(frames(&lines), sink, writer.clone());
        let received = tee.collect().await.unwrap().to_bytes();
        assert_eq!(received.len(), lines.concat().len(), "everything passed on");
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        wait_for(|| store.list(&scope()).unwrap().unwrap().missed.is_some());
        assert_eq!(
            cached_names(&store),
            ["a"],
            "nothing after the gap was cached"
        );
    }

    /// A LIST whose second item is over the limit: the copy stops there.
    #[tokio::test]
    async fn a_list_stops_being_copied_at_an_item_over_the_limit() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start_with(store.clone(), Metrics::new(), false, 200).unwrap();
        let list = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"5"}},"items":[{{"metadata":{{"name":"a","namespace":"d"}}}},{{"metadata":{{"name":"b","namespace":"d","annotations":{{"x":"{}"}}}}}},{{"metadata":{{"name":"c","namespace":"d"}}}}]}}"#,
            "y".repeat(300)
        );
        let parts: Vec<String> = list
            .as_bytes()
            .chunks(64)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let mut tee = TeeBody::new(frames(&parts), Sink::List(scope()), writer.clone());
        let mut received = Vec::new();
        while let Some(chunk) = next_frame(&mut tee).await {
            received.extend_from_slice(&chunk);
            if received.len() > 400 {
                assert!(tee.done, "given up within the big item");
            }
        }
        assert_eq!(received, list.as_bytes());
        assert!(writer.caught_up(Duration::from_secs(5)).await);
        assert!(store.list(&scope()).unwrap().is_none(), "not cached");
        wait_for(|| store.health().missed_scopes == 1);
    }
}
