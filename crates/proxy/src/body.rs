//! The one body type the proxy hands to hyper, and helpers to build it.
//!
//! Upstream bodies stream through untouched (a watch reaches the client event by event); locally
//! generated bodies (Status errors, admin pages) are small and complete.

use bytes::Bytes;
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
