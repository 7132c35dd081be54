//! Compressed transfers from the apiservers: GETs and LISTs ask for gzip (kube-apiserver
//! compresses answers over 128 KiB), the cache and the filters see decoded bytes, and a client
//! that accepted gzip itself gets gzip.
//!
//! [`ask_for_gzip`] sets `Accept-Encoding: gzip` on the upstream request (watches are never
//! compressed by the apiserver and are left alone). When the answer comes compressed,
//! [`decode`] decides: a client that accepted gzip, when nothing on the hub reads the body,
//! gets the compressed bytes as they came; otherwise the body is decoded as it streams and
//! marked, and [`for_client`] compresses it again at the end (after the filters) for a client
//! that accepted gzip. [`count_received`] counts what crossed the WAN, per resource
//! (`outpost_upstream_received_bytes_total`).

use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use flate2::Compression;
use flate2::write::{GzDecoder, GzEncoder};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use outpost_core::Verb;
use prometheus::{IntCounter, IntCounterVec};

use crate::body::{self, BoxError, ProxyBody};
use crate::headers::quality_is_zero;

/// Marks a response whose gzip body the hub decoded.
#[derive(Debug, Clone, Copy)]
struct DecodedGzip;

/// Asks upstream for gzip on the reads the apiserver compresses (GET and LIST).
pub fn ask_for_gzip(method: &Method, verb: Verb, headers: &mut HeaderMap) {
    if method == Method::GET && matches!(verb, Verb::Get | Verb::List) {
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    }
}

/// Whether a client's `Accept-Encoding` takes gzip.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let coding = item.split(';').next().unwrap_or("").trim();
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !quality_is_zero(item)
        })
}

fn is_gzip(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"))
}

/// Decodes a gzip answer unless `client_gzip` and nothing on the hub reads it (`read_here`:
/// the cache tees it or the filters rewrite it); any other answer passes untouched.
pub fn decode(
    resp: Response<ProxyBody>,
    read_here: bool,
    client_gzip: bool,
) -> Response<ProxyBody> {
    if !is_gzip(resp.headers()) || (client_gzip && !read_here) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.extensions.insert(DecodedGzip);
    let body = Coded {
        inner: body,
        coder: Coder::Decode(GzDecoder::new(Vec::new())),
        fed: false,
    };
    Response::from_parts(parts, body.boxed())
}

