//! The one body type the proxy hands to hyper, and helpers to build it.
//!
//! Upstream bodies stream through untouched (a watch reaches the client event by event); locally
//! generated bodies (Status errors, admin pages) are small and complete.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, combinators::BoxBody};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body of either origin.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A complete body from bytes we produced ourselves.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body with no bytes.
pub fn empty() -> ProxyBody {
    full(Bytes::new())
}

/// An upstream (or client) body, streamed frame by frame.
pub fn stream(body: hyper::body::Incoming) -> ProxyBody {
    body.map_err(BoxError::from).boxed()
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

/// The next newline-terminated line of a streamed body (a watch event), skipping blank lines;
/// `None` at the body's end. `framer` keeps what has arrived beyond the line; the call is
/// cancel-safe.
pub async fn next_line(
    body: &mut hyper::body::Incoming,
    framer: &mut outpost_filter::LineFramer,
) -> Result<Option<Bytes>, hyper::Error> {
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

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + Sync {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
