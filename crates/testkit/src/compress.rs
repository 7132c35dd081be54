//! gzip answers, as kube-apiserver's `APIResponseCompression` gives them
//! (`k8s.io/apiserver/pkg/endpoints/handlers/responsewriters`): for a request whose
//! `Accept-Encoding` lists the token `gzip`, a serialized answer (object, list, Status) of more
//! than 128 KiB goes out with `Content-Encoding: gzip` and `Vary: Accept-Encoding`, compressed at
//! level 1; smaller answers and watch streams are never compressed.

use std::io::Write;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::{HeaderValue, Response, header};
use http_body::Body as _;
use http_body_util::BodyExt;

use crate::reply::{Body, full};

/// kube-apiserver's `defaultGzipThresholdBytes`: answers up to this size go uncompressed.
pub const GZIP_THRESHOLD_BYTES: u64 = 128 * 1024;

/// Whether `Accept-Encoding` names `gzip`, read as kube-apiserver reads it: comma-separated
/// tokens compared whole after trimming, so `gzip;q=0.5` does not count.
pub fn accepts_gzip(accept_encoding: Option<&str>) -> bool {
    accept_encoding.is_some_and(|value| value.split(',').any(|token| token.trim() == "gzip"))
}

/// `resp` compressed if its body is complete (not a stream) and over the threshold.
pub async fn large_answer(resp: Response<Body>) -> Response<Body> {
    let Some(len) = resp.body().size_hint().exact() else {
        return resp;
    };
    if len <= GZIP_THRESHOLD_BYTES || resp.headers().contains_key(header::CONTENT_ENCODING) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    // A body with an exact size is one of `reply`'s full bodies, which cannot fail.
    let plain = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let compressed = gzip(&plain);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    Response::from_parts(parts, full(compressed))
}

fn gzip(plain: &[u8]) -> Bytes {
    let mut encoder = GzEncoder::new(Vec::with_capacity(plain.len() / 4), Compression::fast());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(plain);
    Bytes::from(encoder.finish().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::text_response;

    #[test]
    fn the_gzip_token_is_matched_whole() {
        assert!(accepts_gzip(Some("gzip")));
        assert!(accepts_gzip(Some("deflate, gzip")));
        assert!(!accepts_gzip(Some("gzip;q=1.0")));
        assert!(!accepts_gzip(Some("br")));
        assert!(!accepts_gzip(None));
    }

    #[tokio::test]
    async fn only_answers_over_the_threshold_are_compressed() {
        let at_threshold = "x".repeat(GZIP_THRESHOLD_BYTES as usize);
        let resp = large_answer(text_response(200, &at_threshold)).await;
        assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
        let over = format!("{at_threshold}x");
        let resp = large_answer(text_response(200, &over)).await;
        assert_eq!(resp.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(resp.headers()[header::VARY], "Accept-Encoding");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let mut plain = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&body[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, over);
    }
}
