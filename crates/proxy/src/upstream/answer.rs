//! The body of an apiserver's answer, whichever protocol carried it: hyper's own body for
//! HTTP/1.1, an `h2` stream for HTTP/2 ([`super::h2`] speaks `h2` directly).
//!
//! An HTTP/2 body gives its flow-control window back as each frame is read (the server sends
//! as fast as the client reads, no faster) and keeps the answer's `Content-Length` as its size
//! hint, so a relayed answer declares its length as it did upstream.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// Why an answer's body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Http1(#[from] hyper::Error),
    #[error(transparent)]
    Http2(#[from] ::h2::Error),
}

/// An apiserver's answer body.
#[derive(Debug)]
pub enum UpstreamBody {
    Http1(Incoming),
    Http2(H2Body),
}

/// An HTTP/2 answer's body: the stream's data frames, then its trailers.
#[derive(Debug)]
pub struct H2Body {
    recv: ::h2::RecvStream,
    /// Bytes still to come by the answer's `Content-Length`, when it declared one.
    left: Option<u64>,
    data_done: bool,
}

impl H2Body {
    pub fn new(recv: ::h2::RecvStream, headers: &HeaderMap) -> H2Body {
        H2Body {
            recv,
            left: declared_length(headers),
            data_done: false,
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if !self.data_done {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // The window is given back as the bytes leave: a slow client slows the server.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.left = self.left.map(|left| left.saturating_sub(data.len() as u64));
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                // A server that ends a stream early with NO_ERROR or CANCEL closes it, as
                // hyper's own body reads it (an apiserver closing a watch at its timeout).
                Some(Err(e))
                    if matches!(
                        e.reason(),
                        Some(::h2::Reason::NO_ERROR | ::h2::Reason::CANCEL)
                    ) =>
                {
                    return Poll::Ready(None);
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => self.data_done = true,
            }
        }
        match ready!(self.recv.poll_trailers(cx)) {
            Ok(trailers) => Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t)))),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.left
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The `Content-Length` an answer declares, if one valid value.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let first = values.next()?.to_str().ok()?.trim().parse().ok()?;
    values
        .all(|v| v.to_str().ok().and_then(|v| v.trim().parse().ok()) == Some(first))
        .then_some(first)
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            UpstreamBody::Http1(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(BodyError::from))),
            UpstreamBody::Http2(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Http1(body) => body.is_end_stream(),
            UpstreamBody::Http2(body) => body.recv.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Http1(body) => body.size_hint(),
            UpstreamBody::Http2(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(http::header::CONTENT_LENGTH, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_declared_length_is_one_valid_value() {
        assert_eq!(declared_length(&headers(&["2300"])), Some(2300));
        assert_eq!(declared_length(&headers(&["12", "12"])), Some(12));
        assert_eq!(declared_length(&headers(&["12", "13"])), None);
        assert_eq!(declared_length(&headers(&["twelve"])), None);
        assert_eq!(declared_length(&headers(&[])), None);
    }
}
