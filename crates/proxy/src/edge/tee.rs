//! Copies a response body into the cache while it streams to the client.
//!
//! The client always gets every frame as it arrives; the tee only keeps a copy. A whole body (GET,
//! LIST, discovery) is queued when it has ended cleanly; a watch stream is cut into lines and each
//! complete event is queued at once. A body that fails mid-way, grows past [`MAX_BODY`], or meets
//! a full writer queue is abandoned: nothing more of it is cached (a truncated list never
//! replaces a scope; a watch with a gap leaves the scope at its last applied resourceVersion, and
//! the next relist repairs it).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use outpost_cache::{ObjectKey, Scope};
use outpost_filter::LineFramer;

use super::writer::{CacheOp, Chunks, Writer};
use crate::body::{BoxError, ProxyBody};

/// Larger bodies are proxied but not cached (a 1,000-Service list is ~1 MB).
pub const MAX_BODY: usize = 64 << 20;

/// Where the collected bytes go.
#[derive(Debug, Clone)]
pub enum Sink {
    Object(ObjectKey),
    List(Scope),
    Watch(Scope),
    Document { name: String, content_type: String },
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
    /// Set once the copy is given up or handed over; later frames only pass through.
    done: bool,
}

impl TeeBody {
    pub fn new(inner: ProxyBody, sink: Sink, writer: Writer) -> TeeBody {
        TeeBody {
            inner,
            sink,
            writer,
            whole: Chunks::default(),
            framer: LineFramer::new(),
            done: false,
        }
    }

    fn collect(&mut self, data: &Bytes) {
        if self.done {
            return;
        }
        if self.whole.byte_len() + self.framer.buffered() + data.len() > MAX_BODY {
            self.abandon();
            return;
        }
        let Sink::Watch(scope) = &self.sink else {
            self.whole.push(data.clone());
            return;
        };
        // A watch goes to the writer as the lines each chunk completes: one queued operation
        // per chunk. Each line is copied out on its own: a slice would pin the connection's
        // whole read buffer until the writer got to it, and hyper would allocate (and fault in)
        // a fresh buffer for every read meanwhile, which costs more than copying the line.
        self.framer.push(data.clone());
        let lines: Vec<Bytes> = std::iter::from_fn(|| self.framer.next_line())
            .filter(|line| !line.trim_ascii().is_empty())
            .map(|line| Bytes::copy_from_slice(&line))
            .collect();
        if lines.is_empty() {
            return;
        }
        let op = CacheOp::Events {
            scope: scope.clone(),
            lines,
        };
        if !self.writer.submit(op) {
            self.abandon();
        }
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let body = std::mem::take(&mut self.whole);
        let op = match self.sink.clone() {
            Sink::Object(key) => CacheOp::Object { key, body },
            Sink::List(scope) => CacheOp::List { scope, body },
            Sink::Document { name, content_type } => CacheOp::Document {
                name,
                content_type,
                body,
            },
            Sink::Watch(_) => return,
        };
        self.writer.submit(op);
    }

    fn abandon(&mut self) {
        self.done = true;
        self.whole = Chunks::default();
        self.framer = LineFramer::new();
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
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.collect(data);
                }
                // hyper stops polling once a body reports its end, so the last frame may be the
                // last call we get.
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                this.abandon();
                Poll::Ready(Some(Err(e)))
            }
            None => {
                this.finish();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert!(writer.submit(CacheOp::List {
            scope: other.clone(),
            body: marker.into()
        }));
        wait_for(|| store.list(&other).unwrap().is_some());
        assert!(store.list(&scope()).unwrap().is_none());
    }

    #[tokio::test]
    async fn watch_events_are_applied_line_by_line() {
        let store = Arc::new(MemStore::new());
        let writer = Writer::start(store.clone(), Metrics::new(), false).unwrap();
        assert!(writer.submit(CacheOp::List {
            scope: scope(),
            body: Bytes::from_static(LIST).into()
        }));
        let event = br#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b","namespace":"d","resourceVersion":"6"}}}
"#;
        let (x, y) = event.split_at(30);
        let body = chunks(vec![Ok(x), Ok(y), Ok(b"{\"type\":\"ADD")]);
        let tee = TeeBody::new(body, Sink::Watch(scope()), writer);
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
}
