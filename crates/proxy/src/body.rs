//! The one body type the proxy hands to hyper, and helpers to build it.
//!
//! Upstream bodies stream through untouched (a watch reaches the client event by event); locally
//! generated bodies (Status errors, admin pages) are small and complete.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, combinators::BoxBody};

pub use crate::error::{BoxError, DeadlineExceeded};

/// A streaming body of either origin.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A complete body from bytes we produced ourselves.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body with no bytes (boxing nothing allocates nothing).
pub fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}

/// An upstream body, streamed frame by frame.
pub fn stream(body: crate::upstream::UpstreamBody) -> ProxyBody {
    body.map_err(BoxError::from).boxed()
}

/// `inner`, with `on_data` told the length of every data frame as it passes (byte counters,
/// work accounting). The end and the size hint are the inner body's, so a relayed answer keeps
/// its `Content-Length`.
pub fn counted<F>(inner: ProxyBody, on_data: F) -> ProxyBody
where
    F: FnMut(usize) + Send + Sync + Unpin + 'static,
{
    Counted { inner, on_data }.boxed()
}

struct Counted<F> {
    inner: ProxyBody,
    on_data: F,
}

impl<F: FnMut(usize) + Unpin> Body for Counted<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            (this.on_data)(data.len());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `body` until `stop` resolves, then a clean end, as when the apiserver closes a watch at its
/// timeout: the client watches again from the last version it saw. What has arrived is passed on
/// first; the rest of `body` is dropped unread (for an upstream body, with its connection).
pub fn until<F>(body: ProxyBody, stop: F) -> ProxyBody
where
    F: Future<Output = ()> + Send + Sync + 'static,
{
    Until {
        body,
        stop: Box::pin(stop),
        stopped: false,
    }
    .boxed()
}

struct Until<F> {
    body: ProxyBody,
    stop: Pin<Box<F>>,
    stopped: bool,
}

impl<F: Future<Output = ()>> Body for Until<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.stopped {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.stop.as_mut().poll(cx).is_ready() {
            self.stopped = true;
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.stopped || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // Ending early must not break a declared length, so none is passed on.
        SizeHint::default()
    }
}

/// The client's request body on its way through the hub, remembering how it went
/// ([`ClientBody`]): a failed exchange is then put down to the client when its body was
/// malformed or late, not to the apiserver. A body still unfinished at `deadline` fails.
pub fn from_client(
    body: hyper::body::Incoming,
    deadline: Option<(tokio::time::Instant, Duration)>,
) -> (RequestBody, ClientBody) {
    let state = ClientBody::default();
    let deadline = if body.is_end_stream() {
        state.set(ClientBody::ENDED);
        None
    } else {
        deadline.map(|(at, after)| (Box::pin(tokio::time::sleep_until(at)), after))
    };
    let watched = RequestBody {
        inner: body,
        state: state.clone(),
        deadline,
    };
    (watched, state)
}

/// How a client's request body went so far: still arriving, ended, malformed (bad chunked
/// encoding, cut short), or past the request's deadline.
#[derive(Debug, Clone, Default)]
pub struct ClientBody(Arc<ClientBodyState>);

#[derive(Debug, Default)]
struct ClientBodyState {
    state: AtomicU8,
    /// Why the body failed, when it did.
    error: OnceLock<String>,
}

impl ClientBody {
    const OPEN: u8 = 0;
    const ENDED: u8 = 1;
    const FAILED: u8 = 2;
    const LATE: u8 = 3;

    fn set(&self, state: u8) {
        self.0.state.store(state, Ordering::Release);
    }

    fn get(&self) -> u8 {
        self.0.state.load(Ordering::Acquire)
    }

    /// Why the body could not be read, when the client sent something that is not HTTP.
    pub fn malformed(&self) -> Option<&str> {
        (self.get() == Self::FAILED)
            .then(|| self.0.error.get().map(String::as_str))
            .flatten()
    }

    /// The body has not ended: the client is still sending, or stopped (or the deadline cut
    /// it off).
    pub fn unfinished(&self) -> bool {
        matches!(self.get(), Self::OPEN | Self::LATE)
    }

    /// The deadline passed before the body ended.
    pub fn late(&self) -> bool {
        self.get() == Self::LATE
    }
}

/// Why a client's request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    #[error(transparent)]
    Http(#[from] hyper::Error),
    #[error("the request body did not arrive within {0:?}")]
    Late(Duration),
}

/// A client's request body, watched ([`from_client`]).
pub struct RequestBody {
    inner: hyper::body::Incoming,
    state: ClientBody,
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
}

