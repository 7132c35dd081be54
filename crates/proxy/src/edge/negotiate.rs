//! Content negotiation for cached requests.
//!
//! The cache holds upstream JSON, byte for byte. kubelet and kube-proxy send
//! `Accept: application/vnd.kubernetes.protobuf,application/json`; for a cached request the hub
//! asks upstream for `application/json` only (a client that lists JSON accepts it), so what the
//! client receives is exactly what the cache stores and what it will be served offline. A
//! compressed answer is decoded before the cache sees it ([`crate::encoding`]). A client that accepts no JSON at all (protobuf only) is proxied untouched and
//! not cached: it never receives an encoding it did not ask for.

use http::HeaderMap;
use http::header::{self, HeaderValue};

use crate::headers::{has_parameter, quality_is_zero};

/// Whether the `Accept` header allows a plain JSON body (absent and `*/*` do).
pub fn accepts_json(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT) else {
        return true;
    };
    let Ok(accept) = accept.to_str() else {
        return false;
    };
    accept.split(',').any(|item| {
        let media = item.split(';').next().unwrap_or("").trim();
        matches!(media, "application/json" | "application/*" | "*/*" | "")
            && !has_parameter(item, "as")
            && !quality_is_zero(item)
    })
}

/// Rewrites the upstream request so the response is JSON (see the module doc); the client's
/// own `Accept-Encoding` goes ([`crate::encoding`] asks for gzip where it applies).
pub fn ask_for_json(headers: &mut HeaderMap) {
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    headers.remove(header::ACCEPT_ENCODING);
}

/// Whether an upstream response carries plain, uncompressed JSON that the cache may store.
pub fn is_plain_json(headers: &HeaderMap) -> bool {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let identity = headers
        .get(header::CONTENT_ENCODING)
        .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"));
    media.eq_ignore_ascii_case("application/json") && !has_parameter(content_type, "as") && identity
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn kubelet_accept_allows_json() {
        assert!(accepts_json(&accept(
            "application/vnd.kubernetes.protobuf,application/json"
        )));
        assert!(accepts_json(&HeaderMap::new()));
        assert!(accepts_json(&accept("*/*")));
        assert!(accepts_json(&accept("application/json;q=0.9")));
    }

    /// `as` is a parameter, matched by name: in any case, with spaces around it, and not as
    /// the end of another parameter's name.
    #[test]
    fn a_table_is_asked_for_by_its_parameter_only() {
        assert!(!accepts_json(&accept(
            "application/json; AS=Table; v=v1; g=meta.k8s.io"
        )));
        assert!(accepts_json(&accept("application/json;alias=x")));
        let mut headers = HeaderMap::new();
        let table = "application/json; As=Table;v=v1;g=meta.k8s.io";
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(table));
        assert!(!is_plain_json(&headers));
    }

    #[test]
    fn protobuf_only_and_tables_do_not() {
        assert!(!accepts_json(&accept(
            "application/vnd.kubernetes.protobuf"
        )));
        assert!(!accepts_json(&accept("application/json;q=0")));
        assert!(!accepts_json(&accept(
            "application/json;as=Table;v=v1;g=meta.k8s.io"
        )));
        // kubectl get: Table first, plain JSON as the fallback.
        let kubectl = accept(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        );
        assert!(accepts_json(&kubectl));
    }

    #[test]
    fn rewrite_and_response_checks() {
        let mut h = accept("application/vnd.kubernetes.protobuf,application/json");
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        ask_for_json(&mut h);
        assert_eq!(h[header::ACCEPT], "application/json");
        assert!(h.get(header::ACCEPT_ENCODING).is_none());

        let mut resp = HeaderMap::new();
        resp.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert!(is_plain_json(&resp));
        resp.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(!is_plain_json(&resp));
        let mut table = HeaderMap::new();
        table.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json;as=Table;v=v1;g=meta.k8s.io"),
        );
        assert!(!is_plain_json(&table));
    }
}