/// Compresses again, for a client that accepted gzip, an answer [`decode`] decoded.
pub fn for_client(resp: Response<ProxyBody>, client_gzip: bool) -> Response<ProxyBody> {
    if !client_gzip || resp.extensions().get::<DecodedGzip>().is_none() {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    parts.extensions.remove::<DecodedGzip>();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    // The client is on the node: the fastest level, the bytes cross no WAN.
    let body = Coded {
        inner: body,
        coder: Coder::Encode(GzEncoder::new(Vec::new(), Compression::fast())),
        fed: false,
    };
    Response::from_parts(parts, body.boxed())
}

/// Counts the body of `resp` as it arrives, under `resource` and its encoding.
pub fn count_received(
    resp: Response<ProxyBody>,
    counter: &IntCounterVec,
    resource: &str,
) -> Response<ProxyBody> {
    let counted = received_counter(counter, resource, resp.headers());
    resp.map(|inner| body::counted(inner, move |n| counted.inc_by(n as u64)))
}

/// The counter for one upstream answer of `resource` with these headers.
pub fn received_counter(
    counter: &IntCounterVec,
    resource: &str,
    headers: &HeaderMap,
) -> IntCounter {
    let encoding = if is_gzip(headers) { "gzip" } else { "identity" };
    counter.with_label_values(&[resource, encoding])
}

/// `body`, whole, decoded if its headers say gzip (for the hub's own small reads).
pub fn decoded_bytes(headers: &HeaderMap, body: Bytes) -> Result<Bytes, std::io::Error> {
    if !is_gzip(headers) {
        return Ok(body);
    }
    let mut decoder = GzDecoder::new(Vec::new());
    decoder.write_all(&body)?;
    Ok(decoder.finish()?.into())
}

enum Coder {
    Decode(GzDecoder<Vec<u8>>),
    Encode(GzEncoder<Vec<u8>>),
    Done,
}

impl Coder {
    fn write(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        let out = match self {
            Coder::Decode(d) => {
                d.write_all(data)?;
                d.get_mut()
            }
            Coder::Encode(e) => {
                e.write_all(data)?;
                e.get_mut()
            }
            Coder::Done => return Ok(Bytes::new()),
        };
        Ok(std::mem::take(out).into())
    }

    /// The rest of the output; `fed` says whether any input came (an empty body labelled gzip,
    /// as a HEAD's or a 304's is, stays empty).
    fn finish(&mut self, fed: bool) -> std::io::Result<Bytes> {
        let out = match std::mem::replace(self, Coder::Done) {
            Coder::Decode(_) if !fed => Vec::new(),
            Coder::Decode(d) => d.finish()?,
            Coder::Encode(e) => e.finish()?,
            Coder::Done => Vec::new(),
        };
        Ok(out.into())
    }
}

/// A body gzip-decoded or -encoded as it streams.
struct Coded {
    inner: ProxyBody,
    coder: Coder,
    /// Whether any input came.
    fed: bool,
}

impl Body for Coded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if matches!(self.coder, Coder::Done) {
                return Poll::Ready(None);
            }
            let out = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.fed |= !data.is_empty();
                        self.coder.write(&data)
                    }
                    // Trailers: an apiserver sends none on a read; nothing to code.
                    Err(_) => continue,
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    let fed = self.fed;
                    self.coder.finish(fed)
                }
            };
            match out {
                Ok(bytes) if bytes.is_empty() => continue,
                Ok(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Err(e) => {
                    self.coder = Coder::Done;
                    return Poll::Ready(Some(Err(format!("gzip body: {e}").into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.coder, Coder::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn chunked(bytes: Vec<u8>, size: usize) -> ProxyBody {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = bytes
            .chunks(size)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
    }

    fn gzip_response(body: ProxyBody) -> Response<ProxyBody> {
        Response::builder()
            .header(header::CONTENT_ENCODING, "gzip")
            .header(header::CONTENT_LENGTH, "1")
            .body(body)
            .unwrap()
    }

    async fn bytes_of(resp: Response<ProxyBody>) -> Vec<u8> {
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn decoded_for_the_hub_and_compressed_again_for_a_gzip_client() {
        let json = br#"{"kind":"ServiceList","items":[]}"#.repeat(500);
        let resp = decode(gzip_response(chunked(gzip(&json), 7)), true, true);
        assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
        assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
        let (parts, body) = resp.into_parts();
        let decoded = body.collect().await.unwrap().to_bytes();
        assert_eq!(decoded.as_ref(), json.as_slice());

        let again = Response::from_parts(parts, crate::body::full(decoded));
        let out = for_client(again, true);
        assert_eq!(out.headers()[header::CONTENT_ENCODING], "gzip");
        let mut d = GzDecoder::new(Vec::new());
        d.write_all(&bytes_of(out).await).unwrap();
        assert_eq!(d.finish().unwrap(), json);
    }

    #[tokio::test]
    async fn passed_through_when_only_the_client_reads_it() {
        let compressed = gzip(b"{}");
        let resp = decode(gzip_response(chunked(compressed.clone(), 3)), false, true);
        assert_eq!(resp.headers()[header::CONTENT_ENCODING], "gzip");
        let resp = for_client(resp, true);
        assert_eq!(bytes_of(resp).await, compressed);
    }

    #[tokio::test]
    async fn a_client_without_gzip_gets_it_decoded_and_a_broken_stream_fails() {
        let resp = decode(gzip_response(chunked(gzip(b"{}"), 3)), false, false);
        let resp = for_client(resp, false);
        assert_eq!(bytes_of(resp).await, b"{}");
        let resp = decode(gzip_response(chunked(b"not gzip".to_vec(), 3)), true, false);
        assert!(resp.into_body().collect().await.is_err());
        let head = decode(gzip_response(crate::body::empty()), true, false);
        assert_eq!(
            bytes_of(head).await,
            b"",
            "an empty body labelled gzip stays empty"
        );
    }

    #[test]
    fn accept_encoding_rules() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
            m
        };
        assert!(accepts_gzip(&h("gzip")));
        assert!(accepts_gzip(&h("deflate, GZIP;q=0.5")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