impl RequestBody {
    /// As the one body type of the proxy.
    pub fn boxed_proxy(self) -> ProxyBody {
        self.map_err(BoxError::from).boxed()
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        if matches!(self.state.get(), ClientBody::FAILED | ClientBody::LATE) {
            return Poll::Ready(None);
        }
        let polled = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => return self.poll_deadline(cx),
            Poll::Ready(polled) => polled,
        };
        match &polled {
            Some(Err(e)) => {
                let _ = self.state.0.error.set(crate::error::error_chain(e));
                self.state.set(ClientBody::FAILED);
            }
            None => self.state.set(ClientBody::ENDED),
            Some(Ok(_)) if self.inner.is_end_stream() => self.state.set(ClientBody::ENDED),
            Some(Ok(_)) => {}
        }
        Poll::Ready(polled.map(|frame| frame.map_err(RequestBodyError::from)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state.get(), ClientBody::FAILED | ClientBody::LATE)
            || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl RequestBody {
    fn poll_deadline(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let Some((sleep, after)) = &mut self.deadline else {
            return Poll::Pending;
        };
        ready!(sleep.as_mut().poll(cx));
        self.state.set(ClientBody::LATE);
        Poll::Ready(Some(Err(RequestBodyError::Late(*after))))
    }
}

/// A response body that must end by `deadline`: past it, the body fails with
/// [`DeadlineExceeded`] (the client sees the connection cut, as kube-apiserver cuts a response
/// past its request timeout; a body being collected becomes a 504).
pub fn until_deadline(
    body: ProxyBody,
    deadline: tokio::time::Instant,
    exceeded: DeadlineExceeded,
) -> ProxyBody {
    Deadline {
        body,
        sleep: Box::pin(tokio::time::sleep_until(deadline)),
        exceeded: Some(exceeded),
    }
    .boxed()
}

struct Deadline {
    body: ProxyBody,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Taken when the deadline fires; later polls end the body.
    exceeded: Option<DeadlineExceeded>,
}

impl Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.exceeded.is_none() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        ready!(self.sleep.as_mut().poll(cx));
        let exceeded = self.exceeded.take();
        if let Some(e) = &exceeded {
            tracing::warn!(server = %e.server, after = ?e.after, "response body not finished by the request's deadline; cut off");
        }
        Poll::Ready(exceeded.map(|e| Err(BoxError::from(e))))
    }

    fn is_end_stream(&self) -> bool {
        self.exceeded.is_none() || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The next newline-terminated line of a streamed body (a watch event), skipping blank lines;
/// `None` at the body's end. `framer` keeps what has arrived beyond the line; the call is
/// cancel-safe.
pub async fn next_line(
    body: &mut crate::upstream::UpstreamBody,
    framer: &mut outpost_core::wire::LineFramer,
) -> Result<Option<Bytes>, crate::upstream::BodyError> {
    loop {
        while let Some(line) = framer.next_line() {
            if !line.trim_ascii().is_empty() {
                return Ok(Some(line));
            }
        }
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    framer.push(data);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    #[tokio::test]
    async fn until_passes_what_arrived_then_ends_cleanly_when_stopped() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
        let inner = StreamBody::new(tokio_stream_from(rx)).boxed();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut body = until(inner, async move {
            let _ = stop_rx.await;
        });
        tx.send(Ok(Frame::data(Bytes::from_static(b"event 1\n"))))
            .await
            .unwrap();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "event 1\n");
        assert!(!body.is_end_stream());

        tx.send(Ok(Frame::data(Bytes::from_static(b"event 2\n"))))
            .await
            .unwrap();
        stop_tx.send(()).unwrap();
        let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(second, "event 2\n", "what arrived goes out before the end");
        assert!(body.frame().await.is_none(), "a clean end, not an error");
        assert!(body.is_end_stream());
        tx.send(Ok(Frame::data(Bytes::from_static(b"event 3\n"))))
            .await
            .ok();
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_body_past_its_deadline_fails_with_who_and_how_long() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
        let inner = StreamBody::new(tokio_stream_from(rx)).boxed();
        let exceeded = DeadlineExceeded {
            server: "https://api:6443".into(),
            after: Duration::from_millis(100),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        let mut body = until_deadline(inner, deadline, exceeded);
        tx.send(Ok(Frame::data(Bytes::from_static(b"{\"kind\""))))
            .await
            .unwrap();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "{\"kind\"", "what arrives in time goes through");
        let err = body.frame().await.unwrap().unwrap_err();
        let err = err.downcast_ref::<DeadlineExceeded>().expect("typed");
        assert_eq!(&*err.server, "https://api:6443");
        assert!(body.frame().await.is_none(), "ended after the error");
        assert!(body.is_end_stream());
        drop(tx);
    }

    #[tokio::test]
    async fn a_body_that_ends_in_time_is_untouched() {
        let exceeded = DeadlineExceeded {
            server: "".into(),
            after: Duration::from_secs(60),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let body = until_deadline(full("{}"), deadline, exceeded);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + Sync {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
