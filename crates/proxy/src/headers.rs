//! Header hygiene between the two hops: hop-by-hop headers never cross the proxy, except the
//! `Connection: Upgrade` / `Upgrade` pair of a protocol switch (exec, attach, port-forward).
//! Also the reading of a list item's `q=0` that `Accept` and `Accept-Encoding` share.

use http::HeaderMap;
use http::header::{self, HeaderName, HeaderValue};

/// Set on every answer the hub made from a cache rather than relayed (`edge-cache`,
/// `shared-cache`, `local-lease`…): it says where the answer came from.
pub const SERVED_FROM: &str = "x-outpost-served-from";

/// RFC 9110 §7.6.1 connection-specific fields, plus the legacy ones proxies still see.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Whether one item of an `Accept` or `Accept-Encoding` list (`gzip;q=0`) refuses what it names.
pub fn quality_is_zero(item: &str) -> bool {
    parameters(item)
        .filter(|(name, _)| *name == "q")
        .any(|(_, q)| q.parse::<f32>().is_ok_and(|q| q == 0.0))
}

/// Whether a media type or one item of an `Accept` list has the parameter `name`
/// (`application/json;as=Table`: `as`), names compared as HTTP compares them, case aside.
pub fn has_parameter(item: &str, name: &str) -> bool {
    parameters(item).any(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// The `name=value` parameters after a media type or list item's first `;`, trimmed.
fn parameters(item: &str) -> impl Iterator<Item = (&str, &str)> {
    item.split(';').skip(1).filter_map(|p| {
        let (name, value) = p.split_once('=')?;
        Some((name.trim(), value.trim()))
    })
}

/// Whether the request asks to switch protocols (SPDY or websocket).
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers (and those named in `Connection`); keeps the upgrade pair if asked.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most requests and answers carry none: one pass over the names they have is cheaper than
    // a lookup of every name they might have.
    if headers.keys().any(is_connection_specific) {
        let named: Vec<HeaderName> = connection_tokens(headers)
            .filter(|t| !(keep_upgrade && t.eq_ignore_ascii_case("upgrade")))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
        for name in &HOP_BY_HOP {
            headers.remove(name);
        }
        if !keep_upgrade {
            headers.remove(header::UPGRADE);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
}

fn is_connection_specific(name: &HeaderName) -> bool {
    *name == header::UPGRADE || HOP_BY_HOP.contains(name)
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

/// `Authorization: Bearer <token>` (scheme case-insensitive), the rule yurthub uses to pick the
/// transport without the node's client certificate.
pub fn has_bearer_token(headers: &HeaderMap) -> bool {
    bearer_token(headers).is_some()
}

/// The token of `Authorization: Bearer <token>`, when there is one.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer") && !token.is_empty())
        .map(|(_, token)| token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("transfer-encoding", "chunked"),
            ("accept", "application/json"),
            ("upgrade", "websocket"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn each_connection_specific_field_alone_is_stripped_and_the_rest_kept() {
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            let mut h = map(&[(name, "x"), ("accept", "application/json")]);
            strip_hop_by_hop(&mut h, false);
            assert_eq!(h.len(), 1, "{name} is stripped");
            assert!(h.contains_key("accept"), "beside {name}");
        }
        let mut plain = map(&[("accept", "application/json"), ("user-agent", "kubelet")]);
        strip_hop_by_hop(&mut plain, false);
        assert_eq!(plain.len(), 2, "end-to-end fields stay");
    }

    #[test]
    fn keeps_the_upgrade_pair_for_tunnels() {
        let mut h = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("te", "trailers"),
        ]);
        assert!(is_upgrade_request(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get("upgrade").unwrap(), "SPDY/3.1");
        assert_eq!(h.get("connection").unwrap(), "Upgrade");
        assert!(!h.contains_key("te"));
    }

    #[test]
    fn bearer_detection() {
        assert!(has_bearer_token(&map(&[("authorization", "Bearer abc")])));
        assert!(has_bearer_token(&map(&[("authorization", "bearer abc")])));
        assert!(!has_bearer_token(&map(&[("authorization", "Basic abc")])));
        assert!(!has_bearer_token(&map(&[("authorization", "Bearer ")])));
        assert!(!has_bearer_token(&HeaderMap::new()));
    }
}
